// v11_bwd_traits.cuh — v11's backward configurations: V11BwdConfig (keys per CTA, queries per step, the warp
// tile as fa2_mma.cuh sees it, how dQ_i is shared by the warps, the shared-memory layout), the configurations
// each build and grid takes, and the workspace (the fp32 dQ accumulator, LSE * log2 e and D) carved from the
// binding's scratch. Read by mainloop_bwd_sm80.cuh and v11_bwd.cu's launcher.
#pragma once

#include "flashcore.h"
#include "tma.cuh"

#include <cstddef>
#include <type_traits>

constexpr int kBwdMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr float kBwdLog2e = 1.4426950408889634f;
constexpr int kPadRows = 64;  // LSE and D are padded per head to a multiple of every BLOCK_M

template <int kHeadDim_, int kBlockN_, int kBlockM_, bool kKvInRegs_>
struct V11BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per CTA, 16 per warp
  static constexpr int kBlockM = kBlockM_;  // Br: queries per step
  static constexpr bool kKvInRegs = kKvInRegs_;
  static constexpr int kWarps = kBlockN / 16;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  // The warp tile as fa2_mma.cuh's warp_scores sees it: "Q" = the warp's 16 keys, "K" = the query block.
  static constexpr int kMTiles = 1;
  static constexpr int kNTiles = kBlockM / 8;
  static constexpr int kDTiles = kHeadDim / 8;
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
  // Shared memory: K_j | V_j | dQ staging (sm_90) | (Q_i, dO_i) x 2 stages | dS^T | (LSE_i log2 e, D_i) x 2.
  static constexpr int kKvBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKvBytes;
  static constexpr int kDqOffset = 2 * kKvBytes;  // 1024-byte aligned: kKvBytes is a multiple of 2048
  static constexpr int kDqBytes = kTmaDq ? kBlockM * kHeadDim * 4 : 0;
  static constexpr int kStageOffset = kDqOffset + kDqBytes;  // stage s: Q_i at + s * 2 kQBytes, dO_i after it
  static constexpr int kDsOffset = kStageOffset + 4 * kQBytes;
  static constexpr int kStatsOffset = kDsOffset + kBlockN * kDsRowBytes;  // stage s: lse2 [kBlockM], dsum [kBlockM]
  static constexpr int kSmemBytes = kStatsOffset + 2 * 2 * kBlockM * 4;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN % 16 == 0 && kBlockM % 16 == 0 && kBlockM <= kPadRows && kPadRows % kBlockM == 0,
                "BLOCK_N, BLOCK_M: multiples of 16; BLOCK_M divides the padding");
  static_assert(kDqUnits % kWarps == 0 && kDTiles % kDqSplit == 0 && kDqTiles % 2 == 0, "dQ split over the warps");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0, "copies cover whole swizzle periods");
  // The L4's 99 KB per block where the build runs on it; sm_90 builds may take Hopper's 227 KB.
  static_assert(kSmemBytes <= (fc::kBuildsSm90 ? 227 * 1024 : kBwdMaxSmemBytes), "shared memory per block");
};

// Tile sizes as defines, so a registry variant can build another one beside this for a same-run comparison.
#ifndef V11_BWD_D64_BLOCK_N
#define V11_BWD_D64_BLOCK_N 128
#endif
#ifndef V11_BWD_D64_BLOCK_M
#define V11_BWD_D64_BLOCK_M 64
#endif
#ifndef V11_BWD_D64_KV_IN_REGS
#define V11_BWD_D64_KV_IN_REGS 1
#endif
#ifndef V11_BWD_D128_BLOCK_N
#define V11_BWD_D128_BLOCK_N 64
#endif
#ifndef V11_BWD_D128_BLOCK_M
#define V11_BWD_D128_BLOCK_M 32
#endif

using BwdD64 = V11BwdConfig<64, V11_BWD_D64_BLOCK_N, V11_BWD_D64_BLOCK_M, V11_BWD_D64_KV_IN_REGS != 0>;
// D=128 on sm_90 (227 KB): 128 keys x 64 queries, half the dQ reductions per FLOP of the L4's 64 x 32.
using BwdD128 = std::conditional_t<fc::kBuildsSm90, V11BwdConfig<128, 128, 64, false>,
                                   V11BwdConfig<128, V11_BWD_D128_BLOCK_N, V11_BWD_D128_BLOCK_M, false>>;
// Short sequences: when the long grid (key blocks x batch x K/V heads) would not fill the SMs once, 32-key CTAs
// (two warps) make four times as many CTAs (1,8,512,64: 128 instead of 32); at D=128, 64 keys.
using BwdShortD64 = V11BwdConfig<64, 32, 64, true>;
using BwdShortD128 = V11BwdConfig<128, 64, 32, false>;

// Workspace: the fp32 dQ accumulator [B, H, S, D], then LSE * log2 e and D, each [B, H, S_pad] fp32.
struct Workspace {
  float* dq_accum;
  float* lse2;
  float* dsum;
  int padded_rows;  // S_pad
};

inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline int padded_rows(int seq_len) { return fc::ceil_div(seq_len, kPadRows) * kPadRows; }

inline size_t dq_accum_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * p.seq_len * p.head_dim * 4);
}

inline size_t stats_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * padded_rows(p.seq_len) * 4);
}

inline Workspace carve(const FlashcoreBackwardParams& b) {
  unsigned char* base = static_cast<unsigned char*>(b.workspace);
  Workspace w;
  w.padded_rows = padded_rows(b.fwd.seq_len);
  w.dq_accum = reinterpret_cast<float*>(base);
  w.lse2 = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd));
  w.dsum = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd) + stats_bytes(b.fwd));
  return w;
}

