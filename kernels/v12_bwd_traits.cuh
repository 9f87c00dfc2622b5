// v12_bwd_traits.cuh — v12's backward configuration: BwdConfig (head dim, queries per step; keys per CTA, the
// warpgroups, the register split, how the two consumers share dQ_i, the shared-memory layout), the mbarriers and
// tensor maps a CTA holds. Read by mainloop_bwd_sm90.cuh and v12_bwd.cu.
#pragma once

#include "bwd_passes.cuh"
#include "flashcore.h"
#include "hopper.cuh"

struct BwdBarriers {
  uint64_t kv_full;               // K_j and V_j landed (once)
  uint64_t full[2], empty[2];     // a stage's Q_i, dO_i, LSE_i, D_i landed / read by both consumers
  uint64_t ds_full[2], ds_empty[2];  // V12_BWD_DQ_LAG: dS buffer b stored / read by both consumers' dQ products
};

template <int kHeadDim_, int kBlockM_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: queries per step
  static constexpr int kBlockN = 128;       // Bc: keys per CTA, 64 per consumer warpgroup (wgmma's M)
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = fc::kWarpgroupThreads * (1 + kConsumers);  // + the producer warpgroup
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "register file");
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte panels of 64 columns per row
  // dQ_i = dS K_j (kBlockM x D) is split between the two consumers as two wgmma tiles: by rows where the step
  // has 128 queries (D = 64), by columns where it has 64 (D = 128), each 64 x 64; and where it has 80 (D = 128,
  // FlashAttention-3's step there), transposed: consumer g computes dQ_i^T's 64 rows 64 g.. (columns of dQ_i) x 80
  // queries as K_j^T dS^T (wgmma's M must be 64: 80 query rows cannot be its M). Consumer g's tile covers query
  // rows 64 row_half(g) .. + kDqRows, columns 64 col_half(g) .. + 64.
  static constexpr bool kDqByRows = kBlockM == 128;
  static constexpr bool kDqSwapAB = kBlockM == 80;
  static constexpr int kDqRows = kDqByRows ? 64 : kBlockM;  // query rows of one consumer's dQ tile
  static constexpr int kDqRegs = kDqRows * 64 / fc::kWarpgroupThreads;  // its fp32 accumulators per thread
  static_assert((kDqByRows ? kHeadDim : kHeadDim / 2) == 64 && (kDqSwapAB || kDqRows == 64),
                "dQ: two tiles of 64 columns, 64 query rows (or dQ^T's 80)");
  // Shared memory, every tile 1024-byte aligned (the swizzle atom): K_j | V_j | (Q_i, dO_i) x 2 stages |
  // dS x 2 | dQ staging x 2 consumers | (LSE_i log2 e, D_i) x 2 stages | mbarriers.
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // K_j or V_j: kPanels panels of [kBlockN][128 B]
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // Q_i or dO_i: kPanels panels of [kBlockM][128 B]
  static constexpr int kDsBytes = kBlockM * kBlockN * 2;   // dS (queries x keys): 2 panels of [kBlockM][128 B]
  static constexpr int kDqBytes = kDqRows * 64 * 4;  // one consumer's dQ tile: 2 panels of [kDqRows][32 fp32]
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVBytes;
  static constexpr int kQOffset = kVOffset + kKVBytes;     // stage s at + s * kQBytes
  static constexpr int kDoOffset = kQOffset + 2 * kQBytes;
  static constexpr int kDsOffset = kDoOffset + 2 * kQBytes;  // buffer b at + b * kDsBytes
  static constexpr int kDqOffset = kDsOffset + 2 * kDsBytes;  // consumer g at + g * kDqBytes
  static constexpr int kStatsOffset = kDqOffset + kConsumers * kDqBytes;  // stage s: lse2 [kBlockM], dsum [kBlockM]
  static constexpr int kStatsBytes = 2 * kBlockM * 4;
  static constexpr int kBarOffset = kStatsOffset + 2 * kStatsBytes;
  static constexpr int kSmemBytes = kBarOffset + 128 + 1024;  // BwdBarriers, + alignment slack
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0 && kDqBytes % 2048 == 0,
                "swizzle alignment");
  static_assert(kBlockM % 16 == 0 && (kPadRows % kBlockM == 0 || kBlockM == kPadRows80),
                "whole k-steps; LSE_i, D_i within the padded rows");
  static_assert(kBarOffset % 8 == 0 && sizeof(BwdBarriers) <= 128, "mbarriers");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory: at most 227 KB per block on sm_90");
};

struct BwdMaps {
  CUtensorMap q, d_o, k, v;  // 128-byte panels (hopper.cuh's encode_panel_map)
  CUtensorMap dq;            // the fp32 dQ accumulator [B * H][S][D], boxes of 32 columns x 64 rows
};

// The steps of the CTA of key block n_block of K/V head bh_kv (b * H_kv + h_kv): every query head of that head's
// group, and in each the query blocks that see any of its keys (causal, bottom-right: from the first row i with
// i + S_kv - S >= the block's first key). Host and device: tests/fixtures/hosts/v12_bwd_steps.cu checks them.
struct BwdSteps {
  int bh0, m_first, m_blocks, count;
  __host__ __device__ int bh(int step) const { return bh0 + step / m_blocks; }
  __host__ __device__ int m0(int step, int block_m) const { return (m_first + step % m_blocks) * block_m; }
};

template <int kBlockN, int kBlockM>
__host__ __device__ inline BwdSteps bwd_steps(const FlashcoreParams& p, int n_block, int bh_kv) {
  const int n0 = n_block * kBlockN, group = p.heads / p.heads_kv, first_row = n0 - fc::causal_offset(p);
  BwdSteps st;
  st.bh0 = (bh_kv / p.heads_kv) * p.heads + (bh_kv % p.heads_kv) * group;
  st.m_first = p.causal && first_row > 0 ? first_row / kBlockM : 0;
  st.m_blocks = fc::ceil_div(p.seq_len, kBlockM) - st.m_first;
  st.count = st.m_blocks > 0 ? st.m_blocks * group : 0;
  return st;
}

// Whether a consumer's 64 keys from first_key need the causal mask against the query block at m0: some key lies
// right of some query's diagonal (key > query + S_kv - S). Keys past S_kv and queries past S need none: their
// K, V, Q, dO rows load as zeros and their LSE is +inf, so what they add is zero or never stored.
__host__ __device__ inline bool bwd_needs_mask(const FlashcoreParams& p, int first_key, int m0) {
  return p.causal && first_key + 63 > m0 + fc::causal_offset(p);
}

using BwdCfg64 = BwdConfig<64, 128>;
using BwdCfg128 = BwdConfig<128, 64>;
using BwdCfg128x80 = BwdConfig<128, 80>;
