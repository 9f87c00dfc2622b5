// ladder/tile_regs.cuh — a [kRows, D] tile of one (b, h) staged through registers: the synchronous loads of the
// WMMA rungs before cp.async (wmma, fp32p, 64x64).
#pragma once

#include <cuda_fp16.h>

#include <cstddef>

namespace fc {

// fetch_tile issues the thread's global loads (16 bytes each), store_tile writes them to shared memory. The K
// and V fetches of a tile are both issued before either store, so a tile costs one global-memory latency.
// Rows >= S are zero-filled: padded rows reach the tensor cores (and P V) as zeros, never as stale shared
// memory.
template <int kHeadDim, int kRows, int kThreads>
struct TileRegs {
  static constexpr int kVec = 8;                   // halves per 16-byte global access
  static constexpr int kChunks = kHeadDim / kVec;  // accesses per row
  static constexpr int kPerThread = kRows * kChunks / kThreads;
  static_assert(kRows * kChunks % kThreads == 0, "the tile splits evenly over the threads");
  uint4 chunk[kPerThread];
};

template <int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void fetch_tile(TileRegs<kHeadDim, kRows, kThreads>& regs,
                                           const __half* src,  // [S, D] global, one (b, h)
                                           int row0, int seq_len, int tid) {
  using R = TileRegs<kHeadDim, kRows, kThreads>;
#pragma unroll
  for (int i = 0; i < R::kPerThread; ++i) {
    const int idx = tid + i * kThreads;
    const int row = row0 + idx / R::kChunks;
    regs.chunk[i] = row < seq_len ? *reinterpret_cast<const uint4*>(src + static_cast<size_t>(row) * kHeadDim +
                                                                     (idx % R::kChunks) * R::kVec)
                                  : make_uint4(0u, 0u, 0u, 0u);
  }
}

// kLd: halves per row of the shared tile.
template <int kLd, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void store_tile(__half* dst,  // [kRows, kLd] shared
                                           const TileRegs<kHeadDim, kRows, kThreads>& regs, int tid) {
  using R = TileRegs<kHeadDim, kRows, kThreads>;
#pragma unroll
  for (int i = 0; i < R::kPerThread; ++i) {
    const int idx = tid + i * kThreads;
    *reinterpret_cast<uint4*>(dst + (idx / R::kChunks) * kLd + (idx % R::kChunks) * R::kVec) = regs.chunk[i];
  }
}

}  // namespace fc
