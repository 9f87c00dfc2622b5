// sm90/producer_bwd_sm90.cuh — the load side of v12's backward: the CTA's shared memory and mbarriers, the tile
// hand-over (the stage thread publishes each round's claimed tile, every other role takes it), the stage thread
// (Q_i, dO_i, LSE_i, D_i) and the K/V thread. Read by sm90/bwd_dq_sm90.cuh and sm90/mainloop_bwd_sm90.cuh.
#pragma once

#include "common/bwd_passes.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "common/tma.cuh"
#include "sm90/v12_bwd_traits.cuh"

__device__ __forceinline__ unsigned char* v12_bwd_smem() { return fc::dynamic_smem_1024(); }

template <class Cfg>
__device__ __forceinline__ BwdBarriers& bwd_barriers() {
  return *reinterpret_cast<BwdBarriers*>(v12_bwd_smem() + Cfg::kBarOffset);
}

// The producer: round r's tile index (>= bwd_tiles: none left) into slot r % 2 once every reader has taken round
// r - 2's from it.
template <class Cfg>
__device__ __forceinline__ void bwd_publish_tile(int round, int t) {
  BwdBarriers& bars = bwd_barriers<Cfg>();
  fc::mbarrier_wait_parity(&bars.tile_empty[round & 1], ((round >> 1) & 1) ^ 1);
  *reinterpret_cast<volatile int*>(&bars.tile_slot[round & 1]) = t;
  fc::mbarrier_arrive(&bars.tile_full[round & 1]);
}

// Every other role: round r's tile, as the producer published it; false once the list is done.
template <class Cfg>
__device__ __forceinline__ bool bwd_take_tile(const FlashcoreParams& p, int round, BwdTile& tile) {
  BwdBarriers& bars = bwd_barriers<Cfg>();
  fc::mbarrier_wait_parity(&bars.tile_full[round & 1], (round >> 1) & 1);
  const int t = *reinterpret_cast<volatile int*>(&bars.tile_slot[round & 1]);
  fc::mbarrier_arrive(&bars.tile_empty[round & 1]);
  if (t >= bwd_tiles<Cfg::kBlockN>(p)) return false;
  tile = bwd_tile_at<Cfg::kBlockN>(p, t, gridDim.x);
  return true;
}

// One thread: each step's Q_i, dO_i (TMA) and LSE_i, D_i (bulk copies) into stage (the CTA's step count) % 2, over
// the CTA's tiles, which it claims and publishes to the other roles (sm90/v12_bwd_traits.cuh, bwd_tile_at).
template <class Cfg>
__device__ __forceinline__ void bwd_producer(const FlashcoreBackwardParams& b, const Workspace& w, const BwdMaps& maps) {
  BwdBarriers& bars = bwd_barriers<Cfg>();
  unsigned char* smem = v12_bwd_smem();
  const int tiles = bwd_tiles<Cfg::kBlockN>(b.fwd);
  int it = 0, t = blockIdx.x;  // the CTA's steps so far, over its tiles; this round's tile
  for (int round = 0;; ++round) {
    bwd_publish_tile<Cfg>(round, t);
    if (t >= tiles) break;
    const BwdTile tile = bwd_tile_at<Cfg::kBlockN>(b.fwd, t, gridDim.x);
    const BwdSteps steps = bwd_steps<Cfg::kBlockN, Cfg::kBlockM>(b.fwd, tile.n_block, tile.bh_kv);
    int bh = steps.bh0, m = steps.m_first;
    for (int step = 0; step < steps.count; ++step, ++it, steps.advance(bh, m)) {
      const int s = it & 1, m0 = m * Cfg::kBlockM;
      fc::mbarrier_wait_parity(&bars.empty[s], ((it >> 1) & 1) ^ 1);
      fc::mbarrier_arrive_expect_bytes(&bars.full[s], 2 * Cfg::kQBytes + Cfg::kStatsBytes);
      fc::tma_load_4d(smem + Cfg::kQOffset + s * Cfg::kQBytes, &maps.q, 0, m0, 0, bh, &bars.full[s]);
      fc::tma_load_4d(smem + Cfg::kDoOffset + s * Cfg::kQBytes, &maps.d_o, 0, m0, 0, bh, &bars.full[s]);
      float* stats = reinterpret_cast<float*>(smem + Cfg::kStatsOffset + s * Cfg::kStatsBytes);
      const size_t row = static_cast<size_t>(bh) * static_cast<unsigned>(w.padded_rows) + m0;
      fc::bulk_load(stats, w.lse2 + row, Cfg::kBlockM * 4, &bars.full[s]);
      fc::bulk_load(stats + Cfg::kBlockM, w.dsum + row, Cfg::kBlockM * 4, &bars.full[s]);
    }
    // the next tile, claimed as this one's last stage goes out
    t = static_cast<int>(gridDim.x) + atomicAdd(w.tile_counter, 1);
  }
}

// cp.async.bulk.prefetch.tensor.4d.L2: the box at (c0, c1, c2, c3) into L2; nothing waits for it.
__device__ __forceinline__ void bwd_prefetch_l2_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  FC_SM90_ONLY(asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global [%0, {%1, %2, %3, %4}];\n" ::"l"(map),
                            "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                            : "memory"));
}

// Another thread: each tile's K_j and V_j, once both consumers are done with the tile before (their last products
// read K and V), so the next tile's load runs under the consumers' dK, dV stores. A tile after the first is taken
// as the producer publishes it, about two steps before the consumers release K and V: its K_j and V_j go into L2
// then, so the load into shared memory, on the tile's critical path, hits L2 (each K/V tile is read once).
template <class Cfg>
__device__ __forceinline__ void bwd_kv_loader(const FlashcoreParams& p, const BwdMaps& maps) {
  BwdBarriers& bars = bwd_barriers<Cfg>();
  unsigned char* smem = v12_bwd_smem();
  BwdTile tile;
  for (int round = 0; bwd_take_tile<Cfg>(p, round, tile); ++round) {
    const int n0 = tile.n_block * Cfg::kBlockN;
    if (round > 0) {
      bwd_prefetch_l2_4d(&maps.k, 0, n0, 0, tile.bh_kv);
      bwd_prefetch_l2_4d(&maps.v, 0, n0, 0, tile.bh_kv);
    }
    fc::mbarrier_wait_parity(&bars.kv_empty, (round & 1) ^ 1);
    fc::mbarrier_arrive_expect_bytes(&bars.kv_full, 2 * Cfg::kKVBytes);
    fc::tma_load_4d(smem + Cfg::kKOffset, &maps.k, 0, n0, 0, tile.bh_kv, &bars.kv_full);
    fc::tma_load_4d(smem + Cfg::kVOffset, &maps.v, 0, n0, 0, tile.bh_kv, &bars.kv_full);
  }
}
