// v9.cu — rung 9: warp specialization. One producer warp streams K_j/V_j; four consumer warps only compute.
//
// Idea: loading and computing stop taking turns. The CTA's last warp copies K and V tiles into a ring of
// up to 8 shared-memory stages, as far ahead as the ring allows; the four consumer warps wait only for the
// stage they need next and hand it back when done. The hand-offs are mbarriers -- "full[s]" (the copies of
// stage s landed) and "empty[s]" (every consumer thread has finished reading it) -- so the loop has no
// __syncthreads at all, and a consumer never waits on a load the producer could have issued earlier.
//
// Change from v8 (48x32 tiles, every warp loads then computes, 2 cp.async stages, one __syncthreads per tile):
//   - the loads move to a dedicated warp, the ring deepens to 4-8 stages, and the K/V rows of each CTA's own
//     query range are prefetched into L2 at start (as v8 does);
//   - each consumer warp owns whole rows and a private scratch for S and P (softmax lanes 2r and 2r + 1
//     reduce row r), so consumer warps never meet inside the loop; Q_i lives in registers; O_i's per-row
//     rescale is a shuffle, using the accumulator's element -> row map read once through the WMMA API;
//   - two CTA shapes, picked per launch. Grids that fill the GPU: 32 query rows per warp at D=64 (128 per
//     CTA, 32-key tiles), so every K/V fragment read from shared memory feeds two MMAs: 20 KB of shared-memory
//     traffic per 32x32 warp tile against 28 KB for the same FLOPs as 16-row warps (v8's ratio); D=128 keeps
//     16 rows per warp (64 per CTA). Grids smaller than the GPU (1,8,512,64 makes 32 CTAs of 128 rows for
//     132 SMs): CTAs of 32 rows, and the warps pair up on 16 rows, each taking one half of every 64-key tile
//     (32 of a 32-key tile at D=128), merging (m, l, O) at the end through two named barriers of the pair
//     (bar.sync, 64 threads): 128 CTAs, one warp per SM sub-partition, each warp's chain of tiles halved;
//   - where a warp is alone on its sub-partition (16-row warps), S of tile t + 1 goes to the tensor cores
//     while the softmax of tile t runs; 32-row warps have no registers left for it (and have a neighbour).
//
// The seeds' v9 hung forever: its producer and consumer warps spun on volatile shared-memory flags (no
// ordering between the flag and the data, flags read before anyone set them, spin loops in divergent warps).
// Here nothing polls an ordinary flag, and the invariant is that every wait has exactly one matching phase
// completion whose arrivals all happen, with counts equal to the init counts:
//   - full[s] is initialised to 32 = the producer's lanes; each lane arrives once per fill, through
//     cp.async.mbarrier.arrive.noinc, i.e. when its own copies have landed (which also makes them visible).
//     empty[s] is initialised to 128 = every consumer thread; each arrives once per tile it was handed, after
//     its last read of that stage (every thread, since an arrive releases only the arriving thread's reads).
//   - Tile t lives in stage t % kStages on lap t / kStages. Consumers wait for full's phase of parity
//     (lap & 1); the producer, from lap 1 on, waits for empty's phase of parity ((lap - 1) & 1). A barrier
//     can never run two phases ahead of its waiter (a refill needs the release, the release needs the
//     fill), so one parity bit names the phase without ambiguity.
//   - Producer and consumers count tiles with one function (kv_tile_count). A consumer warp with nothing to
//     add to a tile (causal, its rows before the tile's keys) still waits for it and releases it. A warp
//     holds tile t while it waits for t + 1; that needs kStages >= 2 (static_assert), since filling t + 1
//     needs only the release of tile t + 1 - kStages.
//   - Thread 0 initialises the mbarriers before the kernel's one __syncthreads, which comes before the
//     role split; no role's branch has a __syncthreads. The ring has one writer (the producer); Q_i is
//     loaded and O_i stored by the warp that owns those rows, through its own scratch.
// Checked on the CPU before any GPU run (a model of these barriers under random interleavings, and a numpy
// emulation of the index math and numerics; docs/ladder.md). Rejected by estimate, not measured: 16-row warps
// for large grids (28 KB vs 20 KB of shared-memory traffic per 262K FLOPs), the key split for every grid (~6 TB/s
// of L2 reads at 2,16,4096,64), the S look-ahead for 32-row warps (~230 registers, over the 204 of 2 CTAs/SM).
// Scale may have any sign: scores are scaled before the row max.
//
// Run:  flashcore test v9 && flashcore bench v9 --shape 1,8,512,64 && flashcore bench v9 --shape 2,16,4096,64
//
// ptxas (nvcc 13.0), registers sm_90 | sm_89, dynamic smem, no static smem or spills: <64, 1> 168 | 168, 94,336 B
//   (8 stages of 32 keys); <64, 2> 160 | 153, 92,224 B (4 x 64); <128, 1> 168 | 168 and <128, 2> 166 | 161, 88,128 B.
// Measured (H200, `flashcore bench --all`, L2 flushed before each call, median of 200 / 100 calls):
//   1,8,512,64:   11.6 us (1.38x faster than v8; 1.03x SDPA default)
//   2,16,4096,64: 723 us, 190.1 TFLOP/s (1.55x v8)
// Stress (scripts/stress.py): 2,000 launches over random shapes (S in [1, 1100], S=1 every 20th, causal and not), all OK;
// compute-sanitizer memcheck, racecheck, synccheck clean on 1,2,97,64 causal, racecheck also on 1,132,97,64 and
// 1,2,97,128.
#include "flashcore.h"
#include "mbarrier.cuh"
#include "mma_sm80.cuh"  // fc::pack_half2
#include "primitives.cuh"

#include <mma.h>

#include <cmath>
#include <cstdint>

constexpr int kConsumerWarps = 4;                 // compute warps per CTA
constexpr int kConsumerThreads = kConsumerWarps * fc::kWarpSize;
constexpr int kProducerThreads = fc::kWarpSize;  // one producer warp, the CTA's last
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kFrag = 16;                         // WMMA tile edge (m = n = k = 16)
constexpr int kOStride = 64 + 8;                  // floats per row when O_i is staged 64 columns at a time
constexpr int kMaxStages = 8;
constexpr int kSmemBudget = 101376;               // the L4's 99 KB per block

// The CTA's shape, picked per launch from the grid size (launch() below):
//   kKeySplit = 1 (grids that fill the GPU): a consumer warp owns 16 x kRowFrags query rows and every key of
//     a tile. D=64: 32 rows per warp (128 per CTA), so each K_j/V_j fragment read from shared memory feeds
//     two MMAs; D=128: 16 rows (64 per CTA), as 32 would need 128 accumulator registers for O_i alone.
//   kKeySplit = 2 (grids smaller than the GPU, 1,8,512,64): CTAs of 32 rows, twice as many of them; the
//     warps pair up on 16 rows, warp h taking key half h of every tile, and the pair merges (m, l, O) at
//     the end. Each warp's serial chain of tiles is half as long: that chain is the latency.
template <int kHeadDim, int kKeySplit>
struct Config {
  static constexpr int kRowFrags = (kHeadDim == 64 && kKeySplit == 1) ? 2 : 1;
  static constexpr int kRowWarps = kConsumerWarps / kKeySplit;  // warps that own distinct rows
  static constexpr int kWarpRows = kFrag * kRowFrags;
  static constexpr int kBlockM = kRowWarps * kWarpRows;          // Br
  static constexpr int kBlockN = (kHeadDim == 64 && kKeySplit == 2) ? 64 : 32;  // Bc: keys per ring stage
  static constexpr int kSliceN = kBlockN / kKeySplit;           // keys of a tile one warp computes
  static constexpr int kDFrags = kHeadDim / kFrag;
  static constexpr int kNFrags = kSliceN / kFrag;
  // Issue the next tile's S = Q K^T during this tile's softmax: worth a second S in registers when one warp
  // per SM sub-partition has nobody to hide its latency behind; with two row fragments it would spill.
  static constexpr bool kLookahead = kRowFrags == 1;
  static_assert(kKeySplit == 1 || kRowFrags == 1, "the key-split merge handles one row fragment");
  static_assert(kSliceN % kFrag == 0 && kHeadDim % 64 == 0, "WMMA-sized slices, 64-column O staging");
};

constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }
constexpr int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }
constexpr int min2(int a, int b) { return a < b ? a : b; }

// Byte offsets into the dynamic shared memory; every region starts on a 128-byte boundary.
//   K ring   [kStages][kBlockN][kKvStride] half   rows padded by 8 halves: the 8 rows of an ldmatrix phase
//   V ring   [kStages][kBlockN][kKvStride] half   fall in 8 different 16-byte bank groups
//   scratch  [kConsumerWarps][kScratchBytes]      private to its warp, used in turn for
//              Q_i staging  [16 kRowFrags][kHeadDim + 8] half
//              S            [16 kRowFrags][kSliceN + 8] float   (+8: conflict-free fragment stores and
//              P            [16 kRowFrags][kSliceN + 8] half     float4 / ldmatrix reads; P overwrites S)
//              O_i staging  [16][kOStride] float, 64 columns per pass (and, under the key split, the
//                           other warp's O_i, m, l: columns 64 and 65 of the staging hold m and l)
//   full     [kStages] uint64 mbarrier: tile landed (32 producer lanes' copies)
//   empty    [kStages] uint64 mbarrier: tile released (all 128 consumer threads)
// kStages is as many as fit the L4's budget, at most 8:
//   D=64  split 1: 8 x 2 x 4,608 + 4 x 5,120 + 128 = 94,336 B
//   D=64  split 2: 4 x 2 x 9,216 + 4 x 4,608 +  64 = 92,224 B
//   D=128 split 1 and 2: 4 x 2 x 8,704 + 4 x 4,608 + 64 = 88,128 B
template <int kHeadDim, int kKeySplit>
struct SmemLayout {
  using C = Config<kHeadDim, kKeySplit>;
  static constexpr int kKvStride = kHeadDim + 8;  // halves
  static constexpr int kQStride = kHeadDim + 8;   // halves
  static constexpr int kSStride = C::kSliceN + 8;  // floats
  static constexpr int kPStride = C::kSliceN + 8;  // halves
  static constexpr int kTileBytes = C::kBlockN * kKvStride * 2;
  static constexpr int kScratchBytes = align128(max3(C::kWarpRows * kSStride * 4, C::kWarpRows * kQStride * 2,
                                                     kFrag * kOStride * 4));
  static constexpr int kStages =
      min2(kMaxStages, (kSmemBudget - kConsumerWarps * kScratchBytes - 16 * kMaxStages) / (2 * kTileBytes));
  static constexpr int kK = 0;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kScratch = kV + kStages * kTileBytes;
  static constexpr int kFull = kScratch + kConsumerWarps * kScratchBytes;
  static constexpr int kEmpty = kFull + kStages * 8;
  static constexpr int kBytes = kEmpty + kStages * 8;
  static_assert(kTileBytes % 128 == 0, "regions must stay 128-byte aligned");
  static_assert(kKvStride % 8 == 0 && kPStride % 8 == 0 && kSStride % 4 == 0 && kOStride % 4 == 0, "WMMA ldm");
  static_assert(kStages >= 2, "a warp holds tile t while it waits for tile t + 1");
  static_assert(kBytes <= kSmemBudget, "must fit the L4's 99 KB per block");
};

using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kFrag, kFrag, kFrag, float>;
using RowFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, kFrag, kFrag, kFrag, __half, nvcuda::wmma::row_major>;
using KtFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, kFrag, kFrag, kFrag, __half, nvcuda::wmma::col_major>;
using VFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, kFrag, kFrag, kFrag, __half, nvcuda::wmma::row_major>;

// Tags for one tile step: whether the next tile's scores are issued during this tile's softmax.
struct HasNextTile { static constexpr bool value = true; };
struct LastTile { static constexpr bool value = false; };

// Named barriers of the two warps of a key-split pair (64 threads), id kBase + pair for pair 0 or 1. The id is
// an immediate: with a register-valued id ptxas reserves all 16 hardware barriers for the kernel.
// bar.sync is the .aligned barrier: the whole warp must reach it converged, so it starts with __syncwarp()
// (lanes leave the mbarrier wait loops one by one).
template <int kBase>
__device__ __forceinline__ void pair_barrier_sync(int pair) {
  __syncwarp();
  if (pair == 0) asm volatile("bar.sync %0, 64;\n" ::"n"(kBase) : "memory");
  else asm volatile("bar.sync %0, 64;\n" ::"n"(kBase + 1) : "memory");
}
constexpr int kBarPairFree = 1;   // ids 1, 2: half 0 of the pair is out of its loop (0 is __syncthreads')
constexpr int kBarPairReady = 3;  // ids 3, 4: half 1 has left its (m, l, O) in shared memory

// Key tiles a CTA visits; producer and consumers both use this, so they agree on every barrier phase.
// Under causal masking the tiles past the CTA's last query row are skipped entirely.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int kv_tile_count(const FlashcoreParams& p, int row0) {
  const int kv_end = p.causal ? min(p.seq_len, row0 + kBlockM) : p.seq_len;
  return fc::ceil_div(kv_end, kBlockN);
}

// Producer warp: streams K_j and V_j into the ring. Tile t goes to stage t % kStages on lap t / kStages;
// before refilling a stage it waits for the consumers' release of the tile it held, and each lane's copies
// complete the stage's "full" phase themselves (cp.async.mbarrier.arrive.noinc): no lane blocks on a copy.
template <int kHeadDim, int kKeySplit>
__device__ __forceinline__ void produce_kv(const FlashcoreParams& p,
                                           const __half* __restrict__ k,  // [S, D] of this (b, h)
                                           const __half* __restrict__ v,  // [S, D]
                                           __half* K_ring,                // [kStages][kBlockN][kKvStride]
                                           __half* V_ring,                // [kStages][kBlockN][kKvStride]
                                           uint64_t* full, uint64_t* empty, int row0, int n_tiles, int lane) {
  using C = Config<kHeadDim, kKeySplit>;
  using L = SmemLayout<kHeadDim, kKeySplit>;
  constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks

  // The CTAs of a head together bring its K and V into L2 at once, each its own rows: the ring then reads
  // L2, and a cold start (L2 flushed) pays one DRAM round trip instead of one per lap of the ring.
  constexpr int kLinesPerRow = kHeadDim * 2 / 128;
  const int own_rows = min(p.seq_len, row0 + C::kBlockM) - row0;
  for (int i = lane; i < own_rows * kLinesPerRow; i += fc::kWarpSize) {
    const size_t offset = static_cast<size_t>(row0) * kHeadDim + i * 64;  // 64 halves per 128-byte line
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k + offset));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(v + offset));
  }

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % L::kStages;
    const int lap = t / L::kStages;
    if (lap > 0) fc::mbarrier_wait_parity(&empty[stage], (lap - 1) & 1);
    __half* K_j = K_ring + stage * C::kBlockN * L::kKvStride;
    __half* V_j = V_ring + stage * C::kBlockN * L::kKvStride;
    const int n0 = t * C::kBlockN;
#pragma unroll 4
    for (int c = lane; c < C::kBlockN * kChunksPerRow; c += fc::kWarpSize) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const bool valid = n0 + r < p.seq_len;  // rows past the end are zero-filled: 0 * P never makes NaN
      const size_t g = (valid ? static_cast<size_t>(n0 + r) * kHeadDim : 0) + col;
      fc::cp_async_16(K_j + r * L::kKvStride + col, k + g, valid);
      fc::cp_async_16(V_j + r * L::kKvStride + col, v + g, valid);
    }
    fc::cp_async_mbarrier_arrive_noinc(&full[stage]);
  }
  fc::cp_async_wait_all();
}

// S = Q_i K_j^T for one warp's rows and key slice, left in registers; each K fragment feeds every row fragment.
template <int kHeadDim, int kKeySplit>
__device__ __forceinline__ void warp_scores(
    AccFrag (&s)[Config<kHeadDim, kKeySplit>::kRowFrags][Config<kHeadDim, kKeySplit>::kNFrags],
    const RowFrag (&q)[Config<kHeadDim, kKeySplit>::kRowFrags][Config<kHeadDim, kKeySplit>::kDFrags],
    const __half* K_slice) {  // [kSliceN][kKvStride]
  using C = Config<kHeadDim, kKeySplit>;
  constexpr int kKvStride = SmemLayout<kHeadDim, kKeySplit>::kKvStride;
#pragma unroll
  for (int n = 0; n < C::kNFrags; ++n) {
#pragma unroll
    for (int rf = 0; rf < C::kRowFrags; ++rf) nvcuda::wmma::fill_fragment(s[rf][n], 0.f);
#pragma unroll
    for (int kk = 0; kk < C::kDFrags; ++kk) {
      KtFrag k_frag;
      nvcuda::wmma::load_matrix_sync(k_frag, K_slice + n * kFrag * kKvStride + kk * kFrag, kKvStride);
#pragma unroll
      for (int rf = 0; rf < C::kRowFrags; ++rf) nvcuda::wmma::mma_sync(s[rf][n], q[rf][kk], k_frag, s[rf][n]);
    }
  }
}

template <int kCount>
__device__ __forceinline__ float tree_max(const float (&x)[kCount]) {
  float m[4] = {x[0], x[1], x[2], x[3]};  // four chains: a short dependency path, not kCount - 1 steps
#pragma unroll
  for (int j = 4; j < kCount; ++j) m[j % 4] = fmaxf(m[j % 4], x[j]);
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

template <int kCount>
__device__ __forceinline__ float tree_sum(const float (&x)[kCount]) {
  float s[4] = {x[0], x[1], x[2], x[3]};
#pragma unroll
  for (int j = 4; j < kCount; ++j) s[j % 4] += x[j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// 16 rows of O_i (fp32 fragments, already normalised) -> fp16 rows qr0 .. qr0 + 15 of o, through the
// warp's scratch, 64 columns per pass.
template <int kHeadDim>
__device__ __forceinline__ void store_rows(const FlashcoreParams& p, __half* __restrict__ o,  // [S, D]
                                           const AccFrag (&o_frag)[kHeadDim / kFrag], float* staging,  // [16][kOStride]
                                           int qr0, int lane) {
#pragma unroll
  for (int pass = 0; pass < kHeadDim / 64; ++pass) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      nvcuda::wmma::store_matrix_sync(staging + n * kFrag, o_frag[pass * 4 + n], kOStride, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < kFrag * 8; c += fc::kWarpSize) {
      const int r = c / 8, col = (c % 8) * 8;
      const float4 a = *reinterpret_cast<const float4*>(staging + r * kOStride + col);
      const float4 b = *reinterpret_cast<const float4*>(staging + r * kOStride + col + 4);
      if (qr0 + r < p.seq_len) {
        const uint4 packed = {fc::pack_half2(a.x, a.y), fc::pack_half2(a.z, a.w), fc::pack_half2(b.x, b.y), fc::pack_half2(b.z, b.w)};
        *reinterpret_cast<uint4*>(o + static_cast<size_t>(qr0 + r) * kHeadDim + pass * 64 + col) = packed;
      }
    }
    __syncwarp();  // every lane has read the staging before the next pass (or caller) overwrites it
  }
}

// Consumer warp: owns its query rows end to end (Q_i load, every tile of its key slice, O_i store). S and P
// go through its private scratch, so consumer warps never wait for one another inside the loop.
template <int kHeadDim, int kKeySplit>
__device__ __forceinline__ void consume_kv(const FlashcoreParams& p,
                                           const __half* __restrict__ q,  // [S, D] of this (b, h)
                                           __half* __restrict__ o,        // [S, D]
                                           const __half* K_ring,          // [kStages][kBlockN][kKvStride]
                                           const __half* V_ring,          // [kStages][kBlockN][kKvStride]
                                           unsigned char* scratch_base,   // [kConsumerWarps][kScratchBytes]
                                           uint64_t* full, uint64_t* empty, int row0, int n_tiles, int warp,
                                           int lane) {
  using namespace nvcuda;
  using C = Config<kHeadDim, kKeySplit>;
  using L = SmemLayout<kHeadDim, kKeySplit>;
  constexpr int kRowFrags = C::kRowFrags;
  constexpr int kDFrags = C::kDFrags;
  constexpr int kNFrags = C::kNFrags;
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kColsPerLane = C::kSliceN / 2;  // softmax: lanes 2r and 2r + 1 share row r, 4 columns of 8 each

  const int row_warp = warp % C::kRowWarps;
  const int key_half = warp / C::kRowWarps;     // which key slice of every tile (always 0 without the split)
  const int qr0 = row0 + row_warp * C::kWarpRows;  // this warp's first query row
  const int first_key = key_half * C::kSliceN;         // this warp's first key within a tile
  float* scratch = reinterpret_cast<float*>(scratch_base + warp * L::kScratchBytes);
  __half* Q_w = reinterpret_cast<__half*>(scratch);  // [16 kRowFrags][kQStride]
  float* S_w = scratch;                              // [16 kRowFrags][kSStride]
  __half* P_w = reinterpret_cast<__half*>(scratch);  // [16 kRowFrags][kPStride]
  auto K_slice = [&](int t) {  // [kSliceN][kKvStride]
    return K_ring + ((t % L::kStages) * C::kBlockN + first_key) * L::kKvStride;
  };
  auto V_slice = [&](int t) {  // [kSliceN][kKvStride]
    return V_ring + ((t % L::kStages) * C::kBlockN + first_key) * L::kKvStride;
  };
  auto wait_full = [&](int t) {  // then reconverge: the WMMA calls that follow are warp-wide
    fc::mbarrier_wait_parity(&full[t % L::kStages], (t / L::kStages) & 1);
    __syncwarp();
  };
  // Every consumer thread arrives: an arrive releases only the arriving thread's own reads.
  auto release = [&](int t) { fc::mbarrier_arrive(&empty[t % L::kStages]); };

  // Q_i: this warp's rows, zero past the sequence end, into registers for the whole loop
  for (int c = lane; c < C::kWarpRows * kChunksPerRow; c += fc::kWarpSize) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = qr0 + r < p.seq_len;
    fc::cp_async_16(Q_w + r * L::kQStride + col, q + (valid ? static_cast<size_t>(qr0 + r) * kHeadDim : 0) + col,
                    valid);
  }
  fc::cp_async_commit();
  fc::cp_async_wait<0>();
  __syncwarp();
  RowFrag q_frag[kRowFrags][kDFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
    for (int kk = 0; kk < kDFrags; ++kk) {
      wmma::load_matrix_sync(q_frag[rf][kk], Q_w + rf * kFrag * L::kQStride + kk * kFrag, L::kQStride);
    }
  }
  __syncwarp();

  // Which of the 16 rows each accumulator element holds: WMMA leaves the mapping unspecified but fixed for a
  // fragment type, so load a matrix whose entries are their own row index. Scaling O_i's rows is then a
  // shuffle from the softmax lane that owns the row, with no round trip through shared memory.
  for (int i = lane; i < kFrag * kFrag; i += fc::kWarpSize) scratch[(i / kFrag) * kOStride + i % kFrag] = i / kFrag;
  __syncwarp();
  AccFrag probe;
  wmma::load_matrix_sync(probe, scratch, kOStride, wmma::mem_row_major);
  int owner_lane[AccFrag::num_elements];  // the softmax lane (2 r) of element i's row r
#pragma unroll
  for (int i = 0; i < AccFrag::num_elements; ++i) owner_lane[i] = 2 * static_cast<int>(probe.x[i]);
  __syncwarp();

  const int my_row = lane / 2;        // softmax: the row of each row fragment this lane reduces
  const int my_col = (lane % 2) * 4;  // and its first column within every group of 8
  const float scale_log2 = p.scale * static_cast<float>(M_LOG2E);
  float m_i[kRowFrags];  // running row max of S * scale, log2 units (same in both lanes of a row)
  float l_i[kRowFrags];  // this lane's share of the running row sum of P
  AccFrag o_frag[kRowFrags][kDFrags];
  AccFrag s_frag[kRowFrags][kNFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
    m_i[rf] = -INFINITY;
    l_i[rf] = 0.f;
#pragma unroll
    for (int n = 0; n < kDFrags; ++n) wmma::fill_fragment(o_frag[rf][n], 0.f);
  }

  // Softmax and P V of tile t, whose S is in s_frag; with a next tile, its S is computed into s_frag meanwhile.
  auto softmax_pv = [&](int t, auto next) {
    constexpr bool kHasNext = decltype(next)::value;
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int n = 0; n < kNFrags; ++n) {
        wmma::store_matrix_sync(S_w + rf * kFrag * L::kSStride + n * kFrag, s_frag[rf][n], L::kSStride,
                                wmma::mem_row_major);
      }
    }
    __syncwarp();
    if constexpr (kHasNext) wait_full(t + 1);

    // m_new = max(m_i, rowmax(S * scale)), masked past the sequence end and (causal) past the diagonal
    const int key0 = t * C::kBlockN + first_key;  // this warp's first key of tile t
    float x[kRowFrags][kColsPerLane];
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int g = 0; g < kColsPerLane / 4; ++g) {
        const float4 s4 =
            *reinterpret_cast<const float4*>(S_w + (rf * kFrag + my_row) * L::kSStride + g * 8 + my_col);
        x[rf][4 * g + 0] = s4.x * scale_log2;
        x[rf][4 * g + 1] = s4.y * scale_log2;
        x[rf][4 * g + 2] = s4.z * scale_log2;
        x[rf][4 * g + 3] = s4.w * scale_log2;
      }
    }
    if (key0 + C::kSliceN > p.seq_len || (p.causal && key0 + C::kSliceN - 1 > qr0)) {  // warp-uniform
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        const int row = qr0 + rf * kFrag + my_row;
        const int key_end = p.causal ? min(p.seq_len, row + 1) : p.seq_len;
#pragma unroll
        for (int j = 0; j < kColsPerLane; ++j) {
          if (key0 + (j / 4) * 8 + my_col + j % 4 >= key_end) x[rf][j] = -INFINITY;
        }
      }
    }
    if constexpr (kHasNext) warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(t + 1));

    // P = exp(S * scale - m_new); l_i = alpha l_i + rowsum(P)
    float alpha[kRowFrags];
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
      float m_tile = tree_max(x[rf]);
      m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
      const float m_new = fmaxf(m_i[rf], m_tile);
      const float m_base = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: no (-inf) - (-inf)
      alpha[rf] = exp2f(m_i[rf] - m_base);
#pragma unroll
      for (int j = 0; j < kColsPerLane; ++j) x[rf][j] = exp2f(x[rf][j] - m_base);
      l_i[rf] = l_i[rf] * alpha[rf] + tree_sum(x[rf]);
      m_i[rf] = m_new;
    }
    __syncwarp();  // every lane has read its scores before P overwrites them
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int g = 0; g < kColsPerLane / 4; ++g) {
        const uint2 packed = {fc::pack_half2(x[rf][4 * g], x[rf][4 * g + 1]),
                              fc::pack_half2(x[rf][4 * g + 2], x[rf][4 * g + 3])};
        *reinterpret_cast<uint2*>(P_w + (rf * kFrag + my_row) * L::kPStride + g * 8 + my_col) = packed;
      }
    }
    __syncwarp();

    // O_i = diag(alpha) O_i + P V_j
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        const float a = __shfl_sync(0xffffffffu, alpha[rf], owner_lane[i]);
#pragma unroll
        for (int n = 0; n < kDFrags; ++n) o_frag[rf][n].x[i] *= a;
      }
    }
    const __half* V_j = V_slice(t);  // [kSliceN][kKvStride]
#pragma unroll
    for (int kk = 0; kk < kNFrags; ++kk) {
      RowFrag p_frag[kRowFrags];
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        wmma::load_matrix_sync(p_frag[rf], P_w + rf * kFrag * L::kPStride + kk * kFrag, L::kPStride);
      }
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) {
        VFrag v_frag;
        wmma::load_matrix_sync(v_frag, V_j + kk * kFrag * L::kKvStride + n * kFrag, L::kKvStride);
#pragma unroll
        for (int rf = 0; rf < kRowFrags; ++rf) wmma::mma_sync(o_frag[rf][n], p_frag[rf], v_frag, o_frag[rf][n]);
      }
    }
    __syncwarp();  // P is read by every lane before the next tile's S overwrites it
    release(t);    // this thread's reads of tile t (its K slice, maybe one step ago, and its V slice) are done
  };

  // Causal: tiles whose slice starts after the warp's last row add nothing; the warp only passes them back.
  const int last_row = qr0 + C::kWarpRows - 1;
  const int n_active = !p.causal ? n_tiles
                       : last_row < first_key ? 0
                                              : min(n_tiles, (last_row - first_key) / C::kBlockN + 1);
  if (n_active > 0) {
    if constexpr (C::kLookahead) {
      wait_full(0);
      warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(0));
      int t = 0;
      for (; t + 1 < n_active; ++t) softmax_pv(t, HasNextTile{});
      softmax_pv(t, LastTile{});
    } else {
      for (int t = 0; t < n_active; ++t) {
        wait_full(t);
        warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(t));
        softmax_pv(t, LastTile{});
      }
    }
  }
  for (int t = n_active; t < n_tiles; ++t) {
    wait_full(t);
    release(t);
  }

  float l_row[kRowFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) l_row[rf] = l_i[rf] + __shfl_xor_sync(0xffffffffu, l_i[rf], 1);

  if constexpr (kKeySplit == 2) {
    // Merge the pair: O = (e^(m_0 - m) O_0 + e^(m_1 - m) O_1) / (e^(m_0 - m) l_0 + e^(m_1 - m) l_1), m = max.
    // Half 1 leaves (m_1, l_1, O_1) in the pair's scratch once half 0 is out of its loop; half 0 merges.
    // Two named barriers of the pair: "free" (half 0 is done with its scratch), then "ready".
    static_assert(C::kRowWarps == 2, "pair barriers have ids for two pairs");
    float* staging0 = reinterpret_cast<float*>(scratch_base + row_warp * L::kScratchBytes);  // [16][kOStride]
    float* staging1 = reinterpret_cast<float*>(scratch_base + (row_warp + C::kRowWarps) * L::kScratchBytes);
    auto o1_columns = [&](int n) {  // where O_1's column block n lives: blocks 4+ (D=128) in half 0's scratch
      return (n < 4 ? staging1 : staging0) + (n % 4) * kFrag;
    };
    // Both halves pass both barriers at the same two points (the half-specific work sits between them):
    // compute-sanitizer's synccheck reports a bar.sync reached from different instructions as divergent
    // (256 errors), and its racecheck does not model a one-sided bar.arrive (17 hazards on this handoff),
    // though the PTX memory model orders both.
    pair_barrier_sync<kBarPairFree>(row_warp);
    if (key_half == 1) {
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) {
        wmma::store_matrix_sync(o1_columns(n), o_frag[0][n], kOStride, wmma::mem_row_major);
      }
      if (lane % 2 == 0) {
        staging1[my_row * kOStride + 64] = m_i[0];
        staging1[my_row * kOStride + 65] = l_row[0];
      }
    }
    pair_barrier_sync<kBarPairReady>(row_warp);
    if (key_half == 1) return;
    const float m_other = staging1[my_row * kOStride + 64];
    const float l_other = staging1[my_row * kOStride + 65];
    const float m_new = fmaxf(m_i[0], m_other);
    const float m_base = m_new == -INFINITY ? 0.f : m_new;
    const float a_mine = exp2f(m_i[0] - m_base);
    const float a_other = exp2f(m_other - m_base);
    l_row[0] = a_mine * l_row[0] + a_other * l_other;
    float a_mine_e[AccFrag::num_elements], a_other_e[AccFrag::num_elements];
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
      a_mine_e[i] = __shfl_sync(0xffffffffu, a_mine, owner_lane[i]);
      a_other_e[i] = __shfl_sync(0xffffffffu, a_other, owner_lane[i]);
    }
#pragma unroll
    for (int n = 0; n < kDFrags; ++n) {
      AccFrag o1;
      wmma::load_matrix_sync(o1, o1_columns(n), kOStride, wmma::mem_row_major);
#pragma unroll
      for (int i = 0; i < AccFrag::num_elements; ++i) {
        o_frag[0][n].x[i] = a_mine_e[i] * o_frag[0][n].x[i] + a_other_e[i] * o1.x[i];
      }
    }
    __syncwarp();  // O_1's columns in this warp's scratch are read before the store below reuses it
  }

  // O_i = diag(1 / l_i) O_i
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
    const float inv_l = l_row[rf] > 0.f ? 1.f / l_row[rf] : 0.f;
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
      const float r = __shfl_sync(0xffffffffu, inv_l, owner_lane[i]);
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) o_frag[rf][n].x[i] *= r;
    }
    store_rows<kHeadDim>(p, o, o_frag[rf], scratch, qr0 + rf * kFrag, lane);
  }
}

template <int kHeadDim, int kKeySplit>
__global__ void __launch_bounds__(kThreads, 2) v9_fwd(FlashcoreParams p) {
  using C = Config<kHeadDim, kKeySplit>;
  using L = SmemLayout<kHeadDim, kKeySplit>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* K_ring = reinterpret_cast<__half*>(smem + L::kK);          // [kStages][kBlockN][kKvStride]
  __half* V_ring = reinterpret_cast<__half*>(smem + L::kV);          // [kStages][kBlockN][kKvStride]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);    // [kStages]
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);  // [kStages]

  const int warp = threadIdx.x / fc::kWarpSize;
  const int lane = threadIdx.x % fc::kWarpSize;
  // Heaviest causal query tiles first, so the last wave is made of short ones.
  const int row0 = (gridDim.x - 1 - blockIdx.x) * C::kBlockM;
  const int n_tiles = kv_tile_count<C::kBlockM, C::kBlockN>(p, row0);
  const size_t base = fc::head_offset(p, blockIdx.z, blockIdx.y);

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      fc::mbarrier_init(&full[s], kProducerThreads);
      fc::mbarrier_init(&empty[s], kConsumerThreads);
    }
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before either role touches them

  if (warp == kConsumerWarps) {
    produce_kv<kHeadDim, kKeySplit>(p, fc::tensor<__half>(p.k) + base, fc::tensor<__half>(p.v) + base, K_ring, V_ring, full, empty, row0, n_tiles, lane);
  } else {
    consume_kv<kHeadDim, kKeySplit>(p, fc::tensor<__half>(p.q) + base, fc::tensor<__half>(p.o) + base, K_ring, V_ring, smem + L::kScratch, full, empty,
                                    row0, n_tiles, warp, lane);
  }
}

template <int kHeadDim, int kKeySplit>
static const char* launch_config(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemLayout<kHeadDim, kKeySplit>::kBytes;
  if (const char* err = fc::allow_dynamic_smem(v9_fwd<kHeadDim, kKeySplit>, kSmem)) return err;
  v9_fwd<kHeadDim, kKeySplit>
      <<<fc::query_tile_grid(p, Config<kHeadDim, kKeySplit>::kBlockM), kThreads, kSmem, stream>>>(p);
  return fc::launch_status();
}

// The key split when whole-tile CTAs would leave SMs idle (1,8,512,64: 32 CTAs of 128 rows on 132 SMs
// becomes 128 CTAs of 32 rows, each warp walking half the keys).
template <int kHeadDim>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return fc::message("could not read the device's SM count: %s", cudaGetErrorString(cudaGetLastError()));
  }
  const dim3 grid = fc::query_tile_grid(p, Config<kHeadDim, 1>::kBlockM);
  const long long ctas = static_cast<long long>(grid.x) * grid.y * grid.z;
  return ctas < sms ? launch_config<kHeadDim, 2>(p, stream) : launch_config<kHeadDim, 1>(p, stream);
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 2) return 0;
  if (head_dim == 64) {
    plans[0] = {"v9_fwd<64, 1>", kThreads, SmemLayout<64, 1>::kBytes};
    plans[1] = {"v9_fwd<64, 2>", kThreads, SmemLayout<64, 2>::kBytes};
  } else if (head_dim == 128) {
    plans[0] = {"v9_fwd<128, 1>", kThreads, SmemLayout<128, 1>::kBytes};
    plans[1] = {"v9_fwd<128, 2>", kThreads, SmemLayout<128, 2>::kBytes};
  } else {
    return 0;
  }
  return 2;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch<64>(p, stream);
    case 128: return launch<128>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
