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
//   dS   -> shared memory (stmatrix .trans: queries x keys), both consumers meet,
//   dQ_i  = dS K_j                                  wgmma SS, K_j read N-major; each consumer one 64 x 64 tile
// and each consumer's dQ tile, staged in shared memory, goes out by TMA reduce-add (fp32, into the accumulator every
// key block adds to), issued by a warp of the producer warpgroup.
// The passes around it (bwd_passes.cuh, shared with v11): prep (D = rowsum(dO o O), LSE log2 e, the accumulator
// zeroed) and dq (the accumulator times scale, rounded). The forward writes O's rounding residual where a training
// call asks for it, so D is taken from the fp32 O (flashcore.h).
// Causal (bottom-right): a key block starts at the first query block that sees it; only steps whose block crosses
// the diagonal are masked. dK, dV deterministic; dQ's fp32 additions from different key blocks in any order.
//
// Change from v11's backward: wgmma (HGMMA) instead of mma.sync + ldmatrix; TMA and a producer warp instead of
// cp.async from every thread; dS stored by stmatrix .trans; dQ reduced by TMA from every step.
// Parts: v12_bwd_traits.cuh (configuration, layout), mainloop_bwd_sm90.cuh (producer, consumer step, kernel),
// bwd_passes.cuh (prep, dq), consumer_sm90.cuh (the forward's GEMM and packing steps, reused).
//
// Configuration: 128 keys per CTA; D = 64: 128 queries per step (dQ tiles split by rows), D = 128: 64 (split by
// columns; V12_BWD_M80 selects 80, not kept); 2 stages of Q_i, dO_i, LSE_i, D_i; dS double-buffered; one CTA per SM
// (194-195 KB). dQ_i's product is issued before dK's, so that dQ_i is staged and reduce-added while dK's wgmma runs
// (V12_BWD_DQ_FIRST, default 1). Every consumer thread arrives on a stage's empty barrier after its own reads of
// LSE_i and D_i (lane 0 alone arriving was reported by racecheck as a race with the producer's bulk copies refilling
// the stage). The dQ warp (V12_BWD_DQ_WARP, default 1): warp 1 of the producer warpgroup waits on a named barrier
// until a consumer has staged its dQ tile, issues the reduce-add, and releases the staging tile once the copy has
// read it; a consumer no longer waits for its last tile to leave before staging the next. Shared memory by name: the
// CTA's dynamic shared memory is rounded up to 1024 bytes as an offset from the shared array
// (fc::dynamic_smem_1024), so LSE_i and D_i are read with LDS and dQ staged with STS on 32-bit addresses (rounded
// through uintptr_t, every pointer derived from it was generic: LD.E and ST.E on 64-bit addresses).
//
// Run:  flashcore test v12 && flashcore bench v12 --pass bwd --shape 2,16,4096,128
//
// Measured (H200, cold mode, the backward alone, one bench run per row beside SDPA's backends; records in
// docs/results/h200-v12-bwd-*-2026-11-26.json, the story in docs/ladder.md "v12's backward"):
// - correct on the first run: `flashcore test v12` 216 OK (gradients under the rule), worst err/tol 0.88; 2000
//   random launches with gradients (the build before every thread arrived): 1997 OK, 3 with one element each over
//   (worst 1.06x), the same 16-bit-dS tail as v11's backward. racecheck clean at 1,4:2,97:61,128 and
//   1,4:2,200:97,64 causal; memcheck and synccheck there and at 1,2,97,64 causal (the builds just before).
// - first cut, 2,16,4096,128: 1478 us, 0.85x cuDNN (1254), 1.62x FA2 (2399); D=64: 873 us, 0.89x cuDNN; D=128
//   causal 0.88x, D=64 causal 0.95x, 1,16,16384,64 0.93x, 1,16,16384,128 causal 0.90x.
// - dQ first (this build), one run beside the first cut: 2,16,4096,64 863 vs 876 us, 2,16,4096,128 causal 848 vs
//   878, 2,16,4096,128 1510 vs 1489 (within that row's p10-p90 spread of 1477-1538).
// - before the dQ warp, one run (docs/results/h200-v12-bwd-final-2026-11-26.json): 0.88x cuDNN at 2,16,4096,128
//   (1461 vs 1279 us), 0.91x at D=64, 0.93x / 0.96x causal, 0.96x at 1,16,16384,64, 0.93x at 1,16,16384,128
//   causal; fwd+bwd at 2,16,4096,128: 0.88x cuDNN (1939 vs 1702 us).
// - the dQ warp (this build), one run per row beside the same sources with V12_BWD_DQ_WARP=0
//   (docs/results/h200-v12-bwd-dqwarp-2026-11-26.json), us (this build / DQ_WARP=0 / cuDNN: this build vs cuDNN):
//     2,16,4096,128   1370.9 / 1407.2 / 1256.7: 0.92x     2,16,4096,128 causal   788.0 / 838.5 / 767.7: 0.97x
//     2,16,4096,64     802.0 /  858.8 /  776.0: 0.97x     2,16,4096,64 causal    491.2 / 520.9 / 500.9: 1.02x
//     1,16,16384,64   6013.5 / 6422.7 / 6017.0: 1.00x     1,16,16384,128 causal 5312.8 / 5587.0 / 5179.5: 0.97x
//   1.59-1.82x FA2. fwd+bwd (docs/results/h200-v12-fwdbwd-dqwarp-2026-11-26.json): 2,16,4096,64 causal 664.9 vs
//   cuDNN 682.0 us (1.03x), 1,16,16384,64 8257.9 vs 8647.9 (1.05x), 2,16,4096,128 1815.3 vs 1696.6 (0.93x).
//   `flashcore test v12` 216 OK, worst err/tol 0.79; memcheck, synccheck and racecheck clean at 1,4:2,97:61,128 and
//   1,4:2,200:97,64 causal, racecheck at 2,6:2,131:200,128 causal; 2000 random launches with gradients: 1998 OK,
//   2 with one element each over the tolerance (worst 1.15x: dq at 2,5,81,128, dk at 3,1,54,64 causal).
// - shared memory by name (this build), H200, one run per row beside v12prev (the build before it)
//   (docs/results/h200-v12-bwd-lds-2026-11-27.json), us (this build / v12prev / cuDNN: this build vs cuDNN):
//     2,16,4096,128   1347.9 / 1380.0 / 1277.2: 0.95x     2,16,4096,128 causal   771.8 / 790.3 / 771.0: 1.00x
//     2,16,4096,64     776.3 /  798.2 /  779.3: 1.00x     2,16,4096,64 causal    475.4 / 488.3 / 503.1: 1.06x
//     1,16,16384,64   5927.3 / 6094.5 / 6129.5: 1.03x     1,16,16384,128 causal 5206.0 / 5265.1 / 5172.8: 0.99x
//   1.1-2.7% off every row; 1.61-1.86x FA2. fwd+bwd at 2,16,4096,128: 1767.9 vs 1826.7, cuDNN 1692.1 (0.96x).
//   `flashcore test v12` 216 OK (worst err/tol 0.99); racecheck and memcheck clean at 1,4:2,200:97,64 causal,
//   racecheck at 1,4:2,97:61,128 causal (H100); 2000 random launches with gradients: 1999 OK, one dq element at
//   1.06x the tolerance (2,24:6,39,64), the same tail (docs/results/v12-bwd-checks-2026-11-27.txt).
// Tried, not kept (one run each beside the first cut, docs/results/h200-v12-bwd-candidates-2026-11-26.json, unless
// said otherwise):
// - dQ_i added from registers by red.global.add.v2.f32 instead of staging + TMA reduce-add: 15% slower at D=128
//   (1708 vs 1485 us), 10% at D=64.
// - V12_BWD_OVERLAP=1 (at D=128, P^T computed while dP^T's wgmma runs and dS^T while dV's does): within 2% of
//   waiting for both, either way in different runs; the default is 0 (at D=64 it spilled 48 bytes). Beside the
//   dQ warp (docs/results/h200-v12-bwd-switches-dqwarp-2026-11-26.json): 1361 vs 1377 us at 2,16,4096,128, within
//   the spread. V12_BWD_DQ_FIRST=0 there: flat at D=128, 786 vs 801 us at 2,16,4096,64 (one run; defaults kept).
// - 80 queries per step at D = 128 (V12_BWD_M80: 1, FlashAttention-3's step there; dQ_i's 80 x 64 tile computed as
//   dQ_i^T = K_j^T dS^T, wgmma's M being 64): correct (216 OK; sanitizers clean), but at 2,16,4096,128 within the
//   spread of 64 queries in two runs and 5% slower in a third (lent H100; docs/results/
//   h100-v12-bwd-m80-2026-11-27.json, h100-v12-bwd-lanes*-2026-11-27.json, h100-v12-bwd-lds-2026-11-27.json). Its registers: S^T and dP^T take 80,
//   dV and dK 128, so dV's product is awaited before dQ_i's is issued (else ptxas serializes every wgmma) and the
//   lane index is re-read where used (else 4-8 bytes spill). Issuing dK before that wait instead: no better.
// Not reached: >= 1.0x cuDNN at every row (D = 128 non-causal the furthest, 0.95x). ncu (2,16,4096,128, first
// cut): issue slots 21% busy, 10.3 warp cycles per issued instruction (3.1 long scoreboard, 1.9 wait, 1.0
// barrier), 8.9 of 12 warps active (9 of a CTA's 12 live: three of the producer warpgroup's warps exit at once;
// with the dQ warp, two).
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
