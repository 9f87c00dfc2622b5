// ladder/wmma_rung.cuh — what rungs 2 and 3 (ladder/fp32p.cu, ladder/wmma_64x64.cu) share, written once: Q_i staged
// through registers into shared memory (ladder/tile_regs.cuh) and read as WMMA A fragments, the masked scores of a
// softmax thread's columns, and O = diag(alpha) O + P V on WMMA 16x16x16 fragments with alpha read back as an
// accumulator tile. The rungs differ in their tiles, in how many 16x16 blocks of S a warp computes, in the
// softmax's thread layout and in where P lives (its own buffers, or over the scores); each .cu keeps that part, its
// K/V loads and its epilogue, and its story. Both rungs' SASS is what it was before these parts moved here (checked
// with cuobjdump on sm_80, sm_89 and sm_90); moving the epilogue too, or the K/V loads with the rest, renumbered
// fp32p's accumulator registers.
//
// Layout conventions both rungs follow: warp w reads query stripe w / 2 (16 rows) and takes output tiles
// (w % 2) * kOTiles .. of D in P V; diag holds one 16x16 FP32 tile per stripe, a row's value broadcast along it
// (WMMA leaves the fragment layout unspecified, so a per-row factor reaches the accumulators as a loaded tile of
// the same layout).
#pragma once

#include "flashcore.h"
#include "ladder/tile_regs.cuh"

#include <mma.h>

namespace wmma_rung {

namespace wmma = nvcuda::wmma;

constexpr int kFrag = 16;  // WMMA m = n = k
constexpr int kVec = 8;    // halves per 16-byte global access
constexpr float kLog2e = 1.4426950408889634f;

using AccFrag = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;
using AFrag = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __half, wmma::row_major>;

// Q_i (rows row0.., past S zero-filled) into shared memory, then this warp's 16-row stripe as A fragments.
template <int kHeadDim, int kBlockM, int kThreads, int kH>
__device__ __forceinline__ void load_q(AFrag (&q_frag)[kHeadDim / kFrag], __half* Q_i, const __half* q, int row0,
                                       int seq_len, int tid, int stripe) {
  {
    fc::TileRegs<kHeadDim, kBlockM, kThreads> q_regs;
    fc::fetch_tile(q_regs, q, row0, seq_len, tid);
    fc::store_tile<kH>(Q_i, q_regs, tid);
  }
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / kFrag; ++kk) {
    wmma::load_matrix_sync(q_frag[kk], Q_i + stripe * kFrag * kH + kk * kFrag, kH);
  }
}

// A softmax thread's scores (keys key0..) in log2 units, -inf past the sequence end and (causal) past the
// diagonal of query row `row`; returns their max (the caller reduces it over the row's threads).
template <int kCols>
__device__ __forceinline__ float mask_scores(float (&s)[kCols], int key0, int row, const FlashcoreParams& p,
                                             float scale_log2) {
  float m_tile = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int key = key0 + c;
    const bool visible = key < p.seq_len && (!p.causal || key <= row);
    s[c] = visible ? s[c] * scale_log2 : -INFINITY;
    m_tile = fmaxf(m_tile, s[c]);
  }
  return m_tile;
}

// O = diag(alpha) O + P V for this warp's output tiles: alpha from the stripe's broadcast tile (diag_stripe), P the
// stripe's 16 rows of fp16 probabilities (kPStride halves per row), V_j's columns (half_id * kOTiles + t) * 16 ..
template <int kBlockN, int kOTiles, int kH, int kPStride>
__device__ __forceinline__ void rescale_and_accumulate(AccFrag (&O_frag)[kOTiles], const float* diag_stripe,
                                                       const __half* P, const __half* V_j, int half_id) {
  {
    AccFrag alpha_frag;
    wmma::load_matrix_sync(alpha_frag, diag_stripe, kFrag, wmma::mem_row_major);
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
#pragma unroll
      for (int e = 0; e < alpha_frag.num_elements; ++e) O_frag[t].x[e] *= alpha_frag.x[e];
    }
  }
#pragma unroll
  for (int kk = 0; kk < kBlockN / kFrag; ++kk) {
    AFrag p_frag;
    wmma::load_matrix_sync(p_frag, P + kk * kFrag, kPStride);
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __half, wmma::row_major> v_frag;
      wmma::load_matrix_sync(v_frag, V_j + kk * kFrag * kH + (half_id * kOTiles + t) * kFrag, kH);
      wmma::mma_sync(O_frag[t], p_frag, v_frag, O_frag[t]);
    }
  }
}

}  // namespace wmma_rung
