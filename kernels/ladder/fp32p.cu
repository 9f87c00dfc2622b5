// ladder/fp32p.cu — rung 2: both matmuls on tensor cores, 32x32 tiles, FP32 probabilities in their own buffer.
//
// Idea: P V joins Q K^T on the tensor cores, so O_i becomes WMMA accumulator fragments. A CTA owns
// kBlockM = 32 query rows and walks K/V in tiles of kBlockN = 32 keys with 4 warps: warp w computes one 16x16
// block of S = Q_i K_j^T, the softmax writes P = exp(S - m_new) in FP32 to a buffer of its own (l_i sums
// those FP32 values), and each warp converts the 16 x 32 stripe of P it multiplies to fp16 just before P V,
// the one place P is rounded. The per-row rescale O = diag(alpha) O cannot index rows inside a fragment (WMMA
// leaves the element layout unspecified), so it goes through shared memory: the softmax writes alpha
// broadcast along the rows of a 16x16 tile, the warp loads that tile as an accumulator fragment and
// multiplies element by element. Fragments of one type share one layout, which is all this needs (the CUDA
// programming guide's WMMA example combines a loaded and a computed accumulator the same way).
//
// Change from wmma (rung 1): the scalar P V (~90% of rung 1's instructions) becomes 4 WMMA per warp per
// tile; tiles shrink to 32x32, which at 1,8,512,64 gives 128 CTAs instead of 64 on a 132-SM H100; the
// softmax runs four threads per row. The price is block barriers: a warp's S block, softmax rows and P V
// stripe are no longer the same rows, so the tile loop meets at 4 __syncthreads per 32 keys. Q_i's
// fragments are loaded once and kept in registers (the loop is latency-bound, registers are not short).
// Global accesses are 16 bytes wide, and a tile's K and V loads are all issued before its first store.
// The two warps of a 16-row stripe both convert that stripe's P to fp16 (each into its own tile): doing it
// once would need another block barrier per tile, for 16 conversions per lane.
//
// Seed 003's fused 32x32 kernel had error 0.51 and concluded that scores and probabilities could not share
// one buffer at this tile size; they are kept apart here (S_ij and P_ij below), which is that seed's design.
// What prevents a repeat of the error: K/V rows past the sequence end are zero-filled (P = 0 there, and
// 0 x stale shared memory can be NaN), masked scores are -inf before the row max, a fully masked row takes 0
// as its reference max (no (-inf) - (-inf)), and every read of what another warp wrote sits behind a
// __syncthreads that all threads reach.
//
// Shared memory (dynamic; under 48 KB, so no opt-in), kH = D + 8 halves per Q/K/V row (rows 4 banks apart:
// ldmatrix conflict-free). Byte offsets, D=64 / D=128:
//   Q_i   [32][kH]    half       0 /     0
//   K_j   [32][kH]    half    4608 /  8704   row-major = K_j^T col-major
//   V_j   [32][kH]    half    9216 / 17408
//   S_ij  [32][36]    float  13824 / 26112   scores
//   P_ij  [32][36]    float  18432 / 30720   FP32 probabilities
//   P16   [4][16][40] half   23040 / 35328   per warp: the fp16 P stripe it multiplies; then its output stage
//   diag  [2][16][16] float  28160 / 40448   per 16-row stripe: alpha (at the end 1/l_i) broadcast along rows
//   total                    30208 / 42496   every region 32-byte aligned (WMMA pointer rule)
//
// Run:  flashcore test fp32p && flashcore bench fp32p --shape 1,8,512,64
//
// ptxas (nvcc 13.0, -O3 --use_fast_math), registers / static smem / spills / stack:
//   sm_90 D=64: 106 regs, 0 B, 0 B, 0 B;  D=128: 160 regs, 0 B, 0 B, 0 B  (dynamic smem 30208 / 42496 B)
//   sm_89 D=64:  96 regs, 0 B, 0 B, 0 B;  D=128: 128 regs, 0 B, 0 B, 0 B
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench --all`, all rungs in one run, L2 flushed before
// each call, median of 200 / 100 calls):
//   1,8,512,64:   24.2 us (2.0x faster than wmma)
//   2,16,4096,64: 1749 us, 78.6 TFLOP/s
#include "flashcore.h"
#include "common/primitives.cuh"
#include "ladder/wmma_rung.cuh"

namespace wmma = nvcuda::wmma;
using wmma_rung::AccFrag;
using wmma_rung::kFrag;
using wmma_rung::kLog2e;
using wmma_rung::kVec;

constexpr int kBlockM = 32;              // query rows per CTA (Br)
constexpr int kBlockN = 32;              // keys per K/V tile (Bc)
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * fc::kWarpSize;
constexpr int kSStride = kBlockN + 4;    // floats per S/P row: a multiple of 4 (WMMA ldm)
constexpr int kP16Stride = kBlockN + 8;  // halves per fp16 P row: a multiple of 8 (WMMA ldm)
constexpr int kThreadsPerRow = kThreads / kBlockM;        // softmax: 4 consecutive lanes per row
constexpr int kColsPerThread = kBlockN / kThreadsPerRow;  // 8
constexpr int kStripes = kBlockM / kFrag;                 // 16-row stripes: warps 2s and 2s + 1 share stripe s

static_assert(kWarps == (kBlockM / kFrag) * (kBlockN / kFrag), "one 16x16 block of S per warp");
static_assert(kColsPerThread == 8, "the softmax moves its columns as two float4");

template <int kHeadDim>
struct Layout {
  static constexpr int kH = kHeadDim + 8;  // halves per Q/K/V row: rows 4 banks apart, ldmatrix conflict-free
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kBlockM * kH * 2;
  static constexpr int kV = kK + kBlockN * kH * 2;
  static constexpr int kS = kV + kBlockN * kH * 2;
  static constexpr int kP = kS + kBlockM * kSStride * 4;
  static constexpr int kP16 = kP + kBlockM * kSStride * 4;
  static constexpr int kDiag = kP16 + kWarps * kFrag * kP16Stride * 2;
  static constexpr int kBytes = kDiag + kStripes * kFrag * kFrag * 4;
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kP % 32 == 0 && kP16 % 32 == 0 && kDiag % 32 == 0,
                "WMMA fragment pointers must be 32-byte aligned");
  static_assert(kFrag * kP16Stride * 2 >= kFrag * kFrag * 4, "a warp's P16 tile doubles as its 16x16 FP32 staging");
};

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) fp32p_fwd(FlashcoreParams p) {
  using L = Layout<kHeadDim>;
  constexpr int kH = L::kH;
  constexpr int kOTiles = kHeadDim / kFrag / 2;  // output 16x16 tiles per warp: the two warps of a stripe split D
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Q_i = reinterpret_cast<__half*>(smem + L::kQ);    // [kBlockM, kH]
  __half* K_j = reinterpret_cast<__half*>(smem + L::kK);    // [kBlockN, kH]
  __half* V_j = reinterpret_cast<__half*>(smem + L::kV);    // [kBlockN, kH]
  float* S_ij = reinterpret_cast<float*>(smem + L::kS);     // [kBlockM, kSStride]
  float* P_ij = reinterpret_cast<float*>(smem + L::kP);     // [kBlockM, kSStride]
  float* diag = reinterpret_cast<float*>(smem + L::kDiag);  // [kStripes, 16, 16]

  const int tid = threadIdx.x;
  const int warp = tid / fc::kWarpSize, lane = tid % fc::kWarpSize;
  const int row0 = blockIdx.x * kBlockM;
  const size_t base = fc::head_offset(p, blockIdx.z, blockIdx.y);
  const __half* __restrict__ q = fc::tensor<__half>(p.q) + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = fc::tensor<__half>(p.k) + base;  // [S, D]
  const __half* __restrict__ v = fc::tensor<__half>(p.v) + base;  // [S, D]
  __half* __restrict__ o = fc::tensor<__half>(p.o) + base;        // [S, D]

  // Tensor-core work: warp w reads query stripe w / 2; in Q K^T it takes key block w % 2, in P V output
  // tiles (w % 2) * kOTiles ...
  const int stripe = warp / 2;
  const int half_id = warp % 2;
  __half* P16_w = reinterpret_cast<__half*>(smem + L::kP16) + warp * kFrag * kP16Stride;  // [16, kP16Stride]
  // Softmax: 4 consecutive lanes per row; a quarter-warp's 16-byte reads then fall in 8 distinct bank groups.
  const int r = tid / kThreadsPerRow;
  const int c0 = (tid % kThreadsPerRow) * kColsPerThread;
  const int row = row0 + r;
  float* diag_r = diag + (r / kFrag) * kFrag * kFrag + (r % kFrag) * kFrag + (tid % kThreadsPerRow) * 4;  // [4]

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
    __syncthreads();  // the previous tile's K_j, V_j, S_ij, P_ij and diag are fully consumed
    {
      fc::TileRegs<kHeadDim, kBlockN, kThreads> k_regs, v_regs;
      fc::fetch_tile(k_regs, k, n0, p.seq_len, tid);
      fc::fetch_tile(v_regs, v, n0, p.seq_len, tid);
      fc::store_tile<kH>(K_j, k_regs, tid);
      fc::store_tile<kH>(V_j, v_regs, tid);
    }
    __syncthreads();

    // S = Q_i K_j^T, one 16x16 block per warp (the scale is folded into the exp2 argument below)
    {
      AccFrag s_frag;
      wmma::fill_fragment(s_frag, 0.f);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / kFrag; ++kk) {
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __half, wmma::col_major> k_frag;
        wmma::load_matrix_sync(k_frag, K_j + half_id * kFrag * kH + kk * kFrag, kH);
        wmma::mma_sync(s_frag, q_frag[kk], k_frag, s_frag);
      }
      wmma::store_matrix_sync(S_ij + stripe * kFrag * kSStride + half_id * kFrag, s_frag, kSStride, wmma::mem_row_major);
    }
    __syncthreads();

    // m_new = max(m_i, rowmax(S)), masked past the sequence end and (causal) past the diagonal
    float s[kColsPerThread];
    {
      const float4 a = *reinterpret_cast<const float4*>(S_ij + r * kSStride + c0);
      const float4 b = *reinterpret_cast<const float4*>(S_ij + r * kSStride + c0 + 4);
      s[0] = a.x; s[1] = a.y; s[2] = a.z; s[3] = a.w;
      s[4] = b.x; s[5] = b.y; s[6] = b.z; s[7] = b.w;
    }
    float m_tile = wmma_rung::mask_scores(s, n0 + c0, row, p, scale_log2);
    m_tile = fc::group_max<kThreadsPerRow>(m_tile);
    const float m_new = fmaxf(m_i, m_tile);
    const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf) = 0
    const float alpha = exp2f(m_i - m_ref);

    // P = exp2(S - m_new) in FP32; l_i = alpha l_i + rowsum(P)
    float row_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      s[c] = exp2f(s[c] - m_ref);
      row_sum += s[c];
    }
    *reinterpret_cast<float4*>(P_ij + r * kSStride + c0) = make_float4(s[0], s[1], s[2], s[3]);
    *reinterpret_cast<float4*>(P_ij + r * kSStride + c0 + 4) = make_float4(s[4], s[5], s[6], s[7]);
    l_i = l_i * alpha + fc::group_sum<kThreadsPerRow>(row_sum);
    m_i = m_new;
    *reinterpret_cast<float4*>(diag_r) = make_float4(alpha, alpha, alpha, alpha);
    __syncthreads();

    // The fp16 copy of P for the tensor cores: each warp converts the stripe it multiplies (lane: row
    // lane / 2, 16 columns), so the conversion costs a __syncwarp, not another block barrier.
    {
      const float* src = P_ij + (stripe * kFrag + lane / 2) * kSStride + (lane % 2) * kFrag;  // [16]
      __half* dst = P16_w + (lane / 2) * kP16Stride + (lane % 2) * kFrag;                     // [16]
#pragma unroll
      for (int c = 0; c < kFrag; c += 8) {
        const float4 a = *reinterpret_cast<const float4*>(src + c);
        const float4 b = *reinterpret_cast<const float4*>(src + c + 4);
        uint4 packed;
        __half2* h = reinterpret_cast<__half2*>(&packed);
        h[0] = __floats2half2_rn(a.x, a.y);
        h[1] = __floats2half2_rn(a.z, a.w);
        h[2] = __floats2half2_rn(b.x, b.y);
        h[3] = __floats2half2_rn(b.z, b.w);
        *reinterpret_cast<uint4*>(dst + c) = packed;
      }
    }
    __syncwarp();

    // O = diag(alpha) O + P V
    wmma_rung::rescale_and_accumulate<kBlockN, kOTiles, kH, kP16Stride>(O_frag, diag + stripe * kFrag * kFrag, P16_w,
                                                                       V_j, half_id);
  }

  // O = diag(1 / l_i) O through the same broadcast tile; every row has l_i >= 1 (its max term is exp2(0))
  __syncthreads();  // every warp is done reading diag
  const float inv_l = 1.f / l_i;
  *reinterpret_cast<float4*>(diag_r) = make_float4(inv_l, inv_l, inv_l, inv_l);
  __syncthreads();
  AccFrag inv_l_frag;
  wmma::load_matrix_sync(inv_l_frag, diag + stripe * kFrag * kFrag, kFrag, wmma::mem_row_major);
  float* stage = reinterpret_cast<float*>(P16_w);  // [16, 16]: this warp's P16 tile, free after the loop
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
  return fc::launch_query_tiles(fp32p_fwd<kHeadDim>, p, kBlockM, kThreads, Layout<kHeadDim>::kBytes, stream);
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 1) return 0;
  if (head_dim == 64) plans[0] = {FC_PLAN_NAME(fp32p_fwd, 64), kThreads, Layout<64>::kBytes};
  else if (head_dim == 128) plans[0] = {FC_PLAN_NAME(fp32p_fwd, 128), kThreads, Layout<128>::kBytes};
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
