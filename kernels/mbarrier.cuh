// mbarrier.cuh — shared-memory barriers with phases (mbarrier, sm_80+) through inline PTX, for rungs whose
// warps hand tiles to each other instead of meeting at __syncthreads (v9: producer and consumer warps).
//
// An mbarrier counts arrivals. It is initialised with an expected count; when that many arrivals have
// happened its current phase completes, the pending count resets to the expected count and the phase
// parity flips. A waiter names the parity of the phase it waits for, so a ring of buffers reuses each
// barrier once per lap with the parity of (lap & 1). Every operation here is a real barrier operation with
// acquire/release semantics, never a poll of an ordinary shared-memory flag (the seeds' v9 deadlock).
#pragma once

#include <cstdint>

#include "primitives.cuh"

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

}  // namespace fc
