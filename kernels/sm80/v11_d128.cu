// sm80/v11_d128.cu — v11's D=128 forward kernels, fp16 and bf16, in a translation unit of their own: it compiles beside
// sm80/v11.cu's and sm80/v11_bf16.cu's D=64 halves, so an edit of one of them recompiles about half as many kernels as
// before (sm80/launch_fwd_sm80.cuh declares the two functions below; sm80/v11.cu's header tells the rung's story).
#include "flashcore.h"
#include "sm80/launch_fwd_sm80.cuh"

template <class T>
const char* v11_forward_d128(const FlashcoreParams& p, cudaStream_t stream) {
  return forward<LongD128, void, ShortD128, void, T, LongFamilyD128, LongD128>(p, stream);
}

template <class T>
int v11_plan_d128(FlashcoreKernelPlan* all) {
  all[0] = plan_of<LongD128, T>();
  all[1] = plan_of<ShortD128, T>();
  all[2] = plan_of<LongFamilyD128, T, true>();
  all[3] = plan_of<ShortD128, T, true>();
  all[4] = window_plan_of<LongD128, T>();
  return 5;
}

template const char* v11_forward_d128<__half>(const FlashcoreParams&, cudaStream_t);
template const char* v11_forward_d128<__nv_bfloat16>(const FlashcoreParams&, cudaStream_t);
template int v11_plan_d128<__half>(FlashcoreKernelPlan*);
template int v11_plan_d128<__nv_bfloat16>(FlashcoreKernelPlan*);
