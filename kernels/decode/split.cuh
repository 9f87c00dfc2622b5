// decode/split.cuh — the split-KV plan of the decode rung (decode/decode.cu): how many CTAs share the keys of one
// K/V head, which key tiles each of them streams, and where its partial result goes. Host and device code
// alike (__host__ __device__), so the launcher, the workspace size and the kernel read one plan, and a host
// program (tests/fixtures/hosts/decode_split.cu) checks it over many shapes without a GPU.
//
// Work: a group is the G = H / H_kv query heads that read one K/V head, times their S query rows: M = G * S
// rows, row r = g * S + i (head g of the group, query i), which is also the row's place in q, o and lse
// ([B, H, S, ...] flattened: the group's rows are contiguous). A group is cut into m-blocks of block_m rows;
// the keys its rows see (visible_range: the whole cache, or under a window only the window's keys) into tiles of
// block_n keys, aligned to block_n from key 0, and the tiles into `splits` runs of tiles_per_split (the last one
// may be shorter, none is empty). One CTA takes one (K/V head, split, m-block).
#pragma once

#include "flashcore.h"

// Knobs for `flashcore tune decode` (-DNAME=value; variants.yaml's tune block); each default is the shipped value.
#ifndef DECODE_SPLITS
#define DECODE_SPLITS 0  // splits per K/V head: 0 = plan_split's cost model (shipped), N > 0 forces N (clamped)
#endif
#ifndef DECODE_OVERHEAD_TILES
#define DECODE_OVERHEAD_TILES 2  // the cost model's kCtaOverheadTiles, in key tiles (shipped: 2)
#endif
#ifndef DECODE_KCOMBINE_TILES
#define DECODE_KCOMBINE_TILES 2  // the cost model's kCombineTiles, in key tiles (shipped: 2)
#endif

namespace fc::decode {

// The split count's search space and cost model, in units of one key tile streamed by one CTA.
constexpr int kMinSplitTiles = 4;  // a split streams at least this many tiles (fewer: the fill dominates)
constexpr int kMaxSplits = 256;    // partials per row the combine reads, at most
// a CTA's fixed cost: the ring's first fill, Q_i, the merge and its stores
constexpr int kCtaOverheadTiles = DECODE_OVERHEAD_TILES;
constexpr int kCombineTiles = DECODE_KCOMBINE_TILES;  // the combine after a split launch (partials in L2, a launch)
constexpr int kForcedSplits = DECODE_SPLITS;          // 0: the cost model picks; N > 0: plan_split takes N
static_assert(kForcedSplits >= 0 && kCtaOverheadTiles >= 0 && kCombineTiles >= 0, "decode knobs are >= 0");

// The keys query i (0 <= i < S, any head) sees, [first, last] within [0, S_kv): flashcore.h's window about its
// diagonal key i + S_kv - S (bottom-right; causal is the window (-1, 0)); first > last when it sees none. Both
// edges grow with i. Compared before they are added, so that no window up to 2^31 - 1 overflows.
struct RowKeys {
  int first, last;
};

__host__ __device__ inline RowKeys row_keys(const FlashcoreParams& p, int i) {
  const int diag = i + p.seq_len_kv - p.seq_len, last = p.seq_len_kv - 1;
  const int left = p.window_left, right = p.causal ? 0 : p.window_right;
  RowKeys k;
  k.first = left < 0 || left >= diag ? 0 : diag - left;
  k.last = right < 0 || right >= last - diag ? last : diag + right;
  return k;
}

// The keys a group's rows see between them, [begin, end): query 0's first key to query S - 1's last, which is
// S_kv - 1. (Query 0 sees none only when S > S_kv, a cache of one tile: then begin = 0 costs nothing.)
__host__ __device__ inline Range visible_range(const FlashcoreParams& p) {
  return {row_keys(p, 0).first, row_keys(p, p.seq_len - 1).last + 1};
}

// The query head (0 .. H - 1) of row r of K/V head kv_head's group (b * H_kv + h_kv): h_kv * G + r / S.
__host__ __device__ inline int query_head(const FlashcoreParams& p, int kv_head, int r) {
  return kv_head % p.heads_kv * (p.heads / p.heads_kv) + r / p.seq_len;
}

struct Split {
  int kv_heads;         // B * H_kv
  int rows;             // M = G * S: the query rows of one group
  int m_blocks;         // ceil(M / block_m)
  int tile_first;       // the first key tile the group's rows see: visible_range's begin / block_n
  int tiles;            // key tiles from tile_first to the last visible key's (0 only for an empty range)
  int tiles_per_split;  // the last split may have fewer
  int splits;           // CTAs along the keys of one (K/V head, m-block); 1: no combine, O written directly

  __host__ __device__ long long ctas() const { return static_cast<long long>(kv_heads) * m_blocks * splits; }
};

// What one CTA does, from its linear index: m-block fastest (the CTAs that read the same K/V tiles run
// side by side and share them in L2), then split, then K/V head. A 1-D grid: B * H_kv may exceed 65535.
struct CtaWork {
  int kv_head;     // b * H_kv + h_kv
  int split;
  int row0;        // first row of the m-block within the group, a multiple of block_m
  int tile_begin;  // key tiles [tile_begin, tile_end), counted from key 0 (tile t: keys t * block_n ..)
  int tile_end;
};

// (The launcher refuses grids past INT_MAX CTAs, so the index is an int.)
__host__ __device__ inline CtaWork cta_work(const Split& plan, int cta, int block_m) {
  CtaWork w;
  const int m_block = cta % plan.m_blocks;
  const int rest = cta / plan.m_blocks;
  w.split = rest % plan.splits;
  w.kv_head = rest / plan.splits;
  w.row0 = m_block * block_m;
  const int begin = w.split * plan.tiles_per_split;
  w.tile_begin = plan.tile_first + begin;
  w.tile_end = plan.tile_first + (begin + plan.tiles_per_split < plan.tiles ? begin + plan.tiles_per_split : plan.tiles);
  return w;
}

// The split count. Each candidate count s is costed as waves * (tiles per split + kCtaOverheadTiles), plus
// kCombineTiles when s > 1, with waves = ceil(CTAs / slots) and slots = SMs * CTAs per SM; the cheapest
// wins, ties to the fewer splits. Counts that give the same tiles per split as a smaller one are skipped, so
// no split is ever empty. E.g. on 132 SMs x 2 (D = 128, 64-key tiles): B 8, H_kv 8, S_kv 8192 -> 4 splits of
// 32 tiles (256 CTAs, one wave); B 64, S_kv 4096 -> 1 (512 CTAs in two waves beat 1024 in four); B 1, H_kv 8,
// S_kv 131072 -> 33 splits of 63 tiles (264 CTAs). With DECODE_SPLITS = N > 0 the model is bypassed: N splits,
// clamped to the tiles and kMaxSplits, then to the most that leave no split empty (kMinSplitTiles not applied).
// The keys are [key_begin, key_end) (visible_range): a window of 4096 keys over a 131072-key cache is planned,
// launched and streamed as a 4096-key cache would be (65 tiles where the window's 4097 keys cross a tile edge).
__host__ __device__ inline Split plan_split(int kv_heads, int rows, int key_begin, int key_end, int block_m,
                                            int block_n, int slots) {
  Split plan;
  plan.kv_heads = kv_heads;
  plan.rows = rows;
  plan.m_blocks = ceil_div(rows, block_m);
  plan.tile_first = key_begin < key_end ? key_begin / block_n : 0;
  plan.tiles = key_begin < key_end ? ceil_div(key_end, block_n) - plan.tile_first : 0;
  plan.tiles_per_split = plan.tiles;
  plan.splits = 1;
  if (plan.tiles == 0) return plan;  // no row sees a key: one CTA per m-block writes O = 0 and the LSE
  if (kForcedSplits > 0) {
    const int at_most = plan.tiles < kMaxSplits ? plan.tiles : kMaxSplits;
    plan.tiles_per_split = ceil_div(plan.tiles, kForcedSplits < at_most ? kForcedSplits : at_most);
    plan.splits = ceil_div(plan.tiles, plan.tiles_per_split);
    return plan;
  }
  const long long groups = static_cast<long long>(kv_heads) * plan.m_blocks;
  const int by_size = plan.tiles / kMinSplitTiles;
  const int most = by_size < 1 ? 1 : by_size < kMaxSplits ? by_size : kMaxSplits;
  long long best_cost = -1;
  for (int s = 1; s <= most; ++s) {
    const int per_split = ceil_div(plan.tiles, s);
    if (ceil_div(plan.tiles, per_split) != s) continue;  // an empty split: s - 1 runs cover the tiles
    const long long waves = (groups * s + slots - 1) / slots;
    const long long cost = waves * (per_split + kCtaOverheadTiles) + (s > 1 ? kCombineTiles : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      plan.tiles_per_split = per_split;
      plan.splits = s;
    }
  }
  return plan;
}

// The whole cache, keys [0, seq_len_kv): no window.
__host__ __device__ inline Split plan_split(int kv_heads, int rows, int seq_len_kv, int block_m, int block_n,
                                            int slots) {
  return plan_split(kv_heads, rows, 0, seq_len_kv, block_m, block_n, slots);
}

// A split's partial result for one query row, in the forward workspace (splits > 1 only): [B * H * S rows]
// [splits] records of head_dim + 4 floats: the unnormalised O row, then m (the row max times scale * log2 e;
// -inf when the split saw no key of the row), l (sum of the rounded P that O summed), l_fp32 (sum of the
// unrounded P: the LSE's), and one float of padding so that records stay 16-byte aligned.
__host__ __device__ inline int record_floats(int head_dim) { return head_dim + 4; }

__host__ __device__ inline size_t record_offset(const Split& plan, long long row, int split, int head_dim) {
  return (static_cast<size_t>(row) * plan.splits + split) * record_floats(head_dim);
}

__host__ __device__ inline size_t workspace_bytes(const Split& plan, int head_dim) {
  if (plan.splits == 1) return 0;
  return static_cast<size_t>(plan.kv_heads) * plan.rows * plan.splits * record_floats(head_dim) * sizeof(float);
}

}  // namespace fc::decode
