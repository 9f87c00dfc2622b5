// sm80/v11_bwd_traits.cuh — v11's backward configurations: V11BwdConfig (keys per CTA, queries per step, the warp
// tile as common/fa2_fragments.cuh sees it, how dQ_i is shared by the warps, the shared-memory layout), the
// configurations each build and grid takes. Read by sm80/mainloop_bwd_sm80.cuh and sm80/v11_bwd.cu's launcher (the
// workspace and the passes before and after the main kernel: common/bwd_passes.cuh).
#pragma once

#include "common/bwd_passes.cuh"
#include "flashcore.h"
#include "common/tma.cuh"

#include <cstddef>
#include <type_traits>

constexpr int kBwdMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block

template <int kHeadDim_, int kBlockN_, int kBlockM_, bool kKvInRegs_, int kWarpKeys_ = 16>
struct V11BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per CTA, kWarpKeys per warp
  static constexpr int kBlockM = kBlockM_;  // Br: queries per step
  static constexpr bool kKvInRegs = kKvInRegs_;
  // Keys per warp: 16, or 32 (two m16 tiles), so each B fragment of Q_i and dO_i read from shared memory serves
  // two m16 tiles of keys: half the Q_i / dO_i traffic per key, for twice the dK, dV accumulators.
  static constexpr int kWarpKeys = kWarpKeys_;
  // At D = 128, 32 keys would need 256 registers of dK and dV per warp: there a PAIR of warps shares 32 keys
  // (kDHalves = 2). Each computes S^T and dP^T for its half of the step's queries, both write P^T and dS^T to shared
  // memory, and after the CTA's barrier each accumulates dV += P^T dO_i and dK += dS^T Q_i over all the step's
  // queries for its half of D, its A fragments read back from those tiles.
  static constexpr int kDHalves = kHeadDim == 128 && kWarpKeys == 32 ? 2 : 1;
  static constexpr int kWarps = kBlockN / kWarpKeys * kDHalves;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  // The warp walks the step's queries in slices of kSliceM (S^T, dP^T, P^T, dS^T, then that slice's k16 steps
  // of dV and dK), so that at 32 keys one slice of S^T and dP^T (32 queries, 32 floats each) fits beside the 128
  // floats of dK, dV, with K and V re-read from shared memory once per slice (held, their 64 registers of fragments
  // leave room for 16-query slices only, and those spilled 28-44 B: not offered). 16 keys take the step at once.
  // With kDHalves = 2 the warp's one slice is its half of the step's queries.
  static constexpr int kSliceM = kDHalves == 2 ? kBlockM / 2 : kWarpKeys == 16 ? kBlockM : 32;
  static constexpr int kSlices = kDHalves == 2 ? 1 : kBlockM / kSliceM;
  // The warp tile as common/fa2_fragments.cuh's warp_scores sees it: "Q" = the warp's keys, "K" = a slice of the query
  // block.
  static constexpr int kMTiles = kWarpKeys / 16;
  static constexpr int kNTiles = kSliceM / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kAccDTiles = kDTiles / kDHalves;  // n8 tiles of dK and dV a warp accumulates
  static constexpr int kKChunks = kHeadDim / 16;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr bool kQInRegs = kKvInRegs;
  // dQ_i (kBlockM x D) is shared by the warps: kDqMTiles query tiles of 16 rows times D split kDqSplit ways
  // make kDqUnits pieces of 16 rows x kDqTiles n8 tiles; warp w takes pieces w, w + kWarps, ...
  static constexpr int kDqMTiles = kBlockM / 16;
  static constexpr int kDqSplit = kWarps > kDqMTiles ? kWarps / kDqMTiles : 1;
  static constexpr int kDqTiles = kDTiles / kDqSplit;
  static constexpr int kDqUnits = kDqMTiles * kDqSplit;
  static constexpr int kDsRowBytes = kBlockM * 2;
  // sm_90 builds add dQ_i to the accumulator by TMA (one reduce-add per 32 columns from a staging tile of
  // fp32 panels [32 columns][kBlockM rows], 128-byte swizzled) instead of red.add from every lane.
  static constexpr bool kTmaDq = fc::kBuildsSm90;
  static constexpr int kDqPanels = kHeadDim / 32;
  // How sm80/warp_bwd_sm80.cuh's stage_dq addresses the staging tile: per store from the column (D = 64 at 32 keys per
  // warp, where the held base spills), or one base plus compile-time offsets (136 fewer instructions per step).
  static constexpr bool kDqStagePerStore = kWarpKeys == 32 && kDHalves == 1;
  // Shared memory: K_j | V_j | dQ staging (sm_90) | (Q_i, dO_i) x 2 stages | dS^T | P^T (kDHalves = 2) |
  // (LSE_i log2 e, D_i) x 2.
  static constexpr int kKvBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKvBytes;
  static constexpr int kDqOffset = 2 * kKvBytes;  // 1024-byte aligned: kKvBytes is a multiple of 2048
  static constexpr int kDqBytes = kTmaDq ? kBlockM * kHeadDim * 4 : 0;
  static constexpr int kStageOffset = kDqOffset + kDqBytes;  // stage s: Q_i at + s * 2 kQBytes, dO_i after it
  static constexpr int kDsOffset = kStageOffset + 4 * kQBytes;
  static constexpr int kPtOffset = kDsOffset + kBlockN * kDsRowBytes;  // P^T [kBlockN][kBlockM], dS^T's layout
  static constexpr int kStatsOffset = kPtOffset + (kDHalves == 2 ? kBlockN * kDsRowBytes : 0);  // stage s: lse2, dsum
  static constexpr int kSmemBytes = kStatsOffset + 2 * 2 * kBlockM * 4;
  // CTAs per SM the kernel is compiled for (__launch_bounds__' second argument): two where 32-key warps leave
  // room for them (at most 128 threads, so 255 registers each still fit twice in the 64K register file, and
  // twice the shared memory plus the 1 KB reserved per CTA within the SM's 228 KB, sm_90, or 100 KB, sm_89), so
  // one CTA's barriers overlap the other's math. Otherwise 0, no minimum: nvcc then writes no .minnctapersm, as
  // before (an explicit 1 changes ptxas's register allocation of the 64-thread D=128 kernel on sm_90).
  static constexpr int kSmemPerSm = (fc::kBuildsSm90 ? 228 : 100) * 1024;
  static constexpr int kMinBlocks = kWarpKeys == 32 && kThreads <= 128 && 2 * (kSmemBytes + 1024) <= kSmemPerSm ? 2 : 0;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpKeys == 16 || kWarpKeys == 32, "16 or 32 keys per warp");
  static_assert(kWarpKeys == 16 || !kKvInRegs, "32 keys per warp re-read K and V (held, they spill)");
  static_assert(kDHalves == 1 || (kBlockM == 64 && kTmaDq), "warp pairs: 64 queries per step, on sm_90");
  static_assert(kBlockN % kWarpKeys == 0 && kBlockM % kSliceM == 0, "whole warps, whole slices");
  static_assert(kBlockN % 16 == 0 && kBlockM % 16 == 0 && kBlockM <= kPadRows && kPadRows % kBlockM == 0,
                "BLOCK_N, BLOCK_M: multiples of 16; BLOCK_M divides the padding");
  static_assert(kDqUnits % kWarps == 0 && kDTiles % kDqSplit == 0 && kDqTiles % 2 == 0, "dQ split over the warps");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0, "copies cover whole swizzle periods");
  // The L4's 99 KB per block where the build runs on it; sm_90 builds may take Hopper's 227 KB.
  static_assert(kSmemBytes <= (fc::kBuildsSm90 ? 227 * 1024 : kBwdMaxSmemBytes), "shared memory per block");
};

// Tile sizes as defines (declared with these values in variants.yaml), so a registry variant can build another one
// beside this for a same-run comparison.
#ifndef V11_BWD_D64_BLOCK_N
#define V11_BWD_D64_BLOCK_N 128
#endif
#ifndef V11_BWD_D64_BLOCK_M
#define V11_BWD_D64_BLOCK_M 64
#endif
// D=64 on sm_90: 32 keys per warp (4 warps, two CTAs per SM, K and V re-read from shared memory per slice) took
// 2,16,4096,64's backward from 1518 to 1197 us and causal from 899 to 781 (H100, same run; FA2 1313 and 825).
// The L4 keeps 16 keys per warp with K and V in registers: its 99 KB holds one 4-warp CTA per SM.
constexpr bool kBwdD64KvInRegs = !fc::kBuildsSm90;
constexpr int kBwdD64WarpKeys = fc::kBuildsSm90 ? 32 : 16;
#ifndef V11_BWD_D128_BLOCK_N
#define V11_BWD_D128_BLOCK_N 64
#endif
#ifndef V11_BWD_D128_BLOCK_M
#define V11_BWD_D128_BLOCK_M 32
#endif

using BwdD64 = V11BwdConfig<64, V11_BWD_D64_BLOCK_N, V11_BWD_D64_BLOCK_M, kBwdD64KvInRegs, kBwdD64WarpKeys>;
// D=128 on sm_90 (227 KB): 128 keys x 64 queries, half the dQ reductions per FLOP of the L4's 64 x 32; pairs of
// warps share 32 keys (kDHalves above). Each warp owning 16 keys instead was 2% slower at 2,16,4096,128 (2605.6
// against 2556.0 us) and 2.5% causal (1542.9 against 1504.3; H100, the backward alone).
using BwdD128 = std::conditional_t<fc::kBuildsSm90, V11BwdConfig<128, 128, 64, false, 32>,
                                   V11BwdConfig<128, V11_BWD_D128_BLOCK_N, V11_BWD_D128_BLOCK_M, false>>;
// Short sequences: when the long grid (key blocks x batch x K/V heads) would not fill the SMs once, 32-key CTAs
// (two warps) make four times as many CTAs (1,8,512,64: 128 instead of 32); at D=128, 64 keys.
using BwdShortD64 = V11BwdConfig<64, 32, 64, true>;
using BwdShortD128 = V11BwdConfig<128, 64, 32, false>;
