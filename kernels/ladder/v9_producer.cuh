// ladder/v9_producer.cuh — v9's producer warp: K_j, V_j streamed into the shared-memory ring by cp.async, each stage's
// arrival counted on its "full" mbarrier, a stage refilled once the consumers' "empty" mbarrier says so.
#pragma once

#include "common/mbarrier.cuh"
#include "common/primitives.cuh"
#include "ladder/v9_traits.cuh"

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
