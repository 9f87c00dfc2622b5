// common/tma.cuh — the Tensor Memory Accelerator (sm_90+): tensor maps encoded on the host, and the bulk tensor
// copies that use them (global -> shared onto an mbarrier, shared -> global in bulk groups, L2 prefetch).
//
// A tensor map (CUtensorMap, 128 bytes) describes a tensor in global memory and the box one copy moves; a
// kernel takes it as a `const __grid_constant__ CUtensorMap` parameter and passes its address here. One
// thread issues a copy; a load counts its bytes down on an mbarrier (arm it with
// fc::mbarrier_arrive_expect_bytes, common/mbarrier.cuh), a store is tracked by commit/wait of bulk groups.
// Coordinates are in elements, innermost dimension first. Box elements past the tensor's bounds load as zeros
// and are not written by a store. With a 128-byte swizzle a box row of 128 bytes lands with its 16-byte chunk
// c at c ^ (row & 7) — the layout fc::swizzle (common/mma_sm80.cuh) addresses — provided the shared-memory
// destination is 1024-byte aligned (the swizzle is a function of address bits 4-9).
// The device functions compile for every target so that kernel templates parse everywhere; below sm_90 they
// trap (FC_SM90_ONLY), and no launcher runs them there.
#pragma once

#include <cuda.h>          // CUtensorMap, the encoder's enums
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "common/mbarrier.cuh"
#include "common/primitives.cuh"

namespace fc {

// Whether this compile builds an sm_90+ target. nvcc defines __CUDA_ARCH_LIST__ alike in the host and the
// device passes (unlike __CUDA_ARCH__), so host code can leave a TMA kernel unreferenced, and so unbuilt, in
// an sm_89 compile: `if constexpr (fc::kBuildsSm90)` around its launch, `if (fc::kBuildsSm90)` in its plan.
constexpr bool builds_sm90() {
#ifdef __CUDA_ARCH_LIST__
  for (const int arch : {__CUDA_ARCH_LIST__}) {
    if (arch >= 900) return true;
  }
#endif
  return false;
}
constexpr bool kBuildsSm90 = builds_sm90();

// ---- loads: global -> this CTA's shared memory, completing on an mbarrier -------------------------------

// cp.async.bulk.tensor.3d ...: the box at (c0, c1, c2) into dst, its bytes counted on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  FC_SM90_ONLY(asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory"));
}

// cp.async.bulk.tensor.4d ...: the box at (c0, c1, c2, c3) into dst, its bytes counted on bar.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  FC_SM90_ONLY(asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory"));
}

// ---- L2 prefetch: the same boxes into L2 only; nothing waits for them ---------------------------------

// cp.async.bulk.prefetch.tensor.3d.L2: the box at (c0, c1, c2) into L2.
__device__ __forceinline__ void tma_prefetch_3d(const CUtensorMap* map, int c0, int c1, int c2) {
  FC_SM90_ONLY(asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global [%0, {%1, %2, %3}];\n" ::"l"(map), "r"(c0),
                            "r"(c1), "r"(c2)
                            : "memory"));
}

// prefetch.tensormap: the 128-byte map itself into the cache the TMA unit reads it from (a __grid_constant__
// parameter's generic address).
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  FC_SM90_ONLY(asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory"));
}

// ---- stores: this CTA's shared memory -> global, in bulk groups ----------------------------------------
// The writer threads' shared-memory stores must be made visible to the TMA unit first
// (fc::fence_proxy_async_shared, then a barrier), and one thread issues the store.

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` contiguous bytes (a multiple of 16,
// both addresses 16-byte aligned) from global src into dst, counted on bar. No tensor map.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  FC_SM90_ONLY(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory"));
}

// cp.async.bulk.tensor.4d.global.shared::cta.bulk_group: src into the box at (c0, c1, c2, c3).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* src) {
  FC_SM90_ONLY(asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(map), "r"(c0),
      "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(src))
      : "memory"));
}

// cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group: global += src over the box at
// (c0, c1, c2) (fp32 add in L2; elements past the tensor's bounds are skipped).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, int c0, int c1, int c2, const void* src) {
  FC_SM90_ONLY(asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
      "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(src))
      : "memory"));
}

// cp.async.bulk.commit_group: closes this thread's bulk stores issued so far into one group.
__device__ __forceinline__ void tma_store_commit() {
  FC_SM90_ONLY(asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"));
}

// cp.async.bulk.wait_group.read N: at most kPending of this thread's groups still read their shared-memory
// source (the older groups' sources may be overwritten).
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {
  FC_SM90_ONLY(asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory"));
}

// cp.async.bulk.wait_group N: at most kPending of this thread's groups still incomplete (their writes done).
template <int kPending>
__device__ __forceinline__ void tma_store_wait() {
  FC_SM90_ONLY(asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory"));
}

// ---- host: tensor maps ------------------------------------------------------------------------------------

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda); null when
// the driver has none. Looked up once per process.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // an answer here, not a sticky error for the next launch
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A tiled map of a kRank-dimensional tensor (2..5) at `base` (16-byte aligned): dims[0] is the innermost,
// contiguous dimension, in elements; strides_bytes[i] is the byte step of dims[i + 1] (a multiple of 16);
// box[i] elements per copy along dims[i] (each <= 256; box[0] * element size <= the swizzle span when
// swizzled, e.g. 64 fp16 for CU_TENSOR_MAP_SWIZZLE_128B). Out-of-bounds elements load as zeros. False when
// the driver has no encoder or refuses the map (a misaligned base, say): the caller then takes another path.
template <int kRank>
inline bool encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                              const cuuint64_t (&dims)[kRank], const cuuint64_t (&strides_bytes)[kRank - 1],
                              const cuuint32_t (&box)[kRank], CUtensorMapSwizzle swizzle,
                              CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  static_assert(kRank >= 2 && kRank <= 5, "tensor maps here have 2 to 5 dimensions");
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  cuuint32_t element_strides[kRank];
  for (int i = 0; i < kRank; ++i) element_strides[i] = 1;
  const CUresult result = encode(map, type, kRank, const_cast<void*>(base), dims, strides_bytes, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

}  // namespace fc
