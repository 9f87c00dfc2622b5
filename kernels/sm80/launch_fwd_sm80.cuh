// sm80/launch_fwd_sm80.cuh — v11's forward kernels and their launcher, split over translation units that compile in
// parallel (an edit of one recompiles it alone): sm80/v11.cu instantiates the D=64 kernels for fp16, sm80/v11_bf16.cu
// for bf16, sm80/v11_d128.cu the D=128 kernels of both (v11_forward_d128, v11_plan_d128 below). The kernels are
// sm80/kernels_fwd_sm80.cuh, their bodies sm80/forward_sm80.cuh; the story is sm80/v11.cu's header.
#pragma once

#include "flashcore.h"
#include "common/tma.cuh"
#include "sm80/kernels_fwd_sm80.cuh"
#include "sm80/v11_traits.cuh"

#include <cstdint>
#include <cstdio>
#include <type_traits>


// The configuration heuristic, in one place. Split the keys inside the CTA only when the long
// configuration's grid would not fill the GPU once: below that the run is one short wave whose length is
// the per-warp chain, so more CTAs, each with a fraction of the chain, is the win; above it every SM
// already has work and the merge would be pure overhead. Causal masking does not change the choice (it halves the
// work of both regimes alike).
enum class Regime { kLong, kShort };
constexpr int kSplitBelowWaves = 1;  // SHORT when the long grid is below this many waves of SMs

static Regime pick_regime(int batch_heads, int seq_len, int long_block_m, int num_sms) {
  const long long long_ctas = static_cast<long long>(batch_heads) * fc::ceil_div(seq_len, long_block_m);
  return long_ctas < static_cast<long long>(kSplitBelowWaves) * num_sms ? Regime::kShort : Regime::kLong;
}

// The kernels' names as c++filt prints them, for the plan and the fallback note (e.g. "v11_fwd<64, 128, 64, 32, 2, 1,
// 2>": the kernel and Cfg's template arguments).
#define V11_PLAN_NAME(kernel, Cfg) \
  FC_PLAN_NAME(kernel, Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit, \
               Cfg::kMinBlocks)

template <class Cfg, class T, bool kFamily>
static const char* kernel_name() {
  if constexpr (kFamily && std::is_same_v<T, __nv_bfloat16>) return V11_PLAN_NAME(v11_fwd_family_bf16, Cfg);
  else if constexpr (kFamily) return V11_PLAN_NAME(v11_fwd_family, Cfg);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return V11_PLAN_NAME(v11_fwd_bf16, Cfg);
  else return V11_PLAN_NAME(v11_fwd, Cfg);
}

template <class Cfg, class T, bool kFamily>
static const char* tma_kernel_name() {
  if constexpr (kFamily && std::is_same_v<T, __nv_bfloat16>) return V11_PLAN_NAME(v11_fwd_tma_family_bf16, Cfg);
  else if constexpr (kFamily) return V11_PLAN_NAME(v11_fwd_tma_family, Cfg);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return V11_PLAN_NAME(v11_fwd_tma_bf16, Cfg);
  else return V11_PLAN_NAME(v11_fwd_tma, Cfg);
}

template <class Cfg, class T>
static const char* window_kernel_name() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return V11_PLAN_NAME(v11_fwd_window_bf16, Cfg);
  else return V11_PLAN_NAME(v11_fwd_window, Cfg);
}

#define V11_CFG_ARGS(Cfg) Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit, Cfg::kMinBlocks

template <class Cfg, class T, bool kFamily>
static constexpr auto kernel_of() {
  if constexpr (kFamily && std::is_same_v<T, __nv_bfloat16>) return v11_fwd_family_bf16<V11_CFG_ARGS(Cfg)>;
  else if constexpr (kFamily) return v11_fwd_family<V11_CFG_ARGS(Cfg)>;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return v11_fwd_bf16<V11_CFG_ARGS(Cfg)>;
  else return v11_fwd<V11_CFG_ARGS(Cfg)>;
}

template <class Cfg, class T, bool kFamily>
static constexpr auto tma_kernel_of() {
  if constexpr (kFamily && std::is_same_v<T, __nv_bfloat16>) return v11_fwd_tma_family_bf16<V11_CFG_ARGS(Cfg)>;
  else if constexpr (kFamily) return v11_fwd_tma_family<V11_CFG_ARGS(Cfg)>;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return v11_fwd_tma_bf16<V11_CFG_ARGS(Cfg)>;
  else return v11_fwd_tma<V11_CFG_ARGS(Cfg)>;
}

template <class Cfg, class T>
static constexpr auto window_kernel_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return v11_fwd_window_bf16<V11_CFG_ARGS(Cfg)>;
  else return v11_fwd_window<V11_CFG_ARGS(Cfg)>;
}

// Raising a kernel's shared-memory limit is a driver call of about a microsecond: at 1,8,512,64 that would be
// a visible part of the whole run, so it is done once per process and kernel, as PyTorch does.
template <auto kKernel, int kBytes>
static const char* allow_smem_once() {
  static const bool ready = fc::allow_dynamic_smem(kKernel, kBytes) == nullptr;
  return ready ? nullptr : fc::allow_dynamic_smem(kKernel, kBytes);
}

// The in-CTA kernels' grid: query tiles by batch * heads, the order query_tile_fastest picks.
template <class Cfg>
static const char* query_grid(const FlashcoreParams& p, dim3* grid) {
  const unsigned tiles = fc::ceil_div(p.seq_len, Cfg::kBlockM), heads = p.batch * p.heads;
  *grid = query_tile_fastest(p.causal, Cfg::kHeadDim) ? dim3(tiles, heads) : dim3(heads, tiles);
  if (grid->y > 65535) return fc::message("v11: grid y of %u exceeds the limit (65535)", grid->y);
  return nullptr;
}

// The cp.async kernel a launch takes: the window kernel (kWindowOnly), else the dense or family one.
template <class Cfg, class T, bool kFamily, bool kWindowOnly>
static constexpr auto launch_kernel_of() {
  if constexpr (kWindowOnly) return window_kernel_of<Cfg, T>();
  else return kernel_of<Cfg, T, kFamily>();
}

template <class Cfg, class T, bool kFamily, bool kWindowOnly = false>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = launch_kernel_of<Cfg, T, kFamily, kWindowOnly>();
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  dim3 grid;
  if (const char* err = query_grid<Cfg>(p, &grid)) return err;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return fc::launch_status();
}

// A [B * H_kv][S_kv][D] fp16 (bf16) tensor as a 3-D map whose boxes are a stage's kTileN rows x D (D = 64: one 128-byte
// row per box row), swizzled 128 bytes (the chunk ^ (row & 7) layout the kernel reads), zeros past S. False when
// the driver refuses it (a misaligned base, say); the caller then takes the cp.async kernel.
template <class Cfg, class T>
static bool encode_rows_map(CUtensorMap* map, const void* base, const FlashcoreParams& p) {
  constexpr int rows = Cfg::kTileN;
  constexpr auto data_type =
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(p.head_dim) * sizeof(T);
  return fc::encode_tensor_map<3>(map, data_type, base,
                                  {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.seq_len_kv),
                                   static_cast<cuuint64_t>(p.batch) * p.heads_kv},
                                  {row_bytes, row_bytes * p.seq_len_kv},  // bytes, dims 1 and 2
                                  {static_cast<cuuint32_t>(p.head_dim), static_cast<cuuint32_t>(rows), 1},
                                  CU_TENSOR_MAP_SWIZZLE_128B);
}

// The TMA kernel's launch. *launched stays false when the maps could not be made (no error then: the caller
// takes the cp.async kernel).
template <class Cfg, class T, bool kFamily>
static const char* launch_tma(const FlashcoreParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  constexpr auto kernel = tma_kernel_of<Cfg, T, kFamily>();
  constexpr int smem = tma_smem_bytes<Cfg>();
  if (const char* err = allow_smem_once<kernel, smem>()) return err;
  dim3 grid;
  if (const char* err = query_grid<Cfg>(p, &grid)) return err;
  // The maps are made on the host for each new pair of tensors; a loop over the same ones reuses them.
  static thread_local struct {
    const void* k = nullptr;
    const void* v = nullptr;
    int batch = 0, heads_kv = 0, seq_len_kv = 0;
    CUtensorMap map_k, map_v;
  } last;
  if (last.k != p.k || last.v != p.v || last.batch != p.batch || last.heads_kv != p.heads_kv ||
      last.seq_len_kv != p.seq_len_kv) {
    last.k = nullptr;  // no valid pair until both maps are made
    if (!encode_rows_map<Cfg, T>(&last.map_k, p.k, p) || !encode_rows_map<Cfg, T>(&last.map_v, p.v, p)) {
      return nullptr;
    }
    last.k = p.k;
    last.v = p.v;
    last.batch = p.batch;
    last.heads_kv = p.heads_kv;
    last.seq_len_kv = p.seq_len_kv;
  }
  *launched = true;
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p, last.map_k, last.map_v);
  return fc::launch_status();
}

// At D=64 an sm_90 build takes the TMA kernel of the regime (CfgTma; void at D=128, whose 256-byte rows one
// 128-byte-swizzled box does not cover), unless the driver cannot make its tensor maps; the cp.async kernels
// remain for older GPUs and D=128.
// What the last forward on this thread ran in place of its TMA kernel (flashcore_forward_note; cleared by each
// flashcore_forward): one pointer and one buffer for both translation units (an inline function's statics).
inline const char*& v11_forward_note() {
  static thread_local const char* note = nullptr;
  return note;
}

inline char* v11_note_buffer() {
  static thread_local char text[192];
  return text;
}

template <class Cfg, class CfgTma, class T, bool kFamily>
static const char* launch_prefer_tma(const FlashcoreParams& p, cudaStream_t stream) {
  if constexpr (fc::kBuildsSm90 && !std::is_void_v<CfgTma>) {
    const char* why = "this driver does not export cuTensorMapEncodeTiled";
    if (fc::tensor_map_encoder() != nullptr) {
      bool launched = false;
      const char* err = launch_tma<CfgTma, T, kFamily>(p, stream, &launched);
      if (launched || err != nullptr) return err;
      why = "the driver could not make the K/V tensor maps";
    }
    snprintf(v11_note_buffer(), 192, "%s ran in place of %s: %s", kernel_name<Cfg, T, kFamily>(),
             tma_kernel_name<CfgTma, T, kFamily>(), why);
    v11_forward_note() = v11_note_buffer();
  }
  return launch<Cfg, T, kFamily>(p, stream);
}

template <class Long, class LongTma, class Short, class ShortTma, class T, bool kFamily>
static const char* forward_regime(const FlashcoreParams& p, cudaStream_t stream) {
  if (pick_regime(p.batch * p.heads, p.seq_len, Long::kBlockM, fc::sm_count()) == Regime::kShort) {
    return launch_prefer_tma<Short, ShortTma, T, kFamily>(p, stream);
  }
  return launch_prefer_tma<Long, LongTma, T, kFamily>(p, stream);
}

// Whether a call needs the family kernels: a softcap, or a window other than none (-1, -1) and causal (-1, 0). The
// dense kernels take the rest (sinks too: only the row's end).
static bool needs_family(const FlashcoreParams& p) {
  return p.softcap > 0.f || p.window_left >= 0 || p.window_right > 0;
}

// The family kernels where needs_family (the long one's tiles LongFamily, of Long's rows), else the dense ones. Where
// LongWindow is given (D=128, no TMA kernel), a long call with a window and no softcap takes its window kernel.
template <class Long, class LongTma, class Short, class ShortTma, class T, class LongFamily = Long,
          class LongWindow = void>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  static_assert(LongFamily::kBlockM == Long::kBlockM, "one regime choice for both");
  if (!needs_family(p)) return forward_regime<Long, LongTma, Short, ShortTma, T, false>(p, stream);
  if constexpr (!std::is_void_v<LongWindow>) {
    static_assert(std::is_void_v<LongTma> && LongWindow::kBlockM == Long::kBlockM, "the long regime's kernel");
    if (!(p.softcap > 0.f) &&
        pick_regime(p.batch * p.heads, p.seq_len, Long::kBlockM, fc::sm_count()) == Regime::kLong) {
      return launch<LongWindow, T, false, true>(p, stream);
    }
  }
  return forward_regime<LongFamily, LongTma, Short, ShortTma, T, true>(p, stream);
}

// D=128: instantiated for fp16 and bf16 in sm80/v11_d128.cu only.
template <class T>
const char* v11_forward_d128(const FlashcoreParams& p, cudaStream_t stream);
template <class T>
int v11_plan_d128(FlashcoreKernelPlan* all);

template <class T>
static const char* forward_dtype(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return forward<LongD64, LongTmaD64, ShortD64, ShortTmaD64, T>(p, stream);
    case 128: return v11_forward_d128<T>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}

template <class Cfg, class T, bool kFamily = false>
static FlashcoreKernelPlan plan_of() {
  return {kernel_name<Cfg, T, kFamily>(), Cfg::kThreads, Cfg::kSmemBytes};
}

template <class Cfg, class T>
static FlashcoreKernelPlan window_plan_of() {
  return {window_kernel_name<Cfg, T>(), Cfg::kThreads, Cfg::kSmemBytes};
}

template <class Cfg, class T, bool kFamily = false>
static FlashcoreKernelPlan tma_plan_of() {
  return {tma_kernel_name<Cfg, T, kFamily>(), Cfg::kThreads, tma_smem_bytes<Cfg>()};
}

// The dense kernels, then their family twins.
template <class T>
static int plan_dtype(int head_dim, FlashcoreKernelPlan* all) {
  int count = 0;
  if (head_dim == 64) {
    all[count++] = plan_of<LongD64, T>();
    all[count++] = plan_of<ShortD64, T>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<LongTmaD64, T>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<ShortTmaD64, T>();
    all[count++] = plan_of<LongD64, T, true>();
    all[count++] = plan_of<ShortD64, T, true>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<LongTmaD64, T, true>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<ShortTmaD64, T, true>();
  } else if (head_dim == 128) {
    count += v11_plan_d128<T>(all);
  }
  return count;
}
