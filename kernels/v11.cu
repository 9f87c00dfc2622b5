// v11.cu — FlashAttention-2 on raw mma.sync: scores, softmax and P V never leave the registers.
//
// Idea: each warp owns 16 or 32 query rows and their whole softmax, as in FlashAttention-2. S = Q K_j^T runs
// on mma.sync m16n8k16 into fp32 C fragments; a row's max takes two shuffles in the quad of lanes that holds
// it; P = exp2(S * scale * log2 e - m) is packed to fp16 in place, and since the C fragments of two n8
// tiles ARE the A fragment of the next mma, P V runs straight from those registers. K_j and V_j stream through
// a cp.async ring in XOR-swizzled shared memory, read by ldmatrix .x4 (.trans for V) free of bank conflicts.
// The fragment code is kernels/fa2_mma.cuh, the TMA helpers kernels/tma.cuh.
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
#include "fa2_mma.cuh"
#include "mbarrier.cuh"
#include "mma_sm80.cuh"
#include "primitives.cuh"
#include "tma.cuh"

#include <cstdint>
#include <type_traits>

// The tune space (variants.yaml `tune: params:`); every other parameter of a slot is fixed below.
#ifndef V11_LONG_D128_BLOCK_M
#define V11_LONG_D128_BLOCK_M 128
#endif
#ifndef V11_LONG_D128_BLOCK_N
#define V11_LONG_D128_BLOCK_N 48
#endif
#ifndef V11_LONG_D128_WARP_M
#define V11_LONG_D128_WARP_M 32
#endif
#ifndef V11_LONG_D128_MIN_BLOCKS
#define V11_LONG_D128_MIN_BLOCKS 2
#endif
#ifndef V11_SHORT_D64_BLOCK_N
#define V11_SHORT_D64_BLOCK_N 32
#endif
#ifndef V11_SHORT_D64_WARP_M
#define V11_SHORT_D64_WARP_M 16
#endif
#ifndef V11_SHORT_D64_STAGES
#define V11_SHORT_D64_STAGES 3
#endif
#ifndef V11_SHORT_D64_SPLIT
#define V11_SHORT_D64_SPLIT 4
#endif
#ifndef V11_SHORT_TMA_D64_BLOCK_N
#define V11_SHORT_TMA_D64_BLOCK_N 64
#endif
#ifndef V11_SHORT_TMA_D64_STAGES
#define V11_SHORT_TMA_D64_STAGES 3
#endif
#ifndef V11_SHORT_TMA_D64_SPLIT
#define V11_SHORT_TMA_D64_SPLIT 2
#endif

constexpr int kMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr int kMaxWarps = 16;
constexpr float kLog2e = 1.4426950408889634f;

// A tile configuration and everything derived from it. Shared-memory layout (byte offsets):
//   main loop   Q_i      [0, kQBytes)                          [kBlockM][kHeadDim] fp16, swizzled
//               stage s  [kQBytes + s * kStageBytes, + kStageBytes): K_j [kTileN][kHeadDim] fp16, swizzled,
//                        then V_j, same shape, at + kKvBytes
//   split merge (reuses the same bytes once every warp has left the loop; kSplit > 1 only)
//               stats    [0, kStatsBytes)                      [kSplit][kBlockM] float2 (m_i * scale * log2 e, l_i)
//               O parts  [kStatsBytes, kMergeBytes)             [kSplit][kBlockM][kOStride] fp32
// Every region starts on a 128-byte boundary: rows are 128 or 256 bytes and all counts are multiples of 16.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpM_, int kStages_, int kSplit_, int kMinBlocks_>
struct V11Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per warp per tile
  static constexpr int kWarpM = kWarpM_;    // query rows per warp
  static constexpr int kStages = kStages_;
  static constexpr int kSplit = kSplit_;    // key groups per CTA
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the register budget must allow

  static constexpr int kMTiles = kWarpM / 16;        // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp and tile
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O
  static constexpr int kKChunks = kHeadDim / 16;     // k16 steps of Q K^T
  static constexpr int kRowWarps = kBlockM / kWarpM;
  static constexpr int kWarps = kRowWarps * kSplit;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  static constexpr int kTileN = kSplit * kBlockN;   // keys per ring stage
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  // O_i (kMTiles * kDTiles * 4 fp32) plus Q_i held whole in registers must leave room for S and addresses.
  static constexpr bool kQInRegs = kMTiles * kHeadDim <= 128;

  // A split CTA (no Q_i staging in its epilogue) with Q_i in registers loads Q_i straight from global
  // memory, and its shared-memory bytes go to the ring instead (three 128-key stages fit 99 KB at D=64).
  static constexpr bool kQFromGlobal = kSplit > 1 && kQInRegs;
  static constexpr int kQBytes = kQFromGlobal ? 0 : kBlockM * kRowBytes;
  static constexpr int kKvBytes = kTileN * kRowBytes;
  static constexpr int kStageBytes = 2 * kKvBytes;
  static constexpr int kLoopBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kOStride = kHeadDim + 8;  // +8 floats: a half-warp's float2 stores cover the 32 banks once
  static constexpr int kStatsBytes = kSplit * kBlockM * 8;
  static constexpr int kMergeBytes = kSplit > 1 ? kStatsBytes + kSplit * kBlockM * kOStride * 4 : 0;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpM == 16 || kWarpM == 32, "WARP_M: 16 or 32 query rows per warp");
  static_assert(kBlockM % kWarpM == 0 && kBlockM >= kWarpM, "BLOCK_M: a multiple of WARP_M");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "BLOCK_N: a multiple of 16 in 16..128");
  static_assert(kStages >= 2, "STAGES: at least 2 (one tile computes while the next lands)");
  static_assert(kSplit >= 1, "SPLIT: at least 1");
  static_assert(kMinBlocks >= 1, "MIN_BLOCKS: at least 1");
  static_assert(kWarps <= kMaxWarps, "(BLOCK_M / WARP_M) * SPLIT: at most 16 warps per CTA");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0,
                "a CTA-wide copy pass must cover whole 8-row swizzle periods");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

// Configuration slots, V11Config<D, BLOCK_M, BLOCK_N, WARP_M, STAGES, SPLIT, MIN_BLOCKS>: the launcher uses
// exactly these kernels.
using LongD64 = V11Config<64, 128, 64, 32, 2, 1, 2>;
using LongD128 = V11Config<128, V11_LONG_D128_BLOCK_M, V11_LONG_D128_BLOCK_N, V11_LONG_D128_WARP_M, 2, 1,
                           V11_LONG_D128_MIN_BLOCKS>;
using ShortD64 = V11Config<64, 32, V11_SHORT_D64_BLOCK_N, V11_SHORT_D64_WARP_M, V11_SHORT_D64_STAGES,
                           V11_SHORT_D64_SPLIT, 1>;
using ShortD128 = V11Config<128, 32, 16, 16, 2, 4, 1>;
// sm_90's short D=64 kernel (v11_fwd_tma): K and V arrive by TMA, so a wider, shallower tiling pays off.
using ShortTmaD64 = V11Config<64, 32, V11_SHORT_TMA_D64_BLOCK_N, 16, V11_SHORT_TMA_D64_STAGES,
                              V11_SHORT_TMA_D64_SPLIT, 1>;

// Shared memory of a TMA kernel: the ring and merge bytes, then one mbarrier per stage.
template <class Cfg>
constexpr int tma_smem_bytes() {
  return Cfg::kSmemBytes + 8 * Cfg::kStages;
}
// What the TMA path relies on: 128-byte rows (one box row is one swizzle row), Q_i in registers (the ring
// starts at offset 0, every stage and its V half on 1024-byte boundaries), a box of at most 256 rows.
static_assert(ShortTmaD64::kHeadDim == 64 && ShortTmaD64::kQFromGlobal && ShortTmaD64::kTileN <= 256 &&
                  ShortTmaD64::kKvBytes % 1024 == 0,
              "SHORT_TMA_D64: D = 64, SPLIT > 1 with Q_i in registers, SPLIT * BLOCK_N <= 256 keys");
static_assert(tma_smem_bytes<ShortTmaD64>() <= kMaxSmemBytes, "SHORT_TMA_D64: at most 99 KB per block");
// sm_90's long D=64 kernel: LongD64's tiles, K and V by TMA; Q_i by cp.async into its own 1024-byte-aligned bytes.
using LongTmaD64 = LongD64;
static_assert(LongTmaD64::kHeadDim == 64 && LongTmaD64::kSplit == 1 && LongTmaD64::kQInRegs &&
                  LongTmaD64::kQBytes % 1024 == 0 && LongTmaD64::kKvBytes % 1024 == 0 && LongTmaD64::kTileN <= 256,
              "LONG_TMA_D64: D = 64, one key group, Q_i in registers, 1024-byte-aligned stages");

// Grid order, measured at 2,16,4096 on the lent H200: at D=64 non-causal, x = query tile and y = batch * heads
// (every query tile of a few heads per wave) ran 438 us (314 TFLOP/s) against 458 us (300) with batch * heads
// on x; at D=128 the same change went the other way, 820 -> 837 us. (Predicted +3% at D=128 from L2: the
// CTAs of a head walk K/V in lockstep either order, so the working set is a window, not all 64 MB of K/V.)
// So query tile first only for D=64 non-causal. Causal keeps x = batch * heads, y = query tile reversed:
// a wave holds the same heavy tile of many heads and the last wave is made of light tiles.
__host__ __device__ constexpr bool query_tile_fastest(bool causal, int head_dim) { return !causal && head_dim == 64; }
// The in-CTA kernels' body. kTma (v11_fwd_tma, sm_90): K and V arrive by TMA through the tensor maps,
// issued by thread 0 and counted on one mbarrier per stage, instead of 16-byte cp.async from every thread;
// all kStages stages are loaded up front. The short kernel's loop (kSplit > 1) computes S of tile t + 1 in the
// same basic block as tile t's softmax and P V, so the scheduler can interleave the two (one warp per scheduler
// has little else to hide latency with); the long one (two CTAs per SM, 32-row warps) has no registers for a
// second S and takes one tile at a time, Q_i by cp.async into shared memory as in the cp.async kernel.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks, bool kTma,
          class T>
__device__ __forceinline__ void v11_forward(FlashcoreParams p, const CUtensorMap* tmap_k, const CUtensorMap* tmap_v) {
  using Cfg = V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>;
  // 1024-byte aligned: TMA's 128-byte swizzle is a function of address bits 7-9, so a stage must start on a
  // 1024-byte boundary to get the layout the ldmatrix addressing assumes. (The cp.async kernels' SASS is the
  // same as with 128.)
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* stage_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBytes);  // [kStages], kTma only

  const int tid = threadIdx.x;
  const int lane = tid % fc::kWarpSize;
  const int warp = tid / fc::kWarpSize;
  const int group = warp / Cfg::kRowWarps;     // which kBlockN keys of every stage this warp takes
  const int row_warp = warp % Cfg::kRowWarps;  // which kWarpM rows of Q_i this warp owns
  const int seq_len = p.seq_len;        // S: query rows
  const int seq_len_kv = p.seq_len_kv;  // S_kv: key rows
  const int offset = fc::causal_offset(p);  // causal: row i sees keys j <= i + offset
  // Heaviest query tiles first under causal masking: the last tile sees every key.
  const bool tile_fastest = query_tile_fastest(p.causal, kHeadDim);
  const int tile_index = tile_fastest ? blockIdx.x : blockIdx.y;  // this CTA's place among its head's CTAs
  const int tiles = tile_fastest ? gridDim.x : gridDim.y;
  const int m_block = p.causal ? tiles - 1 - tile_index : tile_index;
  const int m0 = m_block * kBlockM;
  const int bh = tile_fastest ? blockIdx.y : blockIdx.x;  // b * H + h
  // b * H_kv + h / (H / H_kv): the key/value head this query head reads (the tensor maps' third coordinate); the
  // divisions only where the heads are grouped (they cost a short run ~0.1 us at the start of every CTA)
  const int head = p.heads_kv == p.heads ? bh : (bh / p.heads) * p.heads_kv + (bh % p.heads) / (p.heads / p.heads_kv);
  const size_t base = static_cast<size_t>(bh) * seq_len * kHeadDim;
  const size_t kv_base = static_cast<size_t>(head) * seq_len_kv * kHeadDim;
  const __half* __restrict__ q = p.q + base;     // [S, D] of this (b, h)
  const __half* __restrict__ k = p.k + kv_base;  // [S_kv, D]
  const __half* __restrict__ v = p.v + kv_base;  // [S_kv, D]
  __half* __restrict__ o = p.o + base;           // [S, D]

  unsigned char* q_s = smem;                                                     // [kBlockM][D]
  auto k_stage = [&](int stage) { return smem + Cfg::kQBytes + stage * Cfg::kStageBytes; };  // [kTileN][D]

  // Keys at or past kv_end are invisible to every row of the CTA: never loaded (zero-filled) nor visited.
  const int kv_end = p.causal ? max(0, min(seq_len_kv, m0 + kBlockM + offset)) : seq_len_kv;
  const int n_tiles = fc::ceil_div(kv_end, Cfg::kTileN);
  auto load_tile = [&](int tile, int stage) {
    unsigned char* k_s = k_stage(stage);
    if constexpr (kTma) {
      // One thread; rows past kv_end but before S_kv arrive too (the masks hide them), rows past S_kv
      // arrive as zeros.
      if (tid == 0) {
        fc::mbarrier_arrive_expect_bytes(&stage_full[stage], Cfg::kStageBytes);
        fc::tma_load_3d(k_s, tmap_k, 0, tile * Cfg::kTileN, head, &stage_full[stage]);
        fc::tma_load_3d(k_s + Cfg::kKvBytes, tmap_v, 0, tile * Cfg::kTileN, head, &stage_full[stage]);
      }
      return;
    }
    fc::copy_rows_async<Cfg, Cfg::kTileN>(k_s, k, tile * Cfg::kTileN, kv_end, tid);
    fc::copy_rows_async<Cfg, Cfg::kTileN>(k_s + Cfg::kKvBytes, v, tile * Cfg::kTileN, kv_end, tid);
  };

  // Q_i straight into registers when it never touches shared memory: issued first, it is needed first.
  fc::QFragments<Cfg> q_frag;
  if constexpr (Cfg::kQFromGlobal) fc::load_q_fragments_global<Cfg>(q_frag, q, m0 + row_warp * kWarpM, seq_len, lane);

  // Prologue: Q_i and the first kStages - 1 tiles in flight at once (Q_i rides in tile 0's group); by TMA
  // all kStages (its loop refills a stage only after every warp is done with it, not a tile ahead).
  if constexpr (!Cfg::kQFromGlobal) fc::copy_rows_async<Cfg, kBlockM>(q_s, q, m0, seq_len, tid);
  if constexpr (kTma && !Cfg::kQFromGlobal) fc::cp_async_commit();
  if constexpr (kTma) {
    if (tid == 0) {
      if (fc::smem_addr(smem) & 1023u) __trap();  // never seen; a wrong layout would be silent
#pragma unroll
      for (int st = 0; st < kStages; ++st) fc::mbarrier_init(&stage_full[st], 1);
      fc::fence_proxy_async_shared();  // the TMA unit must see the barriers initialised
    }
    __syncthreads();
  }
  constexpr int kPrologueTiles = kTma ? kStages : kStages - 1;
#pragma unroll
  for (int st = 0; st < kPrologueTiles; ++st) {
    if (st < n_tiles) load_tile(st, st);
    if constexpr (!kTma) fc::cp_async_commit();
  }
  if constexpr (kTma && kSplit > 1) {
    // The same L2 prefetch as below, a tile at a time: CTA i of the head takes tiles i, i + tiles, ...
    if (tid == 0) {
      for (int tile = kPrologueTiles + tile_index; tile < n_tiles; tile += tiles) {
        fc::tma_prefetch_3d(tmap_k, 0, tile * Cfg::kTileN, head);
        fc::tma_prefetch_3d(tmap_v, 0, tile * Cfg::kTileN, head);
      }
    }
  } else if constexpr (kSplit > 1) {
    // Short sequences: the CTAs of a head split the rest of its K and V into slices and prefetch them to
    // L2 now, so later stages hit L2 instead of each paying a DRAM round trip in lockstep.
    const long long first = static_cast<long long>(min(seq_len_kv, (kStages - 1) * Cfg::kTileN)) * Cfg::kRowBytes / 32;
    const long long sectors = static_cast<long long>(seq_len_kv) * Cfg::kRowBytes / 32 - first;
    const long long begin = first + sectors * tile_index / tiles;
    const long long end = first + sectors * (tile_index + 1) / tiles;
    for (long long sector = begin + tid; sector < end; sector += Cfg::kThreads) {
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(k) + sector * 32);
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(v) + sector * 32);
    }
  }

  // Rows of this warp, and the keys any of them can see (none for a warp wholly past the sequence end).
  const int warp_row0 = m0 + row_warp * kWarpM;
  const int warp_kv_end =
      warp_row0 >= seq_len ? 0 : p.causal ? max(0, min(seq_len_kv, warp_row0 + kWarpM + offset)) : seq_len_kv;
  const float scale_log2 = p.scale * kLog2e;

  // Per-lane ldmatrix row addresses (tile-relative rows are multiples of 8, so row & 7 = lane & 7):
  // A fragments and V (.trans) take rows lane % 8 + 8 * ((lane / 8) % 2); K takes lane % 8 + 8 * (lane / 16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t q_lane = fc::smem_addr(q_s) + (row_warp * kWarpM + a_row) * Cfg::kRowBytes;

  float o_acc[Cfg::kMTiles][Cfg::kDTiles][4];
  float m_i[Cfg::kMTiles][2];
  float l_i[Cfg::kMTiles][2];
  fc::init_rows<Cfg>(o_acc, m_i, l_i);

  using Scores = float[Cfg::kMTiles][Cfg::kNTiles][4];
  // This warp's keys in tile t, key0(t) .. key0(t) + kBlockN - 1, and its ldmatrix rows of K and V in a stage.
  auto key0_of = [&](int t) { return t * Cfg::kTileN + group * kBlockN; };
  auto k_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage)) + (group * kBlockN + k_row) * Cfg::kRowBytes;
  };
  auto v_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage) + Cfg::kKvBytes) + (group * kBlockN + a_row) * Cfg::kRowBytes;
  };
  // Only tiles crossing the diagonal or the sequence end carry invisible keys.
  auto mask_edge = [&](Scores& s, int key0) {
    if (key0 + kBlockN > seq_len_kv || (p.causal && key0 + kBlockN - 1 > warp_row0 + offset)) {
      fc::mask_scores<Cfg>(s, warp_row0 + offset, key0, seq_len_kv, p.causal, lane);
    }
  };
  // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O, then O = O + P V_j.
  auto softmax_pv = [&](Scores& s, int stage) {
    fc::online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
    fc::accumulate_pv<Cfg, T>(s, o_acc, l_i, v_lane_of(stage), lane);
  };

  if constexpr (kTma && !Cfg::kQFromGlobal) {
    // Q_i's cp.async copies, then its fragments: the rest of the loop waits on mbarriers only.
    fc::cp_async_wait<0>();
    __syncthreads();
    fc::load_q_fragments<Cfg>(q_frag, q_lane, lane);
  }
  if constexpr (kTma && kSplit == 1) {
    // The long TMA kernel (two 32-row m16 pairs per warp): no room for a second S, so one tile at a time.
    auto wait_tile = [&](int t) { fc::mbarrier_wait_parity(&stage_full[t % kStages], (t / kStages) & 1); };
    for (int t = 0; t < n_tiles; ++t) {
      if (t >= 1 && t - 1 + kStages < n_tiles) {  // uniform across the CTA, as below
        __syncthreads();
        if (tid == 0) {
          fc::fence_proxy_async_shared();
          load_tile(t - 1 + kStages, (t - 1) % kStages);
        }
      }
      const int key0 = key0_of(t);
      if (key0 >= warp_kv_end) continue;
      wait_tile(t);
      Scores s;
      fc::warp_scores<Cfg, T>(s, q_frag, q_lane, k_lane_of(t % kStages), lane);
      mask_edge(s, key0);
      softmax_pv(s, t % kStages);
    }
  } else if constexpr (kTma) {
    // S of the next tile is computed before this tile's softmax and P V, all in one basic block: the tile's
    // mask comes first, and the branches that decide whether a next tile exists wrap the whole block.
    auto visible = [&](int t) { return t < n_tiles && key0_of(t) < warp_kv_end; };
    auto wait_tile = [&](int t) { fc::mbarrier_wait_parity(&stage_full[t % kStages], (t / kStages) & 1); };
    Scores s, s_next;
    if (visible(0)) {
      wait_tile(0);
      fc::warp_scores<Cfg, T>(s, q_frag, q_lane, k_lane_of(0), lane);
    }
    for (int t = 0; t < n_tiles; ++t) {
      // Tile t - 1's stage is free once every warp is past it: refill it with tile t - 1 + kStages. (The
      // condition is the same for the whole CTA, so every thread reaches the barrier or none does.)
      if (t >= 1 && t - 1 + kStages < n_tiles) {
        __syncthreads();
        if (tid == 0) {
          fc::fence_proxy_async_shared();  // the warps' reads of the stage come before the TMA's writes into it
          load_tile(t - 1 + kStages, (t - 1) % kStages);
        }
      }
      if (!visible(t)) continue;  // not break: later iterations may still hold a barrier
      mask_edge(s, key0_of(t));
      if (visible(t + 1)) {
        wait_tile(t + 1);
        fc::warp_scores<Cfg, T>(s_next, q_frag, q_lane, k_lane_of((t + 1) % kStages), lane);
        softmax_pv(s, t % kStages);
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[mt][j][r] = s_next[mt][j][r];
      } else {
        softmax_pv(s, t % kStages);
      }
    }
  } else {
    int compute_stage = 0;
    int load_stage = kStages - 1;
    for (int t = 0; t < n_tiles; ++t) {
      fc::cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
      __syncthreads();                   // everyone's have, and every warp is done with tile t - 1's stage
      if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, load_stage);
      fc::cp_async_commit();  // an empty group at the tail keeps the wait count uniform
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;

      if constexpr (Cfg::kQInRegs && !Cfg::kQFromGlobal) {
        if (t == 0) fc::load_q_fragments<Cfg>(q_frag, q_lane, lane);
      }

      const int key0 = key0_of(t);
      if (key0 < warp_kv_end) {
        // S = Q_i K_j^T
        Scores s;
        fc::warp_scores<Cfg, T>(s, q_frag, q_lane, k_lane_of(compute_stage), lane);
        mask_edge(s, key0);
        softmax_pv(s, compute_stage);
      }
      compute_stage = compute_stage + 1 == kStages ? 0 : compute_stage + 1;
    }
  }

  if constexpr (kSplit == 1) {
    // O_i = diag(1 / l_i) O_i, staged as fp16 over this warp's own Q_i rows (only this warp ever reads them).
    fc::store_warp_rows<Cfg, T>(q_s, row_warp * kWarpM, o, warp_row0, seq_len, o_acc, l_i, lane);
    if (p.lse != nullptr) {
      fc::store_warp_lse<Cfg>(p.lse + static_cast<size_t>(bh) * seq_len, warp_row0, seq_len, m_i, l_i, scale_log2, lane);
    }
  } else {
    // Merge the kSplit groups: m = max_g m_g, l = sum_g exp2(m_g - m) l_g, O = sum_g exp2(m_g - m) O_g / l.
    // (TMA: every tile loaded was waited on by some warp, since group 0 of the last row warp with rows
    // before seq_len sees every key below kv_end, so no copy is still landing past this barrier.)
    if constexpr (!kTma) fc::cp_async_wait<0>();
    __syncthreads();  // every warp has left the loop: the ring's bytes are free for the merge
    float2* stats = reinterpret_cast<float2*>(smem);                       // [kSplit][kBlockM]
    float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);    // [kSplit][kBlockM][kOStride]
    fc::store_partials<Cfg>(stats, o_part, o_acc, m_i, l_i, group, row_warp, scale_log2, lane);
    __syncthreads();
    fc::merge_split_rows<Cfg, T>(stats, o_part, o, m0, seq_len, tid);
    if (p.lse != nullptr) fc::merge_split_lse<Cfg>(stats, p.lse + static_cast<size_t>(bh) * seq_len, m0, seq_len, tid);
  }
}

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
