// sm80/mainloop_bwd_sm80.cuh — v11's backward kernel on mma.sync: the main loop of a K/V-stationary CTA over the query
// blocks that see its keys (S^T, dP^T, dV, dK from registers; dS^T through shared memory for dQ; at D = 128 on
// sm_90 warp pairs exchange P^T and dS^T through shared memory too and take dV, dK after the barrier) with its
// epilogue (dK, dV stored). The warp-level parts are sm80/warp_bwd_sm80.cuh; the configuration sm80/v11_bwd_traits.cuh;
// the passes before and after it common/bwd_passes.cuh; the launcher sm80/v11_bwd.cu.
#pragma once

#include "sm80/warp_bwd_sm80.cuh"
#include "common/fa2_fragments.cuh"
#include "common/family.cuh"
#include "flashcore.h"
#include "common/primitives.cuh"
#include "common/tma.cuh"
#include "sm80/v11_bwd_traits.cuh"

#include <climits>
#include <cstdint>
#include <type_traits>

// ---- main: one CTA per (key block, batch * K/V head) ----
// The attention family (flashcore.h): the CTA walks only the query blocks fc::visible_rows gives its keys (none: dK =
// dV = 0), and only a warp's slices outside the window's full band (causal: crossing the diagonal) are masked.
// kWindow (v11_bwd_window, and v11_bwd_softcap) takes every call with a window other than none and causal; the dense
// kernel (v11_bwd) only dense and causal calls, with the pre-family loop: the query-block range held across it, the
// causal mask. kSoftcap (v11_bwd_softcap, windows too): t = tanh(S scale / c) is recomputed from S, P = exp(c t - LSE)
// and dS = P o (dP - D) o (1 - t^2), the gradient at the uncapped scaled score, so dK, dQ take their usual scale;
// masked pairs get P = dS = 0 after the fact (a masked tanh is finite). Sinks: nothing here (the forward's LSE holds
// them; dL/dsinks is the prep's).
template <class Cfg, class T, bool kWindow, bool kSoftcap>
__device__ __forceinline__ void v11_backward(const FlashcoreBackwardParams& b, const Workspace& w,
                                             const CUtensorMap& dq_map) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const FlashcoreParams& p = b.fwd;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  const int tid = threadIdx.x, lane = tid % fc::kWarpSize, warp = tid / fc::kWarpSize;
  const int seq_len = p.seq_len, seq_len_kv = p.seq_len_kv, offset = fc::causal_offset(p);
  const int n0 = blockIdx.x * kBlockN;  // this CTA's first key
  const int bh_kv = blockIdx.y;         // b * H_kv + h_kv
  const int group = p.heads / p.heads_kv;
  const int bh0 = (bh_kv / p.heads_kv) * p.heads + (bh_kv % p.heads_kv) * group;  // its first query head
  const size_t kv_base = static_cast<size_t>(bh_kv) * seq_len_kv * kHeadDim;
  const float scale_log2 = p.scale * kBwdLog2e;

  unsigned char* k_s = smem + Cfg::kKOffset;  // [kBlockN][D], swizzled
  unsigned char* v_s = smem + Cfg::kVOffset;  // [kBlockN][D]
  auto q_stage = [&](int s) { return smem + Cfg::kStageOffset + s * 2 * Cfg::kQBytes; };  // [kBlockM][D]
  auto do_stage = [&](int s) { return q_stage(s) + Cfg::kQBytes; };                        // [kBlockM][D]
  unsigned char* ds_s = smem + Cfg::kDsOffset;  // dS^T [kBlockN][kBlockM]
  unsigned char* pt_s = smem + Cfg::kPtOffset;  // P^T [kBlockN][kBlockM] (warp pairs, kDHalves = 2)
  float* dq_s = reinterpret_cast<float*>(smem + Cfg::kDqOffset);  // [kDqPanels][kBlockM][32] fp32, swizzled (sm_90)
  auto stats = [&](int s) { return reinterpret_cast<float*>(smem + Cfg::kStatsOffset) + s * 2 * kBlockM; };

  // Query blocks that hold a row that sees any of keys n0.. (fc::visible_rows; causal: from the first row i with
  // i + offset >= n0): first .. first + count - 1, for each query head of the group. kWindow: a step's (head, block)
  // is recomputed from the grid index where it is used (volatile: never held across the loop; the 255-register
  // configurations spill with it held). Dense: causal or none, the range held (as before the family).
  struct Blocks {
    int first, count;
  };
  const int m_first = kWindow ? 0 : p.causal ? max(0, n0 - offset) / kBlockM : 0;
  const int m_blocks = kWindow ? 0 : fc::ceil_div(seq_len, kBlockM) - m_first;
  auto query_blocks = [&]() {
    if constexpr (kWindow) {
      int cta;
      asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
      const fc::Range rows = fc::visible_rows(p, cta * kBlockN, min(cta * kBlockN + kBlockN, p.seq_len_kv));
      const int first = rows.begin / kBlockM;
      return Blocks{first, rows.begin < rows.end ? fc::ceil_div(rows.end, kBlockM) - first : 0};
    } else {
      return Blocks{m_first, m_blocks};
    }
  };
  // every query head of the group, every block
  const int steps = kWindow ? query_blocks().count * group : m_blocks > 0 ? m_blocks * group : 0;
  auto step_head = [&](int step) { return bh0 + step / query_blocks().count; };
  auto step_row0 = [&](int step) {
    const Blocks blocks = query_blocks();
    return (blocks.first + step % blocks.count) * kBlockM;
  };

  auto load_step = [&](int step, int s) {
    const int bh = step_head(step);
    const int m0 = step_row0(step);
    const size_t base = static_cast<size_t>(bh) * seq_len * kHeadDim;
    fc::copy_rows_async<Cfg, kBlockM>(q_stage(s), fc::tensor<__half>(p.q) + base, m0, seq_len, tid);
    fc::copy_rows_async<Cfg, kBlockM>(do_stage(s), fc::tensor<__half>(b.d_o) + base, m0, seq_len, tid);
    if (tid < 2 * kBlockM / 4) {  // LSE log2 e, then D: 16 bytes per thread (rows padded to kPadRows)
      const int half = tid / (kBlockM / 4), i = tid % (kBlockM / 4);
      const float* src = (half == 0 ? w.lse2 : w.dsum) + static_cast<size_t>(bh) * w.padded_rows + m0 + 4 * i;
      fc::cp_async_16(stats(s) + half * kBlockM + 4 * i, src, true);
    }
  };

  fc::copy_rows_async<Cfg, kBlockN>(k_s, fc::tensor<__half>(p.k) + kv_base, n0, seq_len_kv, tid);
  fc::copy_rows_async<Cfg, kBlockN>(v_s, fc::tensor<__half>(p.v) + kv_base, n0, seq_len_kv, tid);
  if (steps > 0) load_step(0, 0);
  fc::cp_async_commit();

  // Per-lane ldmatrix rows: A fragments and .trans B take (lane % 8) + 8 ((lane / 8) % 2); plain B takes
  // (lane % 8) + 8 (lane / 16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  // this warp's keys (shared with the other warp of its pair, which takes the other half of D, where kDHalves = 2)
  const int key_warp = warp / Cfg::kDHalves, d_half = warp % Cfg::kDHalves;
  const int key0 = n0 + key_warp * Cfg::kWarpKeys;
  const uint32_t k_lane = fc::smem_addr(k_s) + (key_warp * Cfg::kWarpKeys + a_row) * Cfg::kRowBytes;
  const uint32_t v_lane = fc::smem_addr(v_s) + (key_warp * Cfg::kWarpKeys + a_row) * Cfg::kRowBytes;
  fc::QFragments<Cfg> k_frag, v_frag;  // the warp's K and V rows as A fragments (kKvInRegs)

  float dk[Cfg::kMTiles][Cfg::kAccDTiles][4] = {}, dv[Cfg::kMTiles][Cfg::kAccDTiles][4] = {};

  // sm_90: the staged dQ_i of step `step` goes out by TMA reduce-add (thread 0) once every warp has written it
  auto reduce_dq = [&](int step) {
    const int bh = step_head(step), m0 = step_row0(step);
#pragma unroll
    for (int panel = 0; panel < Cfg::kDqPanels; ++panel) {
      fc::tma_reduce_add_3d(&dq_map, 32 * panel, m0, bh, dq_s + panel * kBlockM * 32);
    }
    fc::tma_store_commit();
  };

  for (int step = 0; step < steps; ++step) {
    const int s = step & 1;
    if constexpr (Cfg::kDHalves == 1) {
      if (step + 1 < steps) load_step(step + 1, s ^ 1);  // stage s ^ 1 was last read before step - 1's dS barrier
      fc::cp_async_commit();
      fc::cp_async_wait<1>();
      __syncthreads();
    } else {  // warp pairs read stage s ^ 1 after step - 1's dS barrier too (dV, dK): load it after this one
      fc::cp_async_wait<0>();
      __syncthreads();
      if (step + 1 < steps) load_step(step + 1, s ^ 1);
      fc::cp_async_commit();
    }
    if constexpr (Cfg::kTmaDq) {
      if (tid == 0 && step > 0) reduce_dq(step - 1);
    }
    if constexpr (Cfg::kKvInRegs) {
      if (step == 0) {
        fc::load_q_fragments<Cfg>(k_frag, k_lane, lane);
        fc::load_q_fragments<Cfg>(v_frag, v_lane, lane);
      }
    }
    const int bh = step_head(step);
    const int m0 = step_row0(step);

    // One slice of kSliceM queries at a time (the whole step at 16 keys per warp): q0 is its first query in the block.
    // Unrolled (the 2 slices at 32 keys: 0 spills; as a loop they spill).
#pragma unroll
    for (int slice = 0; slice < Cfg::kSlices; ++slice) {
      const int q0 = (Cfg::kDHalves == 2 ? d_half : slice) * Cfg::kSliceM;
      // S^T = K_j Q_i^T, dP^T = V_j dO_i^T (kWarpKeys keys x kSliceM queries per warp)
      // warp_scores' B fragments come out of ldmatrix in mma order; scores_t's share accumulate_t's lane addresses and
      // need two register moves per mma (SASS: 237 per step at D = 128, where they cost 5% of the backward).
      float st[Cfg::kMTiles][Cfg::kNTiles][4], dpt[Cfg::kMTiles][Cfg::kNTiles][4];
      if constexpr (Cfg::kWarpKeys == 16 || Cfg::kDHalves == 2) {
        const uint32_t q_lane = fc::smem_addr(q_stage(s)) + (b_row + q0) * Cfg::kRowBytes;
        const uint32_t do_lane = fc::smem_addr(do_stage(s)) + (b_row + q0) * Cfg::kRowBytes;
        fc::warp_scores<Cfg, T>(st, k_frag, k_lane, q_lane, lane);
        fc::warp_scores<Cfg, T>(dpt, v_frag, v_lane, do_lane, lane);
      } else {  // D = 64, 32 keys per warp: warp_scores' addresses take 5 more registers there and spill (20 B)
        fc::scores_t<Cfg, T>(st, k_lane, fc::smem_addr(q_stage(s)) + (a_row + q0) * Cfg::kRowBytes, lane);
        fc::scores_t<Cfg, T>(dpt, v_lane, fc::smem_addr(do_stage(s)) + (a_row + q0) * Cfg::kRowBytes, lane);
      }
      static_assert(kWindow || !kSoftcap, "the softcap kernel takes windows too");
      if constexpr (kWindow) {
        // A slice needs a mask where some key of the warp lies past the window's right edge of the slice's first query
        // or before its left edge of the slice's last (keys past S_kv are zero rows of K and V: they add nothing).
        const int window_left = p.window_left < 0 ? INT_MAX : p.window_left;
        const int window_right = p.window_right < 0 ? INT_MAX : p.window_right;
        const int diag0 = m0 + q0 + offset;
        const bool cut = key0 + Cfg::kWarpKeys - 1 - diag0 > window_right || key0 - (diag0 + Cfg::kSliceM - 1) < -window_left;
        auto mask = [&](auto zero) {  // key j is visible to query i iff -window_left <= j - (i + offset) <= window_right
          fc::mask_window_t<Cfg, decltype(zero)::value>(st, dpt, key0, diag0, window_left, window_right, lane);
        };
        if constexpr (kSoftcap) {
          // P^T = exp(c tanh(S^T scale / c) - LSE), dS^T = P^T o (dP^T - D) o (1 - tanh^2); then the mask zeroes both
          float cap_in, cap_out;  // scale / c and c log2 e, recomputed here (volatile: not held across the loop)
          asm volatile("div.approx.f32 %0, %1, %2;" : "=f"(cap_in) : "f"(p.scale), "f"(p.softcap));
          asm volatile("mul.f32 %0, %1, %2;" : "=f"(cap_out) : "f"(p.softcap), "f"(kBwdLog2e));
          fc::probabilities_and_ds_softcap_t<Cfg>(st, dpt, stats(s) + q0, stats(s) + kBlockM + q0, cap_in, cap_out, lane);
          if (cut) mask(std::true_type{});
        } else {
          if (cut) mask(std::false_type{});
          // P^T = exp(S^T * scale - LSE), dS^T = P^T o (dP^T - D)
          fc::probabilities_and_ds_t<Cfg>(st, dpt, stats(s) + q0, stats(s) + kBlockM + q0, scale_log2, lane);
        }
      } else {
        if (p.causal && key0 + Cfg::kWarpKeys - 1 > m0 + q0 + offset) {
          fc::mask_causal_t<Cfg>(st, key0, m0 + q0, offset, lane);
        }
        // P^T = exp(S^T * scale - LSE), dS^T = P^T o (dP^T - D)
        fc::probabilities_and_ds_t<Cfg>(st, dpt, stats(s) + q0, stats(s) + kBlockM + q0, scale_log2, lane);
      }
      if constexpr (Cfg::kDHalves == 1) {
        // dV += P^T dO_i, dK += dS^T Q_i (the slice's k16 steps)
        fc::accumulate_t<Cfg, T>(st, dv, fc::smem_addr(do_stage(s)) + (a_row + q0) * Cfg::kRowBytes, lane);
        fc::accumulate_t<Cfg, T>(dpt, dk, fc::smem_addr(q_stage(s)) + (a_row + q0) * Cfg::kRowBytes, lane);
      } else {  // the pair's other half of the queries is in the other warp's registers: both go through shared memory
        fc::store_ds_t<Cfg, T>(pt_s, st, key_warp * Cfg::kWarpKeys, q0 / 8, lane);
      }
      fc::store_ds_t<Cfg, T>(ds_s, dpt, key_warp * Cfg::kWarpKeys, q0 / 8, lane);
    }
    if constexpr (Cfg::kTmaDq) {
      if (tid == 0) fc::tma_store_wait_read<0>();  // the last step's dQ has left the staging tile
    }
    __syncthreads();
    if constexpr (Cfg::kDHalves == 2) {  // dV += P^T dO_i, dK += dS^T Q_i: the pair's keys, this warp's half of D
      const int d_pair0 = d_half * (Cfg::kAccDTiles / 2);
      fc::accumulate_smem_t<Cfg, T>(pt_s, key_warp * Cfg::kWarpKeys, dv,
                                    fc::smem_addr(do_stage(s)) + a_row * Cfg::kRowBytes, d_pair0, lane);
      fc::accumulate_smem_t<Cfg, T>(ds_s, key_warp * Cfg::kWarpKeys, dk,
                                    fc::smem_addr(q_stage(s)) + a_row * Cfg::kRowBytes, d_pair0, lane);
    }
    // dQ_i += dS K_j, this warp's share, into the accumulator
#pragma unroll
    for (int unit = warp; unit < Cfg::kDqUnits; unit += Cfg::kWarps) {
      const int mtile = unit % Cfg::kDqMTiles, tile0 = (unit / Cfg::kDqMTiles) * Cfg::kDqTiles;
      float dq[Cfg::kDqTiles][4];
      fc::dq_partial<Cfg, T>(dq, ds_s, fc::smem_addr(k_s), mtile, tile0, lane);
      if constexpr (Cfg::kTmaDq) {
        fc::stage_dq<Cfg>(dq_s, dq, mtile, tile0, lane);
      } else {
        fc::red_add_dq<Cfg>(w.dq_accum + static_cast<size_t>(bh) * seq_len * kHeadDim, dq, m0 + 16 * mtile, tile0,
                            seq_len, lane);
      }
    }
    if constexpr (Cfg::kTmaDq) fc::fence_proxy_async_shared();  // the TMA unit reads what the warps wrote
  }
  fc::cp_async_wait<0>();
  if constexpr (Cfg::kTmaDq) {
    __syncthreads();
    if (tid == 0 && steps > 0) {
      reduce_dq(steps - 1);
      fc::tma_store_wait<0>();
    }
  }

  // dK = scale dS^T Q, dV = P^T dO for this warp's kWarpKeys keys (zeros where no query sees them)
  const size_t column0 = kv_base + d_half * (kHeadDim / Cfg::kDHalves);  // this warp's half of D (kDHalves = 2)
  fc::store_rows_t<Cfg, T>(fc::tensor<__half>(b.dk) + column0, dk, p.scale, key0, seq_len_kv, lane);
  fc::store_rows_t<Cfg, T>(fc::tensor<__half>(b.dv) + column0, dv, 1.f, key0, seq_len_kv, lane);
}

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    v11_bwd(FlashcoreBackwardParams b, Workspace w, const __grid_constant__ CUtensorMap dq_map) {
  v11_backward<Cfg, T, false, false>(b, w, dq_map);
}

// The window twin (a window other than none (-1, -1) and causal (-1, 0), no softcap), so that the dense kernel keeps
// its pre-family loop and its name.
template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    v11_bwd_window(FlashcoreBackwardParams b, Workspace w, const __grid_constant__ CUtensorMap dq_map) {
  v11_backward<Cfg, T, true, false>(b, w, dq_map);
}

// The softcap twin (p.softcap > 0, any window).
template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    v11_bwd_softcap(FlashcoreBackwardParams b, Workspace w, const __grid_constant__ CUtensorMap dq_map) {
  v11_backward<Cfg, T, true, true>(b, w, dq_map);
}
