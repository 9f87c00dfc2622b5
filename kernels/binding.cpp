// binding.cpp — the one PyTorch binding every variant is built with (see flashcore.h).
// Input checks, output allocation and the stream live here, once; kernels never include torch.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <vector>

#include "flashcore.h"

// A rung that takes bf16 too defines its own flashcore_dtypes(); this default is fp16 only.
__attribute__((weak)) int flashcore_dtypes() { return 1 << kFlashcoreFloat16; }

namespace {

bool takes(FlashcoreDtype dtype) { return (flashcore_dtypes() >> dtype) & 1; }

void check_input(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got a tensor on ", t.device());
  if (takes(kFlashcoreBFloat16)) {
    TORCH_CHECK(t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16, name,
                " must be float16 or bfloat16, got ", t.scalar_type());
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " is ", t.scalar_type(), " but q is ", q.scalar_type());
  } else {
    TORCH_CHECK(t.scalar_type() == torch::kHalf, name, " must be float16, got ", t.scalar_type());
  }
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D [B, H, S, D], got shape ", t.sizes());
  TORCH_CHECK(t.sizes() == q.sizes(), name, " has shape ", t.sizes(), " but q has ", q.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must start on a 16-byte boundary (kernels use 16-byte vector loads and cp.async)");
  TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), " but q is on ", q.device());
}

torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                      c10::optional<double> scale, c10::optional<torch::Tensor> out) {
  check_input(q, "q", q);
  check_input(k, "k", q);
  check_input(v, "v", q);
  if (out.has_value()) check_input(*out, "out", q);
  TORCH_CHECK(q.numel() < (int64_t(1) << 31), "tensors of more than 2^31 elements are not supported");
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = out.has_value() ? *out : torch::empty_like(q);
  if (q.numel() == 0) return o;

  FlashcoreParams p;
  p.q = reinterpret_cast<const __half*>(q.data_ptr());
  p.k = reinterpret_cast<const __half*>(k.data_ptr());
  p.v = reinterpret_cast<const __half*>(v.data_ptr());
  p.o = reinterpret_cast<__half*>(o.data_ptr());
  p.dtype = q.scalar_type() == torch::kBFloat16 ? kFlashcoreBFloat16 : kFlashcoreFloat16;
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.seq_len = static_cast<int>(q.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.scale = scale.has_value() ? static_cast<float>(*scale) : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.causal = causal;

  const char* err = flashcore_forward(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return o;
}

std::vector<std::tuple<std::string, int, int>> plan(int head_dim) {
  FlashcoreKernelPlan plans[8];
  int n = flashcore_plan(head_dim, plans, 8);
  std::vector<std::tuple<std::string, int, int>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(plans[i].kernel, plans[i].threads_per_block, plans[i].dynamic_smem_bytes);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "attention forward: o = softmax(q k^T * scale) v", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("out") = py::none());
  m.def("dtypes", &flashcore_dtypes, "the element types the launcher takes: a mask of 1 << (0: fp16, 1: bf16)");
  m.def("plan", &plan, "the kernels, threads and dynamic shared memory the launcher uses at a head dim",
        py::arg("head_dim"));
}
