// ladder/wmma_pipeline.cuh — the WMMA FlashAttention body of v8 and v10: the rungs differ only in their tiles.
//
// v8 (48x32 tiles, 2 stages) and v10 (64x64 tiles, 3 stages) run the same kernel: per warp a 16-row stripe
// of the CTA's query tile and one slice of every K/V tile; S = Q K^T through WMMA into a warp-private
// shared block; the softmax on it in registers (one lane pair per row); P written over S as fp16; O += P V
// in WMMA accumulators rescaled in registers through a row map read back from the API; K/V streamed by a
// kStages-deep cp.async ring (kStages - 1 tiles in flight); the warps' key slices merged at the end. Each
// rung's .cu picks the tiles and tells its story; this file is the mechanism, written once (its tiles, layout and
// memory steps: ladder/wmma_pipeline_traits.cuh).
#pragma once

#include "flashcore.h"
#include "common/primitives.cuh"
#include "ladder/wmma_pipeline_traits.cuh"

#include <mma.h>

#include <cstdint>

namespace wmma_pipeline {

// The kernel body over one rung's tiles (PipelineTraits, ladder/wmma_pipeline_traits.cuh: the tile configuration, the
// shared-memory layout and the memory steps).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpsN_, int kStages_, int kMinBlocksPerSm_, bool kPrefetchL2_>
struct Pipeline : PipelineTraits<kHeadDim_, kBlockM_, kBlockN_, kWarpsN_, kStages_, kMinBlocksPerSm_, kPrefetchL2_> {
  using Traits = PipelineTraits<kHeadDim_, kBlockM_, kBlockN_, kWarpsN_, kStages_, kMinBlocksPerSm_, kPrefetchL2_>;
  using Traits::kHeadDim;
  using Traits::kBlockM;
  using Traits::kBlockN;
  using Traits::kWarpsN;
  using Traits::kStages;
  using Traits::kMinBlocksPerSm;
  using Traits::kPrefetchL2;
  using Traits::kSliceN;
  using Traits::kWarpsM;
  using Traits::kThreads;
  using Traits::load_tile_async;
  using Traits::prefetch_rows_l2;
  using Traits::accumulator_row_code;
  using Traits::pack_half2;
  using typename Traits::SmemLayout;

  static __device__ __forceinline__ void forward(const FlashcoreParams& p) {
    using Layout = SmemLayout;
    constexpr int kLdTile = Layout::kLdTile;
    constexpr int kLdS = Layout::kLdS;
    constexpr int kLdP = Layout::kLdP;
    constexpr int kLdO = Layout::kLdO;
    constexpr int kDimFrags = kHeadDim / kFrag;   // 16-wide column blocks of Q, K, V and O
    constexpr int kSliceFrags = kSliceN / kFrag;  // 16-key blocks of a warp's slice
    constexpr int kGroups = kSliceN / 8;          // a softmax lane holds 4 adjacent columns of every 8

    extern __shared__ __align__(128) char smem_raw[];
    const Layout smem(smem_raw);

    const int tid = threadIdx.x;
    const int lane = tid % fc::kWarpSize;
    const int warp = tid / fc::kWarpSize;
    const int warp_m = warp / kWarpsN;  // which 16 query rows of the CTA tile this warp owns
    const int warp_n = warp % kWarpsN;  // which kSliceN keys of every K/V tile
    const int seq_len = p.seq_len;
    // Under causal masking the last query tiles do the most work: hand them out first.
    const int query_tile = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int row0 = query_tile * kBlockM;
    const int stripe_row0 = row0 + warp_m * kFrag;
    const size_t head = fc::head_offset(p, blockIdx.z, blockIdx.y);
    const __half* __restrict__ q = fc::tensor<__half>(p.q) + head;  // [S, D] of this (b, h)
    const __half* __restrict__ k = fc::tensor<__half>(p.k) + head;  // [S, D]
    const __half* __restrict__ v = fc::tensor<__half>(p.v) + head;  // [S, D]
    __half* __restrict__ o = fc::tensor<__half>(p.o) + head;        // [S, D]
    const float scale_log2 = p.scale * kLog2e;  // softmax in base 2: exp(x) = exp2(x log2 e)

    // Under causal masking no row of this CTA sees a key at or past row0 + kBlockM.
    const int kv_end = p.causal ? min(seq_len, row0 + kBlockM) : seq_len;
    const int num_tiles = fc::ceil_div(kv_end, kBlockN);

    if constexpr (kPrefetchL2) {
      const int own_end = min(seq_len, row0 + kBlockM);
      prefetch_rows_l2(k, row0, own_end, tid);
      prefetch_rows_l2(v, row0, own_end, tid);
    }

    // One cp.async group for Q_i, then one per K/V tile.
    load_tile_async<kBlockM>(smem.q(), kLdTile, q, row0, seq_len, tid);
    fc::cp_async_commit();
  #pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < num_tiles) {
        load_tile_async<kBlockN>(smem.k(t), kLdTile, k, t * kBlockN, seq_len, tid);
        load_tile_async<kBlockN>(smem.v(t), kLdTile, v, t * kBlockN, seq_len, tid);
      }
      fc::cp_async_commit();
    }

    float* scores = smem.scores(warp);  // [16][kLdS]: this warp's block of S ...
    __half* probs = smem.probs(warp);   // [16][kLdP]: ... overwritten in place by its P
    const uint32_t row_code = accumulator_row_code(scores, kLdS, lane);

    fc::cp_async_wait<kStages - 1>();  // Q_i has landed; K/V tiles may still be in flight
    __syncthreads();
    FragA q_frag[kDimFrags];
  #pragma unroll
    for (int kk = 0; kk < kDimFrags; ++kk) {
      wmma::load_matrix_sync(q_frag[kk], smem.q() + warp_m * kFrag * kLdTile + kk * kFrag, kLdTile);
    }

    FragAcc o_frag[kDimFrags];  // O_i, unnormalised, over this warp's keys
  #pragma unroll
    for (int nn = 0; nn < kDimFrags; ++nn) wmma::fill_fragment(o_frag[nn], 0.f);
    const int r = lane / 2;        // the score row this lane's softmax works on
    const int col0 = 4 * (lane % 2);  // ... and its columns: col0 .. col0 + 3 of every 8
    float m_i = -INFINITY;  // running max of row r's scaled scores (log2 units) over this warp's keys
    float l_i = 0.f;        // running sum of exp2(s - m_i) over this lane's columns of row r

    for (int j = 0; j < num_tiles; ++j) {
      fc::cp_async_wait<kStages - 2>();
      // Tile j is visible to every warp, and every warp is done with tile j - 1, whose stage is refilled now.
      __syncthreads();
      const int next = j + kStages - 1;
      if (next < num_tiles) {
        load_tile_async<kBlockN>(smem.k(next % kStages), kLdTile, k, next * kBlockN, seq_len, tid);
        load_tile_async<kBlockN>(smem.v(next % kStages), kLdTile, v, next * kBlockN, seq_len, tid);
      }
      fc::cp_async_commit();  // possibly empty: keeps one group per tile, so the wait count stays fixed

      const int key0 = j * kBlockN + warp_n * kSliceN;  // first key of this warp's slice
      // Skip a slice no row of the stripe can see (past the end, above the diagonal, or a stripe of padding).
      if (stripe_row0 >= seq_len || key0 >= seq_len || (p.causal && key0 > stripe_row0 + kFrag - 1)) continue;
      const bool needs_mask = key0 + kSliceN > seq_len || (p.causal && key0 + kSliceN - 1 > stripe_row0);
      const __half* k_slice = smem.k(j % kStages) + warp_n * kSliceN * kLdTile;  // [kSliceN][kLdTile]
      const __half* v_slice = smem.v(j % kStages) + warp_n * kSliceN * kLdTile;  // [kSliceN][kLdTile]

      // S = Q K^T
  #pragma unroll
      for (int f = 0; f < kSliceFrags; ++f) {
        FragAcc s_frag;
        wmma::fill_fragment(s_frag, 0.f);
  #pragma unroll
        for (int kk = 0; kk < kDimFrags; ++kk) {
          FragKt k_frag;
          wmma::load_matrix_sync(k_frag, k_slice + f * kFrag * kLdTile + kk * kFrag, kLdTile);
          wmma::mma_sync(s_frag, q_frag[kk], k_frag, s_frag);
        }
        wmma::store_matrix_sync(scores + f * kFrag, s_frag, kLdS, wmma::mem_row_major);
      }
      __syncwarp();

      // m_new = max(m_i, rowmax(S * scale)), masked past the sequence end and (causal) past the diagonal
      float s[4 * kGroups];
  #pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const float4 x = *reinterpret_cast<const float4*>(scores + r * kLdS + 8 * g + col0);
        s[4 * g + 0] = x.x * scale_log2;
        s[4 * g + 1] = x.y * scale_log2;
        s[4 * g + 2] = x.z * scale_log2;
        s[4 * g + 3] = x.w * scale_log2;
      }
      if (needs_mask) {
        const int query = stripe_row0 + r;
  #pragma unroll
        for (int i = 0; i < 4 * kGroups; ++i) {
          const int key = key0 + 8 * (i / 4) + col0 + i % 4;
          if (key >= seq_len || (p.causal && key > query)) s[i] = -INFINITY;
        }
      }
      float m_tile = -INFINITY;
  #pragma unroll
      for (int i = 0; i < 4 * kGroups; ++i) m_tile = fmaxf(m_tile, s[i]);
      m_tile = fmaxf(m_tile, __shfl_xor_sync(kFullMask, m_tile, 1));  // the lane holding the row's other columns
      const float m_new = fmaxf(m_i, m_tile);
      // A row that has seen no key yet keeps m = -inf: measure from 0 so exp2 never gets (-inf) - (-inf).
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_i - m_ref);

      // P = exp2(S - m_new); l_i = alpha l_i + rowsum(P)
      float row_sum = 0.f;
  #pragma unroll
      for (int i = 0; i < 4 * kGroups; ++i) {
        s[i] = exp2f(s[i] - m_ref);
        row_sum += s[i];
      }
      l_i = l_i * alpha + row_sum;
      m_i = m_new;
      __syncwarp();  // every lane has read its scores before P overwrites them
  #pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const uint2 packed = {pack_half2(s[4 * g], s[4 * g + 1]), pack_half2(s[4 * g + 2], s[4 * g + 3])};
        *reinterpret_cast<uint2*>(probs + r * kLdP + 8 * g + col0) = packed;
      }
      __syncwarp();

      // O = diag(alpha) O + P V   (row x's alpha sits in lane 2x; row_code names each element's row)
  #pragma unroll
      for (int e = 0; e < FragAcc::num_elements; ++e) {
        const float a = __shfl_sync(kFullMask, alpha, 2 * ((row_code >> (4 * e)) & 15));
  #pragma unroll
        for (int nn = 0; nn < kDimFrags; ++nn) o_frag[nn].x[e] *= a;
      }
  #pragma unroll
      for (int f = 0; f < kSliceFrags; ++f) {
        FragA p_frag;
        wmma::load_matrix_sync(p_frag, probs + f * kFrag, kLdP);
  #pragma unroll
        for (int nn = 0; nn < kDimFrags; ++nn) {
          FragV v_frag;
          wmma::load_matrix_sync(v_frag, v_slice + f * kFrag * kLdTile + nn * kFrag, kLdTile);
          wmma::mma_sync(o_frag[nn], p_frag, v_frag, o_frag[nn]);
        }
      }
    }

    fc::cp_async_wait<0>();
    __syncthreads();  // the loop's buffers are free: the epilogue reuses their bytes

    // Each warp leaves its partial (m_w, l_w, O_w) over its keys ...
    float* o_part = smem.o_part(warp_n) + warp_m * kFrag * kLdO;  // [16][kLdO]
  #pragma unroll
    for (int nn = 0; nn < kDimFrags; ++nn) {
      wmma::store_matrix_sync(o_part + nn * kFrag, o_frag[nn], kLdO, wmma::mem_row_major);
    }
    const float l_row = l_i + __shfl_xor_sync(kFullMask, l_i, 1);
    if (lane % 2 == 0) {
      smem.m_part(warp_n)[warp_m * kFrag + r] = m_i;
      smem.l_part(warp_n)[warp_m * kFrag + r] = l_row;
    }
    __syncthreads();

    // ... and each output row merges them: O = sum_w exp2(m_w - M) O_w / sum_w exp2(m_w - M) l_w, M = max_w m_w.
    // M is finite for every real row: key 0 is visible to all of them and lies in warp_n == 0's first slice.
    constexpr int kChunksPerRow = kHeadDim / 8;
    for (int c = tid; c < kBlockM * kChunksPerRow; c += kThreads) {
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * 8;
      if (row0 + row >= seq_len) continue;
      float m_max = -INFINITY;
  #pragma unroll
      for (int w = 0; w < kWarpsN; ++w) m_max = fmaxf(m_max, smem.m_part(w)[row]);
      float acc[8] = {};
      float l_sum = 0.f;
  #pragma unroll
      for (int w = 0; w < kWarpsN; ++w) {
        const float weight = exp2f(smem.m_part(w)[row] - m_max);
        l_sum += weight * smem.l_part(w)[row];
        const float4 lo = *reinterpret_cast<const float4*>(smem.o_part(w) + row * kLdO + col);
        const float4 hi = *reinterpret_cast<const float4*>(smem.o_part(w) + row * kLdO + col + 4);
        acc[0] += weight * lo.x;
        acc[1] += weight * lo.y;
        acc[2] += weight * lo.z;
        acc[3] += weight * lo.w;
        acc[4] += weight * hi.x;
        acc[5] += weight * hi.y;
        acc[6] += weight * hi.z;
        acc[7] += weight * hi.w;
      }
      const float inv_l = 1.f / l_sum;
      const uint4 out = {pack_half2(acc[0] * inv_l, acc[1] * inv_l), pack_half2(acc[2] * inv_l, acc[3] * inv_l),
                         pack_half2(acc[4] * inv_l, acc[5] * inv_l), pack_half2(acc[6] * inv_l, acc[7] * inv_l)};
      *reinterpret_cast<uint4*>(o + static_cast<size_t>(row0 + row) * kHeadDim + col) = out;
    }
  }
};

// Launch a rung's kernel (its __global__ wrapper around Pipeline::forward) with the layout's dynamic shared
// memory, checked against the device's opt-in limit first.
template <class P, class Kernel>
inline const char* launch(Kernel kernel, const FlashcoreParams& p, cudaStream_t stream) {
  return fc::launch_query_tiles(kernel, p, P::kBlockM, P::kThreads, P::SmemLayout::kBytes, stream);
}

}  // namespace wmma_pipeline
