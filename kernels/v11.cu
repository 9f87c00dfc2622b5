// v11.cu — FlashAttention-2 on raw mma.sync: scores, softmax and P V never leave the registers.
//
// Idea: each warp owns 16 or 32 query rows and their whole softmax, as in FlashAttention-2. S = Q K_j^T runs
// on mma.sync m16n8k16 into fp32 C fragments; a row's max takes two shuffles in the quad of lanes that holds
// it; P = exp2(S * scale * log2 e - m) is packed to fp16 in place, and since the C fragments of two n8
// tiles ARE the A fragment of the next mma, P V runs straight from those registers. K_j and V_j stream through
// a cp.async ring in XOR-swizzled shared memory, read by ldmatrix .x4 (.trans for V) free of bank conflicts.
// Parts: v11_traits.cuh (the tile configurations), mainloop_fwd_sm80.cuh (a CTA's prologue, main loop and epilogue),
// fa2_mma.cuh (the warp's fragments), tma.cuh; this file has the kernels and the launcher. Backward: v11_bwd.cu.
//
// Change from the rungs below (v8-v10, WMMA): WMMA's fragment layout is unspecified, so they sent every tile's
// scores through shared memory for the softmax, and P again for P V, with barriers between; PTX specifies
// mma's layouts, so v11 has no round trip. A warp none of whose rows found a new max skips the O rescale.
// Short sequences are a latency problem (1,8,512,64 is one short wave): when the long grid would not fill the
// GPU, 32-row CTAs split each ring stage's keys between groups of warps and merge (m_i, l_i, O_i) through
// shared memory at the end; Q_i goes from global memory straight to registers, and the CTAs of a head prefetch
// its K, V into L2. On sm_90 at D=64 the short kernel is v11_fwd_tma: thread 0 loads each stage by TMA onto an
// mbarrier, so the warps issue no LDGSTS (each 32 KB cp.async refill cost its tile ~250 ns in the MIO queue),
// and its loop is software-pipelined (S of tile t + 1 in the same basic block as tile t's softmax and P V).
// The long D=64 kernel does the same on sm_90 (LongTmaD64: LongD64's tiles, one S at a time, 221 registers).
// Causal: tiles past a warp's last row are skipped, only diagonal tiles build masks, heaviest query tiles first.
// bf16: every kernel also exists as *_bf16 (mma .bf16, P and O rounded to bf16, a bf16 ones column for l_i,
// BFLOAT16 tensor maps); the fp16 kernels are unchanged (same SASS opcodes; sm_90's LongD128 swaps two registers).
// Grouped-query heads and S_kv != S: a CTA of query head h reads K/V head h / (H / H_kv), key tiles run over S_kv
// and the causal mask is bottom-right (row i sees keys j <= i + S_kv - S); the row LSE is written when asked (the
// backward, v11_bwd.cu, reads it). Same run beside the build before (H200, cold): 1,8,512,64 8.2 vs 8.2 us,
// 2,16,4096,64 420.9 vs 430.8, 2,16,4096,128 756.3 vs 767.8.
//
// Configuration (V11Config<D, BLOCK_M, BLOCK_N, WARP_M, STAGES, SPLIT, MIN_BLOCKS>; tune space: variants.yaml):
//   slot         used when                          D  BLOCK_M BLOCK_N WARP_M STAGES SPLIT MIN warps  smem
//   LongD64      B*H*ceil(S/128) >= SMs             64    128     64     32      2     1    2    4   48 KB
//   LongD128                                       128    128     48     32      2     1    2    4   80 KB
//   ShortD64     fewer CTAs than SMs                64     32     32     16      3     4    1    8   96 KB
//   ShortD128                                      128     32     16     16      2     4    1    8   69 KB
//   ShortTmaD64  short, D=64, sm_90+ build          64     32     64     16      3     2    1    4   96 KB
//   LongTmaD64   long, D=64, sm_90+ build           64    128     64     32      2     1    2    4   48 KB
// Why: 32-row warps read each K/V fragment once for two m16 tiles (16-row warps: ldmatrix caps the mma near
// 470 TFLOP/s on an H100); registers set the rest (D=128: 48-key tiles, 777 us at 2,16,4096,128 vs 832 for 32).
// Short: 4 groups x 32 keys 9.5 us at 1,8,512,64 vs 8 x 16 10.6, 2 x 64 9.8 (`flashcore tune`, 20 configurations).
//
// Run:  flashcore test v11 && flashcore bench v11 --shape 1,8,512,64 && flashcore bench v11 --shape 2,16,4096,64
//
// Accuracy: l_i sums the fp16 P that P V multiplies (one more mma per k16 step: P times a ones column), so
// one-hot rows (q = k = v = randn * 30) are exact, as in SDPA (summing fp32 P: 0.0625). It cost 3.6% at
// 2,16,4096,64 (457 vs 441 us, a ptxas schedule); K and V by TMA in the long D=64 kernel won it back (433-436
// us). Five other exact forms, their costs and the schedule study: docs/ladder.md, "Accuracy".
//
// ptxas (nvcc 13.0; no static smem, spills or stack), registers sm_90 | sm_89 (v11_fwd_tma, sm_90 only: long
// <64, 128, 64, 32, 2, 1, 2> 221, short <64, 32, 64, 16, 3, 2, 1> 174):
//   v11_fwd<64, 128, 64, 32, 2, 1, 2>  226 | 219 (2 CTAs/SM)   v11_fwd<64, 32, 32, 16, 3, 4, 1>   136 | 125
//   v11_fwd<128, 128, 48, 32, 2, 1, 2> 254 | 252 (2 CTAs/SM)   v11_fwd<128, 32, 16, 16, 2, 4, 1>  181 | 174
// Measured (H200, `flashcore bench`, L2 flushed, blocking start; the record docs/results/h200.json, and
// runs of this build beside the build before the l_i change, which reads v11b):
//   shape              v11                     SDPA default   SDPA flash (FA2)
//   1,8,512,64         8.1 us (0.74x), v11b 8.1   11.0 us     14.5 us   target <= 0.6x SDPA's time: not met
//     graph mode       5.5 us, v11b 5.5           8.9 us     10.3 us
//   2,16,4096,64       433-436 us, 315-318 TFLOP/s; v11b 436  462 TFLOP/s   294  (cp.async: 456-460 us)
//     causal           230 us, 298 TFLOP/s; v11b 234          368          233  (cp.async: 244 us)
//   2,16,4096,128      359 TFLOP/s (bf16 360)     639 (661)   346 (341)  1.04x FA2 (bf16 1.06x)
// Where the 1,8,512,64 time goes (docs/ladder.md: timelines, ablations, floor study): an empty kernel ~3.5 us;
// loads, merge and the mma work with no softmax at all 7.2-7.3 (0.61x of SDPA); v11's softmax ~1.5 us more.
// Tried and not kept (H200, 1,8,512,64; details in docs/ladder.md): clusters along the keys merged by DSMEM
// 10.0-13.3 us vs 8.8; clusters of 2 / 4 / 8 query tiles sharing K/V by TMA multicast 9.8 / 11.6 / 12.4 vs 8.1;
// tensor maps prefetched, prologue TMA before the CTA barrier 8.1-8.2 vs 8.1-8.2; the cp.async short kernel on
// sm_90 9.4 vs 9.1; next S before this softmax (cp.async) 10.6 vs 9.5; wider TMA tiles 8.3-8.7 (over the L4's
// 99 KB); 16-row CTAs two per SM 9.0-9.3; FlashAttention-4's lazy rescale (never faster, 1.75x FA2's error).
#include "flashcore.h"
#include "mainloop_fwd_sm80.cuh"
#include "tma.cuh"
#include "v11_traits.cuh"

#include <cstdint>
#include <type_traits>


template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __half>(p, nullptr, nullptr);
}

// The same kernels on bf16 tensors (mma .bf16, bf16 rounding of P and O); the fp16 ones keep their names.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_bf16(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __nv_bfloat16>(p, nullptr,
                                                                                                     nullptr);
}

// sm_90's short D=64 kernel: the tensor maps are kernel parameters (__grid_constant__: TMA reads them
// where they are). Only an sm_90+ build instantiates it (fc::kBuildsSm90 in forward and flashcore_plan).
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __half>(p, &tmap_k, &tmap_v);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma_bf16(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __nv_bfloat16>(p, &tmap_k,
                                                                                                    &tmap_v);
}

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

// The kernel's name as c++filt prints it, for the plan (e.g. "v11_fwd<64, 128, 64, 32, 2, 1, 2>").
template <class Cfg>
struct KernelName {
  char text[64];
  explicit KernelName(const char* kernel) {
    snprintf(text, sizeof(text), "%s<%d, %d, %d, %d, %d, %d, %d>", kernel, Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN,
             Cfg::kWarpM, Cfg::kStages, Cfg::kSplit, Cfg::kMinBlocks);
  }
};

template <class Cfg, class T>
static const char* kernel_name() {
  static const KernelName<Cfg> name(std::is_same_v<T, __nv_bfloat16> ? "v11_fwd_bf16" : "v11_fwd");
  return name.text;
}

template <class Cfg, class T>
static const char* tma_kernel_name() {
  static const KernelName<Cfg> name(std::is_same_v<T, __nv_bfloat16> ? "v11_fwd_tma_bf16" : "v11_fwd_tma");
  return name.text;
}

template <class Cfg, class T>
static constexpr auto kernel_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return v11_fwd_bf16<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                        Cfg::kMinBlocks>;
  } else {
    return v11_fwd<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                   Cfg::kMinBlocks>;
  }
}

template <class Cfg, class T>
static constexpr auto tma_kernel_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return v11_fwd_tma_bf16<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                            Cfg::kMinBlocks>;
  } else {
    return v11_fwd_tma<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                       Cfg::kMinBlocks>;
  }
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

template <class Cfg, class T>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = kernel_of<Cfg, T>();
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  dim3 grid;
  if (const char* err = query_grid<Cfg>(p, &grid)) return err;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return fc::launch_status();
}

// A [B * H_kv][S_kv][D] fp16 (bf16) tensor as a 3-D map whose boxes are a stage's kTileN rows x D (D = 64: one 128-byte row
// per box row), swizzled 128 bytes (the chunk ^ (row & 7) layout the kernel reads), zeros past S. False when
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
template <class Cfg, class T>
static const char* launch_tma(const FlashcoreParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  constexpr auto kernel = tma_kernel_of<Cfg, T>();
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
template <class Cfg, class CfgTma, class T>
static const char* launch_prefer_tma(const FlashcoreParams& p, cudaStream_t stream) {
  if constexpr (fc::kBuildsSm90 && !std::is_void_v<CfgTma>) {
    if (fc::tensor_map_encoder() != nullptr) {
      bool launched = false;
      const char* err = launch_tma<CfgTma, T>(p, stream, &launched);
      if (launched || err != nullptr) return err;
    }
  }
  return launch<Cfg, T>(p, stream);
}

template <class Long, class LongTma, class Short, class ShortTma, class T>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  if (pick_regime(p.batch * p.heads, p.seq_len, Long::kBlockM, fc::sm_count()) == Regime::kShort) {
    return launch_prefer_tma<Short, ShortTma, T>(p, stream);
  }
  return launch_prefer_tma<Long, LongTma, T>(p, stream);
}

template <class T>
static const char* forward_dtype(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return forward<LongD64, LongTmaD64, ShortD64, ShortTmaD64, T>(p, stream);
    case 128: return forward<LongD128, void, ShortD128, void, T>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}

template <class Cfg, class T>
static FlashcoreKernelPlan plan_of() {
  return {kernel_name<Cfg, T>(), Cfg::kThreads, Cfg::kSmemBytes};
}

template <class Cfg, class T>
static FlashcoreKernelPlan tma_plan_of() {
  return {tma_kernel_name<Cfg, T>(), Cfg::kThreads, tma_smem_bytes<Cfg>()};
}

template <class T>
static int plan_dtype(int head_dim, FlashcoreKernelPlan* all) {
  int count = 0;
  if (head_dim == 64) {
    all[count++] = plan_of<LongD64, T>();
    all[count++] = plan_of<ShortD64, T>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<LongTmaD64, T>();
    if (fc::kBuildsSm90) all[count++] = tma_plan_of<ShortTmaD64, T>();
  } else if (head_dim == 128) {
    all[count++] = plan_of<LongD128, T>();
    all[count++] = plan_of<ShortD128, T>();
  }
  return count;
}

int v11_backward_plan(int head_dim, FlashcoreKernelPlan* plans);  // v11_bwd.cu

// The forward's fp16 kernels, then its bf16 ones, then the backward's (v11_bwd.cu).
int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  FlashcoreKernelPlan all[kFlashcoreMaxPlans];
  int count = plan_dtype<__half>(head_dim, all);
  if (count == 0) return 0;
  count += plan_dtype<__nv_bfloat16>(head_dim, all + count);
  count += v11_backward_plan(head_dim, all + count);
  const int n = max_plans < count ? max_plans : count;
  for (int i = 0; i < n; ++i) plans[i] = all[i];
  return n;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  // The running max is kept in raw-score units, which orders like the scaled scores only for scale > 0.
  if (!(p.scale > 0.f)) return fc::message("v11 needs a softmax scale > 0 (got %g)", p.scale);
  if (p.seq_len < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  if (p.seq_len_kv < 1) return "v11: k and v have no rows";
  // fp16 first: its kernels are then emitted first, and their SASS is what it was before bf16 existed
  return p.dtype != kFlashcoreBFloat16 ? forward_dtype<__half>(p, stream) : forward_dtype<__nv_bfloat16>(p, stream);
}

// fp16 and bf16: the same kernels, instantiated for each (v11_fwd*_bf16).
int flashcore_dtypes() { return (1 << kFlashcoreFloat16) | (1 << kFlashcoreBFloat16); }

// Grouped-query heads and S_kv != S (each query head reads its K/V head; the causal mask is bottom-right), the
// row log-sum-exp when asked, and the backward in v11_bwd.cu.
int flashcore_features() { return kFlashcoreGqa | kFlashcoreSeqLenKv | kFlashcoreLse | kFlashcoreBackward; }
