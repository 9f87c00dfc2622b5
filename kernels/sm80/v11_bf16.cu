// sm80/v11_bf16.cu — v11's forward on bf16 tensors: the same kernels as sm80/v11.cu's D=64 ones
// (sm80/launch_fwd_sm80.cuh; D=128 is sm80/v11_d128.cu's), instantiated for __nv_bfloat16 (mma .bf16, P and O rounded
// to bf16, kernels named v11_fwd*_bf16) in a translation unit of their own, compiled beside sm80/v11.cu's fp16 half.
// sm80/v11.cu's flashcore_forward and flashcore_plan call these two.
#include "flashcore.h"
#include "sm80/launch_fwd_sm80.cuh"

const char* v11_forward_bf16(const FlashcoreParams& p, cudaStream_t stream) {
  return forward_dtype<__nv_bfloat16>(p, stream);
}

int v11_plan_bf16(int head_dim, FlashcoreKernelPlan* plans) { return plan_dtype<__nv_bfloat16>(head_dim, plans); }
