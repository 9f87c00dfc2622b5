// decode/load.cuh — the decode rung's producer warp: it streams one CTA's run of K/V tiles through a ring
// of kStages shared-memory stages, each stage [K_j panels][V_j panels] in decode/tile.cuh's panel layout.
// Stage s is handed over on two mbarriers: full[s] (the tile landed; the consumers wait on it) and
// empty[s] (all kConsumerThreads consumers are done reading it; the producer waits on it before a refill).
// Tile t of the run sits in stage t % kStages; its lap t / kStages gives the parity of both waits.
//
// Two loaders fill the same layout:
//   load_tiles_tma       sm_90: one lane issues, per stage, one 4-D TMA box of K and one of V (kBlockN keys x
//                        D/64 panels of 64 columns, 128-byte swizzle) onto full[s], armed with the stage's byte count
//                        (full[s] expects 1 arrival). No load instruction per 16 bytes, nothing for the
//                        warps to issue: the whole ring is in flight at the cost of a few instructions.
//   load_tiles_cp_async  any sm_80+: the 32 lanes copy the stage with 16-byte cp.async and arrive on full[s]
//                        when their own copies land (cp.async.mbarrier.arrive.noinc; full[s] expects 32).
// Keys at or past S_kv land as zeros (TMA's out-of-bounds fill, cp.async's zero source size), so P V never
// multiplies uninitialised bytes; the consumers mask their scores to -inf.
#pragma once

#include <cstdint>

#include "decode/tile.cuh"
#include "common/mbarrier.cuh"
#include "common/primitives.cuh"
#include "common/tma.cuh"

namespace fc::decode {

// tiles [tile_begin, tile_end) of K/V head kv_head, by TMA: the maps are common/hopper.cuh's panel maps of
// [B * H_kv][S_kv][D], one box per tile (see decode/decode.cu's encode_kv_map). Called by one lane.
template <class Cfg>
__device__ __forceinline__ void load_tiles_tma(unsigned char* ring, uint64_t* full, uint64_t* empty,
                                               const CUtensorMap* map_k, const CUtensorMap* map_v, int kv_head,
                                               int tile_begin, int tile_end) {
  int stage = 0;
  uint32_t phase = 0;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    if (tile - tile_begin >= Cfg::kStages) fc::mbarrier_wait_parity(&empty[stage], phase ^ 1);  // last lap's reads
    unsigned char* k_s = ring + stage * Cfg::kStageBytes;
    fc::mbarrier_arrive_expect_bytes(&full[stage], Cfg::kStageBytes);
    fc::tma_load_4d(k_s, map_k, 0, tile * Cfg::kBlockN, 0, kv_head, &full[stage]);
    fc::tma_load_4d(k_s + Cfg::kKvBytes, map_v, 0, tile * Cfg::kBlockN, 0, kv_head, &full[stage]);
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

// kBlockN rows from key0 of one head's [S_kv, D] slice into a panel-layout tile: lane copies 16-byte chunk
// lane % (D / 8) of rows lane / (D / 8) + r, r stepping by 32 / (D / 8). Rows 8 apart share the swizzle, so
// the loop runs over the first 8 rows' XOR patterns and steps 1 KB (an immediate) within each.
template <class Cfg>
__device__ __forceinline__ void copy_tile_async(unsigned char* tile, const __half* src, int key0, int lane) {
  constexpr int kChunks = Cfg::kHeadDim / 8;
  constexpr int kRowsPerPass = fc::kWarpSize / kChunks;
  const int chunk = lane % kChunks;
  const int row0 = lane / kChunks;
#pragma unroll
  for (int r8 = 0; r8 < 8; r8 += kRowsPerPass) {
    unsigned char* dst = tile + panel_offset<Cfg>(row0 + r8, chunk);
    const __half* g = src + static_cast<size_t>(key0 + row0 + r8) * Cfg::kHeadDim + chunk * 8;
#pragma unroll
    for (int q = 0; q < Cfg::kBlockN / 8; ++q) fc::cp_async_16(dst + q * 8 * 128, g + q * 8 * Cfg::kHeadDim, true);
  }
}

// The same for the head's last tile, which crosses S_kv: rows past it land as zeros (src-size 0, reading
// nothing from the slice's first row). Once per CTA at most, so a plain loop.
template <class Cfg>
__device__ __forceinline__ void copy_edge_tile_async(unsigned char* tile, const __half* src, int key0, int seq_len_kv,
                                                     int lane) {
  constexpr int kChunks = Cfg::kHeadDim / 8;
  const int chunk = lane % kChunks;
#pragma unroll 1
  for (int row = lane / kChunks; row < Cfg::kBlockN; row += fc::kWarpSize / kChunks) {
    const bool valid = key0 + row < seq_len_kv;
    const __half* g = valid ? src + static_cast<size_t>(key0 + row) * Cfg::kHeadDim + chunk * 8 : src;
    fc::cp_async_16(tile + panel_offset<Cfg>(row, chunk), g, valid);
  }
}

// The same run by cp.async from all 32 lanes; k and v point at the head's [S_kv, D] slices.
template <class Cfg>
__device__ __forceinline__ void load_tiles_cp_async(unsigned char* ring, uint64_t* full, uint64_t* empty,
                                                    const __half* k, const __half* v, int seq_len_kv, int tile_begin,
                                                    int tile_end, int lane) {
  int stage = 0;
  uint32_t phase = 0;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    if (tile - tile_begin >= Cfg::kStages) fc::mbarrier_wait_parity(&empty[stage], phase ^ 1);
    unsigned char* k_s = ring + stage * Cfg::kStageBytes;
    const int key0 = tile * Cfg::kBlockN;
    if (key0 + Cfg::kBlockN <= seq_len_kv) {
      copy_tile_async<Cfg>(k_s, k, key0, lane);
      copy_tile_async<Cfg>(k_s + Cfg::kKvBytes, v, key0, lane);
    } else {
      copy_edge_tile_async<Cfg>(k_s, k, key0, seq_len_kv, lane);
      copy_edge_tile_async<Cfg>(k_s + Cfg::kKvBytes, v, key0, seq_len_kv, lane);
    }
    fc::cp_async_mbarrier_arrive_noinc(&full[stage]);
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  fc::cp_async_wait_all();  // no thread exits with copies in flight
}

}  // namespace fc::decode
