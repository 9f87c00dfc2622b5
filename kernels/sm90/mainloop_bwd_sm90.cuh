// sm90/mainloop_bwd_sm90.cuh — v12's backward kernel: persistent CTAs, each running tiles (a block of 128 keys of one
// K/V head) that its producer thread claims from a counter; that thread streams each step's Q_i, dO_i, LSE_i, D_i
// by TMA into two stages, another loads each tile's K_j, V_j, and two consumer warpgroups of 64 keys each run the
// five products on wgmma (the consumer step and the kernel below). The passes before and after it are
// common/bwd_passes.cuh's; the loads and the tile hand-over sm90/producer_bwd_sm90.cuh's; dQ_i's product, staging and
// reduce-add sm90/bwd_dq_sm90.cuh's; a tile's dK and dV out sm90/epilogue_bwd_sm90.cuh's; the configuration and the
// tile list sm90/v12_bwd_traits.cuh's; the launcher sm90/v12_bwd.cu.
#pragma once

#include "sm90/bwd_dq_sm90.cuh"
#include "common/bwd_passes.cuh"
#include "sm90/consumer_sm90.cuh"
#include "sm90/epilogue_bwd_sm90.cuh"
#include "common/family.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "sm90/producer_bwd_sm90.cuh"
#include "common/tma.cuh"
#include "sm90/v12_bwd_traits.cuh"

#include <cstdint>

// One step of a consumer: S^T and dP^T awaited together, P^T and dS^T, dV; dS_i stored for both consumers' dQ
// products; then dQ_{i-1}'s product (the lag: from the other of two dS buffers handed over on mbarriers, so the
// consumers never meet within a step and one's exp2s run while the other's wgmmas do), then dK's, dQ_{i-1} staged
// for the dQ warp while dK's runs. Tried and not kept (H200, the backward alone, beside the shipped build in one run):
//   - P^T computed while dP^T's wgmma runs and dS^T while dV's (D = 128): 1397.8 against 1355.6 us at 2,16,4096,128,
//     779.3 against 762.6 causal;
//   - no lag (both consumers meet each step before dQ_i): 7% slower at 2,16,4096,64 and 1,16,16384,64, 4% at 64
//     causal, 0-1% at the D = 128 rows. Without the lag, dQ_i issued after dK's was within the spread at D = 128
//     and 1.8% faster at 2,16,4096,64 in one run; the lag needs dQ first;
//   - 80 queries per step at D = 128 (FlashAttention-3's choice, dQ^T computed transposed): 1351.7 against 1301.0 us
//     at 2,16,4096,128 for the 64-query build without the lag (H200), and no faster in four runs on the H100.

// The threads that read each round's tile from the producer: the K/V loader, the dQ warp, both consumers.
constexpr int kTileReaders = 1 + 32 + 2 * fc::kWarpgroupThreads;

// P^T = exp2(S^T * scale log2 e - LSE_i log2 e) in place, on a 64-key x kBlockM tile whose columns are queries
// (this thread: columns 8j + 2(t%4) + {0, 1}; rows r, r + 8 of its warp's 16 keys). Masked (bwd_needs_mask): P = 0
// outside each key's visible queries, qb[0] for key row r, qb[1] for r + 8 (bwd_query_bounds: none for keys past
// S_kv). Padding queries (LSE +inf) get 0.
template <int kBlockM, bool kMask>
__device__ __forceinline__ void probabilities(float (&st)[kBlockM / 2], const float* lse2, float scale_log2,
                                              const BwdQueryBounds (&qb)[2], int query0) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j) {
    const float2 l = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pr = exp2f(fmaf(st[4 * j + e], scale_log2, -((e & 1) ? l.y : l.x)));
      if (kMask) {
        const int query = query0 + 8 * j + 2 * t + (e & 1);
        if (query < qb[e >> 1].first || query > qb[e >> 1].last) pr = 0.f;
      }
      st[4 * j + e] = pr;
    }
  }
}

// dS^T = P^T o (dP^T - D_i) in place of dP^T (the same fragment layout).
template <int kBlockM>
__device__ __forceinline__ void score_gradients(const float (&pt)[kBlockM / 2], float (&dpt)[kBlockM / 2], const float* dsum) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j) {
    const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[4 * j + e] = pt[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? d.y : d.x));
  }
}

// Softcap c: P^T and dS^T of the capped scores, in place of S^T and dP^T (the layout above). t = tanh(S^T scale / c)
// as the forward takes it (fc::tanh_fast) replaces S^T; dP^T - D_i takes its factor 1 - t^2 (the tanh's derivative:
// what turns the capped score's gradient into the raw score scale q.k's, which dQ and dK take as they take the
// uncapped one); then P^T = exp2(c t log2 e - LSE_i log2 e) replaces t (the forward's LSE is the capped scores'),
// masked as probabilities() masks, and dS^T = P^T o (dP^T - D_i) o (1 - t^2). No array beyond S^T and dP^T.
template <int kBlockM, bool kMask>
__device__ __forceinline__ void capped_gradients(float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2], const float* lse2,
                                                 const float* dsum, float scale_over_cap, float cap_log2,
                                                 const BwdQueryBounds (&qb)[2], int query0) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < kBlockM / 2; ++i) st[i] = fc::tanh_fast(st[i] * scale_over_cap);
#pragma unroll
  for (int j = 0; j < kBlockM / 8; ++j) {
    const float2 d = *reinterpret_cast<const float2*>(dsum + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dpt[4 * j + e] = (dpt[4 * j + e] - ((e & 1) ? d.y : d.x)) * fmaf(-st[4 * j + e], st[4 * j + e], 1.f);
    }
  }
  probabilities<kBlockM, kMask>(st, lse2, cap_log2, qb, query0);
#pragma unroll
  for (int i = 0; i < kBlockM / 2; ++i) dpt[i] *= st[i];
}

template <class Cfg, typename T, bool kSoftcap>
__device__ __forceinline__ void bwd_consumer(const FlashcoreBackwardParams& b, const Workspace& w, const BwdMaps& maps) {
  constexpr int kBlockM = Cfg::kBlockM, kHeadDim = Cfg::kHeadDim;
  const FlashcoreParams& p = b.fwd;
  const int g = __shfl_sync(0xffffffffu, threadIdx.x / fc::kWarpgroupThreads, 0) - 1;  // 0 or 1, warp-uniform
  // Held in registers across the loop: reading the lane afresh where it is used (a volatile read the compiler cannot
  // hoist) pins the schedule around it, and cost 6% at D = 64 (H100, beside a build that held it).
  const int warp = threadIdx.x / 32 % 4;
  auto lane = [] { return static_cast<int>(threadIdx.x % 32); };
  const bool tid0 = threadIdx.x % fc::kWarpgroupThreads == 0;
  BwdBarriers& bars = bwd_barriers<Cfg>();
  unsigned char* smem = v12_bwd_smem();
  // this thread's first key in the CTA's block (+ 8: second)
  auto key_row = [&] { return 64 * g + 16 * warp + lane() / 4; };
  const float scale_log2 = p.scale * kBwdLog2e;
  const float scale_over_cap = kSoftcap ? p.scale / p.softcap : 0.f, cap_log2 = kSoftcap ? p.softcap * kBwdLog2e : 0.f;
  const int dq_row_half = Cfg::kDqByRows ? g : 0, dq_col_half = Cfg::kDqByRows ? 0 : g;

  // Descriptors: K_j, V_j rows of this warpgroup as K-major A; Q_i, dO_i as K-major B (S^T, dP^T) and N-major B
  // (dV, dK: a k-step is 16 query rows, 2048 bytes); dS rows of this consumer's dQ tile as K-major A; K_j's
  // 64 columns of its dQ tile as N-major B.
  const uint64_t desc_k = fc::wgmma_desc_sw128(smem + Cfg::kKOffset + 64 * g * 128, 16, 1024);
  const uint64_t desc_v = fc::wgmma_desc_sw128(smem + Cfg::kVOffset + 64 * g * 128, 16, 1024);
  const uint64_t desc_q = fc::wgmma_desc_sw128(smem + Cfg::kQOffset, 16, 1024);
  const uint64_t desc_do = fc::wgmma_desc_sw128(smem + Cfg::kDoOffset, 16, 1024);
  const uint64_t desc_q_t = fc::wgmma_desc_sw128(smem + Cfg::kQOffset, kBlockM * 128, 1024);
  const uint64_t desc_do_t = fc::wgmma_desc_sw128(smem + Cfg::kDoOffset, kBlockM * 128, 1024);
  const uint64_t desc_ds = fc::wgmma_desc_sw128(smem + Cfg::kDsOffset + 64 * dq_row_half * 128, 16, 1024);
  const uint64_t desc_k_t =
      fc::wgmma_desc_sw128(smem + Cfg::kKOffset + dq_col_half * Cfg::kBlockN * 128, Cfg::kBlockN * 128, 1024);
  constexpr uint64_t kStageStep = Cfg::kQBytes >> 4, kDsStep = Cfg::kDsBytes >> 4;
  unsigned char* dq_stage = smem + Cfg::kDqOffset + g * Cfg::kDqBytes;
  // stmatrix addresses: lane l stores row (query) 8 (2i + l/16) + l%8 of 16-byte key chunk 2 warp + (l/8)%2 of
  // panel g (this warpgroup's 64 keys), swizzled; i steps 16 queries (2048 bytes).
  const uint32_t ds_panel = fc::smem_addr(smem + Cfg::kDsOffset + g * kBlockM * 128);
  auto ds_lane = [&] {
    const int l = lane(), st_query = 8 * (l / 16) + l % 8, st_chunk = 2 * warp + (l / 8) % 2;
    return ds_panel + st_query * 128 + ((st_chunk ^ (st_query % 8)) << 4);
  };

  // this consumer's half of dS (queries x keys) into buffer b, visible to the other's wgmma once it has met us
  auto store_ds = [&](const uint32_t (&dsa)[kBlockM / 16][4], int b) {
#pragma unroll
    for (int i = 0; i < kBlockM / 16; ++i) fc::stmatrix_x4_trans(ds_lane() + b * Cfg::kDsBytes + i * 2048, dsa[i]);
    fc::fence_proxy_async_shared();
  };

  // the CTA's steps so far, over its tiles: stages and dS buffers alternate over them, and step it's dQ tile is the
  // CTA's it-th (each waits for the dQ warp to have read the one before)
  int it = 0;
  BwdTile tile;
  for (int round = 0; bwd_take_tile<Cfg>(p, round, tile); ++round) {
    const BwdSteps steps = bwd_steps<Cfg::kBlockN, Cfg::kBlockM>(p, tile.n_block, tile.bh_kv);
    const int n0 = tile.n_block * Cfg::kBlockN;
    const BwdQueryBounds unmasked = bwd_unmasked_steps<kBlockM>(p, n0 + 64 * g);  // bwd_needs_mask, per tile
    float dv[kHeadDim / 2], dk[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) dv[i] = dk[i] = 0.f;
    fc::mbarrier_wait_parity(&bars.kv_full, round & 1);
    for (int step = 0; step < steps.count; ++step, ++it) {
      const int s = it & 1;
      const int m0 = steps.m0(step, kBlockM);
      fc::mbarrier_wait_parity(&bars.full[s], (it >> 1) & 1);
      // S^T = K_j Q_i^T, dP^T = V_j dO_i^T (64 keys x kBlockM queries)
      float st[kBlockM / 2], dpt[kBlockM / 2];
      gemm_qk<T, kHeadDim, kBlockM, Cfg::kBlockN>(st, desc_k, desc_q + s * kStageStep);
      fc::wgmma_fence_operands(st);
      gemm_qk<T, kHeadDim, kBlockM, Cfg::kBlockN>(dpt, desc_v, desc_do + s * kStageStep);
      fc::wgmma_fence_operands(dpt);
      const float* stats = reinterpret_cast<const float*>(smem + Cfg::kStatsOffset + s * Cfg::kStatsBytes);
      // P^T, and dS^T with it: masked where the window cuts this consumer's keys against the step's queries, or where
      // they reach past S_kv (bwd_needs_mask)
      auto to_probabilities = [&] {
        const bool mask = m0 < unmasked.first || m0 > unmasked.last;
        BwdQueryBounds qb[2] = {};
        if (mask) qb[0] = bwd_query_bounds(p, n0 + key_row()), qb[1] = bwd_query_bounds(p, n0 + key_row() + 8);
        if constexpr (kSoftcap) {
          if (mask) {
            capped_gradients<kBlockM, true>(st, dpt, stats, stats + kBlockM, scale_over_cap, cap_log2, qb, m0);
          } else {
            capped_gradients<kBlockM, false>(st, dpt, stats, stats + kBlockM, scale_over_cap, cap_log2, qb, m0);
          }
        } else {
          if (mask) {
            probabilities<kBlockM, true>(st, stats, scale_log2, qb, m0);
          } else {
            probabilities<kBlockM, false>(st, stats, scale_log2, qb, m0);
          }
          score_gradients<kBlockM>(st, dpt, stats + kBlockM);
        }
      };
      uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(st);
      fc::wgmma_fence_operands(dpt);
      to_probabilities();
      if constexpr (kSoftcap) {  // all of P^T, dS^T before the packing: interleaved with it and dV's issue, the
        fc::wgmma_fence_operands(st);  // capped steps spilled 152 bytes at D = 64 (ptxas)
        fc::wgmma_fence_operands(dpt);
      }
      pack_p<T, kBlockM>(st, pa);
      pack_p<T, kBlockM>(dpt, dsa);
      gemm_pv<T, kHeadDim, kBlockM>(dv, pa, desc_do_t + s * kStageStep);  // dV += P^T dO_i (A from registers)
      fc::wgmma_fence_operands(dv);
      // dS_i into buffer s once both consumers' last product from it (step i - 1's) is done; then dQ_{i-1} (buffer
      // s ^ 1, stored by both in step i - 1), then dK; dQ_{i-1} is staged while dK runs. Step 0's product reads a
      // buffer no step has stored and is discarded (issued unconditionally: behind a branch ptxas serialized every
      // wgmma), and buffer 1's first store waits for it like any other.
      if (it > 0) fc::mbarrier_wait_parity(&bars.ds_empty[s], ((it - 1) >> 1) & 1);
      store_ds(dsa, s);
      fc::mbarrier_arrive(&bars.ds_full[s]);
      if (step > 0) fc::mbarrier_wait_parity(&bars.ds_full[s ^ 1], ((it - 1) >> 1) & 1);
      float dq[Cfg::kDqRegs];
      gemm_dq<Cfg, T>(dq, desc_ds + (s ^ 1) * kDsStep, desc_k_t);
      fc::wgmma_fence_operands(dq);
      gemm_pv<T, kHeadDim, kBlockM>(dk, dsa, desc_q_t + s * kStageStep);
      fc::wgmma_fence_operands(dk);
      fc::wgmma_wait<1>();
      fc::wgmma_fence_operands(dv);
      fc::wgmma_fence_operands(pa);
      fc::wgmma_fence_operands(dq);
      fc::mbarrier_arrive(&bars.ds_empty[s ^ 1]);
      if (step > 0) hand_over_dq<Cfg>(dq_stage, dq, g, it - 1, warp, lane());
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(dk);
      fc::wgmma_fence_operands(dsa);
      fc::mbarrier_arrive(&bars.empty[s]);
    }
    // Every thread arrives on kv_empty once per tile, as its products that read K_j and V_j are done: the next
    // tile's K/V load goes out before the last dQ's hand-over, which can wait for the dQ warp.
    if (steps.count > 0) {  // the last step's dQ (the next tile's first step arrives on its buffer's ds_empty)
      const int last = it - 1;
      fc::mbarrier_wait_parity(&bars.ds_full[last & 1], (last >> 1) & 1);
      float dq[Cfg::kDqRegs];
      gemm_dq<Cfg, T>(dq, desc_ds + (last & 1) * kDsStep, desc_k_t);
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(dq);
      fc::mbarrier_arrive(&bars.kv_empty);  // every thread (with a step)
      hand_over_dq<Cfg>(dq_stage, dq, g, it - 1, warp, lane());
    } else {
      fc::mbarrier_arrive(&bars.kv_empty);
    }

    // dK = scale dS^T Q, dV = P^T dO for this warpgroup's 64 keys (sm90/epilogue_bwd_sm90.cuh)
    if constexpr (Cfg::kEpiStaged) {
      unsigned char* epi = smem + Cfg::kEpiOffset + g * Cfg::kEpiBytes;
      store_rows_staged<Cfg, T>(dv, 1.f, &maps.dv, epi, n0 + 64 * g, tile.bh_kv, g, warp, lane());
      store_rows_staged<Cfg, T>(dk, p.scale, &maps.dk, epi, n0 + 64 * g, tile.bh_kv, g, warp, lane());
    } else {
      const size_t kv_base = static_cast<size_t>(tile.bh_kv) * p.seq_len_kv * kHeadDim;
      store_rows_direct<Cfg, T>(dk, p.scale, fc::tensor<T>(b.dk) + kv_base, n0, p.seq_len_kv, key_row());
      store_rows_direct<Cfg, T>(dv, 1.f, fc::tensor<T>(b.dv) + kv_base, n0, p.seq_len_kv, key_row());
    }
  }
  if (Cfg::kEpiStaged && tid0) fc::tma_store_wait<0>();  // the last tile's dK, dV written before the CTA ends
}

template <int kHeadDim, int kBlockM, typename T, bool kSoftcap>
__global__ void __launch_bounds__(BwdConfig<kHeadDim, kBlockM>::kThreads, 1)
    v12_bwd(const FlashcoreBackwardParams b, const Workspace w, const __grid_constant__ BwdMaps maps) {
  using Cfg = BwdConfig<kHeadDim, kBlockM>;
  if (threadIdx.x == 0) {
    BwdBarriers& bars = bwd_barriers<Cfg>();
    fc::mbarrier_init(&bars.kv_full, 1);
    fc::mbarrier_init(&bars.kv_empty, fc::kWarpgroupThreads * Cfg::kConsumers);
    for (int s = 0; s < 2; ++s) {
      fc::mbarrier_init(&bars.full[s], 1);
      fc::mbarrier_init(&bars.empty[s], fc::kWarpgroupThreads * Cfg::kConsumers);
      fc::mbarrier_init(&bars.ds_full[s], fc::kWarpgroupThreads * Cfg::kConsumers);
      fc::mbarrier_init(&bars.ds_empty[s], fc::kWarpgroupThreads * Cfg::kConsumers);
      fc::mbarrier_init(&bars.tile_full[s], 1);
      fc::mbarrier_init(&bars.tile_empty[s], kTileReaders);
    }
    fc::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x < fc::kWarpgroupThreads) {
    fc::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) bwd_producer<Cfg>(b, w, maps);
    if (threadIdx.x == 64) bwd_kv_loader<Cfg>(b.fwd, maps);
    if (threadIdx.x / 32 == 1) bwd_dq_writer<Cfg>(b, maps);
    return;
  }
  fc::setmaxnreg_inc<Cfg::kConsumerRegs>();
  bwd_consumer<Cfg, T, kSoftcap>(b, w, maps);
}
