// ladder/v9_warp.cuh — v9's consumer warp's pieces: S = Q_i K_j^T on WMMA fragments, the short-chain row reductions
// of the softmax, and the epilogue's store of 16 normalised O rows through the warp's scratch.
#pragma once

#include "common/mma_sm80.cuh"  // fc::pack_half2
#include "ladder/v9_traits.cuh"

// S = Q_i K_j^T for one warp's rows and key slice, left in registers; each K fragment feeds every row fragment.
template <int kHeadDim, int kKeySplit>
__device__ __forceinline__ void warp_scores(
    AccFrag (&s)[Config<kHeadDim, kKeySplit>::kRowFrags][Config<kHeadDim, kKeySplit>::kNFrags],
    const RowFrag (&q)[Config<kHeadDim, kKeySplit>::kRowFrags][Config<kHeadDim, kKeySplit>::kDFrags],
    const __half* K_slice) {  // [kSliceN][kKvStride]
  using C = Config<kHeadDim, kKeySplit>;
  constexpr int kKvStride = SmemLayout<kHeadDim, kKeySplit>::kKvStride;
#pragma unroll
  for (int n = 0; n < C::kNFrags; ++n) {
#pragma unroll
    for (int rf = 0; rf < C::kRowFrags; ++rf) nvcuda::wmma::fill_fragment(s[rf][n], 0.f);
#pragma unroll
    for (int kk = 0; kk < C::kDFrags; ++kk) {
      KtFrag k_frag;
      nvcuda::wmma::load_matrix_sync(k_frag, K_slice + n * kFrag * kKvStride + kk * kFrag, kKvStride);
#pragma unroll
      for (int rf = 0; rf < C::kRowFrags; ++rf) nvcuda::wmma::mma_sync(s[rf][n], q[rf][kk], k_frag, s[rf][n]);
    }
  }
}

template <int kCount>
__device__ __forceinline__ float tree_max(const float (&x)[kCount]) {
  float m[4] = {x[0], x[1], x[2], x[3]};  // four chains: a short dependency path, not kCount - 1 steps
#pragma unroll
  for (int j = 4; j < kCount; ++j) m[j % 4] = fmaxf(m[j % 4], x[j]);
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

template <int kCount>
__device__ __forceinline__ float tree_sum(const float (&x)[kCount]) {
  float s[4] = {x[0], x[1], x[2], x[3]};
#pragma unroll
  for (int j = 4; j < kCount; ++j) s[j % 4] += x[j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// 16 rows of O_i (fp32 fragments, already normalised) -> fp16 rows qr0 .. qr0 + 15 of o, through the
// warp's scratch, 64 columns per pass.
template <int kHeadDim>
__device__ __forceinline__ void store_rows(const FlashcoreParams& p, __half* __restrict__ o,  // [S, D]
                                           const AccFrag (&o_frag)[kHeadDim / kFrag], float* staging,  // [16][kOStride]
                                           int qr0, int lane) {
#pragma unroll
  for (int pass = 0; pass < kHeadDim / 64; ++pass) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      nvcuda::wmma::store_matrix_sync(staging + n * kFrag, o_frag[pass * 4 + n], kOStride, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < kFrag * 8; c += fc::kWarpSize) {
      const int r = c / 8, col = (c % 8) * 8;
      const float4 a = *reinterpret_cast<const float4*>(staging + r * kOStride + col);
      const float4 b = *reinterpret_cast<const float4*>(staging + r * kOStride + col + 4);
      if (qr0 + r < p.seq_len) {
        const uint4 packed = {fc::pack_half2(a.x, a.y), fc::pack_half2(a.z, a.w), fc::pack_half2(b.x, b.y), fc::pack_half2(b.z, b.w)};
        *reinterpret_cast<uint4*>(o + static_cast<size_t>(qr0 + r) * kHeadDim + pass * 64 + col) = packed;
      }
    }
    __syncwarp();  // every lane has read the staging before the next pass (or caller) overwrites it
  }
}
