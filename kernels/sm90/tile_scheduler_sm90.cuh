// sm90/tile_scheduler_sm90.cuh — v12's tile scheduler: the work list of items (query rows of one head), dealt to
// persistent CTAs in snake rounds, the key tiles each item reads and masks (bottom-right causal, S_kv), the K/V
// head of a query head (grouped-query), and on the host the planner that picks the kernel and the list by
// replaying the rounds. Host and device alike (tests/fixtures/hosts/v12_items.cu checks it without a GPU).
#pragma once

#include "flashcore.h"
#include "sm90/v12_traits.cuh"

#include <algorithm>
#include <mutex>
#include <vector>

// The work: a list of items, `big` items of kBlockM query rows per head, every head's, then `small` items of
// kBlockM - 64 rows per head (mixed grids only, D = 64: three consumers, so the small items run with one
// fewer and fill the last round). The CTAs are persistent, one per SM, and deal the list out in rounds that
// alternate direction: in round r CTA c runs item r * #CTAs + c (r even) or r * #CTAs + #CTAs - 1 - c (r odd).
// Causal lists go longest first, so the snake pairs a CTA's heavy items with light ones (2,16,4096 causal, the
// busiest CTA's load in 128-row tiles: 144 dealt straight, 128 by the snake, 128 the mean).
struct Items {
  int big, small;  // items per head
};

// One item: its head, first query row and how many consumers have rows in it (64 each).
struct Item {
  int bh, m0, consumers;
};

__host__ __device__ __forceinline__ int snake_index(int round, int cta, int ctas) {
  return round * ctas + ((round & 1) ? ctas - 1 - cta : cta);
}

template <int kBlockM>
__host__ __device__ __forceinline__ Item item_at(const FlashcoreParams& p, Items items, int index) {
  const int heads = p.batch * p.heads;
  Item it;
  int rows = kBlockM;
  if (index < items.big * heads) {
    if (p.causal) {  // longest rows first, across every head: the last round gets the light items
      it.m0 = (items.big - 1 - index / heads) * kBlockM;
      it.bh = index % heads;
    } else {  // a head's query tiles side by side: they walk its K and V together through L2
      it.bh = index / items.big;
      it.m0 = (index % items.big) * kBlockM;
    }
  } else {
    index -= items.big * heads;
    rows = kBlockM - 64;
    it.bh = index / items.small;
    it.m0 = items.big * kBlockM + (index % items.small) * rows;
  }
  it.consumers = min(rows, p.seq_len - it.m0 + 63) / 64;  // a consumer whose 64 rows all lie past S sits out
  return it;
}

// K/V tiles an item reads: every tile of S_kv keys, or (causal) those left of its last row's diagonal, which
// the offset S_kv - S shifts; none when S > S_kv and its rows all lie above the first key's diagonal.
template <int kBlockN>
__host__ __device__ __forceinline__ int item_tiles(const FlashcoreParams& p, const Item& it) {
  const int keys = p.causal ? min(p.seq_len_kv, it.m0 + 64 * it.consumers + fc::causal_offset(p)) : p.seq_len_kv;
  return fc::ceil_div(max(keys, 0), kBlockN);
}

// Whether K/V tile n needs the mask for a warpgroup whose first row sees keys up to first_diag (its row +
// S_kv - S): the tile reaches past S_kv or (causal) right of that diagonal. Every other tile is visible whole
// to each of the warpgroup's rows.
template <int kBlockN>
__host__ __device__ __forceinline__ bool tile_needs_mask(const FlashcoreParams& p, int n, int first_diag) {
  const int last_col = (n + 1) * kBlockN - 1;
  return last_col >= p.seq_len_kv || (p.causal && last_col > first_diag);
}

// The K/V head of query head bh = b * H + h (grouped-query: H / H_kv query heads share one): b * H_kv + h / (H /
// H_kv), which is bh / (H / H_kv) since H_kv divides H.
__host__ __device__ __forceinline__ int kv_head(const FlashcoreParams& p, int bh) {
  return bh / (p.heads / p.heads_kv);
}

// D = 64's grid. Three consumers (192 rows) do more per SM than two: a 192-row item takes ~1.33x a 128-row
// one (measured 1.32-1.37x), but 192-row items quantize the work into fewer, longer rounds. So the item list
// is chosen by replaying the persistent CTAs' rounds (snake_index) with those costs: the
// plan whose busiest CTA finishes first wins (ties: the plain 2-consumer list). Candidates: plain lists of
// 128 or 192 rows, and mixed lists that end every head with 128-row items instead of its last k 192-row ones.
struct Plan {
  int consumers;  // 1, 2 or 3: the kernel
  Items items;
};

template <int kBlockM>
static double items_makespan(const FlashcoreParams& p, Items items, int sms) {
  static constexpr double kCost[4] = {0.0, 0.7, 1.0, 1.33};  // by consumers with rows, in 128-row item times
  const int num_items = (items.big + items.small) * p.batch * p.heads;
  const int ctas = std::min(num_items, sms);
  std::vector<double> busy(ctas, 0.0);  // each persistent CTA's total
  for (int round = 0; round * ctas < num_items; ++round)
    for (int cta = 0; cta < ctas; ++cta) {
      const int index = snake_index(round, cta, ctas);
      if (index < num_items) busy[cta] += kCost[item_at<kBlockM>(p, items, index).consumers];
    }
  return *std::max_element(busy.begin(), busy.end());
}

static Plan plan_d64(const FlashcoreParams& p) {
  const int sms = fc::sm_count();
  const long bh = static_cast<long>(p.batch) * p.heads;
  const int tiles128 = fc::ceil_div(p.seq_len, 128), tiles192 = fc::ceil_div(p.seq_len, 192);
  Plan plain2 = {2, {tiles128, 0}}, plain3 = {3, {tiles192, 0}};
  // One wave of 64-row items (1,8,512,64: 64 CTAs): the one-consumer kernel. Past one wave it lost: 2,8,1024,64
  // (256 items, two rounds) 21.6 us against 16.8 for one round of 128 two-consumer items.
  const int tiles64 = fc::ceil_div(p.seq_len, 64);
  if (bh * tiles64 <= sms) return {1, {tiles64, 0}};
  if (p.causal) return tiles192 * bh >= 8L * sms ? plain3 : plain2;  // causal: 336 vs 343 TFLOP/s at 4096 rows
  if (bh * tiles128 > 24L * sms) return plain3;  // 24+ waves: quantization is noise, 192 rows win per SM
  // The last plan asked for, kept: replaying ~10 plans of up to 24 rounds costs tens of microseconds a call.
  static std::mutex mutex;
  static long last_key[3] = {-1, -1, -1};
  static Plan last_plan;
  const std::lock_guard<std::mutex> lock(mutex);
  if (last_key[0] == bh && last_key[1] == p.seq_len && last_key[2] == sms) return last_plan;
  Plan best = plain2;
  double best_time = items_makespan<128>(p, plain2.items, sms);
  auto consider = [&](Plan plan) {
    const double t = items_makespan<192>(p, plan.items, sms);
    if (t < best_time - 1e-9) best = plan, best_time = t;
  };
  consider(plain3);
  for (int k = 1; k <= 8 && p.seq_len / 192 - k >= 1; ++k) {
    const int big = p.seq_len / 192 - k;
    consider({3, {big, fc::ceil_div(p.seq_len - 192 * big, 128)}});
  }
  last_key[0] = bh, last_key[1] = p.seq_len, last_key[2] = sms;
  last_plan = best;
  return best;
}

// The kernel (consumers) and work list for these parameters; D = 128 always takes plain 128-row items.
static Plan plan_for(const FlashcoreParams& p) {
  return p.head_dim == 64 ? plan_d64(p) : Plan{2, {fc::ceil_div(p.seq_len, 128), 0}};
}
