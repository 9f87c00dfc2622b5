// sm80/v11_traits.cuh — v11's forward tile configurations: V11Config (tile sizes, stages, key groups and the
// shared-memory layout derived from them), the configuration slots the launcher uses, their tune space
// (variants.yaml `tune:`) and the grid order. Read by sm80/v11.cu's launcher and by sm80/forward_sm80.cuh.
#pragma once

#include "flashcore.h"

#include <cstdint>

// The tune space (variants.yaml `tune: params:`); every other parameter of a slot is fixed below.
#ifndef V11_LONG_D128_BLOCK_M
#define V11_LONG_D128_BLOCK_M 128
#endif
#ifndef V11_LONG_D128_BLOCK_N
#define V11_LONG_D128_BLOCK_N 48
#endif
#ifndef V11_LONG_D128_WARP_M
#define V11_LONG_D128_WARP_M 32
#endif
#ifndef V11_LONG_D128_MIN_BLOCKS
#define V11_LONG_D128_MIN_BLOCKS 2
#endif
#ifndef V11_SHORT_D64_BLOCK_N
#define V11_SHORT_D64_BLOCK_N 32
#endif
#ifndef V11_SHORT_D64_WARP_M
#define V11_SHORT_D64_WARP_M 16
#endif
#ifndef V11_SHORT_D64_STAGES
#define V11_SHORT_D64_STAGES 3
#endif
#ifndef V11_SHORT_D64_SPLIT
#define V11_SHORT_D64_SPLIT 4
#endif
#ifndef V11_SHORT_TMA_D64_BLOCK_N
#define V11_SHORT_TMA_D64_BLOCK_N 64
#endif
#ifndef V11_SHORT_TMA_D64_STAGES
#define V11_SHORT_TMA_D64_STAGES 3
#endif
#ifndef V11_SHORT_TMA_D64_SPLIT
#define V11_SHORT_TMA_D64_SPLIT 2
#endif

constexpr int kMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr int kMaxWarps = 16;
constexpr float kLog2e = 1.4426950408889634f;

// A tile configuration and everything derived from it. Shared-memory layout (byte offsets):
//   main loop   Q_i      [0, kQBytes)                          [kBlockM][kHeadDim] fp16, swizzled
//               stage s  [kQBytes + s * kStageBytes, + kStageBytes): K_j [kTileN][kHeadDim] fp16, swizzled,
//                        then V_j, same shape, at + kKvBytes
//   split merge (reuses the same bytes once every warp has left the loop; kSplit > 1 only)
//               stats    [0, kStatsBytes)                      [kSplit][kBlockM] float2 (m_i * scale * log2 e, l_i)
//               O parts  [kStatsBytes, kMergeBytes)             [kSplit][kBlockM][kOStride] fp32
// Every region starts on a 128-byte boundary: rows are 128 or 256 bytes and all counts are multiples of 16.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpM_, int kStages_, int kSplit_, int kMinBlocks_>
struct V11Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per warp per tile
  static constexpr int kWarpM = kWarpM_;    // query rows per warp
  static constexpr int kStages = kStages_;
  static constexpr int kSplit = kSplit_;    // key groups per CTA
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the register budget must allow

  static constexpr int kMTiles = kWarpM / 16;        // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp and tile
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O
  static constexpr int kKChunks = kHeadDim / 16;     // k16 steps of Q K^T
  static constexpr int kRowWarps = kBlockM / kWarpM;
  static constexpr int kWarps = kRowWarps * kSplit;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  static constexpr int kTileN = kSplit * kBlockN;   // keys per ring stage
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  // O_i (kMTiles * kDTiles * 4 fp32) plus Q_i held whole in registers must leave room for S and addresses.
  static constexpr bool kQInRegs = kMTiles * kHeadDim <= 128;

  // A split CTA (no Q_i staging in its epilogue) with Q_i in registers loads Q_i straight from global
  // memory, and its shared-memory bytes go to the ring instead (three 128-key stages fit 99 KB at D=64).
  static constexpr bool kQFromGlobal = kSplit > 1 && kQInRegs;
  static constexpr int kQBytes = kQFromGlobal ? 0 : kBlockM * kRowBytes;
  static constexpr int kKvBytes = kTileN * kRowBytes;
  static constexpr int kStageBytes = 2 * kKvBytes;
  static constexpr int kLoopBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kOStride = kHeadDim + 8;  // +8 floats: a half-warp's float2 stores cover the 32 banks once
  static constexpr int kStatsBytes = kSplit * kBlockM * 8;
  static constexpr int kMergeBytes = kSplit > 1 ? kStatsBytes + kSplit * kBlockM * kOStride * 4 : 0;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpM == 16 || kWarpM == 32, "WARP_M: 16 or 32 query rows per warp");
  static_assert(kBlockM % kWarpM == 0 && kBlockM >= kWarpM, "BLOCK_M: a multiple of WARP_M");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "BLOCK_N: a multiple of 16 in 16..128");
  static_assert(kStages >= 2, "STAGES: at least 2 (one tile computes while the next lands)");
  static_assert(kSplit >= 1, "SPLIT: at least 1");
  static_assert(kMinBlocks >= 1, "MIN_BLOCKS: at least 1");
  static_assert(kWarps <= kMaxWarps, "(BLOCK_M / WARP_M) * SPLIT: at most 16 warps per CTA");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0,
                "a CTA-wide copy pass must cover whole 8-row swizzle periods");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

// Configuration slots, V11Config<D, BLOCK_M, BLOCK_N, WARP_M, STAGES, SPLIT, MIN_BLOCKS>: the launcher uses
// exactly these kernels.
using LongD64 = V11Config<64, 128, 64, 32, 2, 1, 2>;
using LongD128 = V11Config<128, V11_LONG_D128_BLOCK_M, V11_LONG_D128_BLOCK_N, V11_LONG_D128_WARP_M, 2, 1,
                           V11_LONG_D128_MIN_BLOCKS>;
using ShortD64 = V11Config<64, 32, V11_SHORT_D64_BLOCK_N, V11_SHORT_D64_WARP_M, V11_SHORT_D64_STAGES,
                           V11_SHORT_D64_SPLIT, 1>;
using ShortD128 = V11Config<128, 32, 16, 16, 2, 4, 1>;
// LongD128's family twin (v11_fwd_family; D=128's long softcap calls): 32-key tiles. With LongD128's 48 the tanh's registers leave ptxas
// 8-12 bytes short at 255 (spills on sm_89 and sm_90); with 32 it takes 243-247 and spills nothing.
using LongFamilyD128 = V11Config<128, V11_LONG_D128_BLOCK_M, 32, V11_LONG_D128_WARP_M, 2, 1, V11_LONG_D128_MIN_BLOCKS>;
// sm_90's short D=64 kernel (v11_fwd_tma): K and V arrive by TMA, so a wider, shallower tiling pays off.
using ShortTmaD64 = V11Config<64, 32, V11_SHORT_TMA_D64_BLOCK_N, 16, V11_SHORT_TMA_D64_STAGES,
                              V11_SHORT_TMA_D64_SPLIT, 1>;

// Shared memory of a TMA kernel: the ring and merge bytes, then one mbarrier per stage.
template <class Cfg>
constexpr int tma_smem_bytes() {
  return Cfg::kSmemBytes + 8 * Cfg::kStages;
}
// What the TMA path relies on: 128-byte rows (one box row is one swizzle row), Q_i in registers (the ring
// starts at offset 0, every stage and its V half on 1024-byte boundaries), a box of at most 256 rows.
static_assert(ShortTmaD64::kHeadDim == 64 && ShortTmaD64::kQFromGlobal && ShortTmaD64::kTileN <= 256 &&
                  ShortTmaD64::kKvBytes % 1024 == 0,
              "SHORT_TMA_D64: D = 64, SPLIT > 1 with Q_i in registers, SPLIT * BLOCK_N <= 256 keys");
static_assert(tma_smem_bytes<ShortTmaD64>() <= kMaxSmemBytes, "SHORT_TMA_D64: at most 99 KB per block");
// sm_90's long D=64 kernel: LongD64's tiles, K and V by TMA; Q_i by cp.async into its own 1024-byte-aligned bytes.
using LongTmaD64 = LongD64;
static_assert(LongTmaD64::kHeadDim == 64 && LongTmaD64::kSplit == 1 && LongTmaD64::kQInRegs &&
                  LongTmaD64::kQBytes % 1024 == 0 && LongTmaD64::kKvBytes % 1024 == 0 && LongTmaD64::kTileN <= 256,
              "LONG_TMA_D64: D = 64, one key group, Q_i in registers, 1024-byte-aligned stages");

// Grid order, measured at 2,16,4096 on the lent H200: at D=64 non-causal, x = query tile and y = batch * heads
// (every query tile of a few heads per wave) ran 438 us (314 TFLOP/s) against 458 us (300) with batch * heads
// on x; at D=128 the same change went the other way, 820 -> 837 us. (Predicted +3% at D=128 from L2: the
// CTAs of a head walk K/V in lockstep either order, so the working set is a window, not all 64 MB of K/V.)
// So query tile first only for D=64 non-causal. Causal keeps x = batch * heads, y = query tile reversed:
// a wave holds the same heavy tile of many heads and the last wave is made of light tiles.
__host__ __device__ constexpr bool query_tile_fastest(bool causal, int head_dim) { return !causal && head_dim == 64; }
