// decode/decode.cu — flash-decoding: a few query rows against a long K/V cache, run as a bandwidth machine.
//
// Idea: at decode time (S = 1..16 query rows, S_kv in the thousands) attention reads K and V once and does
// almost no math, so the kernel is judged in bytes per second. The G = H / H_kv query heads of a K/V head and
// their S rows are packed into one tile of M = G * S rows (padded to 16 for mma.sync m16n8k16), so each K/V
// byte is read once per group; the keys of a head are split over enough CTAs to fill every SM (Flash-Decoding),
// each streaming its run of 64-key tiles through a deep shared-memory ring; the splits' partials are merged
// by their log-sum-exp in a second, small kernel.
//
// Change from the rung below (v11): v11 gives each CTA 128 query rows of one head and loops over all keys;
// with one query row that is 1/128 of a tile and one CTA per head. Here a CTA is 16 rows of a group and a
// run of keys (kernels/decode/split.cuh: the split count from the SM count, B * H_kv and S_kv, costed in waves
// of CTAs); a producer warp streams K/V by TMA on sm_90 (cp.async elsewhere; kernels/decode/load.cuh) while
// four consumer warps each take 16 keys of every stage (kernels/decode/tile.cuh: v11's fragments, ones-column
// row sums, online softmax, over a 64-column panel layout a TMA box can write at D = 128); the warps merge in
// shared memory, and several splits merge in decode_combine (kernels/decode/combine.cuh: a CTA per query row),
// launched as a programmatic dependent so its launch overlaps the split kernel's tail. LSE sums the unrounded
// fp32 P beside l_i (the rounded P that O divides by, which keeps one-hot rows exact).
//
// The attention family (flashcore.h): a sliding window is planned over the keys the rows see, not the cache
// (decode/split.cuh's visible_range: a 4096-key window over a 131072-key cache launches and streams the 65 tiles
// of its 4097 keys, as a 4096-key cache would its 64), and masked only on the warp steps its two edges cut (one
// unsigned compare per step, as the causal edge alone had; decode/tile.cuh). A query head's sink joins the row's
// denominator where O is written, once (decode/combine.cuh). The softcap is a second instantiation of the split
// kernels (kSoftcap: c tanh(s / c) on MUFU before the masks), so the plain ones keep their inner loop.
//
// Configuration (DecodeConfig below; the numbers behind it are written where it is defined):
//   D    Br  Bc  consumer warps  stages x bytes   smem    CTAs/SM (H100/H200 | L4)
//   64   16  64  4 (+1 producer)   6 x 16 KB      96 KB     2 | 1
//   128  16  64  4 (+1 producer)   3 x 32 KB      96 KB     2 | 1
// Splits at the five targets on 132 SMs x 2 (tests/test_decode_split.py): B8 S_kv 8192 -> 4 (256 CTAs),
// B64 4096 -> 1 (512), B1 131072 -> 33 (264), B16 H64 16384 -> 2 (256), B4 S4 16384 -> 8 (256).
//
// Knobs (-D; `flashcore tune decode`, scripts/decode_sweep.sh): DECODE_SPLITS, DECODE_OVERHEAD_TILES and
// DECODE_KCOMBINE_TILES (the plan, decode/split.cuh), DECODE_RING_KB and DECODE_MIN_BLOCKS (below); each
// default builds the kernels described here, SASS unchanged.
//
// Run:  flashcore test decode && flashcore bench decode --shape 8,32:8,1:8192,128
//       (also 64,32:8,1:4096,128  1,32:8,1:131072,128  16,64:8,1:16384,128  4,32:8,4:16384,128)
//
// ptxas (nvcc 13.0; no spills or stack), registers sm_90 | sm_89, fp16 and bf16 alike, softcap false | true:
//   decode_split_kv_tma<64>  116, 116 | (sm_90 only)    decode_split_kv_tma<128>  168, 168 | (sm_90 only)
//   decode_split_kv<64>      114, 112 | 119, 119        decode_split_kv<128>      168, 168 | 168, 168
//   decode_combine<64>        40 | 44, <128> 39 | 48, 6 KB of static shared memory (one CTA of 128 threads per row)
//
// Measured (H200, `flashcore bench decode v11 v12 --shape ...`, cold mode; the record docs/results/h200.json;
// GB/s = Q, K, V, O bytes / time, K and V nearly all of it):
//   shape (B,H:H_kv,S:S_kv,D)   decode               SDPA cuDNN          vs cuDNN   3.8 TB/s
//   64,32:8,1:4096,128          248.0 us, 4333 GB/s  249.3 us, 4311      1.01x      met
//   8,32:8,1:8192,128           76.2 us, 3526 GB/s   78.6 us, 3416       1.03x      not met (see below)
//   16,64:8,1:16384,128         247.1 us, 4348 GB/s  247.7 us, 4337      1.00x      met
//   1,32:8,1:131072,128         135.6 us, 3960 GB/s  136.8 us, 3924      1.01x      met
//   4,32:8,4:16384,128          77.8 us, 3454 GB/s   203.3 us, 1322      2.61x      not met (see below)
// K/V come through common/hopper.cuh's panel maps with 128-byte L2 promotion: the 3-D maps with a box per panel and
// 256-byte promotion before them streamed 4.27 against 4.46 TB/s (scripts/stream_probe.cu) and made the
// one-split rows 5-6% slower (261.1 and 263.9 us in one run). Tried, not kept: L2::evict_first on the K/V
// loads, ~2% slower at every row. The two 268 MB rows miss 3.8 TB/s in the bench's cold mode because its
// flush leaves the L2 full of dirty lines: a plain read of the same bytes gets 3428 GB/s there, and decode
// 3995 and 3913 after a clean flush (scripts/cold_flush.py). docs/ladder.md, decode, "Load forms and the cold flush".
#include "flashcore.h"
#include "decode/combine.cuh"
#include "decode/load.cuh"
#include "decode/split.cuh"
#include "decode/tile.cuh"
#include "common/fa2_fragments.cuh"
#include "common/hopper.cuh"
#include "common/mbarrier.cuh"
#include "common/tma.cuh"

#include <climits>
#include <cstdint>
#include <cstdio>
#include <type_traits>

// Knobs for `flashcore tune decode` (-DNAME=value; the split knobs are in decode/split.cuh); defaults: shipped.
#ifndef DECODE_RING_KB
#define DECODE_RING_KB 96  // the K/V ring per CTA in KB, stages = ring / stage bytes >= 2 (shipped: 96)
#endif
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 2  // __launch_bounds__ min CTAs per SM, and the plan's cap on CTAs per SM (shipped: 2)
#endif

constexpr int kMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr int kRingBytes = DECODE_RING_KB * 1024;  // 96 KB: two CTAs fit an H100's 228 KB, one the L4's 99 KB

// The CTA: 16 query rows (Br, one m16 tile), a ring of 64-key stages (Bc), four consumer warps that each
// take 16 keys of every stage, one producer warp. Why these numbers:
//   - M = G * S is 4, 8 or 16 rows at every target shape (G = 4 or 8, S = 1 or 4), so one m16 tile, and a
//     group of more rows takes more m-blocks (their CTAs run side by side and read K/V once from DRAM).
//   - Bytes in flight: an H200 streams 4.25 TB/s at ~1 us of loaded latency, 32 KB per SM by Little's law.
//     A 96 KB ring holds 3 stages (D=128, 32 KB each) or 6 (D=64, 16 KB), two CTAs per SM: ~128-160 KB
//     could be in flight per SM, 4-5x the need, so a late stage or a slow SM never starves the DRAM queue.
//   - The math is small: a warp's 16 keys are 2 x D/16 mma for S and D/8 + 1 for P V (33 at D=128), about
//     0.3 us per stage for the whole CTA against the ~1.9 us a stage's bytes take at its share of the
//     bandwidth; the four warps split each stage so it is released after one warp's quarter, not a tile.
template <int kHeadDim_>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 16;  // Br: query rows per CTA
  static constexpr int kBlockN = 64;  // Bc: keys per stage
  static constexpr int kConsumerWarps = 4;
  static constexpr int kConsumerThreads = kConsumerWarps * fc::kWarpSize;
  static constexpr int kThreads = kConsumerThreads + fc::kWarpSize;  // + the producer warp
  static constexpr int kMinBlocks = DECODE_MIN_BLOCKS;                // CTAs per SM the registers must allow
  static constexpr int kWarpKeys = kBlockN / kConsumerWarps;
  static constexpr int kPanels = kHeadDim / 64;  // decode/tile.cuh's panel layout: 64 columns per panel
  static constexpr int kPanelBytes = kBlockN * 128;
  static constexpr int kKvBytes = kPanels * kPanelBytes;  // K_j (or V_j) of one stage
  static constexpr int kStageBytes = 2 * kKvBytes;
  static constexpr int kStages = kRingBytes / kStageBytes;
  static constexpr int kBarrierBytes = 2 * kStages * 8;  // full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kStages * kStageBytes + kBarrierBytes;
  // Q_i's fragments (common/fa2_fragments.cuh's loader), O's and S's tiles
  static constexpr int kMTiles = 1;
  static constexpr int kKChunks = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr bool kQInRegs = true;
  // The warps' merge (reuses the ring): stats [warps][Br] float4, O parts [warps][Br][kOStride] fp32; +8
  // floats per row so that a half-warp's float2 stores cover the 32 banks once.
  static constexpr int kOStride = kHeadDim + 8;
  static constexpr int kStatsBytes = kConsumerWarps * kBlockM * 16;
  static constexpr int kMergeBytes = kStatsBytes + kConsumerWarps * kBlockM * kOStride * 4;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpKeys == 16, "a consumer warp takes one k16 step of P V per stage");
  static_assert(kStages >= 2, "one stage computes while the next lands (DECODE_RING_KB >= 64 at D = 128)");
  static_assert(kMinBlocks >= 1, "DECODE_MIN_BLOCKS: at least one CTA per SM");
  static_assert(kMergeBytes <= kStages * kStageBytes, "the merge buffers fit in the ring");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

// One CTA: (K/V head, split, m-block) from the plan. kTma: the producer loads by TMA through the maps
// (sm_90), else by cp.async. kSoftcap: the scores are capped (p.softcap > 0).
template <class Cfg, class T, bool kTma, bool kSoftcap>
__device__ __forceinline__ void decode_attend(const FlashcoreParams& p, const fc::decode::Split& plan,
                                              const CUtensorMap* map_k, const CUtensorMap* map_v) {
  using namespace fc::decode;
  // 1024-byte aligned: the 128-byte swizzle of a TMA box is a function of address bits 4-9.
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kStages * Cfg::kStageBytes);  // [kStages]
  uint64_t* empty = full + Cfg::kStages;                                                 // [kStages]
  const int tid = threadIdx.x, lane = tid % fc::kWarpSize, warp = tid / fc::kWarpSize;
  const CtaWork work = cta_work(plan, blockIdx.x, Cfg::kBlockM);
  const size_t kv_base = static_cast<size_t>(work.kv_head) * p.seq_len_kv * Cfg::kHeadDim;
  allow_dependent_launch();  // the combine may launch now; it waits for this grid's memory itself

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) {
      fc::mbarrier_init(&full[st], kTma ? 1 : fc::kWarpSize);
      fc::mbarrier_init(&empty[st], Cfg::kConsumerThreads);
    }
    if constexpr (kTma) {
      if (fc::smem_addr(smem) & 1023u) __trap();  // a misaligned ring would be a silently wrong swizzle
      fc::fence_proxy_async_shared();             // the TMA unit sees the barriers initialised
    }
  }
  __syncthreads();

  if (warp == Cfg::kConsumerWarps) {  // the producer
    if constexpr (kTma) {
      if (lane == 0) load_tiles_tma<Cfg>(smem, full, empty, map_k, map_v, work.kv_head, work.tile_begin, work.tile_end);
    } else {
      load_tiles_cp_async<Cfg>(smem, full, empty, fc::tensor<__half>(p.k) + kv_base, fc::tensor<__half>(p.v) + kv_base, p.seq_len_kv, work.tile_begin,
                               work.tile_end, lane);
    }
    return;
  }

  // Q_i: rows row0 .. row0 + 15 of the group's [M, D] rows in q (zeros past M), straight into A fragments.
  const __half* q = fc::tensor<__half>(p.q) + static_cast<size_t>(work.kv_head) * plan.rows * Cfg::kHeadDim;  // [M, D]
  fc::QFragments<Cfg> q_frag;
  fc::load_q_fragments_global<Cfg>(q_frag, q, work.row0, plan.rows, lane);

  // exp2's factor on a score: the raw q.k's scale * log2 e, or log2 e on a capped score (the scale is inside it)
  const float scale_log2 = kSoftcap ? kLog2e : p.scale * kLog2e;
  RowState<Cfg> rows;
  consume_tiles<Cfg, T, kSoftcap>(rows, q_frag[0], fc::smem_addr(smem), full, empty, work.tile_begin, work.tile_end,
                                  key_limits<Cfg::kWarpKeys>(p, work.row0, lane), scale_log2, p.softcap,
                                  kSoftcap ? p.scale / p.softcap : 0.f, warp, lane);

  // Merge the four warps' rows through shared memory (the ring's bytes: every tile has landed and been read).
  fc::named_barrier_sync(1, Cfg::kConsumerThreads);
  float4* stats = reinterpret_cast<float4*>(smem);                     // [warps][Br]
  float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);  // [warps][Br][kOStride]
  store_warp_rows<Cfg>(stats, o_part, rows, warp, scale_log2, lane);
  fc::named_barrier_sync(1, Cfg::kConsumerThreads);
  store_cta_rows<Cfg, T>(stats, o_part, p, plan, work, tid);
}

template <int kHeadDim, class T, bool kSoftcap>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim>::kThreads, DecodeConfig<kHeadDim>::kMinBlocks)
    decode_split_kv(FlashcoreParams p, fc::decode::Split plan) {
  decode_attend<DecodeConfig<kHeadDim>, T, false, kSoftcap>(p, plan, nullptr, nullptr);
}

// The tensor maps are kernel parameters (__grid_constant__: TMA reads them where they are). Only an
// sm_90+ build instantiates this kernel (fc::kBuildsSm90 in the launcher and the plan).
template <int kHeadDim, class T, bool kSoftcap>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim>::kThreads, DecodeConfig<kHeadDim>::kMinBlocks)
    decode_split_kv_tma(FlashcoreParams p, fc::decode::Split plan, const __grid_constant__ CUtensorMap map_k,
                        const __grid_constant__ CUtensorMap map_v) {
  decode_attend<DecodeConfig<kHeadDim>, T, true, kSoftcap>(p, plan, &map_k, &map_v);
}

template <int kHeadDim, class T>
__global__ void __launch_bounds__(fc::decode::kCombineThreads)
    decode_combine(FlashcoreParams p, fc::decode::Split plan) {
  fc::decode::combine_row<DecodeConfig<kHeadDim>, T>(p, plan);
}

// ---- launcher ------------------------------------------------------------------------------------------

// CTAs per SM the plan counts on: what shared memory fits, at most kMinBlocks (DECODE_MIN_BLOCKS, the count
// __launch_bounds__ makes the registers allow). Read once from the device; an H100's 228 KB when there is none
// (a host-only check).
template <class Cfg>
static int ctas_per_sm() {
  static const int ctas = [] {
    int device = 0, smem_per_sm = 233472;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
      cudaGetLastError();
      smem_per_sm = 233472;
    }
    const int fit = smem_per_sm / (Cfg::kSmemBytes + 1024);  // 1 KB reserved per CTA (sm_80+)
    return fit < 1 ? 1 : fit < Cfg::kMinBlocks ? fit : Cfg::kMinBlocks;
  }();
  return ctas;
}

// The plan over the keys the call's rows see (fc::decode::visible_range: the window's under a window): the grid,
// the split kernel and flashcore_forward_workspace all read this one.
template <class Cfg>
static fc::decode::Split plan_for(const FlashcoreParams& p) {
  const fc::Range keys = fc::decode::visible_range(p);
  return fc::decode::plan_split(p.batch * p.heads_kv, p.heads / p.heads_kv * p.seq_len, keys.begin, keys.end,
                                Cfg::kBlockM, Cfg::kBlockN, fc::sm_count() * ctas_per_sm<Cfg>());
}

// Raising a kernel's shared-memory limit is a driver call: once per process and kernel.
template <auto kKernel, int kBytes>
static const char* allow_smem_once() {
  static const bool ready = fc::allow_dynamic_smem(kKernel, kBytes) == nullptr;
  return ready ? nullptr : fc::allow_dynamic_smem(kKernel, kBytes);
}

// K or V, [B * H_kv][S_kv][D], as common/hopper.cuh's panel map: one box is a whole tile, Bc keys x D/64 panels of
// 64 columns, swizzled 128 bytes, zeros past S_kv; L2 promotion 128 B. (The 3-D map with a box per panel and
// 256-byte promotion that this replaced streamed 4.3 against 4.5 TB/s: docs/ladder.md, "Load forms".) False
// when the driver refuses it: the caller then takes the cp.async kernel.
template <class Cfg, class T>
static bool encode_kv_map(CUtensorMap* map, const void* base, const FlashcoreParams& p) {
  constexpr auto type =
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fc::encode_panel_map(map, type, base, p.batch * p.heads_kv, p.seq_len_kv, Cfg::kHeadDim, Cfg::kBlockN,
                              Cfg::kPanels);
}

// The K and V maps for these tensors, made on the host for each new pair and reused by a loop over the same ones;
// nullptr when the driver refuses them (the caller then takes the cp.async kernel).
template <class Cfg, class T>
static const CUtensorMap* kv_maps(const FlashcoreParams& p) {
  static thread_local struct {
    const void* k = nullptr;
    const void* v = nullptr;
    int seq_len_kv = 0, kv_heads = 0;
    CUtensorMap maps[2];  // K, V
  } last;
  const int kv_heads = p.batch * p.heads_kv;
  if (last.k != p.k || last.v != p.v || last.seq_len_kv != p.seq_len_kv || last.kv_heads != kv_heads) {
    last.k = nullptr;  // no valid pair until both maps are made
    if (!encode_kv_map<Cfg, T>(&last.maps[0], p.k, p) || !encode_kv_map<Cfg, T>(&last.maps[1], p.v, p)) return nullptr;
    last.k = p.k;
    last.v = p.v;
    last.seq_len_kv = p.seq_len_kv;
    last.kv_heads = kv_heads;
  }
  return last.maps;
}

// The split kernel by TMA; *launched stays false when the maps cannot be made (no error: cp.async then).
template <class Cfg, class T, bool kSoftcap>
static const char* launch_split_tma(const FlashcoreParams& p, const fc::decode::Split& plan, cudaStream_t stream,
                                    bool* launched) {
  *launched = false;
  constexpr auto kernel = decode_split_kv_tma<Cfg::kHeadDim, T, kSoftcap>;
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  const CUtensorMap* maps = kv_maps<Cfg, T>(p);
  if (maps == nullptr) return nullptr;
  *launched = true;
  kernel<<<static_cast<unsigned>(plan.ctas()), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, plan, maps[0], maps[1]);
  return fc::launch_status();
}

template <class Cfg, class T, bool kSoftcap>
static const char* launch_split(const FlashcoreParams& p, const fc::decode::Split& plan, cudaStream_t stream) {
  if constexpr (fc::kBuildsSm90) {
    if (fc::tensor_map_encoder() != nullptr) {
      bool launched = false;
      const char* err = launch_split_tma<Cfg, T, kSoftcap>(p, plan, stream, &launched);
      if (launched || err != nullptr) return err;
    }
  }
  constexpr auto kernel = decode_split_kv<Cfg::kHeadDim, T, kSoftcap>;
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  kernel<<<static_cast<unsigned>(plan.ctas()), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, plan);
  return fc::launch_status();
}

// The combine, as a programmatic dependent of the split kernel where the build targets sm_90.
template <class Cfg, class T>
static const char* launch_combine(const FlashcoreParams& p, const fc::decode::Split& plan, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(plan.kv_heads * plan.rows));  // one CTA per query row
  config.blockDim = dim3(fc::decode::kCombineThreads);
  config.stream = stream;
  cudaLaunchAttribute dependent;
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &dependent;
  config.numAttrs = fc::kBuildsSm90 ? 1 : 0;
  cudaLaunchKernelEx(&config, decode_combine<Cfg::kHeadDim, T>, p, plan);
  return fc::launch_status();
}

template <int kHeadDim, class T>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim>;
  const fc::decode::Split plan = plan_for<Cfg>(p);
  if (plan.ctas() > INT_MAX) return fc::message("decode: %lld CTAs exceed the grid's limit", plan.ctas());
  if (plan.splits > 1 && p.workspace == nullptr) {
    return fc::message("decode: %d splits need flashcore_forward_workspace(p) bytes of workspace", plan.splits);
  }
  const char* err = p.softcap > 0.f ? launch_split<Cfg, T, true>(p, plan, stream)
                                     : launch_split<Cfg, T, false>(p, plan, stream);
  if (err != nullptr) return err;
  return plan.splits > 1 ? launch_combine<Cfg, T>(p, plan, stream) : nullptr;
}

template <class T>
static const char* forward_dtype(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return forward<64, T>(p, stream);
    case 128: return forward<128, T>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  // The running max is kept in raw-score units, which orders like the scaled scores only for scale > 0.
  if (!(p.scale > 0.f)) return fc::message("decode needs a softmax scale > 0 (got %g)", p.scale);
  if (p.seq_len > flashcore_max_seq_len()) {
    return fc::message("decode takes at most %d query rows, got %d", flashcore_max_seq_len(), p.seq_len);
  }
  if (p.heads_kv < 1 || p.heads % p.heads_kv != 0) {
    return fc::message("decode: %d query heads are not a multiple of %d key/value heads", p.heads, p.heads_kv);
  }
  if (p.seq_len_kv < 1) return fc::message("decode needs at least one key (S_kv = %d)", p.seq_len_kv);
  if (p.seq_len < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  return p.dtype != kFlashcoreBFloat16 ? forward_dtype<__half>(p, stream) : forward_dtype<__nv_bfloat16>(p, stream);
}

size_t flashcore_forward_workspace(const FlashcoreParams& p) {
  if (p.heads_kv < 1 || p.heads % p.heads_kv != 0 || p.seq_len < 1 || p.seq_len_kv < 1 || p.batch < 1) return 0;
  switch (p.head_dim) {
    case 64: return fc::decode::workspace_bytes(plan_for<DecodeConfig<64>>(p), 64);
    case 128: return fc::decode::workspace_bytes(plan_for<DecodeConfig<128>>(p), 128);
    default: return 0;
  }
}

template <int kHeadDim, class T>
static int plan_of(FlashcoreKernelPlan* out) {
  using Cfg = DecodeConfig<kHeadDim>;
  int count = 0;
  for (const bool softcap : {false, true}) {
    out[count++] = {FC_PLAN_NAME(decode_split_kv, kHeadDim, fc::type_name<T>(), softcap), Cfg::kThreads,
                    Cfg::kSmemBytes};
    if (fc::kBuildsSm90) {
      out[count++] = {FC_PLAN_NAME(decode_split_kv_tma, kHeadDim, fc::type_name<T>(), softcap), Cfg::kThreads,
                      Cfg::kSmemBytes};
    }
  }
  out[count++] = {FC_PLAN_NAME(decode_combine, kHeadDim, fc::type_name<T>()), fc::decode::kCombineThreads, 0};
  return count;
}

// fp16's kernels, then bf16's.
int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  FlashcoreKernelPlan all[10];
  int count = 0;
  if (head_dim == 64) {
    count += plan_of<64, __half>(all + count);
    count += plan_of<64, __nv_bfloat16>(all + count);
  } else if (head_dim == 128) {
    count += plan_of<128, __half>(all + count);
    count += plan_of<128, __nv_bfloat16>(all + count);
  }
  const int n = max_plans < count ? max_plans : count;
  for (int i = 0; i < n; ++i) plans[i] = all[i];
  return n;
}

int flashcore_dtypes() { return (1 << kFlashcoreFloat16) | (1 << kFlashcoreBFloat16); }

int flashcore_features() {
  return kFlashcoreGqa | kFlashcoreSeqLenKv | kFlashcoreLse | kFlashcoreWindow | kFlashcoreSoftcap | kFlashcoreSinks;
}

int flashcore_max_seq_len() { return 16; }
