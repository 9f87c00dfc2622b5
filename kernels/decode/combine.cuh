// decode/combine.cuh — how the decode rung's partial results become O and LSE. Two merges of the same kind:
//   in the CTA   its kConsumerWarps warps each saw a quarter of every tile: their (m, l, l_fp32, O) rows go
//                through shared memory and one merge gives the CTA's rows; with one split they are O and LSE,
//                otherwise the CTA's record in the workspace (decode/split.cuh);
//   combine      a second kernel, one CTA per row, merges the row's `splits` records into O and LSE
//                (combine_row). It is launched as a programmatic dependent of the split kernel on sm_90 (the
//                split CTAs let it launch at their start, it waits for their memory at its own), so its launch
//                overlaps their tail.
// Merge of parts p with m_p (log2 units), l_p and O_p: m = max_p m_p, w_p = exp2(m_p - m),
//   O = sum_p w_p O_p / sum_p w_p l_p,   LSE = (m + log2 sum_p w_p l_fp32_p) * ln 2.
// A row no part saw (m = -inf: a window or causal mask that leaves query i no key, i + S_kv < S) gets O = 0 and
// LSE = +inf. A query head's sink (p.sinks) joins the row's denominator once, where O is written (store_output:
// the CTA's merge with one split, the combine with several; never in a record): LSE' = log(exp(LSE) + exp(sink)),
// O' = O exp(LSE - LSE'); a row that saw no key gets O = 0 and LSE = its sink.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "decode/split.cuh"
#include "decode/tile.cuh"
#include "common/fa2_fragments.cuh"
#include "common/family.cuh"

namespace fc::decode {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// The sink of row r of K/V head kv_head's group (p.sinks given) in log2 units.
__device__ __forceinline__ float sink_log2(const FlashcoreParams& p, int kv_head, int r) {
  return p.sinks[query_head(p, kv_head, r)] * kLog2e;
}

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

// Columns 8c .. 8c + 7 of one row merged over the kParts warps: stat(p) gives (m_p, l_p, l_fp32_p), part(p)
// its O row. Returns m; leaves l, l_fp32 and acc (all weighted by exp2(m_p - m); every weight 0 when m = -inf).
template <int kParts, class Stat, class Part>
__device__ __forceinline__ float merge_warps(Stat stat, Part part, int c, float& l, float& l_fp32, float (&acc)[8]) {
  float m = -INFINITY;
#pragma unroll
  for (int p = 0; p < kParts; ++p) m = fmaxf(m, stat(p).x);
  const float m_ref = m == -INFINITY ? 0.f : m;
  l = 0.f;
  l_fp32 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
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

// O = acc / l as 8 elements of T (16 bytes) at o_chunk; with lse (chunk 0's thread only), the row's LSE. sink2:
// the row's sink in log2 units, -inf for none. O divides by the rounded P's sum (one-hot rows stay exact); a
// sink then scales it by exp2(lse2 - lse2'), lse2 = m + log2 l_fp32 the LSE without it, lse2' with it
// (fc::finish_row_log2: o_scale = exp2(m - lse2')).
template <class T>
__device__ __forceinline__ void store_output(__half* o_chunk, float* lse, float m, float l, float l_fp32, float sink2,
                                             const float (&acc)[8]) {
  float inv_l = l > 0.f ? 1.f / l : 0.f;
  float lse2 = m == -INFINITY ? INFINITY : m + __log2f(l_fp32);
  if (sink2 != -INFINITY) {
    float o_scale;  // 0 for a row that saw no key
    lse2 = fc::finish_row_log2(m, l_fp32, sink2, o_scale);
    inv_l *= l_fp32 * o_scale;
  }
  uint4 out;
  out.x = fc::Element<T>::pack(acc[0] * inv_l, acc[1] * inv_l);
  out.y = fc::Element<T>::pack(acc[2] * inv_l, acc[3] * inv_l);
  out.z = fc::Element<T>::pack(acc[4] * inv_l, acc[5] * inv_l);
  out.w = fc::Element<T>::pack(acc[6] * inv_l, acc[7] * inv_l);
  *reinterpret_cast<uint4*>(o_chunk) = out;
  if (lse != nullptr) *lse = lse2 * kLn2;
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
    const float m = merge_warps<Cfg::kConsumerWarps>(
        [&](int w) { return stats[w * Cfg::kBlockM + r]; },
        [&](int w) { return o_part + (w * Cfg::kBlockM + r) * Cfg::kOStride; }, c, l, l_fp32, acc);
    if (plan.splits == 1) {
      store_output<T>(fc::tensor<__half>(p.o) + row * Cfg::kHeadDim + 8 * c, c == 0 && p.lse != nullptr ? p.lse + row : nullptr, m, l,
                      l_fp32, p.sinks != nullptr ? sink_log2(p, work.kv_head, work.row0 + r) : -INFINITY, acc);
    } else {
      float* record = static_cast<float*>(p.workspace) + record_offset(plan, row, work.split, Cfg::kHeadDim);
      reinterpret_cast<float4*>(record + 8 * c)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(record + 8 * c)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (c == 0) *reinterpret_cast<float4*>(record + Cfg::kHeadDim) = make_float4(m, l, l_fp32, 0.f);
    }
  }
}

// The combine kernel: one CTA of kCombineThreads per query row, the row's `splits` records read in parallel.
// First every thread takes a few records' stats for m, then their weights w_s = exp2(m_s - m) (kept in
// shared memory) and the weighted l sums; then slice j of the threads sums w_s O_s over splits s = j mod
// kSlices, 8 columns per thread, and the slices are added in shared memory. Loads of different splits
// never wait on each other: at 33 splits a row is ~3 dependent L2 round trips, not 33.
constexpr int kCombineThreads = 128;

// x reduced over the CTA's kCombineThreads with op (every thread gets the result); scratch: 4 floats.
template <class Op>
__device__ __forceinline__ float reduce_cta(float x, float* scratch, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if (threadIdx.x % fc::kWarpSize == 0) scratch[threadIdx.x / fc::kWarpSize] = x;
  __syncthreads();
  x = op(op(scratch[0], scratch[1]), op(scratch[2], scratch[3]));
  __syncthreads();  // scratch is free again
  return x;
}

template <class Cfg, class T>
__device__ __forceinline__ void combine_row(const FlashcoreParams& p, const Split& plan) {
  static_assert(kCombineThreads == 4 * fc::kWarpSize, "reduce_cta's scratch holds four warps");
  constexpr int kChunks = Cfg::kHeadDim / 8;
  constexpr int kSlices = kCombineThreads / kChunks;
  __shared__ float weight[kMaxSplits];                // w_s
  __shared__ float4 slice_acc[kSlices][kChunks][2];  // each slice's sum, 8 columns per thread
  __shared__ float scratch[4];
  const int tid = threadIdx.x;
  const long long row = blockIdx.x;  // in [B * H * S]
  const int stride = record_floats(Cfg::kHeadDim);
  const float* records = static_cast<const float*>(p.workspace) + record_offset(plan, row, 0, Cfg::kHeadDim);
  auto stat = [&](int s) { return *reinterpret_cast<const float4*>(records + s * stride + Cfg::kHeadDim); };
  wait_for_prerequisite_grid();  // the split kernel's records are complete and visible

  float m = -INFINITY;
  for (int s = tid; s < plan.splits; s += kCombineThreads) m = fmaxf(m, stat(s).x);
  m = reduce_cta(m, scratch, [](float a, float b) { return fmaxf(a, b); });
  const float m_ref = m == -INFINITY ? 0.f : m;  // no split saw a key: every weight 0, not NaN
  float l = 0.f, l_fp32 = 0.f;
  for (int s = tid; s < plan.splits; s += kCombineThreads) {
    const float4 st = stat(s);
    const float w = exp2f(st.x - m_ref);
    weight[s] = w;
    l = fmaf(w, st.y, l);
    l_fp32 = fmaf(w, st.z, l_fp32);
  }
  auto add = [](float a, float b) { return a + b; };
  l = reduce_cta(l, scratch, add);  // (its barriers also publish weight[])
  l_fp32 = reduce_cta(l_fp32, scratch, add);

  const int slice = tid / kChunks, c = tid % kChunks;
  float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
#pragma unroll 4
  for (int s = slice; s < plan.splits; s += kSlices) {
    const float w = weight[s];
    const float4* o = reinterpret_cast<const float4*>(records + s * stride + 8 * c);
    const float4 a = o[0], b = o[1];
    lo = make_float4(fmaf(w, a.x, lo.x), fmaf(w, a.y, lo.y), fmaf(w, a.z, lo.z), fmaf(w, a.w, lo.w));
    hi = make_float4(fmaf(w, b.x, hi.x), fmaf(w, b.y, hi.y), fmaf(w, b.z, hi.z), fmaf(w, b.w, hi.w));
  }
  slice_acc[slice][c][0] = lo;
  slice_acc[slice][c][1] = hi;
  __syncthreads();
  if (slice != 0) return;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < kSlices; ++j) {
    const float4 a = slice_acc[j][c][0], b = slice_acc[j][c][1];
    acc[0] += a.x; acc[1] += a.y; acc[2] += a.z; acc[3] += a.w;
    acc[4] += b.x; acc[5] += b.y; acc[6] += b.z; acc[7] += b.w;
  }
  const float sink2 = p.sinks != nullptr ? sink_log2(p, blockIdx.x / plan.rows, blockIdx.x % plan.rows) : -INFINITY;
  store_output<T>(fc::tensor<__half>(p.o) + row * Cfg::kHeadDim + 8 * c, c == 0 && p.lse != nullptr ? p.lse + row : nullptr, m, l, l_fp32,
                  sink2, acc);
}

}  // namespace fc::decode
