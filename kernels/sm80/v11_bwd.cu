// sm80/v11_bwd.cu — v11's backward: FlashAttention-2's algorithm on mma.sync, K/V-stationary, dQ added in fp32.
//
// Idea: the gradient of O = softmax(Q K^T * scale) V needs P again; rather than store it (S x S), recompute it
// from the forward's row log-sum-exp: P = exp(S * scale - LSE). Three kernels:
//   prep   D = rowsum(dO o O) (minus dLSE where the LSE was used too), LSE * log2 e, both padded to the query
//          block, and the fp32 dQ accumulator zeroed. O is the fp32 O: the stored O plus the rounding residual
//          the training forward wrote beside it (flashcore.h's o_residual), since at a near-one-hot row
//          dS = P o (dP - D) is a small difference of large numbers into which O's rounding lands whole;
//   main   one CTA per block of kBlockN keys of one K/V head holds K_j, V_j (and dK_j, dV_j in registers) and
//          walks every query block (of every query head of its group, under GQA) that can see them, with Q_i,
//          dO_i, LSE_i, D_i double-buffered by cp.async. Each warp owns 16 or 32 keys and computes S^T and dP^T,
//          so dV += P^T dO and dK += dS^T Q run from registers (sm80/warp_bwd_sm80.cuh); dS^T goes through
//          shared memory once, for dQ_i += dS K_j, which every key block adds into the fp32 accumulator (below);
//   dq     dQ = accumulator * scale, rounded to the element type.
// Causal (bottom-right): a key block starts at the first query block that sees it; only blocks that cross
// the diagonal are masked. Sliding windows (flashcore.h) the same way: a key block walks the query blocks
// fc::visible_rows gives it (none: its dK = dV = 0), and a warp masks a slice only where the window cuts it; those
// calls run on v11_bwd_window, softcap's (any window) on v11_bwd_softcap, the dense and causal ones on v11_bwd, whose
// loop is the one before the family (template bools). Softcap recomputes t = tanh(S scale / c), P = exp(c t - LSE)
// and dS = P o (dP - D) o (1 - t^2). Sinks: nothing here (the forward's LSE includes them; dL/dsinks is the prep's).
// dK and dV are deterministic (one CTA owns each key row); dQ is not bitwise deterministic (the order of the fp32
// additions from different key blocks varies from run to run).
//
// Change from the rungs below: the first backward of the ladder. v11's forward (sm80/v11.cu) writes the LSE.
// Parts: sm80/v11_bwd_traits.cuh (configurations), common/bwd_passes.cuh (workspace, prep and dq),
// sm80/mainloop_bwd_sm80.cuh (main), sm80/warp_bwd_sm80.cuh (the warp's fragments); this file launches them.
//
// Configuration (V11BwdConfig<D, BLOCK_N, BLOCK_M, KV_IN_REGS, WARP_KEYS>):
//   D=64   sm_90: 128 keys (4 warps of 32 keys) x 64 queries per step, two CTAs per SM (97 KB each): the two
//          m16 tiles of a warp share every Q_i, dO_i fragment read from shared memory (half that traffic per
//          key), and one CTA's barriers overlap the other's math. dK, dV take 128 registers, so the warp walks
//          the step in 32-query slices and re-reads K and V per slice (held, they need 16-query slices and
//          spill). The L4: 128 keys (8 warps of 16) with K and V in registers (81 KB; one 4-warp CTA per SM
//          would be all its 99 KB allow). Short grids (below one wave of SMs): 32 keys (2 warps of 16) x 64.
//   D=128  sm_90: 128 keys x 64 queries (193 KB), 8 warps in pairs: a pair shares 32 keys (one warp's 32 keys
//          would need 256 registers of dK, dV), each warp computes S^T, dP^T for 32 of the 64 queries, both write
//          P^T and dS^T to shared memory, and after the barrier each accumulates dK, dV for its half of D over
//          all 64 queries (each Q_i, dO_i fragment then serves 32 keys: 19% less shared-memory traffic per
//          step than 16 keys per warp). The L4 build and short grids: 16 keys per warp, 64 keys x 32 queries
//          (68.5 KB); K and V re-read.
//
// Run:  flashcore test v11 && flashcore bench v11 --pass bwd --shape 2,16,4096,64
//
// dQ: on sm_90 the warps stage dQ_i in shared memory and one thread adds it by TMA reduce-add (a 32-column box
// per 128 bytes of row); below sm_90 every lane red.adds its fragments.
//
// Measured (the lent H100, cold, the backward alone beside SDPA's FA2 in the same run; the table and its record
// in docs/ladder.md, "v11's backward"): 32 keys per warp at D=64 took 2,16,4096,64 from 1502 to 1195 us (FA2
// 1322: 1.11x) and causal from 898 to 780 (FA2 831: 1.07x). Warp pairs at D=128 took 2,16,4096,128 from 2606
// to 2556 us and causal from 1543 to 1504 (FA2 2397 and 1468: 0.94x and 0.98x; a ~10% gain was predicted from
// the traffic, docs/ladder.md says where it went). Tried and not kept: 64-key warp-pair CTAs, two per SM, dQ by
// red.add (no room for the staging tile): 3221 us against 2571 (causal 1841 against 1529), same run.
// Instructions (2026-11-27; ncu beside FA2's kernel at 2,16,4096,128: same HMMA count, 1.39x the instructions):
// the warp pairs' S^T, dP^T now load B fragments in mma order (warp_scores) instead of scores_t's, which cost two
// register moves per mma (237 per step), and stage_dq's addresses are one base plus constants (136 fewer):
// 2,16,4096,128 from 2546 to 2408 us, causal from 1503 to 1423 (H200, same run; FA2 2417 and 1432: 1.004x, 1.006x).
// Tried and not kept: dQ one step late with the pairs meeting only each other (v12's lag): 2530 against 2531 us;
// with half the pairs taking dQ first, 2619 (H100, same run). docs/ladder.md, "Instructions, counted".
// Tried and not kept (same run, 2,16,4096,64, 16 keys per warp): 64 keys x 4 warps (2 CTAs/SM) 1554 vs 1486
// us; 32 queries per step 1782. The TMA reduce-add is no faster at D=64 (1509 us in a later run against
// red.add's 1486); it stays, one dQ path for sm_90, since with the 128 x 64 tile it took D=128 from 3199 to
// 2610 us (two runs). Same-run builds that drop part of the dQ path (16 keys per warp): all of it 1486 us,
// dQ computed but not added 1332, no dQ at all 1027.
#include "flashcore.h"
#include "sm80/mainloop_bwd_sm80.cuh"
#include "common/tma.cuh"
#include "sm80/v11_bwd_traits.cuh"

#include <cstdint>
#include <cstdio>
#include <type_traits>

// ---- the launcher ----
namespace {

template <auto kKernel, int kBytes>
const char* allow_smem_once() {
  static const bool ready = fc::allow_dynamic_smem(kKernel, kBytes) == nullptr;
  return ready ? nullptr : fc::allow_dynamic_smem(kKernel, kBytes);
}

// The main kernel of each kind: 0 dense and causal (v11_bwd), 1 windows (v11_bwd_window), 2 softcap (v11_bwd_softcap).
template <class Cfg, class T, int kKind>
static constexpr auto main_kernel() {
  if constexpr (kKind == 2) return v11_bwd_softcap<Cfg, T>;
  else if constexpr (kKind == 1) return v11_bwd_window<Cfg, T>;
  else return v11_bwd<Cfg, T>;
}

template <class Cfg, class T, int kKind>
const char* backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  const Workspace w = carve(b);
  const long long heads = static_cast<long long>(p.batch) * p.heads;
  if (const char* err = launch_bwd_prep<Cfg::kHeadDim, T>(b, w, stream)) return err;

  constexpr auto kernel = main_kernel<Cfg, T, kKind>();
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  const dim3 grid(fc::ceil_div(p.seq_len_kv, Cfg::kBlockN), p.batch * p.heads_kv);
  if (grid.y > 65535) return fc::message("v11 backward: grid y of %u exceeds the limit (65535)", grid.y);
  CUtensorMap dq_map{};
  if constexpr (Cfg::kTmaDq) {
    // the accumulator as [B * H][S][D] fp32, boxes of 32 columns x BLOCK_M rows (rows past S are skipped)
    const cuuint64_t row_bytes = static_cast<cuuint64_t>(Cfg::kHeadDim) * 4;
    if (!fc::encode_tensor_map<3>(&dq_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.dq_accum,
                                  {static_cast<cuuint64_t>(Cfg::kHeadDim), static_cast<cuuint64_t>(p.seq_len),
                                   static_cast<cuuint64_t>(heads)},
                                  {row_bytes, row_bytes * p.seq_len}, {32, static_cast<cuuint32_t>(Cfg::kBlockM), 1},
                                  CU_TENSOR_MAP_SWIZZLE_128B)) {
      return "v11 backward: the driver refused the dQ accumulator's tensor map";
    }
  }
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(b, w, dq_map);
  if (const char* err = fc::launch_status()) return err;

  return launch_bwd_dq<Cfg::kHeadDim, T>(b, w, stream);
}

// The long configuration unless its grid would leave SMs idle (one short wave), as in the forward.
template <class Long>
bool short_grid(const FlashcoreParams& p) {
  return static_cast<long long>(fc::ceil_div(p.seq_len_kv, Long::kBlockN)) * p.batch * p.heads_kv < fc::sm_count();
}

template <class T, int kKind>
const char* backward_kind(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  switch (b.fwd.head_dim) {
    case 64:
      return short_grid<BwdD64>(b.fwd) ? backward<BwdShortD64, T, kKind>(b, stream)
                                       : backward<BwdD64, T, kKind>(b, stream);
    case 128:
      return short_grid<BwdD128>(b.fwd) ? backward<BwdShortD128, T, kKind>(b, stream)
                                        : backward<BwdD128, T, kKind>(b, stream);
    default: return fc::unsupported_head_dim(b.fwd.head_dim);
  }
}

// The softcap kernels (v11_bwd_softcap, any window) where p.softcap > 0; else the window kernels (v11_bwd_window) for a
// window other than none (-1, -1) and causal (-1, 0); the dense ones (v11_bwd) take the rest.
template <class T>
const char* backward_dtype(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  if (p.softcap > 0.f) return backward_kind<T, 2>(b, stream);
  if (p.window_left >= 0 || p.window_right > 0) return backward_kind<T, 1>(b, stream);
  return backward_kind<T, 0>(b, stream);
}

// The kernels' names as c++filt prints them (the plan's entries), e.g.
// "v11_bwd<V11BwdConfig<64, 128, 64, true, 16>, __half>" (the defaulted keys per warp is part of the name).

template <class Cfg, class T, int kKind>
FlashcoreKernelPlan main_plan() {
  const char* config =
      FC_PLAN_NAME(V11BwdConfig, Cfg::kHeadDim, Cfg::kBlockN, Cfg::kBlockM, Cfg::kKvInRegs, Cfg::kWarpKeys);
  const char* name = kKind == 2   ? FC_PLAN_NAME(v11_bwd_softcap, config, fc::type_name<T>())
                     : kKind == 1 ? FC_PLAN_NAME(v11_bwd_window, config, fc::type_name<T>())
                                  : FC_PLAN_NAME(v11_bwd, config, fc::type_name<T>());
  return {name, Cfg::kThreads, Cfg::kSmemBytes};
}

// One dtype's kernels at a head dim: the prep pass, each main configuration, the dq pass, then each main
// configuration's window and softcap twins.
template <int kHeadDim, class T, class... Cfgs>
int plan_dtype(FlashcoreKernelPlan* plans) {
  int n = 0;
  plans[n++] = bwd_prep_plan<kHeadDim, T>();
  ((plans[n++] = main_plan<Cfgs, T, 0>()), ...);
  plans[n++] = bwd_dq_plan<T>();
  ((plans[n++] = main_plan<Cfgs, T, 1>()), ...);
  ((plans[n++] = main_plan<Cfgs, T, 2>()), ...);
  return n;
}

// The long and the short configuration (one entry where a build makes them the same kernel).
template <int kHeadDim, class Long, class Short>
int plan_long_short(FlashcoreKernelPlan* plans) {
  if constexpr (std::is_same_v<Long, Short>) {
    const int n = plan_dtype<kHeadDim, __half, Long>(plans);
    return n + plan_dtype<kHeadDim, __nv_bfloat16, Long>(plans + n);
  } else {
    const int n = plan_dtype<kHeadDim, __half, Long, Short>(plans);
    return n + plan_dtype<kHeadDim, __nv_bfloat16, Long, Short>(plans + n);
  }
}

}  // namespace

size_t flashcore_backward_workspace(const FlashcoreParams& p) { return workspace_bytes(p); }

const char* flashcore_backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  if (!(p.scale > 0.f)) return fc::message("v11 needs a softmax scale > 0 (got %g)", p.scale);
  if (p.lse == nullptr || b.workspace == nullptr) return "v11 backward: the forward's lse and a workspace are needed";
  if (p.seq_len < 1 || p.seq_len_kv < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  return p.dtype != kFlashcoreBFloat16 ? backward_dtype<__half>(b, stream) : backward_dtype<__nv_bfloat16>(b, stream);
}

// The backward's kernels at a head dim, fp16 then bf16 (sm80/v11.cu's flashcore_plan lists them after the forward's).
int v11_backward_plan(int head_dim, FlashcoreKernelPlan* plans) {
  switch (head_dim) {
    case 64: return plan_long_short<64, BwdD64, BwdShortD64>(plans);
    case 128: return plan_long_short<128, BwdD128, BwdShortD128>(plans);
    default: return 0;
  }
}
