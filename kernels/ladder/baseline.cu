// ladder/baseline.cu — rung 0: scalar FP16 FlashAttention, no tensor cores.
//
// Idea: the FlashAttention loop at its plainest. One thread owns one query row (two threads at D=128,
// each 64 of its output dims, their partial dot products joined by one shuffle); the CTA stages a tile of
// kBlockN keys and values in shared memory, every thread computes its row's scores against the tile with
// FP32 FMAs, and the online softmax (running max m_i, running sum l_i, FP32 accumulator O_i) folds each
// tile in, so the S x S score matrix never exists. Everything later on the ladder is measured against this.
//
// Change from the seeds' baseline: the same algorithm (seed 000: 43 registers, 768 B shared memory,
// 1398 us at 1,8,512,64 on the L4); here Q is staged in padded shared memory (one row per thread reads
// with a 33-word stride: no bank conflicts) and the scores of a tile are kept in registers so the O
// rescale happens once per tile instead of once per key.
//
// Run:  flashcore test baseline && flashcore bench baseline --shape 1,8,512,64
//
// ptxas (nvcc 13.0, `flashcore ptxas baseline --arch sm_89,sm_90`): 168 registers on both archs; D=64 12.2 KB
//   static smem, 64 threads, 6 CTAs/SM; D=128 24.2 KB, 128 threads, 3 CTAs/SM (registers bind); 0 spills.
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench --all`, all rungs in one run, L2 flushed before
// each call, median of 200 / 100 calls):
//   1,8,512,64:   308.9 us (0.04x SDPA default's 11.9 us)
//   2,16,4096,64: 9664 us, 14.2 TFLOP/s (SDPA default 460, FA2 294)
// The seeds measured 1398 us on the L4; the H200's 132 SMs and ~3x the clocks x bandwidth explain most of the gap.
#include "flashcore.h"

#include <cfloat>

constexpr int kBlockM = 64;        // query rows per CTA
constexpr int kBlockN = 16;        // keys per shared-memory tile; the tile's scores live in registers
constexpr int kDimsPerThread = 64; // output dims per thread: a whole D=128 row in one thread spilled 344 B

template <int kHeadDim>
__host__ __device__ constexpr int threads_per_row() { return kHeadDim / kDimsPerThread; }

template <int kHeadDim>
__global__ void __launch_bounds__(kBlockM * threads_per_row<kHeadDim>()) baseline_fwd(FlashcoreParams p) {
  constexpr int kSplit = threads_per_row<kHeadDim>();
  constexpr int kThreads = kBlockM * kSplit;
  constexpr int kQStride = kHeadDim + 2;  // +1 word per row: neighbouring rows fall in different banks
  __shared__ __half Q_i[kBlockM * kQStride];
  __shared__ __half K_j[kBlockN * kHeadDim];
  __shared__ __half V_j[kBlockN * kHeadDim];

  const int tid = threadIdx.x;
  const int r_local = tid / kSplit;
  const int d0 = (tid % kSplit) * kDimsPerThread;  // this thread's output dims: d0 .. d0 + 63
  const int row0 = blockIdx.x * kBlockM;
  const int row = row0 + r_local;
  const size_t base = fc::head_offset(p, blockIdx.z, blockIdx.y);
  const __half* __restrict__ q = fc::tensor<__half>(p.q) + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = fc::tensor<__half>(p.k) + base;  // [S, D]
  const __half* __restrict__ v = fc::tensor<__half>(p.v) + base;  // [S, D]
  __half* __restrict__ o = fc::tensor<__half>(p.o) + base;        // [S, D]

  for (int i = tid; i < kBlockM * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    Q_i[r * kQStride + d] = (row0 + r < p.seq_len) ? q[static_cast<size_t>(row0 + r) * kHeadDim + d] : __half(0.f);
  }

  float m_i = -INFINITY;  // running row max of the scaled scores
  float l_i = 0.f;        // running row sum of exp(s - m_i)
  float O_i[kDimsPerThread];  // running unnormalised output, dims d0 .. d0 + 63
#pragma unroll
  for (int d = 0; d < kDimsPerThread; ++d) O_i[d] = 0.f;

  // Under causal masking no row of this CTA sees a key past its last row.
  const int last_row = min(p.seq_len, row0 + kBlockM) - 1;
  const int kv_end = p.causal ? last_row + 1 : p.seq_len;

  for (int n0 = 0; n0 < kv_end; n0 += kBlockN) {
    __syncthreads();  // the previous tile is fully consumed (and Q_i is written, on the first pass)
    for (int i = tid; i < kBlockN * kHeadDim; i += kThreads) {
      const int key = n0 + i / kHeadDim;
      const size_t g = static_cast<size_t>(key) * kHeadDim + i % kHeadDim;
      K_j[i] = key < p.seq_len ? k[g] : __half(0.f);
      V_j[i] = key < p.seq_len ? v[g] : __half(0.f);
    }
    __syncthreads();

    // S = Q K^T * scale, masked past the sequence end and (causal) past the diagonal
    float s[kBlockN];
    float m_tile = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBlockN; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int d = d0; d < d0 + kDimsPerThread; d += 2) {
        const float2 qd = __half22float2(*reinterpret_cast<const __half2*>(&Q_i[r_local * kQStride + d]));
        const float2 kd = __half22float2(*reinterpret_cast<const __half2*>(&K_j[j * kHeadDim + d]));
        acc = fmaf(qd.x, kd.x, acc);
        acc = fmaf(qd.y, kd.y, acc);
      }
      if constexpr (kSplit == 2) acc += __shfl_xor_sync(0xffffffffu, acc, 1);  // the other half of the row
      const int key = n0 + j;
      const bool visible = key < p.seq_len && (!p.causal || key <= row);
      s[j] = visible ? acc * p.scale : -INFINITY;
      m_tile = fmaxf(m_tile, s[j]);
    }

    // m_new = max(m_i, rowmax(S)); P = exp(S - m_new); O = diag(exp(m_i - m_new)) O + P V
    const float m_new = fmaxf(m_i, m_tile);
    if (m_new == -INFINITY) continue;  // nothing visible yet (only rows past the sequence end)
    const float alpha = __expf(m_i - m_new);
    l_i *= alpha;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; ++d) O_i[d] *= alpha;
#pragma unroll
    for (int j = 0; j < kBlockN; ++j) {
      const float p_j = __expf(s[j] - m_new);
      l_i += p_j;
#pragma unroll
      for (int d = 0; d < kDimsPerThread; d += 2) {
        const float2 vd = __half22float2(*reinterpret_cast<const __half2*>(&V_j[j * kHeadDim + d0 + d]));
        O_i[d] = fmaf(p_j, vd.x, O_i[d]);
        O_i[d + 1] = fmaf(p_j, vd.y, O_i[d + 1]);
      }
    }
    m_i = m_new;
  }

  if (row < p.seq_len) {
    const float inv_l = 1.f / l_i;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 2) {
      *reinterpret_cast<__half2*>(&o[static_cast<size_t>(row) * kHeadDim + d0 + d]) =
          __floats2half2_rn(O_i[d] * inv_l, O_i[d + 1] * inv_l);
    }
  }
}

template <int kHeadDim>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  baseline_fwd<kHeadDim><<<fc::query_tile_grid(p, kBlockM), kBlockM * threads_per_row<kHeadDim>(), 0, stream>>>(p);
  return fc::launch_status();
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 1) return 0;
  if (head_dim == 64) plans[0] = {FC_PLAN_NAME(baseline_fwd, 64), kBlockM * threads_per_row<64>(), 0};
  else if (head_dim == 128) plans[0] = {FC_PLAN_NAME(baseline_fwd, 128), kBlockM * threads_per_row<128>(), 0};
  else return 0;
  return 1;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch<64>(p, stream);
    case 128: return launch<128>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
