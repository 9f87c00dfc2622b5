// ladder/wmma_64x64.cu — rung 3: 64x64 tiles and 8 warps; scores and probabilities share one buffer.
//
// Idea: fp32p's two WMMA matmuls over tiles four times the size. A CTA owns kBlockM = 64 query rows and
// walks K/V in tiles of kBlockN = 64 keys with 8 warps: warp w computes two 16x16 blocks of S = Q_i K_j^T
// (stripe w / 2, keys (w % 2) * 32 ..) and two (D=64) or four (D=128) 16x16 tiles of O_i. The softmax reads
// a row's FP32 scores into registers, sums l_i from the FP32 probabilities there, and then writes P, rounded
// to fp16 once, over the bytes the scores occupied: scores and probabilities share one buffer by temporal
// separation. The separating barrier is a __syncwarp, because a row's four softmax threads live in one warp
// and P row r (fp16, 136-half stride) lies inside score row r (fp32, 68-float stride); P V reads P from there.
//
// Change from fp32p (rung 2), and why it is faster although 1,8,512,64 now gives 64 CTAs instead of 128:
// half as many K/V tile iterations, and each iteration waits once on global memory with nothing to hide it
// (no cp.async yet); 4 block barriers per 64 keys instead of 8; 8 warps per CTA instead of 4; and P makes one
// shared-memory trip instead of two (fp32p writes FP32 P, reads it back to convert, writes and reads fp16 P).
//
// Seed 003 planned ~90 KB here: 16 KB score and probability buffers in a union, an 8 KB fp16 P buffer, a
// 20 KB FP32 O in shared memory and a 16 KB buffer of P V partials merged into it every tile. O stays in
// accumulator fragments instead, rescaled through a broadcast tile as in fp32p: 16 registers per thread at
// D=64 (32 at D=128) against 36 KB of shared memory and a store-load-merge per tile. That leaves 48 KB at
// D=64 and 72 KB at D=128, so both head dims fit the L4's 99 KB. The seed's union "corrupted data" because
// P was written while other threads still read the scores; here a row's scores are read only by the warp
// that owns the row, and all of them are read before any P is written (the __syncwarp above).
//
// Shared memory (dynamic), kH = D + 8 halves per Q/K/V row (rows 4 banks apart: ldmatrix conflict-free).
// Byte offsets, D=64 / D=128:
//   Q_i   [64][kH]    half       0 /     0
//   K_j   [64][kH]    half    9216 / 17408   row-major = K_j^T col-major
//   V_j   [64][kH]    half   18432 / 34816
//   S_ij  [64][68]    float  27648 / 52224   scores; as half [64][136], P in each row's first 128 B;
//                                            after the loop, 8 per-warp 16x16 FP32 output stages
//   diag  [4][16][16] float  45056 / 69632   per 16-row stripe: alpha (at the end 1/l_i) broadcast along rows
//   total                    49152 / 73728   (fc::allow_dynamic_smem opts in above 48 KB); all 32-byte aligned
//
// Run:  flashcore test 64x64 && flashcore bench 64x64 --shape 1,8,512,64
//
// ptxas (nvcc 13.0, -O3 --use_fast_math), registers / static smem / spills / stack:
//   sm_90 D=64: 125 regs, 0 B, 0 B, 0 B;  D=128: 172 regs, 0 B, 0 B, 0 B  (dynamic smem 49152 / 73728 B)
//   sm_89 D=64: 101 regs, 0 B, 0 B, 0 B;  D=128: 169 regs, 0 B, 0 B, 0 B
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench --all`, all rungs in one run, L2 flushed before
// each call, median of 200 / 100 calls):
//   1,8,512,64:   21.7 us (1.1x faster than fp32p)
//   2,16,4096,64: 1175 us, 117.0 TFLOP/s
// The smallest step of the ladder: at 1,8,512,64 the 64-row tiles give 64 CTAs for 132 SMs.
#include "flashcore.h"
#include "ladder/wmma_rung.cuh"

namespace wmma = nvcuda::wmma;
using wmma_rung::AccFrag;
using wmma_rung::kFrag;
using wmma_rung::kLog2e;
using wmma_rung::kVec;

constexpr int kBlockM = 64;              // query rows per CTA (Br)
constexpr int kBlockN = 64;              // keys per K/V tile (Bc)
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * fc::kWarpSize;
constexpr int kSStride = kBlockN + 4;    // floats per score row: a multiple of 4 (WMMA ldm), rows 4 banks apart
constexpr int kP16Stride = 2 * kSStride; // halves per P row: P row r starts where score row r starts
constexpr int kThreadsPerRow = 4;        // softmax threads per row, all in one warp
constexpr int kColsPerThread = kBlockN / kThreadsPerRow;  // 16
constexpr int kRowsPerWarp = fc::kWarpSize / kThreadsPerRow;  // 8
constexpr int kStripes = kBlockM / kFrag;                  // 16-row stripes: warps 2s and 2s + 1 share stripe s

static_assert(kWarps * kRowsPerWarp == kBlockM, "the softmax covers every row once");
static_assert(kWarps == 2 * kStripes, "two warps per 16-row stripe");
static_assert(kP16Stride % 8 == 0, "WMMA ldm for half is a multiple of 8");

template <int kHeadDim>
struct Layout {
  static constexpr int kH = kHeadDim + 8;  // halves per Q/K/V row: rows 4 banks apart, ldmatrix conflict-free
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kBlockM * kH * 2;
  static constexpr int kV = kK + kBlockN * kH * 2;
  static constexpr int kS = kV + kBlockN * kH * 2;
  static constexpr int kDiag = kS + kBlockM * kSStride * 4;
  static constexpr int kBytes = kDiag + kStripes * kFrag * kFrag * 4;
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kDiag % 32 == 0,
                "WMMA fragment pointers must be 32-byte aligned");
  static_assert(kWarps * kFrag * kFrag <= kBlockM * kSStride, "the output stages fit in S_ij");
};

// Max and sum over the 4 lanes of a row: lanes l, l + 8, l + 16, l + 24.
__device__ __forceinline__ float row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) wmma_64x64_fwd(FlashcoreParams p) {
  using L = Layout<kHeadDim>;
  constexpr int kH = L::kH;
  constexpr int kSTiles = kBlockN / kFrag / 2;   // 16x16 blocks of S per warp
  constexpr int kOTiles = kHeadDim / kFrag / 2;  // 16x16 tiles of O per warp: the two warps of a stripe split D
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Q_i = reinterpret_cast<__half*>(smem + L::kQ);    // [kBlockM, kH]
  __half* K_j = reinterpret_cast<__half*>(smem + L::kK);    // [kBlockN, kH]
  __half* V_j = reinterpret_cast<__half*>(smem + L::kV);    // [kBlockN, kH]
  float* S_ij = reinterpret_cast<float*>(smem + L::kS);     // [kBlockM, kSStride]
  __half* P_ij = reinterpret_cast<__half*>(smem + L::kS);   // [kBlockM, kP16Stride], over S_ij
  float* diag = reinterpret_cast<float*>(smem + L::kDiag);  // [kStripes, 16, 16]

  const int tid = threadIdx.x;
  const int warp = tid / fc::kWarpSize, lane = tid % fc::kWarpSize;
  const int row0 = blockIdx.x * kBlockM;
  const size_t base = fc::head_offset(p, blockIdx.z, blockIdx.y);
  const __half* __restrict__ q = fc::tensor<__half>(p.q) + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = fc::tensor<__half>(p.k) + base;  // [S, D]
  const __half* __restrict__ v = fc::tensor<__half>(p.v) + base;  // [S, D]
  __half* __restrict__ o = fc::tensor<__half>(p.o) + base;        // [S, D]

  // Tensor-core work: warp w reads query stripe w / 2 and takes half w % 2 of the keys (Q K^T) and of the
  // output dims (P V).
  const int stripe = warp / 2;
  const int half_id = warp % 2;
  // Softmax: warp w owns rows 8w .. 8w + 7, row 8w + lane % 8 split over lanes l, l + 8, l + 16, l + 24 in
  // 16-column blocks; each quarter-warp then reads 8 rows (one 16-byte bank group each) at a time.
  const int r = warp * kRowsPerWarp + lane % kRowsPerWarp;
  const int quarter = lane / kRowsPerWarp;
  const int c0 = quarter * kColsPerThread;
  const int row = row0 + r;
  float* diag_r = diag + (r / kFrag) * kFrag * kFrag + (r % kFrag) * kFrag + quarter * 4;  // [4]

  wmma_rung::AFrag q_frag[kHeadDim / kFrag];
  wmma_rung::load_q<kHeadDim, kBlockM, kThreads, kH>(q_frag, Q_i, q, row0, p.seq_len, tid, stripe);

  AccFrag O_frag[kOTiles];  // O_i rows of `stripe`, dims (half_id * kOTiles + t) * 16 .. + 15
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) wmma::fill_fragment(O_frag[t], 0.f);
  float m_i = -INFINITY;  // running row max, in log2 units (scores pre-multiplied by scale * log2(e))
  float l_i = 0.f;        // running row sum of exp2(s - m_i), summed in FP32

  const float scale_log2 = p.scale * kLog2e;
  // Under causal masking no row of this CTA sees a key past its last row: later tiles are skipped whole.
  const int kv_end = p.causal ? min(p.seq_len, row0 + kBlockM) : p.seq_len;

  for (int n0 = 0; n0 < kv_end; n0 += kBlockN) {
    __syncthreads();  // the previous tile's K_j, V_j, P_ij and diag are fully consumed
    {
      fc::TileRegs<kHeadDim, kBlockN, kThreads> k_regs, v_regs;
      fc::fetch_tile(k_regs, k, n0, p.seq_len, tid);
      fc::fetch_tile(v_regs, v, n0, p.seq_len, tid);
      fc::store_tile<kH>(K_j, k_regs, tid);
      fc::store_tile<kH>(V_j, v_regs, tid);
    }
    __syncthreads();

    // S = Q_i K_j^T, two 16x16 blocks per warp (the scale is folded into the exp2 argument below)
    {
      AccFrag s_frag[kSTiles];
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) wmma::fill_fragment(s_frag[t], 0.f);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / kFrag; ++kk) {
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) {
          wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __half, wmma::col_major> k_frag;
          wmma::load_matrix_sync(k_frag, K_j + (half_id * kSTiles + t) * kFrag * kH + kk * kFrag, kH);
          wmma::mma_sync(s_frag[t], q_frag[kk], k_frag, s_frag[t]);
        }
      }
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
        wmma::store_matrix_sync(S_ij + stripe * kFrag * kSStride + (half_id * kSTiles + t) * kFrag, s_frag[t], kSStride,
                                wmma::mem_row_major);
      }
    }
    __syncthreads();

    // m_new = max(m_i, rowmax(S)), masked past the sequence end and (causal) past the diagonal
    float s[kColsPerThread];
#pragma unroll
    for (int c = 0; c < kColsPerThread; c += 4) {
      const float4 raw = *reinterpret_cast<const float4*>(S_ij + r * kSStride + c0 + c);
      s[c] = raw.x; s[c + 1] = raw.y; s[c + 2] = raw.z; s[c + 3] = raw.w;
    }
    float m_tile = wmma_rung::mask_scores(s, n0 + c0, row, p, scale_log2);
    m_tile = row_max(m_tile);
    const float m_new = fmaxf(m_i, m_tile);
    const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf) = 0
    const float alpha = exp2f(m_i - m_ref);

    // P = exp2(S - m_new); l_i = alpha l_i + rowsum(P) from the FP32 values, P rounded to fp16 once
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      s[c] = exp2f(s[c] - m_ref);
      sum += s[c];
    }
    l_i = l_i * alpha + row_sum(sum);
    m_i = m_new;
    __syncwarp();  // this row's scores are all read (only this warp reads them) before P goes over them
#pragma unroll
    for (int c = 0; c < kColsPerThread; c += 8) {
      uint4 packed;
      __half2* h = reinterpret_cast<__half2*>(&packed);
#pragma unroll
      for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(s[c + 2 * e], s[c + 2 * e + 1]);
      *reinterpret_cast<uint4*>(P_ij + r * kP16Stride + c0 + c) = packed;
    }
    *reinterpret_cast<float4*>(diag_r) = make_float4(alpha, alpha, alpha, alpha);
    __syncthreads();

    // O = diag(alpha) O + P V
    wmma_rung::rescale_and_accumulate<kBlockN, kOTiles, kH, kP16Stride>(
        O_frag, diag + stripe * kFrag * kFrag, P_ij + stripe * kFrag * kP16Stride, V_j, half_id);
  }

  // O = diag(1 / l_i) O through the same broadcast tile; every row has l_i >= 1 (its max term is exp2(0))
  __syncthreads();  // every warp is done reading diag and P_ij
  const float inv_l = 1.f / l_i;
  *reinterpret_cast<float4*>(diag_r) = make_float4(inv_l, inv_l, inv_l, inv_l);
  __syncthreads();
  AccFrag inv_l_frag;
  wmma::load_matrix_sync(inv_l_frag, diag + stripe * kFrag * kFrag, kFrag, wmma::mem_row_major);
  float* stage = S_ij + warp * kFrag * kFrag;  // [16, 16]: this warp's output stage
  const int out_row = row0 + stripe * kFrag + lane / 2;
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) {
#pragma unroll
    for (int e = 0; e < inv_l_frag.num_elements; ++e) O_frag[t].x[e] *= inv_l_frag.x[e];
    wmma::store_matrix_sync(stage, O_frag[t], kFrag, wmma::mem_row_major);
    __syncwarp();
    if (out_row < p.seq_len) {
      const float* src = stage + (lane / 2) * kFrag + (lane % 2) * kVec;  // [8]
      uint4 packed;
      __half2* h = reinterpret_cast<__half2*>(&packed);
#pragma unroll
      for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(src[2 * e], src[2 * e + 1]);
      *reinterpret_cast<uint4*>(o + static_cast<size_t>(out_row) * kHeadDim + (half_id * kOTiles + t) * kFrag +
                                (lane % 2) * kVec) = packed;
    }
    __syncwarp();  // the stage is read out before the next tile overwrites it
  }
}

template <int kHeadDim>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  return fc::launch_query_tiles(wmma_64x64_fwd<kHeadDim>, p, kBlockM, kThreads, Layout<kHeadDim>::kBytes, stream);
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 1) return 0;
  if (head_dim == 64) plans[0] = {FC_PLAN_NAME(wmma_64x64_fwd, 64), kThreads, Layout<64>::kBytes};
  else if (head_dim == 128) plans[0] = {FC_PLAN_NAME(wmma_64x64_fwd, 128), kThreads, Layout<128>::kBytes};
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
