// sm90/v12_bwd_traits.cuh — v12's backward configuration: BwdConfig (head dim, queries per step; keys per tile, the
// warpgroups, the register split, how the two consumers share dQ_i, the shared-memory layout), the mbarriers and
// tensor maps a CTA holds, the tile list and a tile's steps. Read by sm90/mainloop_bwd_sm90.cuh and sm90/v12_bwd.cu.
#pragma once

#include "common/bwd_passes.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"

#include <climits>

struct BwdBarriers {
  uint64_t kv_full, kv_empty;     // the tile's K_j and V_j landed / read by both consumers' last products
  uint64_t full[2], empty[2];     // a stage's Q_i, dO_i, LSE_i, D_i landed / read by both consumers
  uint64_t ds_full[2], ds_empty[2];  // dS buffer b stored / read by both consumers' dQ products (the dQ lag)
  uint64_t tile_full[2], tile_empty[2];  // the tile of round r in tile_slot[r % 2] / read by every other role
  int tile_slot[2];
};

template <int kHeadDim_, int kBlockM_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: queries per step
  static constexpr int kBlockN = 128;       // Bc: keys per tile, 64 per consumer warpgroup (wgmma's M)
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = fc::kWarpgroupThreads * (1 + kConsumers);  // + the producer warpgroup
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(fc::setmaxnreg_fits(kThreads, kProducerRegs, kConsumerRegs, kConsumers),
                "setmaxnreg: the warpgroups' registers exceed the CTA's launch pool (the .inc would hang)");
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte panels of 64 columns per row
  // dQ_i = dS K_j (kBlockM x D) is split between the two consumers as two wgmma tiles: by rows where the step
  // has 128 queries (D = 64), by columns where it has 64 (D = 128), each 64 x 64. Consumer g's tile covers query
  // rows 64 row_half(g) .. + kDqRows, columns 64 col_half(g) .. + 64.
  static constexpr bool kDqByRows = kBlockM == 128;
  static constexpr int kDqRows = kDqByRows ? 64 : kBlockM;  // query rows of one consumer's dQ tile
  static constexpr int kDqRegs = kDqRows * 64 / fc::kWarpgroupThreads;  // its fp32 accumulators per thread
  static_assert((kDqByRows ? kHeadDim : kHeadDim / 2) == 64 && kDqRows == 64,
                "dQ: two tiles of 64 columns, 64 query rows");
  // Shared memory, every tile 1024-byte aligned (the swizzle atom): K_j | V_j | (Q_i, dO_i) x 2 stages |
  // dS x 2 | dQ staging x 2 consumers | (LSE_i log2 e, D_i) x 2 stages | mbarriers | a dK/dV staging tile per
  // consumer (dV, then dK through it; where it fits: kEpiStaged).
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
  static constexpr int kEpiOffset = (kBarOffset + 128 + 1023) / 1024 * 1024;  // BwdBarriers, to the swizzle atom
  static constexpr int kEpiBytes = 64 * kHeadDim * 2;   // one consumer's dK or dV rows: kPanels panels of [64][128 B]
  static constexpr bool kEpiStaged = kEpiOffset + kConsumers * kEpiBytes + 1024 <= 227 * 1024;
  static constexpr int kSmemBytes =  // + alignment slack
      (kEpiStaged ? kEpiOffset + kConsumers * kEpiBytes : kBarOffset + 128) + 1024;
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0 && kDqBytes % 2048 == 0,
                "swizzle alignment");
  static_assert(kBlockM % 16 == 0 && kPadRows % kBlockM == 0,
                "whole k-steps; LSE_i, D_i within the padded rows");
  static_assert(kBarOffset % 8 == 0 && sizeof(BwdBarriers) <= 128, "mbarriers");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory: at most 227 KB per block on sm_90");
};

struct BwdMaps {
  CUtensorMap q, d_o, k, v;  // 128-byte panels (common/hopper.cuh's encode_panel_map)
  CUtensorMap dq;            // the fp32 dQ accumulator [B * H][S][D], boxes of 32 columns x 64 rows
  CUtensorMap dk, dv;        // the gradients [B * H_kv][S_kv][D], 128-byte panels, boxes of 64 rows (kEpiStaged)
};

// The window as the backward reads it (the launcher applies this to the params it passes): an edge that hides no key
// from any row becomes -1 (unbounded): the left one where window_left >= S_kv - 1, the right one where
// window_right >= S - 1 (causal with one query row among them). Such a window then takes the unmasked path, and every
// sum of an edge and a position below (fc::visible_rows, fc::fully_visible_keys, bwd_query_bounds) stays within int
// for the edges up to 2^31 - 1 the binding admits. p.causal is not read past this point.
__host__ __device__ inline void bwd_normalize_window(FlashcoreParams& p) {
  if (p.window_left >= p.seq_len_kv - 1) p.window_left = -1;
  if (p.window_right >= p.seq_len - 1) p.window_right = -1;
}

// The CTAs are persistent, one per SM (at most one per tile); a tile is one block of 128 keys of one K/V head. CTA c
// starts with tile c; its producer claims each next one from the workspace's counter (#CTAs + the count so far) as
// it issues its tile's last stage, about two steps before the consumers finish it, and hands it to the CTA's other
// roles through shared memory (sm90/producer_bwd_sm90.cuh: bwd_publish_tile, bwd_take_tile). The list: without a
// mask, head-major, a head's key blocks side by side, so the tiles running at once walk few heads' Q, dO and dQ
// through L2 together; causal or windowed, heads in groups of max(1, #CTAs / key blocks), each group's tiles heaviest
// first: claimed in that order the CTAs' loads even out as a longest-first greedy's do, while the tiles running at
// once still come from about two groups. A tile's query blocks (bwd_steps) shrink with its key block where the window
// has a right edge (causal: every head's key block 0, which the most query blocks see, then block 1, ...; with a left
// edge too they are as many for every block but the last few, which are lighter), and grow with it where it has only
// a left edge: the list walks key blocks from the last there.
struct BwdTile {
  int n_block, bh_kv;
};

template <int kBlockN>
__host__ __device__ inline int bwd_tiles(const FlashcoreParams& p) {
  return fc::ceil_div(p.seq_len_kv, kBlockN) * p.batch * p.heads_kv;
}

template <int kBlockN>
__host__ __device__ inline BwdTile bwd_tile_at(const FlashcoreParams& p, int t, int ctas) {
  const unsigned u = t, n_blocks = fc::ceil_div(p.seq_len_kv, kBlockN), heads = p.batch * p.heads_kv;
  if (!fc::masked(p)) return {static_cast<int>(u % n_blocks), static_cast<int>(u / n_blocks)};
  const unsigned group = max(1u, ctas / n_blocks), per_group = group * n_blocks, g0 = u / per_group * group;
  const unsigned r = u % per_group, size = min(group, heads - g0), n = r / size;
  return {static_cast<int>(p.window_right < 0 ? n_blocks - 1 - n : n), static_cast<int>(g0 + r % size)};
}

// The steps of the tile of key block n_block of K/V head bh_kv (b * H_kv + h_kv): every query head of that head's
// group, and in each the query blocks that hold a row that sees any of its keys (fc::visible_rows: from the first row
// whose right edge reaches the block's first key to the last whose left edge reaches its last; both edges
// bottom-right). Host and device: tests/fixtures/hosts/v12_bwd_steps.cu checks them. The producer, the dQ warp and
// the consumers each walk these steps: they agree on every tile's count, or the stages' barriers deadlock. A tile
// that no row sees has none: its dK and dV are stored as zeros.
struct BwdSteps {
  int bh0, m_first, m_blocks, count;
  __host__ __device__ int bh(int step) const { return bh0 + step / m_blocks; }
  __host__ __device__ int m0(int step, int block_m) const { return (m_first + step % m_blocks) * block_m; }
  // From step's (bh, query block m) to the next step's, without bh() and m0()'s divisions (the producer's 24
  // registers): bh(step + 1) and m0(step + 1) / block_m.
  __host__ __device__ void advance(int& bh, int& m) const {
    if (++m == m_first + m_blocks) {
      m = m_first;
      ++bh;
    }
  }
};

template <int kBlockN, int kBlockM>
__host__ __device__ inline BwdSteps bwd_steps(const FlashcoreParams& p, int n_block, int bh_kv) {
  const int n0 = n_block * kBlockN, group = p.heads / p.heads_kv;
  const fc::Range rows = fc::visible_rows(p, n0, min(n0 + kBlockN, p.seq_len_kv));
  BwdSteps st;
  const unsigned kv = bh_kv, heads_kv = p.heads_kv;  // (unsigned: the producer's registers)
  st.bh0 = static_cast<int>(kv / heads_kv) * p.heads + static_cast<int>(kv % heads_kv) * group;
  st.m_first = rows.begin / kBlockM;  // (rows.begin >= 0)
  st.m_blocks = rows.begin < rows.end ? fc::ceil_div(rows.end, kBlockM) - st.m_first : 0;
  st.count = st.m_blocks * group;
  return st;
}

// Whether a consumer's 64 keys from first_key need the per-element mask against the query block at m0: some key
// lies outside some query's window (right of its right edge, causal's diagonal, or left of its left edge), or past
// S_kv. Keys past S_kv load as zeros (score 0), and unmasked their P = exp2(-LSE) would overflow the 16-bit P and dS
// for a row whose LSE is below about -11 (fp16: a softcapped row of saturated negative scores, one that sees few
// keys), and dS K_j's zero rows make that NaN in dQ: masked, they add nothing. Queries past S need none: their Q,
// dO rows load as zeros and their LSE is +inf (P = 0). A query that sees no key at all (its LSE +inf, or its sink's)
// is masked wherever it is.
template <int kBlockM>
__host__ __device__ inline bool bwd_needs_mask(const FlashcoreParams& p, int first_key, int m0) {
  if (first_key + 64 > p.seq_len_kv) return true;
  if (!fc::masked(p)) return false;
  const fc::Range all = fc::fully_visible_keys(p, m0, min(m0 + kBlockM, p.seq_len));
  return first_key < all.begin || first_key + 64 > all.end;
}

// The queries that see key `key` (fc::key_visible solved for the row): [first, last], INT_MIN / INT_MAX where the
// window has no such edge; none (first > last) for a key past S_kv. A consumer thread takes these once per key of its
// fragment on a masked step.
struct BwdQueryBounds {
  int first, last;
};
__host__ __device__ __forceinline__ BwdQueryBounds bwd_query_bounds(const FlashcoreParams& p, int key) {
  const int diag = key - fc::causal_offset(p);  // the query whose diagonal holds this key
  const int past = (p.seq_len_kv - 1 - key) >> 31;  // -1 for a key past S_kv, else 0 (no select: 0 spills at D = 64)
  return {p.window_right < 0 ? INT_MIN : diag - p.window_right,
          min(p.window_left < 0 ? INT_MAX : diag + p.window_left, past ^ INT_MAX)};
}

// The same per tile: the steps whose first query row m0 lies in [first, last] need no mask for a consumer's 64 keys
// from first_key (none where first > last): a step tests m0 against two bounds taken once per tile.
// bwd_needs_mask(p, first_key, m0) == !(first <= m0 <= last) for every m0 < S (the host check holds them to it).
template <int kBlockM>
__host__ __device__ inline BwdQueryBounds bwd_unmasked_steps(const FlashcoreParams& p, int first_key) {
  if (first_key + 64 > p.seq_len_kv) return {INT_MAX, INT_MIN};  // keys past S_kv: every step
  if (!fc::masked(p)) return {INT_MIN, INT_MAX};
  const int off = fc::causal_offset(p);
  // the right edge: the step's first row sees the last key; the left edge: its last row (within S) sees the first
  const int first = p.window_right < 0 ? INT_MIN : first_key + 63 - off - p.window_right;
  const int last_row = first_key - off + p.window_left;  // the last row whose left edge reaches first_key
  const int last = p.window_left < 0 || last_row >= p.seq_len - 1 ? INT_MAX : last_row - kBlockM + 1;
  return {first, last};
}

using BwdCfg64 = BwdConfig<64, 128>;
using BwdCfg128 = BwdConfig<128, 64>;
