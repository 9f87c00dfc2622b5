// ladder/wmma_pipeline_traits.cuh — the tiles of the WMMA FlashAttention body (ladder/wmma_pipeline.cuh) of v8 and v10:
// WMMA fragment types, a rung's tile configuration and its shared-memory layout, and the memory steps that read them
// (cp.async tile loads, L2 prefetch, the accumulator row map, fp16 packing).
#pragma once

#include "flashcore.h"
#include "common/primitives.cuh"

#include <mma.h>

#include <cstdint>

namespace wmma_pipeline {

using namespace nvcuda;

constexpr int kFrag = 16;  // WMMA tile edge (m = n = k = 16)
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __half, wmma::row_major>;      // Q_i, P
using FragKt = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __half, wmma::col_major>;     // K_j^T
using FragV = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __half, wmma::row_major>;      // V_j
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;                   // S, O_i

static_assert(FragAcc::num_elements * 4 <= 32, "the row code packs 4 bits per accumulator element");

constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }
constexpr int max_int(int a, int b) { return a > b ? a : b; }

// One rung's tiles at one head dim: kBlockM query rows per CTA (16 per warp stripe), kBlockN keys per K/V tile
// split into kWarpsN slices, a kStages-deep ring, __launch_bounds__'s kMinBlocksPerSm, and whether the CTAs
// prefetch their own K/V rows to L2 up front.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpsN_, int kStages_, int kMinBlocksPerSm_, bool kPrefetchL2_>
struct PipelineTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;                            // Br: query rows per CTA
  static constexpr int kBlockN = kBlockN_;                            // Bc: keys per K/V tile
  static constexpr int kWarpsN = kWarpsN_;                            // key slices of every tile
  static constexpr int kStages = kStages_;                            // K/V tiles in shared memory
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr bool kPrefetchL2 = kPrefetchL2_;
  static constexpr int kSliceN = kBlockN / kWarpsN;                   // keys of each tile one warp owns
  static constexpr int kWarpsM = kBlockM / kFrag;                     // row stripes
  static constexpr int kThreads = kWarpsM * kWarpsN * fc::kWarpSize;

  static_assert(kBlockM % kFrag == 0 && kSliceN % kFrag == 0 && kBlockN % kSliceN == 0, "WMMA-sized tiles");
  static_assert(kStages >= 2, "cp.async needs a stage to compute and one to land");
  static_assert(kThreads <= 1024, "at most 32 warps per CTA");

  struct SmemLayout {
    static constexpr int kLdTile = kHeadDim + 8;  // halves per Q/K/V row
    static constexpr int kLdS = kSliceN + 8;      // floats per score row: 4 rows of a store or a float4 read
                                                  // phase land in 4 disjoint 8-bank groups
    static constexpr int kLdP = kSliceN + 8;      // halves per probability row (P overwrites S in place)
    static constexpr int kLdO = kHeadDim + 4;     // floats per row of a warp's partial O

    static constexpr int kQ = 0;
    static constexpr int kK = kQ + align128(kBlockM * kLdTile * 2);
    static constexpr int kKStage = align128(kBlockN * kLdTile * 2);
    static constexpr int kV = kK + kStages * kKStage;
    static constexpr int kScratch = kV + kStages * kKStage;
    static constexpr int kScratchWarp = align128(kFrag * kLdS * 4);
    static constexpr int kLoopBytes = kScratch + kWarpsM * kWarpsN * kScratchWarp;

    static constexpr int kOPart = 0;
    static constexpr int kOPartSlice = align128(kBlockM * kLdO * 4);
    static constexpr int kMPart = kOPart + kWarpsN * kOPartSlice;
    static constexpr int kStatSlice = align128(kBlockM * 4);
    static constexpr int kLPart = kMPart + kWarpsN * kStatSlice;
    static constexpr int kEpilogueBytes = kLPart + kWarpsN * kStatSlice;

    static constexpr int kBytes = max_int(kLoopBytes, kEpilogueBytes);

    static_assert(kLdTile % 8 == 0 && kLdP % 8 == 0 && kLdS % 4 == 0 && kLdO % 4 == 0, "WMMA ldm rules");
    static_assert(kFrag * kLdP * 2 <= kFrag * kLdS * 4, "P fits in the bytes of S");
    static_assert(kBytes <= 101376, "the tiles must fit the L4's 99 KB per block at this head dim");

    char* base;
    __device__ explicit SmemLayout(char* smem) : base(smem) {}
    __device__ __half* q() const { return reinterpret_cast<__half*>(base + kQ); }  // [kBlockM][kLdTile]
    __device__ __half* k(int stage) const {                                         // [kBlockN][kLdTile]
      return reinterpret_cast<__half*>(base + kK + stage * kKStage);
    }
    __device__ __half* v(int stage) const {                                         // [kBlockN][kLdTile]
      return reinterpret_cast<__half*>(base + kV + stage * kKStage);
    }
    __device__ float* scores(int warp) const {                                      // [16][kLdS]
      return reinterpret_cast<float*>(base + kScratch + warp * kScratchWarp);
    }
    __device__ __half* probs(int warp) const {                                      // [16][kLdP], over scores()
      return reinterpret_cast<__half*>(base + kScratch + warp * kScratchWarp);
    }
    __device__ float* o_part(int slice) const {                                     // [kBlockM][kLdO]
      return reinterpret_cast<float*>(base + kOPart + slice * kOPartSlice);
    }
    __device__ float* m_part(int slice) const {                                     // [kBlockM]
      return reinterpret_cast<float*>(base + kMPart + slice * kStatSlice);
    }
    __device__ float* l_part(int slice) const {                                     // [kBlockM]
      return reinterpret_cast<float*>(base + kLPart + slice * kStatSlice);
    }
  };

  // Rows [row0, row0 + kRows) of a [S, D] matrix -> a [kRows][ld] shared tile, one 16-byte cp.async per
  // chunk. Rows past the sequence end are zero-filled: a masked key then multiplies a zero row of V (p = 0
  // times garbage could be NaN).
  template <int kRows>
  static __device__ __forceinline__ void load_tile_async(__half* tile, int ld, const __half* __restrict__ src, int row0,
                                                  int seq_len, int tid) {
    constexpr int kChunks = kRows * (kHeadDim / 8);
  #pragma unroll
    for (int i = 0; i < fc::ceil_div(kChunks, kThreads); ++i) {
      const int c = tid + i * kThreads;
      if (kChunks % kThreads != 0 && c >= kChunks) break;
      const int r = c / (kHeadDim / 8);
      const int col = (c % (kHeadDim / 8)) * 8;
      const bool valid = row0 + r < seq_len;
      const __half* from = src + static_cast<size_t>(valid ? row0 + r : 0) * kHeadDim + col;
      fc::cp_async_16(tile + r * ld + col, from, valid);
    }
  }

  // Rows [row_begin, row_end) of a [S, D] matrix, at most kBlockM of them -> L2, one prefetch per 128-byte line.
  static __device__ __forceinline__ void prefetch_rows_l2(const __half* src, int row_begin, int row_end, int tid) {
    constexpr int kLinesPerRow = kHeadDim * static_cast<int>(sizeof(__half)) / 128;
    const char* first = reinterpret_cast<const char*>(src + static_cast<size_t>(row_begin) * kHeadDim);
    const int lines = (row_end - row_begin) * kLinesPerRow;
  #pragma unroll
    for (int i = 0; i < fc::ceil_div(kBlockM * kLinesPerRow, kThreads); ++i) {
      const int line = tid + i * kThreads;
      if (line < lines) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(first + line * 128));
    }
  }

  // Which row of its 16 x 16 tile each accumulator element holds, 4 bits per element. WMMA does not specify
  // the order, so write a tile whose entries are their own row index and load it back through the API.
  static __device__ __forceinline__ uint32_t accumulator_row_code(float* scratch, int ld, int lane) {
    for (int i = lane; i < kFrag * kFrag; i += fc::kWarpSize) scratch[(i / kFrag) * ld + i % kFrag] = i / kFrag;
    __syncwarp();
    FragAcc probe;
    wmma::load_matrix_sync(probe, scratch, ld, wmma::mem_row_major);
    uint32_t code = 0;
  #pragma unroll
    for (int e = 0; e < FragAcc::num_elements; ++e) code |= static_cast<uint32_t>(probe.x[e]) << (4 * e);
    __syncwarp();  // every lane has read the probe before the scratch holds scores
    return code;
  }

  static __device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

}  // namespace wmma_pipeline
