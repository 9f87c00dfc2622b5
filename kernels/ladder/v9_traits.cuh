// ladder/v9_traits.cuh — v9's configuration (kernels/ladder/v9.cu tells the rung's story): the warp roles (four
// consumer warps, one producer), the two CTA shapes (Config), the shared-memory layout of the K/V ring and the warps'
// scratch (SmemLayout), the WMMA fragment types, the key-split pair's named barriers and the tile count producer and
// consumers agree on. Read by ladder/v9_producer.cuh, ladder/v9_warp.cuh, ladder/v9_consumer.cuh and ladder/v9.cu.
#pragma once

#include "flashcore.h"

#include <mma.h>

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
