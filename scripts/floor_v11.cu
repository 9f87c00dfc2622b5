// floor_v11.cu — what part of v11's work costs at 1,8,512,64: the floor under issue 5's 0.6x target.
// Built and timed by scripts/floor_v11.py (torch.utils.cpp_extension, sm_90 only); not a variant: every
// kernel here computes garbage on purpose, so it must never be registered or compared for correctness.
//
// Each kernel keeps v11's short-sequence partition (128 CTAs of 32 query rows, 16 per head, 4 warps: two
// 16-row warps x two key groups, one warp per scheduler) and drops parts of its work:
//   0 loads_only    thread 0 brings the head's whole K and V (128 KB: 4 stages of 128 keys, 32 KB each, all
//                   issued at once by cp.async.bulk), every warp loads its Q rows from global memory, waits
//                   for every stage, then the groups merge through shared memory and O is stored.
//   1 hmma          loads_only plus v11's tensor work exactly: per warp and stage S = Q K^T (32 HMMA.16816,
//                   K by ldmatrix from XOR-swizzled addresses) and O += P V (32 HMMA, V by ldmatrix .trans)
//                   with P = fp16(S). No softmax at all: no row max, no shuffles, no exp2, no sums, no rescale.
//   2 hmma_overlap  hmma with the stage loop unrolled and P V fed from Q's fragments instead of S, so nothing
//                   orders the 256 HMMAs of a warp but the registers: its best HMMA rate.
//   3 hmma_no_wait  hmma with the loop unrolled and no K or V loaded at all (math on whatever shared memory
//                   holds): Q's load, the tensor work, the merge and the store, with no K/V latency.
//   4 hmma_2_stages hmma unrolled over two stages of 256 keys (two 64-key tiles per warp and stage): the
//                   fastest of the tilings tried outside the repo (8 stages, 8 warps, 32-row warps, K and V
//                   on their own barriers were all slower).
// (-1 is an empty kernel on the same grid.) Each has it easier than a correct kernel: 128 KB of shared memory
// (the L4 allows 99 KB, so a real kernel refills a ring) and no softmax. A kernel that computes attention does
// all of hmma's work and more; these show what that work costs in the schedules tried, not a proof that no
// schedule does better. No timestamps either: the probe harnesses of earlier sessions tested a __device__
// pointer at entry, one DRAM round trip after the L2 flush, which put ~0.7 us on their floors.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>

#include "flashcore.h"
#include "mbarrier.cuh"
#include "mma_sm80.cuh"
#include "primitives.cuh"

namespace {

constexpr int kSeq = 512, kDim = 64, kRows = 32;
constexpr int kRowBytes = kDim * 2;                // 128 B: one K or V row
constexpr int kSmemBytes = 2 * kSeq * kRowBytes;   // 128 KB: the head's whole K and V
constexpr int kThreads = 128;                      // two 16-row warps x two key groups
constexpr int kPartStride = kDim + 4;              // fp32 partial rows, padded

enum Mode { kEmpty = -1, kLoadsOnly = 0, kHmma = 1, kHmmaOverlap = 2, kHmmaNoWait = 3, kHmmaTwoStages = 4 };

// One bulk copy of `bytes` contiguous global bytes into shared memory, counted down on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  FC_SM90_ONLY(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(fc::smem_addr(dst)), "l"(src), "r"(bytes), "r"(fc::smem_addr(bar))
      : "memory"));
}

__global__ void empty_kernel() {}

// One warp's tensor work on one 64-key tile, as v11 does it: S = Q K^T (32 HMMA), then O += P V (32 HMMA)
// with P = fp16(S) in place of the softmax. kQAsP: P V takes Q's fragments instead (S is still computed).
template <bool kQAsP>
__device__ __forceinline__ void tile_hmma(float (&acc)[8][4], const uint32_t (&qf)[4][4], uint32_t k_lane,
                                          uint32_t v_lane, int lane, uint32_t& keep) {
  const int k_half = (lane >> 3) & 1, v_half = lane >> 4;
  float s[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[j][r] = 0.f;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc)
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      fc::ldmatrix_x4(b, k_lane + np * 16 * kRowBytes + fc::ldmatrix_chunk(kc, k_half, lane));
      fc::mma_16816(s[2 * np], qf[kc], b[0], b[1]);
      fc::mma_16816(s[2 * np + 1], qf[kc], b[2], b[3]);
    }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t pa[4] = {fc::pack_half2(s[2 * kk][0], s[2 * kk][1]), fc::pack_half2(s[2 * kk][2], s[2 * kk][3]),
                      fc::pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                      fc::pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    if constexpr (kQAsP) {
      keep ^= pa[0];  // S must still be computed, but nothing waits for it
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[r] = qf[kk][r];
    }
#pragma unroll
    for (int dp = 0; dp < 4; ++dp) {
      uint32_t b[4];
      fc::ldmatrix_x4_trans(b, v_lane + kk * 16 * kRowBytes + fc::ldmatrix_chunk(dp, v_half, lane));
      fc::mma_16816(acc[2 * dp], pa, b[0], b[1]);
      fc::mma_16816(acc[2 * dp + 1], pa, b[2], b[3]);
    }
  }
}

template <int kMode, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    floor_kernel(const __half* q, const __half* k, const __half* v, __half* o) {
  constexpr int kStageKeys = kSeq / kStages, kGroupKeys = kStageKeys / 2;  // two key groups per stage
  constexpr int kKvStageBytes = kStageKeys * kRowBytes;                   // K (or V) bytes per stage
  constexpr int kTiles = kGroupKeys / 64;                                  // 64-key tiles per warp and stage
  static_assert(kGroupKeys % 64 == 0 && kTiles >= 1, "a warp's keys in a stage must be whole 64-key tiles");
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t stage_full[kStages];
  const int tid = threadIdx.x, lane = tid % fc::kWarpSize, warp = tid / fc::kWarpSize;
  const int group = warp / 2, row_warp = warp % 2;
  const int head = blockIdx.x / (kSeq / kRows), m0 = blockIdx.x % (kSeq / kRows) * kRows;
  const size_t head_base = static_cast<size_t>(head) * kSeq * kDim;

  constexpr bool kLoads = kMode != kHmmaNoWait;
  if (kLoads && tid == 0) {
    for (int st = 0; st < kStages; ++st) fc::mbarrier_init(&stage_full[st], 1);
    fc::fence_proxy_async_shared();
    for (int st = 0; st < kStages; ++st) {  // stage st: K rows, then V rows, of keys st * kStageKeys ...
      fc::mbarrier_arrive_expect_bytes(&stage_full[st], 2 * kKvStageBytes);
      const size_t row0 = head_base + static_cast<size_t>(st) * kStageKeys * kDim;
      bulk_load(smem + st * 2 * kKvStageBytes, k + row0, kKvStageBytes, &stage_full[st]);
      bulk_load(smem + st * 2 * kKvStageBytes + kKvStageBytes, v + row0, kKvStageBytes, &stage_full[st]);
    }
  }
  // Q's A fragments straight from global memory, as v11's short kernels load them.
  uint32_t qf[4][4];
  {
    const __half* qr = q + head_base + static_cast<size_t>(m0 + row_warp * 16 + lane / 4) * kDim + (lane % 4) * 2;
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      qf[kc][0] = *reinterpret_cast<const uint32_t*>(qr + kc * 16);
      qf[kc][1] = *reinterpret_cast<const uint32_t*>(qr + 8 * kDim + kc * 16);
      qf[kc][2] = *reinterpret_cast<const uint32_t*>(qr + kc * 16 + 8);
      qf[kc][3] = *reinterpret_cast<const uint32_t*>(qr + 8 * kDim + kc * 16 + 8);
    }
  }
  __syncthreads();  // the barriers are initialised

  float acc[8][4];
#pragma unroll
  for (int d = 0; d < 8; ++d)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[d][r] = 0.f;
  uint32_t keep = 0;
  const int k_row = (lane & 7) + (lane >> 4) * 8, v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll(kMode == kHmma ? 1 : kStages)
  for (int st = 0; st < kStages; ++st) {
    if constexpr (kLoads) fc::mbarrier_wait_parity(&stage_full[st], 0);
    if constexpr (kMode != kLoadsOnly) {
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        // v11's per-lane ldmatrix rows (tile rows are 8-aligned, so the swizzle term is lane & 7)
        const uint32_t keys =
            fc::smem_addr(smem + st * 2 * kKvStageBytes) + (group * kGroupKeys + tile * 64) * kRowBytes;
        tile_hmma<kMode == kHmmaOverlap>(acc, qf, keys + k_row * kRowBytes,
                                         keys + kKvStageBytes + v_row * kRowBytes, lane, keep);
      }
    }
  }

  // Group 1 hands its partial O to group 0 through shared memory (over stage 0: every warp is past it);
  // group 0 adds and stores fp16 O.
  __syncthreads();
  float* part = reinterpret_cast<float*>(smem);  // [kRows][kPartStride]
  const int g = lane / 4, tq = lane % 4;
  if (group == 1) {
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float* p = part + (row_warp * 16 + g + 8 * h) * kPartStride + d * 8 + 2 * tq;
        p[0] = acc[d][2 * h];
        p[1] = acc[d][2 * h + 1];
      }
  }
  __syncthreads();
  if (group == 0) {
    __half* out = o + head_base + static_cast<size_t>(m0 + row_warp * 16) * kDim;
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* p = part + (row_warp * 16 + g + 8 * h) * kPartStride + d * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(out + (g + 8 * h) * kDim + d * 8 + 2 * tq) =
            fc::pack_half2(acc[d][2 * h] + p[0], acc[d][2 * h + 1] + p[1]) ^ keep;
      }
  }
}

template <int kMode, int kStages = 4>
const char* launch_floor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& o,
                         int ctas, cudaStream_t stream) {
  if (const char* err = fc::allow_dynamic_smem(floor_kernel<kMode, kStages>, kSmemBytes)) return err;
  floor_kernel<kMode, kStages><<<ctas, kThreads, kSmemBytes, stream>>>(
      reinterpret_cast<const __half*>(q.data_ptr()), reinterpret_cast<const __half*>(k.data_ptr()),
      reinterpret_cast<const __half*>(v.data_ptr()), reinterpret_cast<__half*>(o.data_ptr()));
  return fc::launch_status();
}

void launch(int mode, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& o) {
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&q, &k, &v, &o}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == torch::kHalf && t->is_contiguous() && t->dim() == 4 &&
                    t->size(2) == kSeq && t->size(3) == kDim,
                "floor kernels take contiguous CUDA fp16 [B, H, 512, 64] tensors");
  }
  const int ctas = static_cast<int>(q.size(0) * q.size(1)) * (kSeq / kRows);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const char* err = nullptr;
  switch (mode) {
    case kEmpty:
      empty_kernel<<<ctas, kThreads, 0, stream>>>();
      err = fc::launch_status();
      break;
    case kLoadsOnly: err = launch_floor<kLoadsOnly>(q, k, v, o, ctas, stream); break;
    case kHmma: err = launch_floor<kHmma>(q, k, v, o, ctas, stream); break;
    case kHmmaOverlap: err = launch_floor<kHmmaOverlap>(q, k, v, o, ctas, stream); break;
    case kHmmaNoWait: err = launch_floor<kHmmaNoWait>(q, k, v, o, ctas, stream); break;
    case kHmmaTwoStages: err = launch_floor<kHmmaTwoStages, 2>(q, k, v, o, ctas, stream); break;
    default: TORCH_CHECK(false, "unknown floor mode ", mode);
  }
  TORCH_CHECK(err == nullptr, err ? err : "");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("launch", &launch, "launch one floor kernel (mode -1..4)"); }
