// sm90/v12_bwd.cu — v12's backward: FlashAttention-3's algorithm on Hopper (sm_90a), the five products on wgmma.
//
// Idea: v11's backward (FlashAttention-2: K/V-stationary tiles, P recomputed from the forward's LSE, S^T and dP^T so
// that dV and dK take their A operand from registers), with its math on warpgroups and its loads on the copy
// engine, as v12's forward has them. Persistent CTAs (one per SM) run tiles of 128 keys of one K/V head: one thread
// loads a tile's K_j and V_j, another streams each step's Q_i, dO_i (TMA, 128-byte swizzled panels) and LSE_i, D_i
// (bulk copies) into two stages on full/empty mbarriers; two consumer warpgroups own 64 keys each and per step run
//   S^T  = K_j Q_i^T,  dP^T = V_j dO_i^T            wgmma, both operands from shared memory (SS)
//   P^T  = exp2(S^T scale log2 e - LSE_i log2 e),  dS^T = P^T o (dP^T - D_i)      in registers
//   dV  += P^T dO_i,   dK  += dS^T Q_i              wgmma, A from registers (RS), dO_i, Q_i read N-major
//   dS   -> shared memory (stmatrix .trans: queries x keys), into one of two buffers handed over on mbarriers,
//   dQ_{i-1} = dS_{i-1} K_j (one step late: both halves of dS_{i-1} stored in the last step)   wgmma SS
// and each consumer's dQ tile (64 x 64), staged in shared memory, goes out by TMA reduce-add (fp32, into the
// accumulator every key block adds to), issued by a warp of the producer warpgroup; at a tile's end each consumer's
// dV and dK go through a staging tile of its own (stmatrix) and out by TMA store. The stage thread claims the
// CTA's next tile from a counter as it issues a tile's last stage; causal lists go heaviest first within groups of
// heads (sm90/v12_bwd_traits.cuh), so the claims even the SMs' loads out. Passes around it (common/bwd_passes.cuh,
// shared with v11): prep (D = rowsum(dO o O) from the fp32 O, LSE log2 e, accumulator and counter zeroed) and dq
// (accumulator times scale, rounded). Causal and sliding windows (bottom-right): a tile walks only the query blocks
// that see its keys (fc::visible_rows), and only steps that a window edge cuts are masked per element; a tile that no
// query sees stores dK = dV = 0, and a query that sees no key keeps the zero dQ that prep wrote. Softcap: the kernel's
// kSoftcap instantiation recomputes t = tanh(s / c) and takes dS through 1 - t^2 (sm90/mainloop_bwd_sm90.cuh); the
// other is the dense one, unchanged. Sinks need nothing here: P = exp2(S - LSE) with the forward's LSE, which holds the
// sink, is the softmax with the sink's column, whose dP is 0, so D and dS are as without; prep adds dL/dsinks.
// dK, dV deterministic; dQ's fp32 additions from different tiles in any order.
//
// Change from v11's backward: wgmma (HGMMA) instead of mma.sync + ldmatrix; TMA and producer threads instead of
// cp.async from every thread; dS stored by stmatrix .trans; dQ reduced by TMA from every step; the consumers never
// wait for each other within a step (dQ one step late); persistent CTAs claiming tiles instead of one CTA per tile;
// dK, dV stored by TMA from shared memory instead of 4-byte stores from every thread.
// Parts: sm90/v12_bwd_traits.cuh (configuration, layout, tile list), sm90/producer_bwd_sm90.cuh (the loads, the tile
// hand-over), sm90/mainloop_bwd_sm90.cuh (the consumers, the kernel), sm90/bwd_dq_sm90.cuh (dQ_i's product, staging,
// reduce-add, the dQ warp), sm90/epilogue_bwd_sm90.cuh (dK, dV out), common/bwd_passes.cuh (prep, dq),
// sm90/consumer_sm90.cuh (the forward's GEMM and packing steps).
//
// Configuration: D = 64: 128 queries per step (dQ tiles split by rows), D = 128: 64 (split by columns); 2 stages;
// dS double-buffered; 212 KB at D = 64, 227 KB at D = 128; registers 24 (producer warpgroup) / 240 (consumers), the
// whole pool of a 384-thread CTA (fc::setmaxnreg_fits: at 32 / 240 every launch hung). The dQ lag and the dQ warp
// (sm90/mainloop_bwd_sm90.cuh); every consumer thread arrives on a stage's empty barrier (racecheck found lane 0
// alone racing the refill); shared memory addressed by name (fc::dynamic_smem_1024: LDS/STS, not generic
// LD.E/ST.E). V12_BWD_MAX_CTAS caps the grid (a test knob, in the registry's defines: with 2 CTAs every shape runs
// many tiles per CTA).
//
// Run:  flashcore test v12 && flashcore bench v12 --pass bwd --shape 2,16,4096,128 --causal
// Measured (H200, cold, the backward alone, one bench per row beside SDPA's backends and the build before; every
// step's runs: docs/ladder.md "v12's backward" and the sections after it):
// - first cut 0.85-0.95x cuDNN; dQ first 1.5-3.4% at two of three rows; the dQ warp 2.6-7.1%; shared memory by name
//   1.1-2.7%; the dQ lag 7.4% at 2,16,4096,64, 4.1% at 64 causal, 7.1% at 1,16,16384,64, none at 2,16,4096,128;
//   persistent CTAs claiming tiles 11.1% at 2,16,4096,64 causal, 3.3% at 2,16,4096,128 causal; dK, dV by TMA
//   store 7.6% at 2,16,4096,128, 2.4% at 128 causal, 3.6% at 2,16,4096,64, 1.3% at 64 causal, 1.1% at 1,16,16384,128
//   causal, -1.6% at 1,16,16384,64 (phase clocks: a tile's end 217 -> 99 cycles per step; docs/ladder.md "Staged
//   dK, dV"). This build, us, v12 / cuDNN sampled in turn (bench --pair sdpa-cudnn; h200-v12-bwd-pair-2026-11-27.json):
//     2,16,4096,128   1289.2 / 1324.7: 1.03x     2,16,4096,128 causal   674.0 /  776.7: 1.15x
//     2,16,4096,64     712.7 /  785.9: 1.10x     2,16,4096,64 causal    396.6 /  501.0: 1.26x
//     1,16,16384,64   5480.1 / 6073.8: 1.11x     1,16,16384,128 causal 5044.8 / 5239.8: 1.04x
//   fwd+bwd at those rows 1.02x, 1.13x, 1.09x, 1.19x, 1.12x, 1.06x (h200-v12-fwdbwd-pair-...). Rows timed one after
//   the other put 2,16,4096,128 at 0.99-1.03x by the clock each ran at (docs/ladder.md, "Paired samples").
// - `flashcore test v12` 216 OK; the 2-CTA build 216 OK, its sanitizers clean; 2000 random launches with gradients
//   all OK, worst 0.97 (v12-bwd-epilogue-checks-2026-11-27.txt).
// Tried, not kept (docs/ladder.md has each run): dQ added from registers by red.global.add (10-15% slower);
// P^T under dP^T's wgmma (within 2%); no dQ lag, with dQ issued before or after dK; FA3's 80 queries per step at
// D = 128 (no faster; sm90/mainloop_bwd_sm90.cuh has the numbers); the consumers taking turns to issue S^T, dP^T
// (within 1.4%); tiles dealt in static snake rounds (6.4% slower at 1,16,16384,128 causal: the tiles running at once
// spanned all 16 heads' Q, dO and dQ); three Q_i/dO_i stages at D = 128 (0.0% and 1.1%: the consumers' waits on a stage
// are not the loads'). Not reached: the 1.1x moonshot at the D = 128 rows (1.03x and 1.04x in turn with cuDNN, twice on
// the H200).
#include "common/bwd_passes.cuh"
#include "flashcore.h"
#include "common/hopper.cuh"
#include "sm90/mainloop_bwd_sm90.cuh"
#include "sm90/v12_bwd_traits.cuh"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <type_traits>

// The persistent grid's size: 0 (default) one CTA per SM; N > 0 at most N CTAs (a test knob: with few CTAs every
// shape runs several tiles per CTA, as only long ones do at one per SM)
#ifndef V12_BWD_MAX_CTAS
#define V12_BWD_MAX_CTAS 0
#endif

namespace {

template <class Cfg, class T>
const char* backward(const FlashcoreBackwardParams& b_in, cudaStream_t stream) {
  FlashcoreBackwardParams b = b_in;
  bwd_normalize_window(b.fwd);  // edges that hide nothing: unbounded (sm90/v12_bwd_traits.cuh)
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr CUtensorMapDataType kType =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const FlashcoreParams& p = b.fwd;
  const Workspace w = carve(b);
  const long long heads = static_cast<long long>(p.batch) * p.heads;
  if (const char* err = launch_bwd_prep<kHeadDim, T>(b, w, stream)) return err;

  const auto kernel =
      p.softcap > 0.f ? v12_bwd<kHeadDim, Cfg::kBlockM, T, true> : v12_bwd<kHeadDim, Cfg::kBlockM, T, false>;
  if (const char* err = fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes)) return err;
  const int bh = p.batch * p.heads, bh_kv = p.batch * p.heads_kv;
  BwdMaps maps;
  const cuuint64_t dq_row_bytes = static_cast<cuuint64_t>(kHeadDim) * 4;
  if (!fc::encode_panel_map(&maps.q, kType, p.q, bh, p.seq_len, kHeadDim, Cfg::kBlockM, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.d_o, kType, b.d_o, bh, p.seq_len, kHeadDim, Cfg::kBlockM, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.k, kType, p.k, bh_kv, p.seq_len_kv, kHeadDim, Cfg::kBlockN, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.v, kType, p.v, bh_kv, p.seq_len_kv, kHeadDim, Cfg::kBlockN, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.dk, kType, b.dk, bh_kv, p.seq_len_kv, kHeadDim, 64, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.dv, kType, b.dv, bh_kv, p.seq_len_kv, kHeadDim, 64, Cfg::kPanels) ||
      !fc::encode_tensor_map<3>(&maps.dq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.dq_accum,
                                {static_cast<cuuint64_t>(kHeadDim), static_cast<cuuint64_t>(p.seq_len),
                                 static_cast<cuuint64_t>(heads)},
                                {dq_row_bytes, dq_row_bytes * p.seq_len}, {32, Cfg::kDqRows, 1},
                                CU_TENSOR_MAP_SWIZZLE_128B)) {
    return "v12 backward: the driver refused a TMA tensor map (is the driver new enough, the tensor 16-byte aligned?)";
  }
  const long long tiles = static_cast<long long>(fc::ceil_div(p.seq_len_kv, Cfg::kBlockN)) * bh_kv;
  if (tiles > INT_MAX) return fc::message("v12 backward: %lld key blocks exceed the tile list's int", tiles);
  const int sms = V12_BWD_MAX_CTAS > 0 ? V12_BWD_MAX_CTAS : fc::sm_count();
  const int ctas = static_cast<int>(std::min<long long>(tiles, sms));  // persistent: one per SM
  kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(b, w, maps);
  if (const char* err = fc::launch_status()) return err;

  return launch_bwd_dq<kHeadDim, T>(b, w, stream);
}

template <class T>
const char* backward_dtype(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  switch (b.fwd.head_dim) {
    case 64: return backward<BwdCfg64, T>(b, stream);
    case 128: return backward<BwdCfg128, T>(b, stream);
    default: return fc::unsupported_head_dim(b.fwd.head_dim);
  }
}

// prep, main (without softcap, with), dq for one dtype (names as c++filt prints them)
template <class Cfg, class T>
int plan_dtype(FlashcoreKernelPlan* plans) {
  plans[0] = bwd_prep_plan<Cfg::kHeadDim, T>();
  plans[1] = {FC_PLAN_NAME(v12_bwd, Cfg::kHeadDim, Cfg::kBlockM, fc::type_name<T>(), false), Cfg::kThreads,
              Cfg::kSmemBytes};
  plans[2] = {FC_PLAN_NAME(v12_bwd, Cfg::kHeadDim, Cfg::kBlockM, fc::type_name<T>(), true), Cfg::kThreads,
              Cfg::kSmemBytes};
  plans[3] = bwd_dq_plan<T>();
  return 4;
}

template <class Cfg>
int plan_both(FlashcoreKernelPlan* plans) {
  const int n = plan_dtype<Cfg, __half>(plans);
  return n + plan_dtype<Cfg, __nv_bfloat16>(plans + n);
}

}  // namespace

size_t flashcore_backward_workspace(const FlashcoreParams& p) { return workspace_bytes(p); }

const char* flashcore_backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  if (!(p.scale > 0.f)) return fc::message("v12 needs a positive softmax scale (got %g)", p.scale);
  if (p.lse == nullptr || b.workspace == nullptr) return "v12 backward: the forward's lse and a workspace are needed";
  if (p.seq_len < 1 || p.seq_len_kv < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  return p.dtype == kFlashcoreBFloat16 ? backward_dtype<__nv_bfloat16>(b, stream) : backward_dtype<__half>(b, stream);
}

// The backward's kernels at a head dim, fp16 then bf16 (sm90/v12.cu's flashcore_plan lists them after the forward's).
int v12_backward_plan(int head_dim, FlashcoreKernelPlan* plans) {
  switch (head_dim) {
    case 64: return plan_both<BwdCfg64>(plans);
    case 128: return plan_both<BwdCfg128>(plans);
    default: return 0;
  }
}
