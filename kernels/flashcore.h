// flashcore.h — the contract every variant implements, and the few helpers they share.
//
// A variant is one or more .cu files that include this header (and CUDA headers) only — never torch —
// so that `flashcore ptxas` can compile it with plain nvcc, on a machine with no GPU, in seconds.
// kernels/binding.cpp wraps the functions below for PyTorch once, for every variant: the harness
// never special-cases a variant.
//
//   flashcore_plan      what the launcher will ask for at a head dim: one entry per __global__ kernel
//                       (its name, threads per block, dynamic shared memory). Host code only, so the
//                       ptxas report can read it without a GPU.
//   flashcore_forward   launches O = softmax(Q K^T * scale [+ causal mask]) V on a stream. Returns
//                       nullptr on success, or a message that names what went wrong (the binding raises
//                       it as a Python error, so a bad launch is a clear error, never silent garbage).
//
// Optional (flashcore_defaults.h gives the binding and the probe a default for each):
//   flashcore_dtypes    which element types the launcher takes, as a mask of 1 << FlashcoreDtype.
//                       Default: fp16 only.
//   flashcore_features  what else it supports, a mask of FlashcoreFeature: grouped-query heads, key
//                       sequences of another length than the queries', the row log-sum-exp, a backward.
//                       Default: none of them (the binding then refuses such inputs with a clear error).
//   flashcore_backward  dQ, dK, dV from dO, Q, K, V, O and the forward's LSE, for a rung that declares
//   flashcore_backward_workspace   kFlashcoreBackward; the workspace is scratch the binding allocates.
//   flashcore_forward_workspace    scratch bytes the forward needs (a split-KV decode's partials). Default 0.
//   flashcore_max_seq_len          the most query rows S it takes (a decode rung's tile). Default 0: any.
//   flashcore_forward_note         what the last flashcore_forward on this thread ran in place of the kernel
//                                  its plan prefers, and why (a fallback), or nullptr (the default): the bench
//                                  row that timed the call names it.
//
// Tensors are contiguous, fp16 (or bf16 where a rung says so): q and o [B, H, S, D], k and v
// [B, H_kv, S_kv, D]. H_kv divides H: query head h reads key/value head h / (H / H_kv) (multi-head H_kv = H,
// grouped-query, multi-query H_kv = 1). Under `causal` the mask is aligned bottom-right (FlashAttention
// 2.1+, torch's causal_lower_right): query i sees keys j <= i + S_kv - S; a query row that sees no key at all
// (S > S_kv) gets O = 0 and LSE = +inf. A rung without kFlashcoreGqa / kFlashcoreSeqLenKv only ever sees
// H_kv = H and S_kv = S.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>

enum FlashcoreDtype : int { kFlashcoreFloat16 = 0, kFlashcoreBFloat16 = 1 };

// What a rung supports beyond [B, H, S, D] forward attention (flashcore_features()). This is the one declaration
// of the feature bits: the quoted word after each is the name variants.yaml's `features:` gives it, and
// flashcore_cli (registry/variants.py) reads both from here.
enum FlashcoreFeature : int {
  kFlashcoreGqa = 1 << 0,       // "gqa": H_kv < H, grouped-query and multi-query attention
  kFlashcoreSeqLenKv = 1 << 1,  // "seqlen_kv": S_kv != S, decode, chunked prefill
  kFlashcoreLse = 1 << 2,       // "lse": writes p.lse when it is not nullptr
  kFlashcoreBackward = 1 << 3,  // "backward": flashcore_backward (implies kFlashcoreLse: the backward reads the
                                // forward's; and the forward writes p.o_residual where it is given)
  kFlashcoreWindow = 1 << 4,    // "window": p.window_left / p.window_right other than (-1, -1) and (-1, 0)
  kFlashcoreSoftcap = 1 << 5,   // "softcap": p.softcap > 0
  kFlashcoreSinks = 1 << 6,     // "sinks": p.sinks, a per-head logit in each row's softmax denominator
};

struct FlashcoreParams {
  // The tensors' elements are of type `dtype` (fp16 or bf16): a rung reads them through fc::tensor<T>.
  const void* q;  // [B, H, S, D]
  const void* k;  // [B, H_kv, S_kv, D]
  const void* v;  // [B, H_kv, S_kv, D]
  void* o;        // [B, H, S, D]
  int batch;
  int heads;        // H: query heads
  int seq_len;      // S: query rows
  int head_dim;
  float scale;      // softmax scale; the binding passes 1/sqrt(D) unless the caller gave one
  bool causal;      // mask key j > i + S_kv - S (bottom-right)
  FlashcoreDtype dtype;  // fp16 unless flashcore_dtypes() admits bf16 and the tensors are bf16
  int heads_kv;     // H_kv: key/value heads, a divisor of H
  int seq_len_kv;   // S_kv: key/value rows
  float* lse;       // [B, H, S] fp32: log(sum_j exp(S_ij * scale)) per query row (natural log), or nullptr
  void* workspace;  // flashcore_forward_workspace(*this) bytes, 256-byte aligned, contents undefined (or nullptr: 0 bytes)
  // [B, H, S, D] in the element type, or nullptr: where given, a rung with kFlashcoreBackward writes O's rounding
  // residual (its fp32 O minus the O it stored) beside O, and its backward adds it back, so that D = rowsum(dO o O)
  // is taken from the fp32 O (a training forward; what autograd saves)
  void* o_residual;
  // The attention family (FlashAttention's names). A rung sees values other than the defaults below only where it
  // declares the feature; the binding refuses them for a rung that does not. Each applies to the forward and, for a
  // rung with kFlashcoreBackward, to its backward alike (the backward gets the forward's params in fwd).
  //   Window: query row i sees key j iff  (window_left < 0 or j >= i + S_kv - S - window_left)  and
  //                                       (window_right < 0 or j <= i + S_kv - S + window_right),
  //   bottom-right aligned as causal is. The binding sets causal = (window_right == 0): causal is the window
  //   (-1, 0), so a rung without kFlashcoreWindow sees (-1, -1) or (-1, 0) only, with causal saying which. An edge
//   that hides no key (window_left >= S_kv - 1, window_right >= S - 1 but for causal's 0) reaches a rung as -1, as
//   FlashAttention-3's launcher does it: so window_left < S_kv and window_right < S, and every sum of a row or key
//   index (below 2^31) and an edge stays in int.
  //   A row that sees no key (a window past either end) gets O = 0 and LSE = +inf (or its sink, below).
  int window_left = -1;   // -1: unbounded (the default members make FlashcoreParams{} unwindowed, uncapped, sinkless)
  int window_right = -1;  // -1: unbounded; 0 under causal
  //   Softcap: with softcap = c > 0 the score s = scale * q.k becomes c * tanh(s / c) before the softmax (and the
  //   sink, the LSE and the backward all read the capped score). 0: off.
  float softcap = 0.f;
  //   Sinks: [H] fp32, or nullptr: one logit per query head (on the scale of the capped scores) that joins every
  //   row's softmax denominator and carries no value: with m the row max and l = sum_j exp(s_j - m),
  //   LSE = log(exp(m) * l + exp(sink)) and O = sum_j exp(s_j - LSE) v_j. The LSE the forward writes includes it,
  //   so a backward that reads that LSE needs nothing more; dL/dsinks is the binding's (binding.cpp).
  const float* sinks = nullptr;
};

// The backward of one forward call: fwd holds what the forward was given and gave (o, lse).
struct FlashcoreBackwardParams {
  FlashcoreParams fwd;  // q, k, v, o (the forward's output), lse (its log-sum-exp), o_residual (its rounding
                        // residual, or nullptr), shapes, scale, causal, dtype
  const void* d_o;      // [B, H, S, D]: dL/dO, of type fwd.dtype as every tensor here
  void* dq;             // [B, H, S, D]
  void* dk;             // [B, H_kv, S_kv, D]: summed over the H / H_kv query heads that read each K/V head
  void* dv;             // [B, H_kv, S_kv, D]
  const float* d_lse;   // [B, H, S] fp32: dL/dLSE where the forward's LSE was used too, else nullptr (zero)
  // [H] fp32, zeroed by the binding, where fwd.sinks is given (else nullptr): the rung adds dL/dsink_h into it,
  //   sum over b and i of exp(sink_h - LSE_bhi) * (dLSE_bhi - D_bhi), D_bhi = sum_d dO_bhid * O_bhid (the fp32 O)
  float* dsinks = nullptr;
  void* workspace;      // flashcore_backward_workspace(fwd) bytes, 256-byte aligned, contents undefined
};

struct FlashcoreKernelPlan {
  const char* kernel;      // the kernel as ptxas names it once demangled, e.g. "baseline_fwd<64>"
  int threads_per_block;
  int dynamic_smem_bytes;  // what the launcher passes at launch (0 for static shared memory only)
};

// Fills at most max_plans entries for this head dim; returns how many (0: head dim unsupported). Every
// reader passes a buffer of kFlashcoreMaxPlans; a rung that would list more fails the probe's check. Each
// entry's kernel name comes from FC_PLAN_NAME (below), never typed out.
int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans);
constexpr int kFlashcoreMaxPlans = 32;

// nullptr on success, else a message (valid until the calling thread's next call).
const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream);

// 1 << kFlashcoreFloat16 unless the rung defines it.
int flashcore_dtypes();

// A mask of FlashcoreFeature; 0 unless the rung defines it.
int flashcore_features();

// Scratch bytes flashcore_forward needs for these shapes (p.workspace is not yet set); 0 unless defined.
size_t flashcore_forward_workspace(const FlashcoreParams& p);

// The most query rows (S) the launcher takes; 0 (the default): no limit.
int flashcore_max_seq_len();

// A substitution by the last flashcore_forward on this thread ("<kernel> ran in place of <kernel>: <why>"), or
// nullptr when it ran what it prefers; valid until that thread's next flashcore_forward.
const char* flashcore_forward_note();

// Scratch bytes flashcore_backward needs for these shapes (a rung with kFlashcoreBackward defines both).
size_t flashcore_backward_workspace(const FlashcoreParams& p);
const char* flashcore_backward(const FlashcoreBackwardParams& p, cudaStream_t stream);

namespace fc {

// A tensor of FlashcoreParams (void*: its element type is p.dtype) as elements of T, the type the rung runs on
// (__half or __nv_bfloat16; a rung that moves 16-bit elements without arithmetic may read either as __half).
template <class T>
__host__ __device__ __forceinline__ const T* tensor(const void* ptr) {
  return static_cast<const T*>(ptr);
}
template <class T>
__host__ __device__ __forceinline__ T* tensor(void* ptr) {
  return static_cast<T*>(ptr);
}

constexpr int kWarpSize = 32;

// The element type as kernel names spell it (c++filt): "__half" or "__nv_bfloat16".
template <class T>
constexpr const char* type_name() {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "__half or __nv_bfloat16");
  return std::is_same_v<T, __half> ? "__half" : "__nv_bfloat16";
}

inline void append_template_argument(std::string& name, int value) { name += std::to_string(value); }
inline void append_template_argument(std::string& name, bool value) { name += value ? "true" : "false"; }
inline void append_template_argument(std::string& name, const char* value) { name += value; }

// "kernel<a, b, ...>" as c++filt prints the instantiation, kept for the process (a plan entry points at it).
// Arguments: ints, bools, element types (type_name<T>()) or nested template names (plan_name itself).
template <class... Args>
inline const char* plan_name(const char* kernel, Args... args) {
  std::string name = kernel;
  name += '<';
  int i = 0;
  ((name += i++ ? ", " : "", append_template_argument(name, args)), ...);
  name += '>';
  static std::mutex mutex;
  static std::set<std::string> names;  // a set's elements never move: the pointers stay valid
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A printf-style message in a per-thread buffer: what flashcore_forward returns on failure.
inline const char* message(const char* fmt, ...) {
  static thread_local char buffer[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buffer, sizeof(buffer), fmt, args);
  va_end(args);
  return buffer;
}

inline const char* unsupported_head_dim(int head_dim) {
  return message("head dim %d is not supported by this kernel", head_dim);
}

// Call right after a launch: the launch's own error (bad configuration, too much shared memory...).
inline const char* launch_status() {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : message("kernel launch failed: %s", cudaGetErrorString(err));
}

// The SM count of the device current at the first call (kept for the process): the launchers size grids and
// pick regimes by it. 132 (an H100's or H200's) when it cannot be read, e.g. in a host-only check without a GPU.
inline int sm_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();  // clear it: the next launch must not report this as its own error
      return 132;
    }
    return sms;
  }();
  return count;
}

// Raises a kernel's dynamic shared memory limit to `bytes` after checking the device's opt-in maximum,
// so that a tile that does not fit is a clear error before launch, never an "unspecified launch failure".
template <typename Kernel>
inline const char* allow_dynamic_smem(Kernel kernel, int bytes) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    return message("could not read the device's shared memory limit: %s", cudaGetErrorString(cudaGetLastError()));
  }
  if (bytes > optin) {
    return message("needs %d bytes of shared memory per block; this device allows %d", bytes, optin);
  }
  if (bytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return message("cudaFuncSetAttribute failed: %s", cudaGetErrorString(err));
  }
  return nullptr;
}

// Grid for kernels that give each CTA `block_m` query rows of one (batch, head): x walks the query
// tiles so that neighbouring CTAs share a head's K and V in L2.
inline dim3 query_tile_grid(const FlashcoreParams& p, int block_m) {
  return dim3(ceil_div(p.seq_len, block_m), p.heads, p.batch);
}

#ifdef __CUDACC__  // launch syntax: not for the host compiler that builds binding.cpp
// Launches kernel(p) over query tiles of block_m rows with `smem` bytes of dynamic shared memory, raised past
// 48 KB only after the device's opt-in limit says it fits; returns the launch's own error, or nullptr.
template <typename Kernel>
inline const char* launch_query_tiles(Kernel kernel, const FlashcoreParams& p, int block_m, int threads, int smem,
                                      cudaStream_t stream) {
  if (const char* err = allow_dynamic_smem(kernel, smem)) return err;
  kernel<<<query_tile_grid(p, block_m), threads, smem, stream>>>(p);
  return launch_status();
}
#endif

// Offset of the (b, h) slice of a [B, H, S, D] tensor.
__host__ __device__ inline size_t head_offset(const FlashcoreParams& p, int b, int h) {
  return (static_cast<size_t>(b) * p.heads + h) * static_cast<size_t>(p.seq_len) * p.head_dim;
}

// Offset of the K/V slice that query head h of batch b reads in a [B, H_kv, S_kv, D] tensor.
__host__ __device__ inline size_t kv_head_offset(const FlashcoreParams& p, int b, int h) {
  return (static_cast<size_t>(b) * p.heads_kv + h / (p.heads / p.heads_kv)) * static_cast<size_t>(p.seq_len_kv) *
         p.head_dim;
}

// Bottom-right causal alignment: query row i sees keys j <= i + causal_offset(p).
__host__ __device__ inline int causal_offset(const FlashcoreParams& p) { return p.seq_len_kv - p.seq_len; }

// The keys query rows [row_begin, row_end) see between them, as [begin, end) clipped to [0, S_kv); begin >= end
// when they see none. With one row, exactly that row's keys (the window above); a tile of rows gets the union,
// and the keys every row of it sees need no mask (fully_visible_keys).
struct Range {
  int begin, end;
};
__host__ __device__ inline Range visible_keys(const FlashcoreParams& p, int row_begin, int row_end) {
  const int first = row_begin + causal_offset(p), last = row_end - 1 + causal_offset(p);
  const int begin = p.window_left < 0 ? 0 : (first - p.window_left > 0 ? first - p.window_left : 0);
  const int end = p.window_right < 0 ? p.seq_len_kv
                                     : (last + p.window_right + 1 < p.seq_len_kv ? last + p.window_right + 1 : p.seq_len_kv);
  return {begin, end};
}
// The keys that every row of [row_begin, row_end) sees (no mask needed there); begin >= end when there are none.
__host__ __device__ inline Range fully_visible_keys(const FlashcoreParams& p, int row_begin, int row_end) {
  // The last row's lower bound and the first row's upper bound (both grow with the row).
  return {visible_keys(p, row_end - 1, row_end).begin, visible_keys(p, row_begin, row_begin + 1).end};
}
// The query rows that see at least one key of [key_begin, key_end), as [begin, end) clipped to [0, S): a backward
// that walks key tiles visits only these.
__host__ __device__ inline Range visible_rows(const FlashcoreParams& p, int key_begin, int key_end) {
  const int off = causal_offset(p);
  const int lo = p.window_right < 0 ? 0 : key_begin - off - p.window_right;
  const int hi = p.window_left < 0 ? p.seq_len : key_end - 1 - off + p.window_left + 1;
  return {lo > 0 ? lo : 0, hi < p.seq_len ? hi : p.seq_len};
}
// Whether key j is visible to row i (the per-element mask of a tile the window cuts).
__host__ __device__ __forceinline__ bool key_visible(const FlashcoreParams& p, int row, int key) {
  const int diag = row + causal_offset(p);
  return (p.window_left < 0 || key >= diag - p.window_left) && (p.window_right < 0 || key <= diag + p.window_right) &&
         key >= 0 && key < p.seq_len_kv;
}
// A head's sink logit, or -inf where the call has none (exp(-inf - m) = 0 adds nothing).
__host__ __device__ __forceinline__ float sink_logit(const FlashcoreParams& p, int head) {
  return p.sinks != nullptr ? p.sinks[head] : -INFINITY;
}
// Whether the call masks by position at all (causal or a window).
__host__ __device__ inline bool masked(const FlashcoreParams& p) { return p.window_left >= 0 || p.window_right >= 0; }

}  // namespace fc

// A plan entry's kernel name from the kernel itself and its template arguments: FC_PLAN_NAME(v9_fwd, 64, 2) is
// "v9_fwd<64, 2>", the name ptxas reports once demangled. The kernel is named by its identifier, so a renamed
// kernel (`flashcore new`) renames its plan entry with it.
#define FC_PLAN_NAME(kernel, ...) fc::plan_name(#kernel, __VA_ARGS__)
