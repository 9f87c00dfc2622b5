// decode_combine.cuh — how the decode rung's partial results become O and LSE. Two merges of the same kind:
//   in the CTA   its kConsumerWarps warps each saw a quarter of every tile: their (m, l, l_fp32, O) rows go
//                through shared memory and one merge gives the CTA's rows; with one split they are O and LSE,
//                otherwise the CTA's record in the workspace (decode_split.cuh);
//   combine      a second kernel merges a row's `splits` records into O and LSE. It is launched as a
//                programmatic dependent of the split kernel on sm_90 (the split CTAs let it launch at their
//                start, it waits for their memory at its own), so its launch overlaps their tail.
// Merge of parts p with m_p (log2 units), l_p and O_p: m = max_p m_p, w_p = exp2(m_p - m),
//   O = sum_p w_p O_p / sum_p w_p l_p,   LSE = (m + log2 sum_p w_p l_fp32_p) * ln 2.
// A row no part saw (m = -inf; only causal rows with i + S_kv < S) gets O = 0 and LSE = +inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "decode_split.cuh"
#include "decode_tile.cuh"
#include "fa2_mma.cuh"

namespace fc::decode {

constexpr float kLn2 = 0.6931471805599453f;

// griddepcontrol (sm_90+; no-ops below, where the combine is an ordinary stream-ordered launch).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Columns 8c .. 8c + 7 of one row merged over n parts: stat(p) gives (m_p, l_p, l_fp32_p), part(p) its O
// row. Returns m; leaves l, l_fp32 and acc (all weighted by exp2(m_p - m); every weight 0 when m = -inf).
template <class Stat, class Part>
__device__ __forceinline__ float merge_parts(int n, Stat stat, Part part, int c, float& l, float& l_fp32,
                                             float (&acc)[8]) {
  float m = -INFINITY;
#pragma unroll 4
  for (int p = 0; p < n; ++p) m = fmaxf(m, stat(p).x);
  const float m_ref = m == -INFINITY ? 0.f : m;
  l = 0.f;
  l_fp32 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
#pragma unroll 4
  for (int p = 0; p < n; ++p) {
    const float4 st = stat(p);
    const float w = exp2f(st.x - m_ref);
    l = fmaf(w, st.y, l);
    l_fp32 = fmaf(w, st.z, l_fp32);
    const float4* o = reinterpret_cast<const float4*>(part(p) + 8 * c);
    const float4 lo = o[0], hi = o[1];
    acc[0] = fmaf(w, lo.x, acc[0]); acc[1] = fmaf(w, lo.y, acc[1]);
    acc[2] = fmaf(w, lo.z, acc[2]); acc[3] = fmaf(w, lo.w, acc[3]);
    acc[4] = fmaf(w, hi.x, acc[4]); acc[5] = fmaf(w, hi.y, acc[5]);
    acc[6] = fmaf(w, hi.z, acc[6]); acc[7] = fmaf(w, hi.w, acc[7]);
  }
  return m;
}

// O = acc / l as 8 elements of T (16 bytes) at o_chunk; with lse (chunk 0's thread only), the row's LSE.
template <class T>
__device__ __forceinline__ void store_output(__half* o_chunk, float* lse, float m, float l, float l_fp32,
                                             const float (&acc)[8]) {
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  uint4 out;
  out.x = fc::Element<T>::pack(acc[0] * inv_l, acc[1] * inv_l);
  out.y = fc::Element<T>::pack(acc[2] * inv_l, acc[3] * inv_l);
  out.z = fc::Element<T>::pack(acc[4] * inv_l, acc[5] * inv_l);
  out.w = fc::Element<T>::pack(acc[6] * inv_l, acc[7] * inv_l);
  *reinterpret_cast<uint4*>(o_chunk) = out;
  if (lse != nullptr) *lse = m == -INFINITY ? INFINITY : (m + __log2f(l_fp32)) * kLn2;
}

// A warp's rows into the CTA merge buffers: stats [kConsumerWarps][16] float4 (m_i * scale_log2, l_i,
// l_fp32, 0) and o_part [kConsumerWarps][16][kOStride] fp32.
template <class Cfg>
__device__ __forceinline__ void store_warp_rows(float4* stats, float* o_part, RowState<Cfg>& st, int warp,
                                                float scale_log2, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * Cfg::kBlockM + g + 8 * h;
    const float l_fp32 = fc::group_sum<4>(st.l_fp32[h]);  // the quad's four column pairs
    if (tq == 0) stats[row] = make_float4(st.m_i[h] * scale_log2, st.l_i[h], l_fp32, 0.f);
#pragma unroll
    for (int d = 0; d < Cfg::kDTiles; ++d) {
      *reinterpret_cast<float2*>(o_part + row * Cfg::kOStride + 8 * d + 2 * tq) =
          make_float2(st.o[d][2 * h], st.o[d][2 * h + 1]);
    }
  }
}

// The CTA's rows, once every warp's are in stats / o_part: one consumer thread per (row, 8 columns) merges
// the warps; rows past the group's M are padding and are not written. One split: O and LSE. Several: the
// CTA's record of each row in the workspace, unnormalised, for the combine.
template <class Cfg, class T>
__device__ __forceinline__ void store_cta_rows(const float4* stats, const float* o_part, const FlashcoreParams& p,
                                               const Split& plan, const CtaWork& work, int tid) {
  constexpr int kChunks = Cfg::kHeadDim / 8;
  for (int item = tid; item < Cfg::kBlockM * kChunks; item += Cfg::kConsumerThreads) {
    const int r = item / kChunks, c = item % kChunks;
    if (work.row0 + r >= plan.rows) continue;
    const long long row = static_cast<long long>(work.kv_head) * plan.rows + work.row0 + r;  // in [B * H * S]
    float l, l_fp32, acc[8];
    const float m = merge_parts(
        Cfg::kConsumerWarps, [&](int w) { return stats[w * Cfg::kBlockM + r]; },
        [&](int w) { return o_part + (w * Cfg::kBlockM + r) * Cfg::kOStride; }, c, l, l_fp32, acc);
    if (plan.splits == 1) {
      store_output<T>(p.o + row * Cfg::kHeadDim + 8 * c, c == 0 && p.lse != nullptr ? p.lse + row : nullptr, m, l,
                      l_fp32, acc);
    } else {
      float* record = static_cast<float*>(p.workspace) + record_offset(plan, row, work.split, Cfg::kHeadDim);
      reinterpret_cast<float4*>(record + 8 * c)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(record + 8 * c)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) *reinterpret_cast<float4*>(record + Cfg::kHeadDim) = make_float4(m, l, l_fp32, 0.f);
    }
  }
}

// The combine kernel's body: thread (row, c) of the [B * H * S rows][D / 8 chunks] grid merges the row's
// `splits` records, columns 8c .. 8c + 7.
template <class Cfg, class T>
__device__ __forceinline__ void combine_rows(const FlashcoreParams& p, const Split& plan) {
  constexpr int kChunks = Cfg::kHeadDim / 8;
  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long row = item / kChunks;
  const int c = static_cast<int>(item % kChunks);
  wait_for_prerequisite_grid();  // the split kernel's records are complete and visible
  if (row >= static_cast<long long>(plan.kv_heads) * plan.rows) return;
  const float* records = static_cast<const float*>(p.workspace) + record_offset(plan, row, 0, Cfg::kHeadDim);
  const int stride = record_floats(Cfg::kHeadDim);
  float l, l_fp32, acc[8];
  const float m = merge_parts(
      plan.splits, [&](int s) { return *reinterpret_cast<const float4*>(records + s * stride + Cfg::kHeadDim); },
      [&](int s) { return records + s * stride; }, c, l, l_fp32, acc);
  store_output<T>(p.o + row * Cfg::kHeadDim + 8 * c, c == 0 && p.lse != nullptr ? p.lse + row : nullptr, m, l, l_fp32,
                  acc);
}

}  // namespace fc::decode
