// sm90/v12_traits.cuh — v12's configurations: Config (head dim, keys per K/V tile, consumer warpgroups, ring slots; the
// register split and the shared-memory layout derived from them), the mbarriers and tensor maps a CTA holds, and
// the configurations the launcher takes. Read by every part of v12 (sm90/tile_scheduler_sm90.cuh,
// sm90/consumer_sm90.cuh, sm90/mainloop_fwd_sm90.cuh, sm90/epilogue_fwd_sm90.cuh) and sm90/v12.cu.
#pragma once

#include "flashcore.h"
#include "common/hopper.cuh"

constexpr int kSchedBarrier = 1;  // named barriers 1 .. kConsumers: the consumers' GEMM turns; then one per consumer

template <int kHeadDim_, int kBlockN_, int kConsumers_, int kStages_>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // keys per K/V tile
  static constexpr int kConsumers = kConsumers_;                           // consumer warpgroups, 64 rows each
  static constexpr int kStages = kStages_;  // K/V ring slots (2 for long runs: 3 at D = 64 measured 408 vs 420)
  static constexpr int kBlockM = 64 * kConsumers;                          // Br: query rows per CTA
  static constexpr int kThreads = fc::kWarpgroupThreads * (1 + kConsumers);  // + the producer warpgroup
  // setmaxnreg: what the producer keeps and what each consumer grows to (the register file is 64 K).
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static_assert(fc::setmaxnreg_fits(kThreads, kProducerRegs, kConsumerRegs, kConsumers),
                "setmaxnreg: the warpgroups' registers exceed the CTA's launch pool (the .inc would hang)");
  static constexpr int kPanels = kHeadDim / 64;           // 128-byte panels of 64 columns per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  // Each V slot is followed by a panel of ones, which P V reads as 8 more columns of V: those columns of O
  // accumulate l = sum_j P_ij from the same fp16 P as the rest of O (so numerator and denominator agree
  // exactly: one-hot and uniform rows come out exact), with no FADD for the row sum.
  static constexpr int kVSlotBytes = kKVBytes + kBlockN * 128;
  static constexpr int kOCols = kHeadDim + 8;             // O's columns in registers: D, then l (x 8)
  // Shared memory: Q_i | K_j x kStages | (V_j, ones) x kStages | O | mbarriers; 1024-byte aligned (swizzle atom).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kOOffset = kVOffset + kStages * kVSlotBytes;  // O's staging tile, laid out as Q_i's
  static constexpr int kBarOffset = kOOffset + kQBytes;
  static constexpr int kSmemBytes = kBarOffset + 8 * (2 + 4 * kStages) + 1024;  // + alignment slack
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory: at most 227 KB per block on sm_90");
};

template <int kStages>
struct Barriers {
  uint64_t q_full, q_empty;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
};

struct Maps {
  CUtensorMap q, k, v, o;
};

// Tiles: 128 keys per K/V tile everywhere (192 measured 394 vs 418 TFLOP/s at 2,16,4096,64; 176 at D = 128
// does not fit next to the ones panels).
constexpr int kKeysPerTile = 128;
using Cfg64 = Config<64, kKeysPerTile, 2, 2>;
using Cfg64Wide = Config<64, kKeysPerTile, 3, 2>;
using Cfg128 = Config<128, kKeysPerTile, 2, 2>;
// Grids of one wave of 64-row items (1,8,512,64: 64 on 132 SMs, where 128-row items made 32): one consumer per
// CTA, twice the CTAs, and four slots, so a 512-key head's K and V are all in flight at once.
using Cfg64Short = Config<64, kKeysPerTile, 1, 4>;
