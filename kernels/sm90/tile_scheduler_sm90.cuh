// sm90/tile_scheduler_sm90.cuh — v12's tile scheduler: the work list of items (query rows of one head), dealt to
// persistent CTAs in snake rounds, the key tiles each item reads and masks (bottom-right causal or a window, S_kv),
// the K/V head of a query head (grouped-query), and on the host the planner that picks the kernel and the list by
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
// Lists whose items grow with their rows (causal, or any window bounded on the right only) go longest first, so
// the snake pairs a CTA's heavy items with light ones (2,16,4096 causal, the busiest CTA's load in 128-row tiles:
// 144 dealt straight, 128 by the snake, 128 the mean). A window bounded on the left gives every item about the same
// tiles (lighter ones only at a head's ends): its lists keep a head's items side by side, which share K/V in L2.
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

// Whether the list goes longest first: an item's key tiles grow with its rows (causal: window (-1, 0); (-1, w)).
__host__ __device__ __forceinline__ bool longest_first(const FlashcoreParams& p) {
  return p.window_left < 0 && p.window_right >= 0;
}

template <int kBlockM>
__host__ __device__ __forceinline__ Item item_at(const FlashcoreParams& p, Items items, int index) {
  const int heads = p.batch * p.heads;
  Item it;
  int rows = kBlockM;
  if (index < items.big * heads) {
    if (longest_first(p)) {  // longest rows first, across every head: the last round gets the light items
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

// K/V tiles an item reads, [begin, end) in tiles of kBlockN keys (fc::visible_keys over its consumers' rows, rows
// past S included): every tile of S_kv keys, or those its rows' window reaches (causal: left of its last row's
// diagonal, which the offset S_kv - S shifts); none (begin >= end) when its rows see no key (S > S_kv causal, a window
// past either end of the keys). The producer and every consumer walk exactly these.
template <int kBlockN>
__host__ __device__ __forceinline__ fc::Range item_key_tiles(const FlashcoreParams& p, const Item& it) {
  const fc::Range keys = fc::visible_keys(p, it.m0, it.m0 + 64 * it.consumers);
  if (keys.end <= keys.begin) return {0, 0};
  return {keys.begin / kBlockN, fc::ceil_div(keys.end, kBlockN)};
}

template <int kBlockN>
__host__ __device__ __forceinline__ int item_tiles(const FlashcoreParams& p, const Item& it) {
  const fc::Range tiles = item_key_tiles<kBlockN>(p, it);
  return tiles.end - tiles.begin;
}

// The key tiles consumer g's rows (64 from it.m0 + 64g, rows past S included) see: a part of item_key_tiles, since its
// rows are some of the item's; none (begin >= end) when they see no key. The consumer runs the GEMMs and softmax on
// these only and takes the item's other tiles' turns without them (with several consumers an item walks the union
// of their windows: at window 1024 a 192-row item reads 10 tiles and each consumer sees 9).
template <int kBlockN>
__host__ __device__ __forceinline__ fc::Range consumer_key_tiles(const FlashcoreParams& p, const Item& it, int g) {
  return item_key_tiles<kBlockN>(p, Item{it.bh, it.m0 + 64 * g, 1});
}

// The K/V tiles every row of a warpgroup (64 rows from first_row, rows past S included) sees whole: those need no
// mask. Every other tile of its item is masked: it reaches past S_kv, or a row's window cuts it (right of the
// diagonal under causal, or left of a left-bounded window's start). begin >= end: every tile is masked.
template <int kBlockN>
__host__ __device__ __forceinline__ fc::Range unmasked_tiles(const FlashcoreParams& p, int first_row) {
  const fc::Range keys = fc::fully_visible_keys(p, first_row, first_row + 64);
  if (keys.end <= keys.begin) return {0, 0};
  return {fc::ceil_div(keys.begin, kBlockN), keys.end / kBlockN};
}

// Whether K/V tile n needs the mask for a warpgroup whose first row sees keys up to first_diag (its row +
// S_kv - S): unmasked_tiles for that warpgroup.
template <int kBlockN>
__host__ __device__ __forceinline__ bool tile_needs_mask(const FlashcoreParams& p, int n, int first_diag) {
  const fc::Range whole = unmasked_tiles<kBlockN>(p, first_diag - fc::causal_offset(p));
  return n < whole.begin || n >= whole.end;
}

// Which tiles a warpgroup's mask (64 rows from first_row, rows past S included) needs which bound of, as
// [begin, end): tiles n >= begin start at or right of every row's first key (no left cut), tiles n < end end at or
// left of every row's end (no right cut; S_kv's included). A tile in both runs unmasked (exactly unmasked_tiles);
// one out of both needs both bounds. A row's first key and end grow with the row, hence the last row's first key
// and the first row's end.
template <int kBlockN>
__host__ __device__ __forceinline__ fc::Range mask_edges(const FlashcoreParams& p, int first_row) {
  const int begin = fc::visible_keys(p, first_row + 63, first_row + 64).begin;  // >= 0
  const int end = fc::visible_keys(p, first_row, first_row + 1).end;            // <= S_kv; < 0: a row sees none
  return {fc::ceil_div(begin, kBlockN), end < 0 ? -1 : end / kBlockN};
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
// 128 or 192 rows, and mixed lists that end every head with 128-row items instead of its last k 192-row ones. An
// item's cost is also in proportion to its key tiles (+ 1 for its Q_i, first S and epilogue): uniform without a
// window (the choice is the one by consumers alone), and what balances a windowed list. The tiles are those its
// busiest consumer computes (consumer_key_tiles), not the item's union, which a 192-row item widens by a tile.
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
      if (index >= num_items) continue;
      const Item it = item_at<kBlockM>(p, items, index);
      int tiles = 0;  // the most any of its consumers computes (consumer_key_tiles; the others' turns are cheap)
      for (int g = 0; g < it.consumers; ++g) {
        const fc::Range own = consumer_key_tiles<kKeysPerTile>(p, it, g);
        tiles = std::max(tiles, own.end - own.begin);
      }
      busy[cta] += kCost[it.consumers] * (tiles + 1);
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
  // causal: 336 vs 343 TFLOP/s at 4096 rows. A window bounded on the left is replayed below, by its items' tiles.
  if (p.causal && p.window_left < 0) return tiles192 * bh >= 8L * sms ? plain3 : plain2;
  if (bh * tiles128 > 24L * sms) return plain3;  // 24+ waves: quantization is noise, 192 rows win per SM
  // The last plan asked for, kept: replaying ~10 plans of up to 24 rounds costs tens of microseconds a call.
  static std::mutex mutex;
  static long last_key[6] = {-1, -1, -1, -1, -1, -1};
  static Plan last_plan;
  const std::lock_guard<std::mutex> lock(mutex);
  const long key[6] = {bh, p.seq_len, sms, p.seq_len_kv, p.window_left, p.window_right};
  if (std::equal(key, key + 6, last_key)) return last_plan;
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
  std::copy(key, key + 6, last_key);
  last_plan = best;
  return best;
}

// The kernel (consumers) and work list for these parameters; D = 128 always takes plain 128-row items.
static Plan plan_for(const FlashcoreParams& p) {
  return p.head_dim == 64 ? plan_d64(p) : Plan{2, {fc::ceil_div(p.seq_len, 128), 0}};
}
