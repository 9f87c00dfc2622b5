// sm90/bwd_dq_sm90.cuh — dQ_i in v12's backward: each consumer's product (dS K_j), its staging in shared memory in the
// TMA box's layout, the reduce-add into the fp32 accumulator, and the producer warp that issues it (the dQ warp).
// Read by sm90/mainloop_bwd_sm90.cuh.
#pragma once

#include "flashcore.h"
#include "common/hopper.cuh"
#include "sm90/producer_bwd_sm90.cuh"
#include "common/tma.cuh"
#include "sm90/v12_bwd_traits.cuh"

#include <cstdint>

constexpr int kDqFull = 4;   // + g: consumer g's dQ staged, for the dQ warp (128 + 32 threads)
constexpr int kDqEmpty = 6;  // + g: the dQ warp has read consumer g's staged tile (128 + 32)

// Consumer g's staged dQ tile (two panels of [kDqRows rows][32 fp32], 128-byte swizzled) reduce-added by TMA into
// the fp32 accumulator at query rows m0.. of head bh, as one bulk group; one thread calls it.
template <class Cfg>
__device__ __forceinline__ void reduce_add_dq_tile(const BwdMaps& maps, unsigned char* smem, int g, int m0, int bh) {
  const int row_half = Cfg::kDqByRows ? g : 0, col_half = Cfg::kDqByRows ? 0 : g;
  unsigned char* stage = smem + Cfg::kDqOffset + g * Cfg::kDqBytes;
#pragma unroll
  for (int panel = 0; panel < 2; ++panel) {
    fc::tma_reduce_add_3d(&maps.dq, 64 * col_half + 32 * panel, m0 + 64 * row_half, bh,
                          stage + panel * Cfg::kDqRows * 128);
  }
  fc::tma_store_commit();
}

// The dQ warp: warp 1 of the producer warpgroup. For every step of every tile of the CTA and each consumer:
// wait until the consumer has staged its dQ tile and let lane 0 reduce-add it by TMA; before the next step's, once
// the copies have read the staging tiles, tell the consumers they may write the next ones.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_writer(const FlashcoreBackwardParams& b, const BwdMaps& maps) {
  unsigned char* smem = v12_bwd_smem();
  const bool leader = threadIdx.x % 32 == 0;
  int it = 0;  // the CTA's steps so far, over its tiles
  BwdTile tile;
  for (int round = 0; bwd_take_tile<Cfg>(b.fwd, round, tile); ++round) {
    const BwdSteps steps = bwd_steps<Cfg::kBlockN, Cfg::kBlockM>(b.fwd, tile.n_block, tile.bh_kv);
    int bh = steps.bh0, m = steps.m_first;
#pragma unroll 1
    for (int step = 0; step < steps.count; ++step, ++it, steps.advance(bh, m)) {
      const int m0 = m * Cfg::kBlockM;
      if (it > 0) {  // the last step's tiles read: the consumers may stage this step's
        if (leader) fc::tma_store_wait_read<0>();
        __syncwarp();
#pragma unroll
        for (int g = 0; g < Cfg::kConsumers; ++g) fc::named_barrier_arrive(kDqEmpty + g, fc::kWarpgroupThreads + 32);
      }
#pragma unroll
      for (int g = 0; g < Cfg::kConsumers; ++g) {
        fc::named_barrier_sync(kDqFull + g, fc::kWarpgroupThreads + 32);
        if (leader) reduce_add_dq_tile<Cfg>(maps, smem, g, m0, bh);
      }
    }
  }
  if (leader) fc::tma_store_wait<0>();
}

// dQ's 64 x 64 tile of this consumer: dS (its 64 query rows, all kBlockN keys: two K-major panels) times K_j's
// 64 columns (N-major: K_j's rows are the keys), 8 k-steps of 16 keys.
template <class Cfg, typename T>
__device__ __forceinline__ void gemm_dq(float (&dq)[Cfg::kDqRegs], uint64_t desc_ds, uint64_t desc_k) {
  fc::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t ds = desc_ds + (((kk / 4) * Cfg::kBlockM * 128 + (kk % 4) * 32) >> 4);
    const uint64_t k = desc_k + ((kk * 2048) >> 4);
    fc::wgmma_ss<64, T, 1>(dq, ds, k, kk > 0);
  }
  fc::wgmma_commit();
}

// This consumer's dQ tile into its staging tile (2 panels of [kDqRows query rows][32 fp32], 128-byte swizzled: the
// TMA box's layout).
template <class Cfg>
__device__ __forceinline__ void stage_dq(unsigned char* dq_stage, const float (&dq)[Cfg::kDqRegs], int warp, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < Cfg::kDqRegs / 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + lane / 4 + 8 * h;  // accumulator row
      const int col = 8 * j + 2 * t, panel = col / 32, chunk = (col % 32) / 4;
      *reinterpret_cast<float2*>(dq_stage + panel * Cfg::kDqRows * 128 + row * 128 + ((chunk ^ (row % 8)) << 4) +
                                 4 * (col % 4)) = make_float2(dq[4 * j + 2 * h], dq[4 * j + 2 * h + 1]);
    }
  }
}

// Consumer g's k-th dQ tile in the CTA into its staging tile, once the dQ warp has read tile k - 1, then handed to
// that warp. (Issuing the reduce-add from the consumer's thread 0 after the warpgroup met instead, without the dQ
// warp, was 2.6-7.1% slower at issue 30's six rows on the H200.)
template <class Cfg>
__device__ __forceinline__ void hand_over_dq(unsigned char* dq_stage, const float (&dq)[Cfg::kDqRegs], int g, int k,
                                             int warp, int lane) {
  if (k > 0) fc::named_barrier_sync(kDqEmpty + g, fc::kWarpgroupThreads + 32);
  stage_dq<Cfg>(dq_stage, dq, warp, lane);
  fc::fence_proxy_async_shared();
  fc::named_barrier_arrive(kDqFull + g, fc::kWarpgroupThreads + 32);
}
