// sm90/epilogue_bwd_sm90.cuh — the end of a tile in v12's backward: one consumer warpgroup's dV and dK (times the
// softmax scale), 64 keys x D each, rounded to T. Where the staging tiles fit (BwdConfig::kEpiStaged), each goes
// through the warpgroup's staging tile (stmatrix into 128-byte swizzled panels, the TMA box's layout) and out by
// one TMA store, which clips rows at or past S_kv; the warpgroup waits only for its previous store to have read
// the tile. Else (80 queries per step) each thread stores its fragments to global memory itself. Read by
// sm90/mainloop_bwd_sm90.cuh.
#pragma once

#include "sm90/consumer_sm90.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "common/mma_sm80.cuh"
#include "common/tma.cuh"
#include "sm90/v12_bwd_traits.cuh"

#include <cstdint>

constexpr int kEpiBarrier = 8;  // + g: consumer g's staging tile free, then written (128 threads)

// acc (a 64 x D wgmma accumulator: this thread's rows 16 warp + lane/4 (+ 8), columns 8j + 2(lane%4) (+ 1)) times
// scale into the staging tile, then stored by TMA at rows first_row.. of head bh_kv. One 16 x 16 block per
// stmatrix: its four 8 x 8 tiles are (rows +0, +8) x (columns +0, +8), lane l giving row l % 8 of tile l / 8.
template <class Cfg, typename T>
__device__ __forceinline__ void store_rows_staged(const float (&acc)[Cfg::kHeadDim / 2], float scale,
                                                  const CUtensorMap* map, unsigned char* tile, int first_row,
                                                  int bh_kv, int g, int warp, int lane) {
  const bool tid0 = threadIdx.x % fc::kWarpgroupThreads == 0;
  if (tid0) fc::tma_store_wait_read<0>();  // the last store from this tile has read it
  fc::named_barrier_sync(kEpiBarrier + g, fc::kWarpgroupThreads);
  const int tile_of_lane = lane / 8, row = 16 * warp + lane % 8 + 8 * (tile_of_lane % 2);
  const uint32_t base = fc::smem_addr(tile);
#pragma unroll
  for (int c = 0; c < Cfg::kHeadDim / 16; ++c) {
    const int col = 16 * c + 8 * (tile_of_lane / 2), panel = col / 64, chunk = (col % 64) / 8;
    const float* a = acc + 8 * c;  // columns 16c.. (j = 2c) and 16c + 8.. (j = 2c + 1)
    const uint32_t r[4] = {pack2<T>(a[0] * scale, a[1] * scale), pack2<T>(a[2] * scale, a[3] * scale),
                           pack2<T>(a[4] * scale, a[5] * scale), pack2<T>(a[6] * scale, a[7] * scale)};
    fc::stmatrix_x4(base + panel * 64 * 128 + fc::swizzle(row, chunk, 128), r);
  }
  fc::fence_proxy_async_shared();  // the writes above, before the TMA reads them
  fc::named_barrier_sync(kEpiBarrier + g, fc::kWarpgroupThreads);
  if (tid0) {
    fc::tma_store_4d(map, 0, first_row, 0, bh_kv, tile);
    fc::tma_store_commit();
  }
}

// The same rows stored by each thread to global memory (4 bytes at a time); rows at or past S_kv are not written.
template <class Cfg, typename T>
__device__ __forceinline__ void store_rows_direct(const float (&acc)[Cfg::kHeadDim / 2], float scale, T* out,
                                                  int first_key, int seq_len_kv, int key_row) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = first_key + key_row + 8 * h;
    if (key >= seq_len_kv) continue;
    T* row = out + static_cast<size_t>(key) * Cfg::kHeadDim;
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
      *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * (threadIdx.x % 4)) =
          pack2<T>(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
    }
  }
}
