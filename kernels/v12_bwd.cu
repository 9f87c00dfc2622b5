// v12_bwd.cu — v12's backward: FlashAttention-3's algorithm on Hopper (sm_90a), the five products on wgmma.
//
// Idea: v11's backward (FlashAttention-2: K/V-stationary CTAs, P recomputed from the forward's LSE, S^T and dP^T so
// that dV and dK take their A operand from registers), with its math on warpgroups and its loads on the copy
// engine, as v12's forward has them. One CTA per block of 128 keys of one K/V head: a producer thread loads K_j
// and V_j once, then streams each step's Q_i, dO_i (TMA, 128-byte swizzled panels) and LSE_i, D_i (bulk copies)
// into two stages on full/empty mbarriers; two consumer warpgroups own 64 keys each and per step run
//   S^T  = K_j Q_i^T,  dP^T = V_j dO_i^T            wgmma, both operands from shared memory (SS)
//   P^T  = exp2(S^T scale log2 e - LSE_i log2 e),  dS^T = P^T o (dP^T - D_i)      in registers
//   dV  += P^T dO_i,   dK  += dS^T Q_i              wgmma, A from registers (RS), dO_i, Q_i read N-major
//   dS   -> shared memory (stmatrix .trans: queries x keys), into one of two buffers handed over on mbarriers,
//   dQ_{i-1} = dS_{i-1} K_j (one step late: both halves of dS_{i-1} stored in the last step)   wgmma SS
// and each consumer's dQ tile (64 x 64), staged in shared memory, goes out by TMA reduce-add (fp32, into the
// accumulator every key block adds to), issued by a warp of the producer warpgroup.
// The passes around it (bwd_passes.cuh, shared with v11): prep (D = rowsum(dO o O) from the fp32 O, LSE log2 e, the
// accumulator zeroed) and dq (the accumulator times scale, rounded). Causal (bottom-right): a key block starts at the
// first query block that sees it; only steps crossing the diagonal are masked. dK, dV deterministic; dQ's fp32
// additions from different key blocks in any order.
//
// Change from v11's backward: wgmma (HGMMA) instead of mma.sync + ldmatrix; TMA and a producer warp instead of
// cp.async from every thread; dS stored by stmatrix .trans; dQ reduced by TMA from every step; the two consumers
// never wait for each other within a step (dQ one step late), so one's exp2s run under the other's wgmmas.
// Parts: v12_bwd_traits.cuh (configuration, layout), mainloop_bwd_sm90.cuh (producer, consumer step, kernel),
// bwd_dq_sm90.cuh (dQ_i's product, staging, reduce-add, the dQ warp), bwd_passes.cuh (prep, dq), consumer_sm90.cuh
// (the forward's GEMM and packing steps, reused).
//
// Configuration: 128 keys per CTA; D = 64: 128 queries per step (dQ tiles split by rows), D = 128: 64 (split by
// columns); 2 stages of Q_i, dO_i, LSE_i, D_i; dS double-buffered; one CTA per SM (194-195 KB). dQ_{i-1}'s product
// is issued in step i before dK_i's (V12_BWD_DQ_LAG, default 1; 0: dQ_i in step i, both consumers meeting first);
// every consumer thread arrives on a stage's empty barrier after its own reads of LSE_i, D_i (racecheck found lane 0
// alone racing the refill); a producer warp issues the dQ reduce-adds (V12_BWD_DQ_WARP, default 1); shared memory
// addressed by name (fc::dynamic_smem_1024: LDS/STS, not generic LD.E/ST.E).
//
// Run:  flashcore test v12 && flashcore bench v12 --pass bwd --shape 2,16,4096,128
//
// Measured (H200, cold, the backward alone, one bench per row beside SDPA's backends; the journal of every step,
// with its records, is docs/ladder.md "v12's backward" and the sections after it):
// - first cut: 0.85-0.95x cuDNN; dQ first: 1.5-3.4% at two of three rows; the dQ warp: 2.6-7.1%; shared memory by
//   name: 1.1-2.7%; the dQ lag: 7.4% at 2,16,4096,64, 4.1% at 64 causal, 7.1% at 1,16,16384,64, 1.0% and 0.3% at
//   the causal D = 128 rows, none at 2,16,4096,128 (-1.5% to +1.4% in five runs;
//   docs/results/h200-v12-bwd-lag-2026-11-27.json). This build, us (v12 / cuDNN):
//     2,16,4096,128   1355.6 / 1290.7: 0.95x     2,16,4096,128 causal   762.6 /  772.1: 1.01x
//     2,16,4096,64     720.0 /  777.5: 1.08x     2,16,4096,64 causal    455.1 /  500.0: 1.10x
//     1,16,16384,64   5574.1 / 6083.9: 1.09x     1,16,16384,128 causal 5180.8 / 5210.2: 1.01x
//   1.70-1.87x FA2. fwd+bwd at 2,16,4096,128: 1817.2 vs cuDNN 1693.0 us (0.93x). Back to back, where both run at
//   the 700 W cap (~1.7 GHz), v12's backward at 2,16,4096,128 takes 1425 us, cuDNN's 1443 (scripts/power_cap.py).
// - `flashcore test v12` 216 OK (gradients under the rule); sanitizers clean at odd causal grouped shapes; 2000
//   random launches with gradients all OK (worst 0.95; earlier runs met one dq element at 1.06x, the 16-bit dS tail
//   of v11's backward too: docs/results/v12-bwd-lag-checks-2026-11-27.txt).
// Tried, not kept (docs/ladder.md has each run):
// - dQ added from registers by red.global.add.v2.f32: 10-15% slower than staging + TMA reduce-add.
// - V12_BWD_OVERLAP=1 (P^T while dP^T's wgmma runs, dS^T while dV's): within 2% either way; spills at D = 64.
// - V12_BWD_DQ_FIRST=0: flat at D = 128; 0.8-1.8% faster at 2,16,4096,64 in three runs, 0.3% slower at
//   1,16,16384,64; no target row changes either way, so the default stays.
// - V12_BWD_M80 (80 queries per step at D = 128, FlashAttention-3's; dQ_i computed transposed): correct, no faster
//   in four H100 runs; needs dV awaited before dQ_i and the lane index re-read (which, everywhere, cost 6% at D = 64).
// - v12's forward on fc::dynamic_smem_1024 too: 6% slower at 2,16,4096,128 (one H100 run).
// - With the lag: the consumers taking turns to issue S^T and dP^T (FA3's forward's ping-pong), within 1.4%; key
//   block n starting at query block n (dQ adds spread over rows), 4.9% slower at D = 64, within 0.4% at 128;
//   V12_BWD_OVERLAP=1, 2-3% slower at D = 128.
// Not reached: >= 1.0x cuDNN at every row in the bench (2,16,4096,128 0.94-0.97x in five runs, where cuDNN's own
// kernel reads 1238-1302 us by its place in the run: docs/ladder.md "The dQ lag").
#include "bwd_passes.cuh"
#include "flashcore.h"
#include "hopper.cuh"
#include "mainloop_bwd_sm90.cuh"
#include "v12_bwd_traits.cuh"

#include <cstdio>
#include <type_traits>

namespace {

template <class Cfg, class T>
const char* backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr CUtensorMapDataType kType =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const FlashcoreParams& p = b.fwd;
  const Workspace w = carve(b);
  const long long heads = static_cast<long long>(p.batch) * p.heads;
  if (const char* err = launch_bwd_prep<kHeadDim, T>(b, w, stream)) return err;

  const auto kernel = v12_bwd<kHeadDim, Cfg::kBlockM, T>;
  if (const char* err = fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes)) return err;
  const int bh = p.batch * p.heads, bh_kv = p.batch * p.heads_kv;
  BwdMaps maps;
  const cuuint64_t dq_row_bytes = static_cast<cuuint64_t>(kHeadDim) * 4;
  if (!fc::encode_panel_map(&maps.q, kType, p.q, bh, p.seq_len, kHeadDim, Cfg::kBlockM, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.d_o, kType, b.d_o, bh, p.seq_len, kHeadDim, Cfg::kBlockM, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.k, kType, p.k, bh_kv, p.seq_len_kv, kHeadDim, Cfg::kBlockN, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.v, kType, p.v, bh_kv, p.seq_len_kv, kHeadDim, Cfg::kBlockN, Cfg::kPanels) ||
      !fc::encode_tensor_map<3>(&maps.dq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.dq_accum,
                                {static_cast<cuuint64_t>(kHeadDim), static_cast<cuuint64_t>(p.seq_len),
                                 static_cast<cuuint64_t>(heads)},
                                {dq_row_bytes, dq_row_bytes * p.seq_len}, {32, Cfg::kDqRows, 1},
                                CU_TENSOR_MAP_SWIZZLE_128B)) {
    return "v12 backward: the driver refused a TMA tensor map (is the driver new enough, the tensor 16-byte aligned?)";
  }
  const dim3 grid(fc::ceil_div(p.seq_len_kv, Cfg::kBlockN), bh_kv);
  if (grid.y > 65535) return fc::message("v12 backward: grid y of %u exceeds the limit (65535)", grid.y);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(b, w, maps);
  if (const char* err = fc::launch_status()) return err;

  return launch_bwd_dq<kHeadDim, T>(b, w, stream);
}

// D = 128: 80 queries per step (dQ transposed) where V12_BWD_M80 asks for it, else 64.
inline bool step80(const FlashcoreParams& p) { return V12_BWD_M80 == 2 || (V12_BWD_M80 == 1 && !p.causal); }

template <class T>
const char* backward_dtype(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  switch (b.fwd.head_dim) {
    case 64: return backward<BwdCfg64, T>(b, stream);
    case 128:
      if constexpr (V12_BWD_M80 != 0) {  // (its kernels are not compiled otherwise)
        if (step80(b.fwd)) return backward<BwdCfg128x80, T>(b, stream);
      }
      return backward<BwdCfg128, T>(b, stream);
    default: return fc::unsupported_head_dim(b.fwd.head_dim);
  }
}

// prep, main, dq for one dtype (names as c++filt prints them)
template <class Cfg, class T>
int plan_dtype(FlashcoreKernelPlan* plans) {
  static char main[64];
  snprintf(main, sizeof(main), "v12_bwd<%d, %d, %s>", Cfg::kHeadDim, Cfg::kBlockM, bwd_type_name<T>());
  plans[0] = bwd_prep_plan<Cfg::kHeadDim, T>();
  plans[1] = {main, Cfg::kThreads, Cfg::kSmemBytes};
  plans[2] = bwd_dq_plan<T>();
  return 3;
}

template <class Cfg>
int plan_both(FlashcoreKernelPlan* plans) {
  const int n = plan_dtype<Cfg, __half>(plans);
  return n + plan_dtype<Cfg, __nv_bfloat16>(plans + n);
}

// D = 128: the 64-query kernels (causal, or every call with V12_BWD_M80 0), then the 80-query ones where any call
// takes them
int plan_d128(FlashcoreKernelPlan* plans) {
  const int n = V12_BWD_M80 == 2 ? 0 : plan_both<BwdCfg128>(plans);
  return n + (V12_BWD_M80 == 0 ? 0 : plan_both<BwdCfg128x80>(plans + n));
}

}  // namespace

size_t flashcore_backward_workspace(const FlashcoreParams& p) { return dq_accum_bytes(p) + 2 * stats_bytes(p); }

const char* flashcore_backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  if (!(p.scale > 0.f)) return fc::message("v12 needs a positive softmax scale (got %g)", p.scale);
  if (p.lse == nullptr || b.workspace == nullptr) return "v12 backward: the forward's lse and a workspace are needed";
  if (p.seq_len < 1 || p.seq_len_kv < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  return p.dtype == kFlashcoreBFloat16 ? backward_dtype<__nv_bfloat16>(b, stream) : backward_dtype<__half>(b, stream);
}

// The backward's kernels at a head dim, fp16 then bf16 (v12.cu's flashcore_plan lists them after the forward's).
int v12_backward_plan(int head_dim, FlashcoreKernelPlan* plans) {
  switch (head_dim) {
    case 64: return plan_both<BwdCfg64>(plans);
    case 128: return plan_d128(plans);
    default: return 0;
  }
}
