// common/mbarrier.cuh — shared-memory barriers with phases (mbarrier, sm_80+) through inline PTX, for rungs whose
// warps hand tiles to each other instead of meeting at __syncthreads (v9: producer and consumer warps).
//
// An mbarrier counts arrivals. It is initialised with an expected count; when that many arrivals have
// happened its current phase completes, the pending count resets to the expected count and the phase
// parity flips. A waiter names the parity of the phase it waits for, so a ring of buffers reuses each
// barrier once per lap with the parity of (lap & 1). Every operation here is a real barrier operation with
// acquire/release semantics, never a poll of an ordinary shared-memory flag (the seeds' v9 deadlock).
#pragma once

#include <cstdint>

#include "common/primitives.cuh"

namespace fc {

// One thread initialises; the block must meet at a __syncthreads before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t expected_arrivals) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(expected_arrivals) : "memory");
}

// This thread's arrival; releases its own earlier shared-memory reads and writes to the phase's waiters.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared.b64 state, [%0];\n"
      "}\n" ::"r"(smem_addr(bar))
      : "memory");
}

// An arrival that the hardware performs once every cp.async this thread issued so far has landed, which
// makes those writes visible to the phase's waiters. `.noinc`: it is one of the init count's arrivals.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// True once the phase of this parity has completed (acquire). sm_90 has try_wait, which may suspend the
// thread for a while in hardware; sm_80/sm_89 have test_wait only.
__device__ __forceinline__ bool mbarrier_test_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_test_parity(bar, parity)) {
  }
}

// Waits until every cp.async this thread issued has landed (a thread must not exit with copies in flight).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Bulk copies (cp.async.bulk, TMA; sm_90 only: on older targets these trap) count their bytes down on an
// mbarrier instead of arriving on it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FC_SM90_ONLY(statement) statement
#else
#define FC_SM90_ONLY(statement) __trap()
#endif

// Makes this thread's ordinary shared-memory writes visible to the bulk-copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
  FC_SM90_ONLY(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}

// One thread's arrival on `bar` (initialised for one) that also makes its current phase wait for `bytes`
// of bulk copies to land.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  FC_SM90_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                            : "memory"));
}

}  // namespace fc
