// sm80/kernels_fwd_sm80.cuh — v11's forward __global__ kernels: the dense ones (fp16, bf16; cp.async and, on sm_90,
// TMA-fed), their family twins and the window kernels, each a v11_forward (sm80/forward_sm80.cuh) of one configuration.
// sm80/launch_fwd_sm80.cuh picks and launches them.
#pragma once

#include "flashcore.h"
#include "sm80/forward_sm80.cuh"
#include "sm80/v11_traits.cuh"

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __half>(p, nullptr, nullptr);
}

// The same kernels on bf16 tensors (mma .bf16, bf16 rounding of P and O); the fp16 ones keep their names.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_bf16(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __nv_bfloat16>(p, nullptr,
                                                                                                     nullptr);
}

// sm_90's short D=64 kernel: the tensor maps are kernel parameters (__grid_constant__: TMA reads them
// where they are). Only an sm_90+ build instantiates it (fc::kBuildsSm90 in forward and flashcore_plan).
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __half>(p, &tmap_k, &tmap_v);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma_bf16(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __nv_bfloat16>(p, &tmap_k,
                                                                                                    &tmap_v);
}

// The family twins of the four kernels above (v11_forward's kSoftcap and kWindow): every call with a window (other
// than causal's (-1, 0)) or a softcap runs on them (but D=128's long windowed calls without softcap: v11_fwd_window,
// below), so that the dense kernels keep their pre-family loop and their names.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_family(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __half, true>(p, nullptr, nullptr);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_family_bf16(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __nv_bfloat16, true>(p, nullptr,
                                                                                                           nullptr);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma_family(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                       const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __half, true>(p, &tmap_k, &tmap_v);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma_family_bf16(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                            const __grid_constant__ CUtensorMap tmap_v) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true, __nv_bfloat16, true>(
      p, &tmap_k, &tmap_v);
}

// The window kernels (v11_forward's kWindow without kSoftcap): D=128's long windowed calls without a softcap, on
// LongD128's 48-key tiles (the family kernel's 32-key tiles, which the softcap needs, would cost them ~7%).
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_window(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __half, false, true>(p, nullptr,
                                                                                                         nullptr);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd_window_bf16(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false, __nv_bfloat16, false, true>(
      p, nullptr, nullptr);
}
