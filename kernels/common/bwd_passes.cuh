// common/bwd_passes.cuh — what every backward shares around its main kernel: the workspace carved from the binding's
// scratch (the fp32 dQ accumulator, LSE * log2 e and D, a tile counter), the prep pass before the main kernel
// (D = rowsum(dO o O), LSE in log2 units, the accumulator and counter zeroed) and the pass after it that rounds dQ.
// v11's backward (mma.sync) and v12's (wgmma) launch the same two passes around their main kernels.
#pragma once

#include "common/fa2_fragments.cuh"
#include "flashcore.h"
#include "common/primitives.cuh"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <type_traits>

constexpr float kBwdLog2e = 1.4426950408889634f;
// LSE and D are padded per head to a multiple of kPadRows (every main kernel's BLOCK_M of 64 or 128): the last step
// of any main kernel reads rows within the padding.
constexpr int kPadRows = 128;

// Workspace: the fp32 dQ accumulator [B, H, S, D], then LSE * log2 e and D, each [B, H, S_pad] fp32, then the
// persistent main kernels' tile counter (zeroed by prep).
struct Workspace {
  float* dq_accum;
  float* lse2;
  float* dsum;
  int* tile_counter;
  int padded_rows;  // S_pad
};

inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline int padded_rows(int seq_len) { return fc::ceil_div(seq_len, kPadRows) * kPadRows; }

inline size_t dq_accum_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * p.seq_len * p.head_dim * 4);
}

inline size_t stats_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * padded_rows(p.seq_len) * 4);
}

inline size_t workspace_bytes(const FlashcoreParams& p) { return dq_accum_bytes(p) + 2 * stats_bytes(p) + 256; }

inline Workspace carve(const FlashcoreBackwardParams& b) {
  unsigned char* base = static_cast<unsigned char*>(b.workspace);
  Workspace w;
  w.padded_rows = padded_rows(b.fwd.seq_len);
  w.dq_accum = reinterpret_cast<float*>(base);
  w.lse2 = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd));
  w.dsum = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd) + stats_bytes(b.fwd));
  w.tile_counter = reinterpret_cast<int*>(base + dq_accum_bytes(b.fwd) + 2 * stats_bytes(b.fwd));
  return w;
}

// ---- prep: D = rowsum(dO o O) - dLSE (O + its residual where the forward wrote one), LSE log2 e (padding rows:
// D = 0, LSE = +inf), dQ accumulator = 0, tile counter = 0, and dL/dsinks where the call has sinks ----
// One thread per 8 elements of a row; the kChunks threads of a row are consecutive lanes.
template <int kHeadDim, class T>
__global__ void __launch_bounds__(256) bwd_prep(FlashcoreBackwardParams b, Workspace w) {
  constexpr int kChunks = kHeadDim / 8;
  const FlashcoreParams& p = b.fwd;
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long row_flat = thread / kChunks;  // over (b * H + h, padded row)
  const int chunk = static_cast<int>(thread % kChunks);
  const long long bh = row_flat / w.padded_rows;
  const int row = static_cast<int>(row_flat % w.padded_rows);
  const bool head = bh < static_cast<long long>(p.batch) * p.heads;  // (no early return: the row's lanes shuffle)
  if (thread == 0) *w.tile_counter = 0;
  float dot = 0.f;
  if (head && row < p.seq_len) {
    const size_t offset = (static_cast<size_t>(bh) * p.seq_len + row) * kHeadDim + chunk * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(fc::tensor<T>(p.o) + offset);
    const uint4 d_o = *reinterpret_cast<const uint4*>(fc::tensor<T>(b.d_o) + offset);
    const T* ov = reinterpret_cast<const T*>(&o);
    const T* dv = reinterpret_cast<const T*>(&d_o);
    float o32[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) o32[i] = static_cast<float>(ov[i]);
    if (p.o_residual != nullptr) {  // the fp32 O: D from the O that the kernel's P made, not its rounding
      const uint4 r = *reinterpret_cast<const uint4*>(fc::tensor<T>(p.o_residual) + offset);
      const T* rv = reinterpret_cast<const T*>(&r);
#pragma unroll
      for (int i = 0; i < 8; ++i) o32[i] += static_cast<float>(rv[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) dot += o32[i] * static_cast<float>(dv[i]);
    float4* acc = reinterpret_cast<float4*>(w.dq_accum + offset);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  dot = fc::group_sum<kChunks>(dot);
  float d_sink = 0.f;  // this row's share of dL/dsink_h: -exp(sink_h - LSE) * (D - dLSE)
  if (head && chunk == 0) {
    const size_t at = static_cast<size_t>(bh) * w.padded_rows + row;
    const size_t src = static_cast<size_t>(bh) * p.seq_len + row;
    const float dsum = row < p.seq_len ? dot - (b.d_lse != nullptr ? b.d_lse[src] : 0.f) : 0.f;
    w.dsum[at] = dsum;
    w.lse2[at] = row < p.seq_len ? p.lse[src] * kBwdLog2e : INFINITY;
    if (b.dsinks != nullptr && row < p.seq_len) {
      d_sink = -__expf(p.sinks[bh % p.heads] - p.lse[src]) * dsum;
    }
  }
  if (b.dsinks != nullptr) {
    // A block's 256 / kChunks rows lie in one (b, h) (S_pad is a multiple of 128): one atomic per block.
    static_assert(kPadRows % (256 / kChunks) == 0, "a block's rows must not cross a head");
    __shared__ float warp_sums[8];
    d_sink = fc::group_sum<32>(d_sink);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = d_sink;
    __syncthreads();
    if (threadIdx.x == 0 && head) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += warp_sums[i];
      atomicAdd(b.dsinks + bh % p.heads, sum);
    }
  }
}

// ---- dq: dQ = scale * accumulator, 8 elements per thread ----
template <class T>
__global__ void __launch_bounds__(256) bwd_dq(FlashcoreBackwardParams b, Workspace w, long long chunks) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const float4* src = reinterpret_cast<const float4*>(w.dq_accum) + 2 * i;
  const float4 lo = src[0], hi = src[1];
  const float s = b.fwd.scale;
  uint4 out;
  out.x = fc::Element<T>::pack(lo.x * s, lo.y * s);
  out.y = fc::Element<T>::pack(lo.z * s, lo.w * s);
  out.z = fc::Element<T>::pack(hi.x * s, hi.y * s);
  out.w = fc::Element<T>::pack(hi.z * s, hi.w * s);
  fc::tensor<uint4>(b.dq)[i] = out;
}

// ---- the launches and plan entries of both passes, for every backward's launcher ----
inline long long bwd_blocks_of_256(long long threads) { return (threads + 255) / 256; }

template <int kHeadDim, class T>
const char* launch_bwd_prep(const FlashcoreBackwardParams& b, const Workspace& w, cudaStream_t stream) {
  const long long threads = static_cast<long long>(b.fwd.batch) * b.fwd.heads * w.padded_rows * (kHeadDim / 8);
  bwd_prep<kHeadDim, T><<<static_cast<unsigned>(bwd_blocks_of_256(threads)), 256, 0, stream>>>(b, w);
  return fc::launch_status();
}

template <int kHeadDim, class T>
const char* launch_bwd_dq(const FlashcoreBackwardParams& b, const Workspace& w, cudaStream_t stream) {
  const long long chunks = static_cast<long long>(b.fwd.batch) * b.fwd.heads * b.fwd.seq_len * (kHeadDim / 8);
  bwd_dq<T><<<static_cast<unsigned>(bwd_blocks_of_256(chunks)), 256, 0, stream>>>(b, w, chunks);
  return fc::launch_status();
}

// The two passes' plan entries.
template <int kHeadDim, class T>
FlashcoreKernelPlan bwd_prep_plan() {
  return {FC_PLAN_NAME(bwd_prep, kHeadDim, fc::type_name<T>()), 256, 0};
}

template <class T>
FlashcoreKernelPlan bwd_dq_plan() {
  return {FC_PLAN_NAME(bwd_dq, fc::type_name<T>()), 256, 0};
}
