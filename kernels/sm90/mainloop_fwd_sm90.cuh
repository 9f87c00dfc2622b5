// sm90/mainloop_fwd_sm90.cuh — v12's kernel and its roles. A persistent CTA of one producer warpgroup and consumer
// warpgroups: producer (TMA loads of Q_i, K_j, V_j into the ring), and per item of the work list each consumer
// either relays the turns (relay_turns: an item with none of its rows, or none that see its keys) or runs the main
// loop (mainloop: the GEMMs and the softmax under ping-pong turns) over the item's tiles its rows see, taking the
// others' turns without GEMMs (skip_tiles), then the epilogue (sm90/epilogue_fwd_sm90.cuh). Composed of
// sm90/tile_scheduler_sm90.cuh's work list, sm90/turns_fwd_sm90.cuh's ring and turns and sm90/consumer_sm90.cuh's
// steps.
#pragma once

#include "sm90/consumer_sm90.cuh"
#include "sm90/epilogue_fwd_sm90.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "sm90/tile_scheduler_sm90.cuh"
#include "sm90/turns_fwd_sm90.cuh"
#include "sm90/v12_traits.cuh"

#include <cstdint>

// The dynamic shared memory, 1024-byte aligned (the swizzle atom). Every role derives it (and all below) again
// after its setmaxnreg: a value kept across it would be spilled, since the producer keeps only 24-32 registers.
// Rounded through uintptr_t, so the compiler sees a generic pointer (the epilogue's staging stores are ST.E, not
// STS): fc::dynamic_smem_1024, which keeps it shared, left the forward 6% slower at 2,16,4096,128 (434.8 against
// 408.3 us, one run on the lent H100, 2026-11-27), where v12's backward gained by it.
__device__ __forceinline__ unsigned char* v12_smem() {
  extern __shared__ unsigned char smem_raw[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

template <class Cfg>
__device__ __forceinline__ Barriers<Cfg::kStages>& v12_barriers() {
  return *reinterpret_cast<Barriers<Cfg::kStages>*>(v12_smem() + Cfg::kBarOffset);
}

__device__ __forceinline__ int num_items(const FlashcoreParams& p, const Items& items) {
  return (items.big + items.small) * p.batch * p.heads;
}

template <class Cfg>
__device__ __forceinline__ void init_barriers() {
  auto& b = v12_barriers<Cfg>();
  fc::mbarrier_init(&b.q_full, 1);
  fc::mbarrier_init(&b.q_empty, 4 * Cfg::kConsumers);
  for (int s = 0; s < Cfg::kStages; ++s) {
    fc::mbarrier_init(&b.k_full[s], 1);
    fc::mbarrier_init(&b.v_full[s], 1);
    fc::mbarrier_init(&b.k_empty[s], 4 * Cfg::kConsumers);
    fc::mbarrier_init(&b.v_empty[s], 4 * Cfg::kConsumers);
  }
  fc::fence_mbarrier_init();
}

// The ones panels after each V slot, written once (from thread `first`, `stride` apart); the tensor cores read
// them through the async proxy, hence the fence before the threads meet. The long kernels write them with every
// thread before the roles split; the short one (one consumer, a latency-bound wave) leaves them to its consumer
// after the split, so the producer's first loads go out first: 1,8,512,64 9.1-9.2 us vs 9.5 (graph 6.2 vs 6.5).
// The same order in the long kernels read 284 vs 281 us at 2,16,4096,64 and 429 vs 423 at D = 128 (ptxas
// scheduled their loops differently), so they keep this one.
template <class Cfg, typename T>
__device__ __forceinline__ void write_ones(int first, int stride) {
  for (int slot = 0; slot < Cfg::kStages; ++slot) {
    uint4* ones = reinterpret_cast<uint4*>(v12_smem() + Cfg::kVOffset + slot * Cfg::kVSlotBytes + Cfg::kKVBytes);
    for (int i = first; i < Cfg::kBlockN * 128 / 16; i += stride) {
      ones[i] = make_uint4(kOnePair<T>, kOnePair<T>, kOnePair<T>, kOnePair<T>);
    }
  }
  fc::fence_proxy_async_shared();
}

// One thread streams each item's Q_i, then its K_j and V_j (the key tiles item_key_tiles gives) through the ring.
// Q_i of the next item goes in as soon as every consumer has issued its last S of this one (q_empty), so it lands
// during this item's last softmax, P V and stores.
template <class Cfg>
__device__ __forceinline__ void producer(const FlashcoreParams& p, const Maps& maps, const Items& items) {
  constexpr int kStages = Cfg::kStages, kBlockN = Cfg::kBlockN;
  auto& bars = v12_barriers<Cfg>();
  __half* q_tile = reinterpret_cast<__half*>(v12_smem() + Cfg::kQOffset);
  __half* k_tiles = reinterpret_cast<__half*>(v12_smem() + Cfg::kKOffset);
  __half* v_tiles = reinterpret_cast<__half*>(v12_smem() + Cfg::kVOffset);
  fc::tma_prefetch_descriptor(&maps.q);
  fc::tma_prefetch_descriptor(&maps.k);
  fc::tma_prefetch_descriptor(&maps.v);
  fc::tma_prefetch_descriptor(&maps.o);
  int t = 0;  // K/V tiles issued by this CTA so far: the ring's slot and lap
  for (int round = 0, index = blockIdx.x; index < num_items(p, items); index = snake_index(++round, blockIdx.x, gridDim.x)) {
    const Item it = item_at<Cfg::kBlockM>(p, items, index);
    const fc::Range tiles = item_key_tiles<kBlockN>(p, it);
    const int kv_bh = kv_head(p, it.bh);  // K and V are [B * H_kv][S_kv][D]
    fc::mbarrier_wait_parity(&bars.q_empty, (round & 1) ^ 1);
    fc::mbarrier_arrive_expect_bytes(&bars.q_full, Cfg::kQBytes);
    fc::tma_load_4d(q_tile, &maps.q, 0, it.m0, 0, it.bh, &bars.q_full);
    for (int n = tiles.begin; n < tiles.end; ++n, ++t) {
      const int s = t % kStages;
      const uint32_t lap = (t / kStages) & 1;
      fc::mbarrier_wait_parity(&bars.k_empty[s], lap ^ 1);
      fc::mbarrier_arrive_expect_bytes(&bars.k_full[s], Cfg::kKVBytes);
      fc::tma_load_4d(k_tiles + s * (Cfg::kKVBytes / 2), &maps.k, 0, n * kBlockN, 0, kv_bh, &bars.k_full[s]);
      fc::mbarrier_wait_parity(&bars.v_empty[s], lap ^ 1);
      fc::mbarrier_arrive_expect_bytes(&bars.v_full[s], Cfg::kKVBytes);
      fc::tma_load_4d(v_tiles + s * (Cfg::kVSlotBytes / 2), &maps.v, 0, n * kBlockN, 0, kv_bh, &bars.v_full[s]);
    }
  }
}

// The wgmma descriptors a consumer reads: Q_i's rows of its warpgroup (panel 0, row 64g), ring slot 0's K_j and
// V_j, and one slot's step in descriptor units.
struct Descs {
  uint64_t q, k0, v0;
};

// One consumer's main loop over an item's key tiles n0 .. n1 - 1 (n1 > n0; the ring indexed by key tile):
// S = Q_i K_n^T, the softmax, O += P V_n, with the next tile's S issued before this one's P V so the softmax overlaps
// it. o and st come out unnormalized. edges (mask_edges) says which tiles need which bound of the mask; c and
// cap_in are online_softmax's (softcap: cap * log2(e) and scale / cap).
template <class Cfg, typename T, bool kSoftcap>
__device__ __forceinline__ void mainloop(const FlashcoreParams& p, Barriers<Cfg::kStages>& bars, const Ring<Cfg::kStages>& ring,
                                         const Turns<Cfg::kConsumers>& turns, const Descs& d, int n0, int n1,
                                         float c, float cap_in, fc::Range edges, int diag0, float (&o)[Cfg::kOCols / 2],
                                         RowState& st) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM;
  constexpr uint64_t kKSlotStep = Cfg::kKVBytes >> 4;  // one ring slot further, in descriptor units
  constexpr uint64_t kVSlotStep = Cfg::kVSlotBytes >> 4;
  float s[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  float alpha[2];
  // Copies of the softmax, so that the tiles that need no mask (all but those the window's edges, the diagonal or
  // S_kv cut) run none of its index arithmetic: predicated off, it still took issue slots (ncu: ALU the busiest
  // pipe); and in the loop a cut tile compares only the bound that cuts it (the diagonal's, or a window's left
  // edge's). The first tile, once per item, where the left edge is what usually cuts it (a window's), compares
  // that one alone or both: one copy fewer.
  auto softmax = [&](int n) {
    const bool left = n < edges.begin, right = n >= edges.end;
    if (!left && !right) {
      online_softmax<kBlockN, 0, kSoftcap>(s, st, alpha, c, cap_in, diag0, n * kBlockN, p);
    } else if (!left) {
      online_softmax<kBlockN, kMaskRight, kSoftcap>(s, st, alpha, c, cap_in, diag0, n * kBlockN, p);
    } else if (!right) {
      online_softmax<kBlockN, kMaskLeft, kSoftcap>(s, st, alpha, c, cap_in, diag0, n * kBlockN, p);
    } else {
      online_softmax<kBlockN, kMaskLeft | kMaskRight, kSoftcap>(s, st, alpha, c, cap_in, diag0, n * kBlockN, p);
    }
  };
  // The first tile: S = Q_i K_n0^T, then its softmax.
  fc::mbarrier_wait_parity(&bars.k_full[ring.slot(n0)], ring.lap(n0));
  turns.take();
  gemm_qk<T, kHeadDim, kBlockN, kBlockM>(s, d.q, d.k0 + ring.slot(n0) * kKSlotStep);
  fc::wgmma_fence_operands(s);
  turns.pass();
  fc::wgmma_wait<0>();
  fc::wgmma_fence_operands(s);
  release(&bars.k_empty[ring.slot(n0)]);
  if (n0 >= edges.end) {
    online_softmax<kBlockN, kMaskLeft | kMaskRight, kSoftcap>(s, st, alpha, c, cap_in, diag0, n0 * kBlockN, p);
  } else if (n0 < edges.begin) {
    online_softmax<kBlockN, kMaskLeft, kSoftcap>(s, st, alpha, c, cap_in, diag0, n0 * kBlockN, p);
  } else {
    online_softmax<kBlockN, 0, kSoftcap>(s, st, alpha, c, cap_in, diag0, n0 * kBlockN, p);
  }
  pack_p<T, kBlockN>(s, pa);

  for (int n = n0 + 1; n < n1; ++n) {
    const int sk = ring.slot(n), sv = ring.slot(n - 1);
    // Issue S_next = Q_i K_n^T, then O += P V_{n-1}; the softmax of S_next overlaps P V_{n-1}.
    fc::mbarrier_wait_parity(&bars.k_full[sk], ring.lap(n));
    turns.take();
    gemm_qk<T, kHeadDim, kBlockN, kBlockM>(s, d.q, d.k0 + sk * kKSlotStep);
    fc::wgmma_fence_operands(s);
    fc::mbarrier_wait_parity(&bars.v_full[sv], ring.lap(n - 1));
    gemm_pv<T, Cfg::kOCols, kBlockN>(o, pa, d.v0 + sv * kVSlotStep);
    fc::wgmma_fence_operands(o);
    turns.pass();
    fc::wgmma_wait<1>();  // S_next has landed; P V may still run
    fc::wgmma_fence_operands(s);
    release(&bars.k_empty[sk]);
    softmax(n);
    fc::wgmma_wait<0>();  // P V_{n-1} done: P and V_{n-1}'s slot are free
    fc::wgmma_fence_operands(o);
    fc::wgmma_fence_operands(pa);  // the wgmma read pa until here: keep its registers from being reused
    release(&bars.v_empty[sv]);
    // O = diag(alpha) O (l included)
#pragma unroll
    for (int j = 0; j < Cfg::kOCols / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    pack_p<T, kBlockN>(s, pa);
  }
  release(&bars.q_empty);  // every S of this item has landed: the producer may load the next Q_i
  // The last tile's O += P V.
  const int sv = ring.slot(n1 - 1);
  fc::mbarrier_wait_parity(&bars.v_full[sv], ring.lap(n1 - 1));
  turns.take();
  gemm_pv<T, Cfg::kOCols, kBlockN>(o, pa, d.v0 + sv * kVSlotStep);
  fc::wgmma_fence_operands(o);
  turns.pass();
  fc::wgmma_wait<0>();
  fc::wgmma_fence_operands(o);
  fc::wgmma_fence_operands(pa);
  release(&bars.v_empty[sv]);
}

// Consumer warpgroup g (1 .. kConsumers in the CTA, counted from 0 here) owns query rows 64g .. 64g + 63 of each
// item it is dealt.
template <class Cfg, typename T, bool kSoftcap>
__device__ __forceinline__ void consumer(const FlashcoreParams& p, const Maps& maps, const Items& items) {
  constexpr int kConsumers = Cfg::kConsumers, kBlockM = Cfg::kBlockM;
  // The warpgroup index through a shuffle: the compiler then knows it is warp-uniform and keeps it, and the
  // item values derived from it, in uniform registers (without this, the 3-consumer kernel spilled).
  const int g = __shfl_sync(0xffffffffu, threadIdx.x / fc::kWarpgroupThreads, 0) - 1;
  auto& bars = v12_barriers<Cfg>();
  __half* q_tile = reinterpret_cast<__half*>(v12_smem() + Cfg::kQOffset);
  const int tid = threadIdx.x % fc::kWarpgroupThreads;
  const int r_local = 16 * (tid / 32) + (tid % 32) / 4;  // this thread's rows in the warpgroup: r_local, + 8
  // exp(x) = exp2(x * log2(e)): c turns a score into log2 units, the raw S * scale or (softcap) the cap's tanh.
  const float c = (kSoftcap ? p.softcap : p.scale) * 1.4426950408889634f;
  const float cap_in = kSoftcap ? p.scale / p.softcap : 0.f;  // softcap: S * scale / cap, the tanh's argument
  const Descs descs = {fc::wgmma_desc_sw128(q_tile + 64 * g * 64, 16, 1024),
                       fc::wgmma_desc_sw128(reinterpret_cast<__half*>(v12_smem() + Cfg::kKOffset), 16, 1024),
                       fc::wgmma_desc_sw128(reinterpret_cast<__half*>(v12_smem() + Cfg::kVOffset), Cfg::kBlockN * 128, 1024)};

  if constexpr (kConsumers == 1) {  // the short kernel's ones panels, while the first loads fly
    write_ones<Cfg, T>(tid, fc::kWarpgroupThreads);
    fc::named_barrier_sync(kSchedBarrier, fc::kWarpgroupThreads);  // one consumer takes no turns: id free
  }

  const Turns<kConsumers> turns = {kSchedBarrier + g, kSchedBarrier + (g + 1) % kConsumers};
  if (g == kConsumers - 1) turns.pass();  // the first consumer takes the CTA's first turn
  Ring<Cfg::kStages> ring = {0};
  for (int round = 0, index = blockIdx.x; index < num_items(p, items); index = snake_index(++round, blockIdx.x, gridDim.x)) {
    const uint32_t q_lap = round & 1;
    const Item it = item_at<kBlockM>(p, items, index);
    const fc::Range tiles = item_key_tiles<Cfg::kBlockN>(p, it);
    const int num_n = tiles.end - tiles.begin;
    // An item with no K/V tiles (its rows see no key: causal with S > S_kv, a window past either end of the keys)
    // has no turns either: every consumer skips them alike, so the counts stay matched; each still takes Q_i's lap,
    // and those with rows write them (O = 0, the LSE +inf or the sink).
    if (g >= it.consumers) {
      relay_turns<Cfg>(bars, ring, turns, num_n, q_lap);
      ring.t += num_n;
      continue;
    }
    const int first_row = it.m0 + 64 * g;  // this warpgroup's first query row
    const fc::Range own = consumer_key_tiles<Cfg::kBlockN>(p, it, g);  // within tiles; the rest are skipped
    // Bottom-right: row i's window is centred on key i + S_kv - S (its diagonal): this thread's first row's.
    const int diag0 = first_row + fc::causal_offset(p) + r_local;

    float o[Cfg::kOCols / 2];  // O_i's fragment, then the l columns
#pragma unroll
    for (int i = 0; i < Cfg::kOCols / 2; ++i) o[i] = 0.f;
    RowState st = {{-INFINITY, -INFINITY}};
    if (own.end <= own.begin) {
      // No row of this warpgroup sees a key of the item (or the item has no tiles): O = 0 and l = 0 (LSE +inf).
      relay_turns<Cfg>(bars, ring, turns, num_n, q_lap);
    } else {
      fc::mbarrier_wait_parity(&bars.q_full, q_lap);
      const Ring<Cfg::kStages> item_ring = {ring.t - tiles.begin};  // indexed by key tile
      skip_tiles<Cfg>(bars, item_ring, turns, tiles.begin, own.begin);
      mainloop<Cfg, T, kSoftcap>(p, bars, item_ring, turns, descs, own.begin, own.end, c, cap_in,
                                 mask_edges<Cfg::kBlockN>(p, first_row), diag0, o, st);
      skip_tiles<Cfg>(bars, item_ring, turns, own.end, tiles.end);
    }
    ring.t += num_n;
    const int bh = item_at<kBlockM>(p, items, index).bh;  // recomputed: one register fewer through the loop
    store_rows<Cfg, T>(p, maps, v12_smem(), o, st, g, bh, first_row, tid, r_local);
  }
}

template <int kHeadDim, int kBlockN, int kConsumers, int kStages, typename T, bool kSoftcap>
__global__ void __launch_bounds__(Config<kHeadDim, kBlockN, kConsumers, kStages>::kThreads, 1)
    v12_fwd(const FlashcoreParams p, const __grid_constant__ Maps maps, const Items items) {
  using Cfg = Config<kHeadDim, kBlockN, kConsumers, kStages>;
  if (threadIdx.x == 0) init_barriers<Cfg>();
  if constexpr (kConsumers > 1) write_ones<Cfg, T>(threadIdx.x, Cfg::kThreads);
  __syncthreads();
  if (threadIdx.x < fc::kWarpgroupThreads) {
    fc::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) producer<Cfg>(p, maps, items);
    return;
  }
  fc::setmaxnreg_inc<Cfg::kConsumerRegs>();
  consumer<Cfg, T, kSoftcap>(p, maps, items);
}
