// common/primitives.cuh — device building blocks shared by the rungs from v8 up: asynchronous copies
// (cp.async, sm_80+) and warp reductions. Each rung's .cu keeps its own story; what is here is plumbing.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>

namespace fc {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg). When !valid it writes 16 zero bytes and
// reads nothing (src-size 0), which is how tiles past the sequence end are padded; the caller still
// passes an in-bounds address (e.g. the tensor's first row).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Reductions over groups of kWidth consecutive lanes (kWidth a power of two <= 32); every lane of the
// group gets the result.
template <int kWidth = 32>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <int kWidth = 32>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace fc
