// v11_bwd.cu — v11's backward: FlashAttention-2's algorithm on mma.sync, K/V-stationary, dQ added in fp32.
//
// Idea: the gradient of O = softmax(Q K^T * scale) V needs P again; rather than store it (S x S), recompute it
// from the forward's row log-sum-exp: P = exp(S * scale - LSE). Three kernels:
//   prep   D = rowsum(dO o O) (minus dLSE where the LSE was used too), LSE * log2 e, both padded to the query
//          block, and the fp32 dQ accumulator zeroed;
//   main   one CTA per block of kBlockN keys of one K/V head holds K_j, V_j (and dK_j, dV_j in registers) and
//          walks every query block (of every query head of its group, under GQA) that can see them, with Q_i,
//          dO_i, LSE_i, D_i double-buffered by cp.async. Each warp owns 16 keys and computes S^T and dP^T, so
//          dV += P^T dO and dK += dS^T Q run from registers (fa2_bwd.cuh); dS^T goes through shared memory
//          once, for dQ_i += dS K_j, which every key block adds into the fp32 accumulator (below);
//   dq     dQ = accumulator * scale, rounded to the element type.
// Causal (bottom-right): a key block starts at the first query block that sees it; only blocks that cross
// the diagonal are masked. dK and dV are deterministic (one CTA owns each key row); dQ is not bitwise
// deterministic (the order of the fp32 additions from different key blocks varies from run to run).
//
// Change from the rungs below: the first backward of the ladder. v11's forward (v11.cu) writes the LSE.
//
// Configuration (V11BwdConfig<D, BLOCK_N, BLOCK_M, KV_IN_REGS>), 16 keys per warp:
//   D=64   128 keys (8 warps) x 64 queries per step, K and V fragments held in registers (97 KB on sm_90,
//          81 KB on the L4); short grids (below one wave of SMs) 32 keys (2 warps) x 64
//   D=128  sm_90: 128 keys (8 warps) x 64 queries (177 KB); the L4 build and short grids: 64 keys x 32 queries
//          (68.5 KB); K and V re-read from shared memory (no registers left for their fragments)
//
// Run:  flashcore test v11 && flashcore bench v11 --pass bwd --shape 2,16,4096,64
//
// dQ: on sm_90 the warps stage dQ_i in shared memory and one thread adds it by TMA reduce-add (a 32-column box
// per 128 bytes of row); below sm_90 every lane red.adds its fragments.
//
// Measured (H200, cold mode, the backward alone beside SDPA's FA2 and cuDNN backward in the same run; TFLOP/s at
// 2.5 x the forward's FLOPs):  shape                v11                 FA2 (SDPA flash)   cuDNN
//                                2,16,4096,64         1509 us, 228 TF     1300 us, 264 TF    781 us, 440 TF
//                                2,16,4096,64 causal   888 us, 193 TF      821 us, 209 TF    506 us, 340 TF
//                                2,16,4096,128        2610 us, 263 TF     2385 us, 288 TF   1267 us, 543 TF
//                                2,16,4096,128 causal 1520 us, 226 TF     1434 us, 240 TF    779 us, 441 TF
//                                1,16,16384,64       11431 us, 240 TF     9480 us, 290 TF   6124 us, 449 TF
//   v11's backward is 0.83-0.94x FA2's: the target (>= 1.0x at every row) is not met. fwd+bwd at 1,8,512,64:
//   34.7 us against SDPA's 35.4 (docs/results/h200.json).
// Where the time goes (same-run builds that drop part of the dQ path, timing only, at 2,16,4096,64 with
// red.add): all of it 1486 us; dQ computed but not added 1332; no dQ at all 1027. The dQ path (its second
// barrier, the dS^T round trip, 32 of every 160 mma and 24 of every 88 ldmatrix) is a third of the time.
// Tried and not kept (same run, 2,16,4096,64): 64 keys x 4 warps (2 CTAs/SM) 1554 vs 1486 us; 32 queries per
// step 1782. The TMA reduce-add is no faster at D=64 (1509 us in a later run against red.add's 1486); it stays,
// one dQ path for sm_90, since with the 128 x 64 tile it took D=128 from 3199 to 2610 us (two runs).
#include "flashcore.h"
#include "fa2_bwd.cuh"
#include "fa2_mma.cuh"
#include "primitives.cuh"
#include "tma.cuh"

#include <cstdint>
#include <type_traits>

constexpr int kBwdMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr float kBwdLog2e = 1.4426950408889634f;
constexpr int kPadRows = 64;  // LSE and D are padded per head to a multiple of every BLOCK_M

template <int kHeadDim_, int kBlockN_, int kBlockM_, bool kKvInRegs_>
struct V11BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per CTA, 16 per warp
  static constexpr int kBlockM = kBlockM_;  // Br: queries per step
  static constexpr bool kKvInRegs = kKvInRegs_;
  static constexpr int kWarps = kBlockN / 16;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  // The warp tile as fa2_mma.cuh's warp_scores sees it: "Q" = the warp's 16 keys, "K" = the query block.
  static constexpr int kMTiles = 1;
  static constexpr int kNTiles = kBlockM / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKChunks = kHeadDim / 16;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr bool kQInRegs = kKvInRegs;
  // dQ_i (kBlockM x D) is shared by the warps: kDqMTiles query tiles of 16 rows times D split kDqSplit ways
  // make kDqUnits pieces of 16 rows x kDqTiles n8 tiles; warp w takes pieces w, w + kWarps, ...
  static constexpr int kDqMTiles = kBlockM / 16;
  static constexpr int kDqSplit = kWarps > kDqMTiles ? kWarps / kDqMTiles : 1;
  static constexpr int kDqTiles = kDTiles / kDqSplit;
  static constexpr int kDqUnits = kDqMTiles * kDqSplit;
  static constexpr int kDsRowBytes = kBlockM * 2;
  // sm_90 builds add dQ_i to the accumulator by TMA (one reduce-add per 32 columns from a staging tile of
  // fp32 panels [32 columns][kBlockM rows], 128-byte swizzled) instead of red.add from every lane.
  static constexpr bool kTmaDq = fc::kBuildsSm90;
  static constexpr int kDqPanels = kHeadDim / 32;
  // Shared memory: K_j | V_j | dQ staging (sm_90) | (Q_i, dO_i) x 2 stages | dS^T | (LSE_i log2 e, D_i) x 2.
  static constexpr int kKvBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKvBytes;
  static constexpr int kDqOffset = 2 * kKvBytes;  // 1024-byte aligned: kKvBytes is a multiple of 2048
  static constexpr int kDqBytes = kTmaDq ? kBlockM * kHeadDim * 4 : 0;
  static constexpr int kStageOffset = kDqOffset + kDqBytes;  // stage s: Q_i at + s * 2 kQBytes, dO_i after it
  static constexpr int kDsOffset = kStageOffset + 4 * kQBytes;
  static constexpr int kStatsOffset = kDsOffset + kBlockN * kDsRowBytes;  // stage s: lse2 [kBlockM], dsum [kBlockM]
  static constexpr int kSmemBytes = kStatsOffset + 2 * 2 * kBlockM * 4;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN % 16 == 0 && kBlockM % 16 == 0 && kBlockM <= kPadRows && kPadRows % kBlockM == 0,
                "BLOCK_N, BLOCK_M: multiples of 16; BLOCK_M divides the padding");
  static_assert(kDqUnits % kWarps == 0 && kDTiles % kDqSplit == 0 && kDqTiles % 2 == 0, "dQ split over the warps");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0, "copies cover whole swizzle periods");
  // The L4's 99 KB per block where the build runs on it; sm_90 builds may take Hopper's 227 KB.
  static_assert(kSmemBytes <= (fc::kBuildsSm90 ? 227 * 1024 : kBwdMaxSmemBytes), "shared memory per block");
};

// Tile sizes as defines, so a registry variant can build another one beside this for a same-run comparison.
#ifndef V11_BWD_D64_BLOCK_N
#define V11_BWD_D64_BLOCK_N 128
#endif
#ifndef V11_BWD_D64_BLOCK_M
#define V11_BWD_D64_BLOCK_M 64
#endif
#ifndef V11_BWD_D64_KV_IN_REGS
#define V11_BWD_D64_KV_IN_REGS 1
#endif
#ifndef V11_BWD_D128_BLOCK_N
#define V11_BWD_D128_BLOCK_N 64
#endif
#ifndef V11_BWD_D128_BLOCK_M
#define V11_BWD_D128_BLOCK_M 32
#endif

using BwdD64 = V11BwdConfig<64, V11_BWD_D64_BLOCK_N, V11_BWD_D64_BLOCK_M, V11_BWD_D64_KV_IN_REGS != 0>;
// D=128 on sm_90 (227 KB): 128 keys x 64 queries, half the dQ reductions per FLOP of the L4's 64 x 32.
using BwdD128 = std::conditional_t<fc::kBuildsSm90, V11BwdConfig<128, 128, 64, false>,
                                   V11BwdConfig<128, V11_BWD_D128_BLOCK_N, V11_BWD_D128_BLOCK_M, false>>;
// Short sequences: when the long grid (key blocks x batch x K/V heads) would not fill the SMs once, 32-key CTAs
// (two warps) make four times as many CTAs (1,8,512,64: 128 instead of 32); at D=128, 64 keys.
using BwdShortD64 = V11BwdConfig<64, 32, 64, true>;
using BwdShortD128 = V11BwdConfig<128, 64, 32, false>;

// Workspace: the fp32 dQ accumulator [B, H, S, D], then LSE * log2 e and D, each [B, H, S_pad] fp32.
struct Workspace {
  float* dq_accum;
  float* lse2;
  float* dsum;
  int padded_rows;  // S_pad
};

inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline int padded_rows(int seq_len) { return fc::ceil_div(seq_len, kPadRows) * kPadRows; }

inline size_t dq_accum_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * p.seq_len * p.head_dim * 4);
}

inline size_t stats_bytes(const FlashcoreParams& p) {
  return align256(static_cast<size_t>(p.batch) * p.heads * padded_rows(p.seq_len) * 4);
}

inline Workspace carve(const FlashcoreBackwardParams& b) {
  unsigned char* base = static_cast<unsigned char*>(b.workspace);
  Workspace w;
  w.padded_rows = padded_rows(b.fwd.seq_len);
  w.dq_accum = reinterpret_cast<float*>(base);
  w.lse2 = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd));
  w.dsum = reinterpret_cast<float*>(base + dq_accum_bytes(b.fwd) + stats_bytes(b.fwd));
  return w;
}

// ---- prep: D = rowsum(dO o O) - dLSE, LSE log2 e (padding rows: D = 0, LSE = +inf), dQ accumulator = 0 ----
// One thread per 8 elements of a row; the kChunks threads of a row are consecutive lanes.
template <int kHeadDim, class T>
__global__ void __launch_bounds__(256) v11_bwd_prep(FlashcoreBackwardParams b, Workspace w) {
  constexpr int kChunks = kHeadDim / 8;
  const FlashcoreParams& p = b.fwd;
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long row_flat = thread / kChunks;  // over (b * H + h, padded row)
  const int chunk = static_cast<int>(thread % kChunks);
  const long long bh = row_flat / w.padded_rows;
  const int row = static_cast<int>(row_flat % w.padded_rows);
  const bool head = bh < static_cast<long long>(p.batch) * p.heads;  // (no early return: the row's lanes shuffle)
  float dot = 0.f;
  if (head && row < p.seq_len) {
    const size_t offset = (static_cast<size_t>(bh) * p.seq_len + row) * kHeadDim + chunk * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(p.o + offset);
    const uint4 d_o = *reinterpret_cast<const uint4*>(b.d_o + offset);
    const T* ov = reinterpret_cast<const T*>(&o);
    const T* dv = reinterpret_cast<const T*>(&d_o);
#pragma unroll
    for (int i = 0; i < 8; ++i) dot += static_cast<float>(ov[i]) * static_cast<float>(dv[i]);
    float4* acc = reinterpret_cast<float4*>(w.dq_accum + offset);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  dot = fc::group_sum<kChunks>(dot);
  if (head && chunk == 0) {
    const size_t at = static_cast<size_t>(bh) * w.padded_rows + row;
    const size_t src = static_cast<size_t>(bh) * p.seq_len + row;
    w.dsum[at] = row < p.seq_len ? dot - (b.d_lse != nullptr ? b.d_lse[src] : 0.f) : 0.f;
    w.lse2[at] = row < p.seq_len ? p.lse[src] * kBwdLog2e : INFINITY;
  }
}

// ---- main: one CTA per (key block, batch * K/V head) ----
template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads)
    v11_bwd(FlashcoreBackwardParams b, Workspace w, const __grid_constant__ CUtensorMap dq_map) {
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
  float* dq_s = reinterpret_cast<float*>(smem + Cfg::kDqOffset);  // [kDqPanels][kBlockM][32] fp32, swizzled (sm_90)
  auto stats = [&](int s) { return reinterpret_cast<float*>(smem + Cfg::kStatsOffset) + s * 2 * kBlockM; };

  // Query blocks that see any of keys n0..: causal, from the first row i with i + offset >= n0.
  const int m_first = p.causal ? max(0, n0 - offset) / kBlockM : 0;
  const int m_blocks = fc::ceil_div(seq_len, kBlockM) - m_first;
  const int steps = m_blocks > 0 ? m_blocks * group : 0;  // every query head of the group, every block

  auto load_step = [&](int step, int s) {
    const int bh = bh0 + step / m_blocks;
    const int m0 = (m_first + step % m_blocks) * kBlockM;
    const size_t base = static_cast<size_t>(bh) * seq_len * kHeadDim;
    fc::copy_rows_async<Cfg, kBlockM>(q_stage(s), p.q + base, m0, seq_len, tid);
    fc::copy_rows_async<Cfg, kBlockM>(do_stage(s), b.d_o + base, m0, seq_len, tid);
    if (tid < 2 * kBlockM / 4) {  // LSE log2 e, then D: 16 bytes per thread (rows padded to kPadRows)
      const int half = tid / (kBlockM / 4), i = tid % (kBlockM / 4);
      const float* src = (half == 0 ? w.lse2 : w.dsum) + static_cast<size_t>(bh) * w.padded_rows + m0 + 4 * i;
      fc::cp_async_16(stats(s) + half * kBlockM + 4 * i, src, true);
    }
  };

  fc::copy_rows_async<Cfg, kBlockN>(k_s, p.k + kv_base, n0, seq_len_kv, tid);
  fc::copy_rows_async<Cfg, kBlockN>(v_s, p.v + kv_base, n0, seq_len_kv, tid);
  if (steps > 0) load_step(0, 0);
  fc::cp_async_commit();

  // Per-lane ldmatrix rows: A fragments and .trans B take (lane % 8) + 8 ((lane / 8) % 2); plain B takes
  // (lane % 8) + 8 (lane / 16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int key0 = n0 + warp * 16;  // this warp's keys
  const uint32_t k_lane = fc::smem_addr(k_s) + (warp * 16 + a_row) * Cfg::kRowBytes;
  const uint32_t v_lane = fc::smem_addr(v_s) + (warp * 16 + a_row) * Cfg::kRowBytes;
  fc::QFragments<Cfg> k_frag, v_frag;  // the warp's K and V rows as A fragments (kKvInRegs)

  float dk[Cfg::kDTiles][4] = {}, dv[Cfg::kDTiles][4] = {};

  // sm_90: the staged dQ_i of step `step` goes out by TMA reduce-add (thread 0) once every warp has written it
  auto reduce_dq = [&](int step) {
    const int bh = bh0 + step / m_blocks, m0 = (m_first + step % m_blocks) * kBlockM;
#pragma unroll
    for (int panel = 0; panel < Cfg::kDqPanels; ++panel) {
      fc::tma_reduce_add_3d(&dq_map, 32 * panel, m0, bh, dq_s + panel * kBlockM * 32);
    }
    fc::tma_store_commit();
  };

  for (int step = 0; step < steps; ++step) {
    const int s = step & 1;
    if (step + 1 < steps) load_step(step + 1, s ^ 1);  // stage s ^ 1 was last read before step - 1's dS barrier
    fc::cp_async_commit();
    fc::cp_async_wait<1>();
    __syncthreads();
    if constexpr (Cfg::kTmaDq) {
      if (tid == 0 && step > 0) reduce_dq(step - 1);
    }
    if constexpr (Cfg::kKvInRegs) {
      if (step == 0) {
        fc::load_q_fragments<Cfg>(k_frag, k_lane, lane);
        fc::load_q_fragments<Cfg>(v_frag, v_lane, lane);
      }
    }
    const int bh = bh0 + step / m_blocks;
    const int m0 = (m_first + step % m_blocks) * kBlockM;

    // S^T = K_j Q_i^T, dP^T = V_j dO_i^T (16 keys x kBlockM queries per warp)
    float st[1][Cfg::kNTiles][4], dpt[1][Cfg::kNTiles][4];
    const uint32_t q_lane = fc::smem_addr(q_stage(s)) + b_row * Cfg::kRowBytes;
    const uint32_t do_lane = fc::smem_addr(do_stage(s)) + b_row * Cfg::kRowBytes;
    fc::warp_scores<Cfg, T>(st, k_frag, k_lane, q_lane, lane);
    fc::warp_scores<Cfg, T>(dpt, v_frag, v_lane, do_lane, lane);
    if (p.causal && key0 + 15 > m0 + offset) fc::mask_causal_t<Cfg>(st, key0, m0, offset, lane);
    // P^T = exp(S^T * scale - LSE), dS^T = P^T o (dP^T - D)
    fc::probabilities_and_ds_t<Cfg>(st, dpt, stats(s), stats(s) + kBlockM, scale_log2, lane);
    // dV += P^T dO_i, dK += dS^T Q_i
    fc::accumulate_t<Cfg, T>(st, dv, fc::smem_addr(do_stage(s)) + a_row * Cfg::kRowBytes, lane);
    fc::accumulate_t<Cfg, T>(dpt, dk, fc::smem_addr(q_stage(s)) + a_row * Cfg::kRowBytes, lane);
    fc::store_ds_t<Cfg, T>(ds_s, dpt, warp * 16, lane);
    if constexpr (Cfg::kTmaDq) {
      if (tid == 0) fc::tma_store_wait_read<0>();  // the last step's dQ has left the staging tile
    }
    __syncthreads();
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

  // dK = scale dS^T Q, dV = P^T dO for this warp's 16 keys (zeros where no query sees them)
  fc::store_rows_t<Cfg, T>(b.dk + kv_base, dk, p.scale, key0, seq_len_kv, lane);
  fc::store_rows_t<Cfg, T>(b.dv + kv_base, dv, 1.f, key0, seq_len_kv, lane);
}

// ---- dq: dQ = scale * accumulator, 8 elements per thread ----
template <class T>
__global__ void __launch_bounds__(256) v11_bwd_dq(FlashcoreBackwardParams b, Workspace w, long long chunks) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const float4* src = reinterpret_cast<const float4*>(w.dq_accum) + 2 * i;
  const float4 lo = src[0], hi = src[1];
  const float s = b.fwd.scale;
  uint4 out;
  out.x = fc::Element<T>::pack(lo.x * s, lo.y * s);
  out.y = fc::Element<T>::pack(lo.z * s, lo.w * s);
  out.z = fc::Element<T>::pack(hi.x * s, hi.y * s);
  out.w = fc::Element<T>::pack(hi.z * s, hi.w * s);
  reinterpret_cast<uint4*>(b.dq)[i] = out;
}

// ---- the launcher ----
namespace {

template <auto kKernel, int kBytes>
const char* allow_smem_once() {
  static const bool ready = fc::allow_dynamic_smem(kKernel, kBytes) == nullptr;
  return ready ? nullptr : fc::allow_dynamic_smem(kKernel, kBytes);
}

template <class Cfg, class T>
const char* backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  const Workspace w = carve(b);
  const long long heads = static_cast<long long>(p.batch) * p.heads;
  const long long prep_threads = heads * w.padded_rows * (Cfg::kHeadDim / 8);
  v11_bwd_prep<Cfg::kHeadDim, T><<<static_cast<unsigned>((prep_threads + 255) / 256), 256, 0, stream>>>(b, w);
  if (const char* err = fc::launch_status()) return err;

  constexpr auto kernel = v11_bwd<Cfg, T>;
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

  const long long chunks = heads * p.seq_len * (Cfg::kHeadDim / 8);
  v11_bwd_dq<T><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(b, w, chunks);
  return fc::launch_status();
}

// The long configuration unless its grid would leave SMs idle (one short wave), as in the forward.
template <class Long>
bool short_grid(const FlashcoreParams& p) {
  return static_cast<long long>(fc::ceil_div(p.seq_len_kv, Long::kBlockN)) * p.batch * p.heads_kv < fc::sm_count();
}

template <class T>
const char* backward_dtype(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  switch (b.fwd.head_dim) {
    case 64:
      return short_grid<BwdD64>(b.fwd) ? backward<BwdShortD64, T>(b, stream) : backward<BwdD64, T>(b, stream);
    case 128:
      return short_grid<BwdD128>(b.fwd) ? backward<BwdShortD128, T>(b, stream) : backward<BwdD128, T>(b, stream);
    default: return fc::unsupported_head_dim(b.fwd.head_dim);
  }
}

// The kernels' names as c++filt prints them (the plan's entries), e.g. "v11_bwd<V11BwdConfig<64, 128, 64, true>, __half>".
template <class T>
constexpr const char* type_name() {
  return std::is_same_v<T, __half> ? "__half" : "__nv_bfloat16";
}

template <class Cfg, class T>
FlashcoreKernelPlan main_plan() {
  static char text[96];
  snprintf(text, sizeof(text), "v11_bwd<V11BwdConfig<%d, %d, %d, %s>, %s>", Cfg::kHeadDim, Cfg::kBlockN, Cfg::kBlockM,
           Cfg::kKvInRegs ? "true" : "false", type_name<T>());
  return {text, Cfg::kThreads, Cfg::kSmemBytes};
}

// One dtype's kernels at a head dim: the prep pass, each main configuration, the dq pass.
template <int kHeadDim, class T, class... Cfgs>
int plan_dtype(FlashcoreKernelPlan* plans) {
  static char prep[64], dq[64];
  snprintf(prep, sizeof(prep), "v11_bwd_prep<%d, %s>", kHeadDim, type_name<T>());
  snprintf(dq, sizeof(dq), "v11_bwd_dq<%s>", type_name<T>());
  int n = 0;
  plans[n++] = {prep, 256, 0};
  ((plans[n++] = main_plan<Cfgs, T>()), ...);
  plans[n++] = {dq, 256, 0};
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

size_t flashcore_backward_workspace(const FlashcoreParams& p) { return dq_accum_bytes(p) + 2 * stats_bytes(p); }

const char* flashcore_backward(const FlashcoreBackwardParams& b, cudaStream_t stream) {
  const FlashcoreParams& p = b.fwd;
  if (!(p.scale > 0.f)) return fc::message("v11 needs a softmax scale > 0 (got %g)", p.scale);
  if (p.lse == nullptr || b.workspace == nullptr) return "v11 backward: the forward's lse and a workspace are needed";
  if (p.seq_len < 1 || p.seq_len_kv < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  return p.dtype != kFlashcoreBFloat16 ? backward_dtype<__half>(b, stream) : backward_dtype<__nv_bfloat16>(b, stream);
}

// The backward's kernels at a head dim, fp16 then bf16 (v11.cu's flashcore_plan lists them after the forward's).
int v11_backward_plan(int head_dim, FlashcoreKernelPlan* plans) {
  switch (head_dim) {
    case 64: return plan_long_short<64, BwdD64, BwdShortD64>(plans);
    case 128: return plan_long_short<128, BwdD128, BwdShortD128>(plans);
    default: return 0;
  }
}
