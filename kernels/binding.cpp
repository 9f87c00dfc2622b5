// binding.cpp — the one PyTorch binding every variant is built with (see flashcore.h).
// Input checks, output allocation and the stream live here, once; kernels never include torch.
// Bad input raises ValueError (TORCH_CHECK_VALUE) with one line naming the tensor and the rule; a launch
// the rung refuses raises RuntimeError with the rung's message.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <vector>

#include "flashcore.h"
#include "flashcore_defaults.h"

namespace {

bool takes(FlashcoreDtype dtype) { return (flashcore_dtypes() >> dtype) & 1; }

// Numbers, shapes and devices in the messages below are made into text by std::to_string, not by the stream's
// number formatting. On the lent H100 (2026-11-26) every failed check whose message streamed an integer or a
// shape (k and v of different shapes, a 3-D q, a head-count mismatch) ended the process with SIGSEGV, where
// those whose message held only words or a dtype raised their ValueError (tests/test_gpu.py,
// test_bad_input_raises_clear_errors).
std::string num(int64_t x) { return std::to_string(x); }
std::string shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}
bool has(FlashcoreFeature feature) { return (flashcore_features() & feature) != 0; }

// What every tensor must be: CUDA, an element type the rung takes (q's), 4-D, contiguous, 16-byte aligned.
void check_tensor(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(t.is_cuda(), name, " must be a CUDA tensor, got a tensor on ", t.device().str());
  if (takes(kFlashcoreBFloat16)) {
    TORCH_CHECK_VALUE(t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16, name,
                      " must be float16 or bfloat16, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.scalar_type() == q.scalar_type(), name, " is ", t.scalar_type(), " but q is ",
                      q.scalar_type());
  } else {
    TORCH_CHECK_VALUE(t.scalar_type() == torch::kHalf, name, " must be float16, got ", t.scalar_type());
  }
  TORCH_CHECK_VALUE(t.dim() == 4, name, " must be 4-D [B, H, S, D], got shape ", shape(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
                    " must start on a 16-byte boundary (kernels use 16-byte vector loads and cp.async)");
  TORCH_CHECK_VALUE(t.device() == q.device(), name, " is on ", t.device().str(), " but q is on ", q.device().str());
  TORCH_CHECK_VALUE(t.numel() < (int64_t(1) << 31), name, " has more than 2^31 elements");
}

// q, o: [B, H, S, D]; k, v: [B, H_kv, S_kv, D], with H_kv and S_kv other than H and S only where the rung
// declares it.
void check_problem(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  check_tensor(q, "q", q);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v has shape ", shape(v), " but k has ", shape(k));
  TORCH_CHECK_VALUE(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k has shape ", shape(k), " but q has ",
                    shape(q), " (batch and head dim must match)");
  const int64_t heads = q.size(1), heads_kv = k.size(1);
  TORCH_CHECK_VALUE(heads_kv >= 1 && heads % heads_kv == 0, "q has ", num(heads), " heads and k ", num(heads_kv),
                    ": the query heads must be a multiple of the key/value heads");
  TORCH_CHECK_VALUE(heads_kv == heads || has(kFlashcoreGqa), "k and v have ", num(heads_kv), " heads and q ", num(heads),
                    ": grouped-query attention is not supported by this variant (it needs equal head counts)");
  TORCH_CHECK_VALUE(k.size(2) == q.size(2) || has(kFlashcoreSeqLenKv), "k and v have ", num(k.size(2)),
                    " rows and q ", num(q.size(2)),
                    ": key sequences of another length than the queries' are not supported by this variant");
  TORCH_CHECK_VALUE(k.size(2) >= 1 || q.size(2) == 0, "k and v have no rows: attention needs at least one key");
  const int max_rows = flashcore_max_seq_len();
  TORCH_CHECK_VALUE(max_rows == 0 || q.size(2) <= max_rows, "q has ", num(q.size(2)), " rows: this variant takes at most ",
                    num(max_rows), " query rows (a decode kernel)");
}

void check_same(const torch::Tensor& t, const char* name, const torch::Tensor& like, const char* like_name,
                const torch::Tensor& q) {
  check_tensor(t, name, q);
  TORCH_CHECK_VALUE(t.sizes() == like.sizes(), name, " has shape ", shape(t), " but ", like_name, " has ",
                    shape(like));
}

// The attention family's arguments as the caller gave them (FlashAttention's names), checked once by family().
struct Family {
  int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  c10::optional<torch::Tensor> sinks;
};

// Checks the family's values and that the rung takes them; normalizes the window (causal sets its right edge to
// 0, (-1, 0) is causal, an edge that hides nothing is -1), and sets p's fields (p's shapes already set).
void family(FlashcoreParams& p, bool causal, const Family& f, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(f.window_left >= -1 && f.window_right >= -1, "window_size must be -1 (unbounded) or >= 0 on each side, got (",
                    num(f.window_left), ", ", num(f.window_right), ")");
  TORCH_CHECK_VALUE(f.window_left < (int64_t(1) << 31) && f.window_right < (int64_t(1) << 31),
                    "window_size must be below 2^31 on each side");
  // An edge that hides no key is -1 (flashcore.h): a left edge of S_kv - 1 or more, a right edge of S - 1 or more
  // (causal's 0 stays: it is what `causal` reads); so a window past the sequence runs on any variant, as causal or dense.
  const int64_t seq = p.seq_len, seq_kv = p.seq_len_kv;
  const int left = f.window_left >= 0 && f.window_left < seq_kv - 1 ? static_cast<int>(f.window_left) : -1;
  const int right = causal ? 0 : f.window_right > 0 && f.window_right >= seq - 1 ? -1 : static_cast<int>(f.window_right);
  TORCH_CHECK_VALUE((left < 0 && right <= 0) || has(kFlashcoreWindow), "window_size (", num(left), ", ", num(right),
                    ") is not supported by this variant: it takes no sliding window (only causal or none)");
  TORCH_CHECK_VALUE(std::isfinite(f.softcap) && f.softcap >= 0.0, "softcap must be a finite number >= 0 (0: off), got ",
                    std::to_string(f.softcap));
  TORCH_CHECK_VALUE(f.softcap == 0.0 || has(kFlashcoreSoftcap), "softcap is not supported by this variant");
  p.window_left = left;
  p.window_right = right;
  p.causal = right == 0;
  p.softcap = static_cast<float>(f.softcap);
  p.sinks = nullptr;
  if (f.sinks.has_value()) {
    const torch::Tensor& s = *f.sinks;
    TORCH_CHECK_VALUE(has(kFlashcoreSinks), "sinks are not supported by this variant");
    TORCH_CHECK_VALUE(s.is_cuda() && s.device() == q.device(), "sinks must be on q's device (", q.device().str(),
                      "), got ", s.device().str());
    TORCH_CHECK_VALUE(s.scalar_type() == torch::kFloat, "sinks must be float32, got ", s.scalar_type());
    TORCH_CHECK_VALUE(s.dim() == 1 && s.size(0) == q.size(1) && s.is_contiguous(),
                      "sinks must be a contiguous [H] tensor, one logit per query head (H = ", num(q.size(1)),
                      "), got shape ", shape(s));
    p.sinks = s.data_ptr<float>();
  }
}

FlashcoreParams params(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& o, bool causal, c10::optional<double> scale, float* lse,
                       const Family& f) {
  FlashcoreParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.dtype = q.scalar_type() == torch::kBFloat16 ? kFlashcoreBFloat16 : kFlashcoreFloat16;
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.seq_len = static_cast<int>(q.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.heads_kv = static_cast<int>(k.size(1));
  p.seq_len_kv = static_cast<int>(k.size(2));
  p.scale = scale.has_value() ? static_cast<float>(*scale) : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.lse = lse;
  p.workspace = nullptr;
  p.o_residual = nullptr;
  family(p, causal, f, q);
  return p;
}

// o (into `out` when given), the row log-sum-exp [B, H, S] fp32 when want_lse, and O's rounding residual
// (flashcore.h's o_residual) when want_residual; the tensors not asked for are undefined.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> run_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                    const torch::Tensor& v, bool causal,
                                                                    c10::optional<double> scale,
                                                                    const c10::optional<torch::Tensor>& out,
                                                                    bool want_lse, bool want_residual,
                                                                    const Family& f) {
  check_problem(q, k, v);
  if (out.has_value()) check_same(*out, "out", q, "q", q);
  TORCH_CHECK_VALUE(!want_lse || has(kFlashcoreLse), "the row log-sum-exp is not computed by this variant");
  TORCH_CHECK_VALUE(!want_residual || has(kFlashcoreBackward), "this variant is forward-only: it has no training forward");
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = out.has_value() ? *out : torch::empty_like(q);
  torch::Tensor lse, residual;
  if (want_lse) lse = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(torch::kFloat));
  if (want_residual) residual = torch::empty_like(q);
  FlashcoreParams p = params(q, k, v, o, causal, scale, want_lse ? lse.data_ptr<float>() : nullptr, f);
  if (q.numel() == 0) return {o, lse, residual};
  p.o_residual = want_residual ? residual.data_ptr() : nullptr;
  const size_t bytes = flashcore_forward_workspace(p);
  torch::Tensor workspace;
  if (bytes > 0) {
    workspace = torch::empty({static_cast<int64_t>(bytes)}, q.options().dtype(torch::kByte));
    p.workspace = workspace.data_ptr();
  }
  const char* err = flashcore_forward(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {o, lse, residual};
}

Family make_family(std::tuple<int64_t, int64_t> window_size, double softcap, const c10::optional<torch::Tensor>& sinks) {
  Family f;
  f.window_left = std::get<0>(window_size);
  f.window_right = std::get<1>(window_size);
  f.softcap = softcap;
  f.sinks = sinks;
  return f;
}

torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                      c10::optional<double> scale, c10::optional<torch::Tensor> out,
                      std::tuple<int64_t, int64_t> window_size, double softcap, c10::optional<torch::Tensor> sinks) {
  return std::get<0>(run_forward(q, k, v, causal, scale, out, false, false, make_family(window_size, softcap, sinks)));
}

std::tuple<torch::Tensor, torch::Tensor> forward_lse(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v, bool causal, c10::optional<double> scale,
                                                     std::tuple<int64_t, int64_t> window_size, double softcap,
                                                     c10::optional<torch::Tensor> sinks) {
  auto [o, lse, residual] =
      run_forward(q, k, v, causal, scale, c10::nullopt, true, false, make_family(window_size, softcap, sinks));
  return {o, lse};
}

// The forward a training step runs: o, lse, and O's rounding residual for the backward.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward_train(const torch::Tensor& q, const torch::Tensor& k,
                                                                      const torch::Tensor& v, bool causal,
                                                                      c10::optional<double> scale,
                                                                      std::tuple<int64_t, int64_t> window_size,
                                                                      double softcap, c10::optional<torch::Tensor> sinks) {
  return run_forward(q, k, v, causal, scale, c10::nullopt, true, true, make_family(window_size, softcap, sinks));
}

// dq, dk, dv of one forward call, from dO and what the forward was given and gave (o, lse, and the residual of
// o where it was a training forward).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward(const torch::Tensor& d_o, const torch::Tensor& q,
                                                                 const torch::Tensor& k, const torch::Tensor& v,
                                                                 const torch::Tensor& o, const torch::Tensor& lse,
                                                                 bool causal, c10::optional<double> scale,
                                                                 const c10::optional<torch::Tensor>& grad_lse,
                                                                 const c10::optional<torch::Tensor>& out_residual,
                                                                 c10::optional<torch::Tensor> dq_out,
                                                                 c10::optional<torch::Tensor> dk_out,
                                                                 c10::optional<torch::Tensor> dv_out,
                                                                 std::tuple<int64_t, int64_t> window_size,
                                                                 double softcap, c10::optional<torch::Tensor> sinks,
                                                                 c10::optional<torch::Tensor> dsinks_out) {
  TORCH_CHECK_VALUE(has(kFlashcoreBackward), "this variant is forward-only: it has no backward");
  check_problem(q, k, v);
  check_same(o, "out", q, "q", q);
  check_same(d_o, "grad_out", q, "q", q);
  TORCH_CHECK_VALUE(lse.is_cuda() && lse.scalar_type() == torch::kFloat && lse.is_contiguous() &&
                        lse.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2)}),
                    "lse must be the forward's contiguous float32 [B, H, S] log-sum-exp, got ", lse.scalar_type(),
                    " of shape ", shape(lse));
  if (grad_lse.has_value()) {
    TORCH_CHECK_VALUE(grad_lse->is_cuda() && grad_lse->scalar_type() == torch::kFloat && grad_lse->is_contiguous() &&
                          grad_lse->sizes() == lse.sizes(),
                      "grad_lse must be a contiguous float32 tensor shaped like lse ", shape(lse));
  }
  if (out_residual.has_value()) check_same(*out_residual, "out_residual", q, "q", q);
  if (dq_out.has_value()) check_same(*dq_out, "dq", q, "q", q);
  if (dk_out.has_value()) check_same(*dk_out, "dk", k, "k", q);
  if (dv_out.has_value()) check_same(*dv_out, "dv", v, "v", q);
  const Family f = make_family(window_size, softcap, sinks);
  FlashcoreParams fwd = params(q, k, v, o, causal, scale, const_cast<float*>(lse.data_ptr<float>()), f);
  TORCH_CHECK_VALUE(!dsinks_out.has_value() || sinks.has_value(), "dsinks is given but sinks are not");
  if (dsinks_out.has_value()) {
    TORCH_CHECK_VALUE(dsinks_out->is_cuda() && dsinks_out->scalar_type() == torch::kFloat && dsinks_out->is_contiguous() &&
                          dsinks_out->sizes() == sinks->sizes() && dsinks_out->device() == q.device(),
                      "dsinks must be a contiguous float32 tensor shaped like sinks, on q's device");
  }
  const c10::cuda::CUDAGuard guard(q.device());
  auto dq = dq_out.has_value() ? *dq_out : torch::empty_like(q);
  auto dk = dk_out.has_value() ? *dk_out : torch::empty_like(k);
  auto dv = dv_out.has_value() ? *dv_out : torch::empty_like(v);
  // dL/dsinks: zeroed here, added to by the rung (flashcore.h); a caller that passes no dsinks gets none.
  torch::Tensor dsinks;
  if (sinks.has_value()) dsinks = dsinks_out.has_value() ? dsinks_out->zero_() : torch::zeros_like(*sinks);
  if (q.numel() == 0 || k.numel() == 0) {
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  FlashcoreBackwardParams b;
  b.fwd = fwd;
  b.fwd.o_residual = out_residual.has_value() ? out_residual->data_ptr() : nullptr;
  b.d_o = d_o.data_ptr();
  b.dq = dq.data_ptr();
  b.dk = dk.data_ptr();
  b.dv = dv.data_ptr();
  b.d_lse = grad_lse.has_value() ? grad_lse->data_ptr<float>() : nullptr;
  b.dsinks = sinks.has_value() ? dsinks.data_ptr<float>() : nullptr;
  const size_t bytes = flashcore_backward_workspace(b.fwd);
  torch::Tensor workspace;
  if (bytes > 0) workspace = torch::empty({static_cast<int64_t>(bytes)}, q.options().dtype(torch::kByte));
  b.workspace = bytes > 0 ? workspace.data_ptr() : nullptr;
  const char* err = flashcore_backward(b, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, err);
  return {dq, dk, dv};
}

std::vector<std::tuple<std::string, int, int>> plan(int head_dim) {
  FlashcoreKernelPlan plans[kFlashcoreMaxPlans];
  int n = flashcore_plan(head_dim, plans, kFlashcoreMaxPlans);
  std::vector<std::tuple<std::string, int, int>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(plans[i].kernel, plans[i].threads_per_block, plans[i].dynamic_smem_bytes);
  return out;
}

}  // namespace

// The module's functions (not PYBIND11_MODULE: see flashcore_binding_init below).
static void define_module(py::module_& m) {
  m.def("forward", &forward, "attention forward: o = softmax(q k^T * scale) v", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("out") = py::none(),
        py::arg("window_size") = std::make_tuple(-1, -1), py::arg("softcap") = 0.0, py::arg("sinks") = py::none());
  m.def("forward_lse", &forward_lse, "attention forward that also returns the row log-sum-exp (fp32 [B, H, S])",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(),
        py::arg("window_size") = std::make_tuple(-1, -1), py::arg("softcap") = 0.0, py::arg("sinks") = py::none());
  m.def("forward_train", &forward_train,
        "the forward a training step runs: (out, lse, out_residual), the last O's rounding residual for the backward",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(),
        py::arg("window_size") = std::make_tuple(-1, -1), py::arg("softcap") = 0.0, py::arg("sinks") = py::none());
  m.def("backward", &backward,
        "attention backward: (dq, dk, dv) from grad_out, q, k, v, out, lse [, out_residual] (into dq, dk, dv when given)",
        py::arg("grad_out"),
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("causal") = false,
        py::arg("scale") = py::none(), py::arg("grad_lse") = py::none(), py::arg("out_residual") = py::none(),
        py::arg("dq") = py::none(), py::arg("dk") = py::none(), py::arg("dv") = py::none(),
        py::arg("window_size") = std::make_tuple(-1, -1), py::arg("softcap") = 0.0, py::arg("sinks") = py::none(),
        py::arg("dsinks") = py::none());
  m.def("dtypes", &flashcore_dtypes, "the element types the launcher takes: a mask of 1 << (0: fp16, 1: bf16)");
  m.def("max_seq_len", &flashcore_max_seq_len, "the most query rows the launcher takes (0: any)");
  m.def("features", &flashcore_features, "what else it supports: a mask of FlashcoreFeature (kernels/flashcore.h)");
  m.def("plan", &plan, "the kernels, threads and dynamic shared memory the launcher uses at a head dim",
        py::arg("head_dim"));
  m.def("forward_note", []() -> py::object {
    const char* note = flashcore_forward_note();
    return note != nullptr ? py::object(py::str(note)) : py::object(py::none());
  }, "what the last forward on this thread ran in place of the kernel its plan prefers, and why (None: nothing)");
}

// This file is compiled once into an object that every variant's module links (flashcore_cli/builder/jit.py), so a
// module's name cannot be TORCH_EXTENSION_NAME: it comes from the entry point flashcore generates per module,
//   PyMODINIT_FUNC PyInit_<name>() { return flashcore_binding_init("<name>"); }
// with a string literal (module_name must outlive the module). Single-phase init, as PYBIND11_PLUGIN did.
extern "C" PyObject* flashcore_binding_init(const char* module_name) {
  PYBIND11_CHECK_PYTHON_VERSION
  PYBIND11_ENSURE_INTERNALS_READY
  static PyModuleDef def;  // one per shared library, so one per variant's module
  try {
    auto m = py::module_::create_extension_module(module_name, nullptr, &def);
    define_module(m);
    return m.ptr();
  }
  PYBIND11_CATCH_INIT_EXCEPTIONS
  return nullptr;
}
