// sm90/turns_fwd_sm90.cuh — how v12's forward consumers move through the K/V ring (Ring) and take turns at the
// tensor cores (Turns), and the two ways a consumer keeps pace without computing: relay_turns (an item with none of
// its rows, or none that see its keys) and skip_tiles (an item's tiles its rows do not see). sm90/mainloop_fwd_sm90.cuh
// runs them.
#pragma once

#include "sm90/consumer_sm90.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "sm90/v12_traits.cuh"

#include <cstdint>

// Where the consumers are in the ring: the current item's i-th tile sits in slot (t + i) % kStages, on that lap.
// (mainloop's copy counts from the item's first key tile instead: t less that tile's index, so n is the key tile.)
template <int kStages>
struct Ring {
  int t;  // K/V tiles of this CTA's earlier items
  __device__ __forceinline__ int slot(int n) const { return (t + n) % kStages; }
  __device__ __forceinline__ uint32_t lap(int n) const { return static_cast<uint32_t>((t + n) / kStages) & 1; }
};

// Ping-pong: the consumers take turns issuing GEMMs (named barriers mine / next), so one's softmax runs while
// another's GEMMs do. The turns run round the ring for the CTA's whole life, across items: the last consumer hands
// the first its first turn once, and every turn passes on (the last consumer's last turn of an item lets the first
// start the next item's S while the last still runs its epilogue; the last pass is left unmatched at exit, as in
// FlashAttention-3's scheduler barriers). Every consumer takes num_n + 1 turns per item (num_n K/V tiles), even
// with no rows in the item or none in a tile: a ring whose members changed from item to item let a consumer's
// first arrival of one item land on a barrier still counting the last item's turns (a hang at 3,16,3000,64).
// (One consumer has no one to take turns with.)
template <int kConsumers>
struct Turns {
  int mine, next;
  __device__ __forceinline__ void take() const {
    if constexpr (kConsumers > 1) fc::named_barrier_sync(mine, 2 * fc::kWarpgroupThreads);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (kConsumers > 1) fc::named_barrier_arrive(next, 2 * fc::kWarpgroupThreads);
  }
};

// A consumer with no rows in the item, or whose rows see none of its tiles: relay the turns, and release each slot
// as it fills, so every barrier's count stays 4 per consumer. Waiting for each fill keeps this warpgroup within one
// lap of the producer.
template <class Cfg>
__device__ __forceinline__ void relay_turns(Barriers<Cfg::kStages>& bars, const Ring<Cfg::kStages>& ring,
                                            const Turns<Cfg::kConsumers>& turns, int num_n, uint32_t q_lap) {
  fc::mbarrier_wait_parity(&bars.q_full, q_lap);
  release(&bars.q_empty);
  for (int n = 0; n < num_n; ++n) {
    fc::mbarrier_wait_parity(&bars.k_full[ring.slot(n)], ring.lap(n));
    turns.take();
    turns.pass();
    release(&bars.k_empty[ring.slot(n)]);
    if (n > 0) {
      fc::mbarrier_wait_parity(&bars.v_full[ring.slot(n - 1)], ring.lap(n - 1));
      release(&bars.v_empty[ring.slot(n - 1)]);
    }
  }
  if (num_n > 0) {
    fc::mbarrier_wait_parity(&bars.v_full[ring.slot(num_n - 1)], ring.lap(num_n - 1));
    turns.take();
    turns.pass();
    release(&bars.v_empty[ring.slot(num_n - 1)]);
  }
}

// Key tiles n0 .. n1 - 1 of the item that a consumer's rows see none of (every score of theirs masked): one turn
// each with no GEMM, and each slot released once filled (the ring indexed by key tile). Skipping them is exact:
// their P is 0 and they leave m and O as they were.
template <class Cfg>
__device__ __forceinline__ void skip_tiles(Barriers<Cfg::kStages>& bars, const Ring<Cfg::kStages>& ring,
                                           const Turns<Cfg::kConsumers>& turns, int n0, int n1) {
  for (int n = n0; n < n1; ++n) {
    fc::mbarrier_wait_parity(&bars.k_full[ring.slot(n)], ring.lap(n));
    turns.take();
    turns.pass();
    release(&bars.k_empty[ring.slot(n)]);
    fc::mbarrier_wait_parity(&bars.v_full[ring.slot(n)], ring.lap(n));
    release(&bars.v_empty[ring.slot(n)]);
  }
}
