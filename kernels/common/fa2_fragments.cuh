// common/fa2_fragments.cuh — FlashAttention-2's warp tile on mma.sync m16n8k16 fragments, written once (v11 and later):
// the swizzled cp.async tile copy, Q_i's A fragments, S = Q K^T, the edge masks, the online softmax on the
// C fragments and P V straight from those registers (the epilogue and the split merge: sm80/epilogue_fwd_sm80.cuh).
//
// Each helper is a template over a tile configuration Cfg (sm80/v11.cu's V11Config) and reads these members:
//   kHeadDim, kBlockM (query rows per CTA), kBlockN (keys per warp per tile), kWarpM (query rows per warp),
//   kMTiles = kWarpM / 16, kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8, kKChunks = kHeadDim / 16,
//   kChunks = kHeadDim / 8 (16-byte chunks per row), kRowBytes = 2 kHeadDim, kThreads (the copying threads),
//   kQInRegs (Q_i held in registers), kOStride (floats per row of a merge buffer).
// Fragment layouts and the swizzle: common/mma_sm80.cuh. A lane holds, for m16 tile mt, rows g = lane / 4 and
// g + 8 (index h = 0, 1 below) and columns 2t, 2t + 1 (t = lane % 4) of every n8 tile.
// The helpers that multiply or round take the element type T (__half or __nv_bfloat16, see Element below);
// copies and pointers only move 2-byte elements, so they stay typed __half whatever the tensors hold.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashcore.h"
#include "common/family.cuh"
#include "common/mma_sm80.cuh"
#include "common/primitives.cuh"

namespace fc {

// What changes with the element type: the mma's input type, the rounding of fp32 into a 16-bit pair (and of
// one value, back to fp32), and the pair 1.0, 1.0 (the ones column whose product with P gives l_i).
template <class T>
struct Element;

template <>
struct Element<__half> {
  static constexpr uint32_t kOnes = 0x3c003c00u;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_16816(d, a, b0, b1);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_half2(lo, hi); }
  static __device__ __forceinline__ float round(float x) { return __half2float(__float2half_rn(x)); }
};

template <>
struct Element<__nv_bfloat16> {
  static constexpr uint32_t kOnes = 0x3f803f80u;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
  static __device__ __forceinline__ float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
};

// kRows x kChunks 16-byte chunks of a [S, D] slice, rows first_row.., into a swizzled tile. Rows at or past
// valid_rows are zeroed with a plain shared store instead (never read from global memory), so the copies
// of one thread all address off one pointer with immediate offsets.
template <class Cfg, int kRows>
__device__ __forceinline__ void copy_rows_async(unsigned char* tile, const __half* src, int first_row,
                                                int valid_rows, int tid) {
  constexpr int kPasses = fc::ceil_div(kRows * Cfg::kChunks, Cfg::kThreads);
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunks;
  const int row0 = tid / Cfg::kChunks;
  const int chunk = tid % Cfg::kChunks;
  const __half* g = src + static_cast<size_t>(first_row + row0) * Cfg::kHeadDim + chunk * 8;
  if constexpr (kRowsPerPass % 8 != 0) {
    // Fewer than 8 rows per pass (a 64-thread copy group at D=128): the XOR changes from pass to pass.
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      unsigned char* s = tile + fc::swizzle(row, chunk, Cfg::kRowBytes);
      if ((kRows * Cfg::kChunks) % Cfg::kThreads == 0 || row < kRows) {
        if (first_row + row < valid_rows) {
          fc::cp_async_16(s, g + pass * kRowsPerPass * Cfg::kHeadDim, true);
        } else {
          *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    return;
  }
  unsigned char* s = tile + fc::swizzle(row0, chunk, Cfg::kRowBytes);  // row0 + k * kRowsPerPass: same XOR
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    if ((kRows * Cfg::kChunks) % Cfg::kThreads == 0 || row < kRows) {
      if (first_row + row < valid_rows) {
        fc::cp_async_16(s + pass * kRowsPerPass * Cfg::kRowBytes, g + pass * kRowsPerPass * Cfg::kHeadDim, true);
      } else {
        *reinterpret_cast<uint4*>(s + pass * kRowsPerPass * Cfg::kRowBytes) = make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// The per-warp row state, kept in registers: O_i = 0, m_i = -inf, l_i = 0 to start.
template <class Cfg>
__device__ __forceinline__ void init_rows(float (&o)[Cfg::kMTiles][Cfg::kDTiles][4], float (&m_i)[Cfg::kMTiles][2],
                                          float (&l_i)[Cfg::kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int d = 0; d < Cfg::kDTiles; ++d)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[mt][d][r] = 0.f;
    m_i[mt][0] = m_i[mt][1] = -INFINITY;
    l_i[mt][0] = l_i[mt][1] = 0.f;
  }
}

// Q_i's A fragments for the warp's rows when they are held in registers (Cfg::kQInRegs); one placeholder
// register set otherwise (warp_scores then re-reads Q_i from shared memory).
template <class Cfg>
using QFragments = uint32_t[Cfg::kQInRegs ? Cfg::kMTiles : 1][Cfg::kQInRegs ? Cfg::kKChunks : 1][4];

template <class Cfg>
__device__ __forceinline__ void load_q_fragments(QFragments<Cfg>& q_frag, uint32_t q_lane, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int kc = 0; kc < Cfg::kKChunks; ++kc)
      fc::ldmatrix_x4(q_frag[mt][kc], q_lane + mt * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, lane >> 4, lane));
}

// The same fragments straight from global memory (for CTAs that never stage Q_i in shared memory):
// lane (g, t) of an m16 tile holds rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9 of each k16
// step, four 4-byte loads per step. Rows at or past seq_len read as zeros.
template <class Cfg>
__device__ __forceinline__ void load_q_fragments_global(QFragments<Cfg>& q_frag, const __half* q, int row0,
                                                        int seq_len, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * h;
      const uint32_t* src =
          reinterpret_cast<const uint32_t*>(q + static_cast<size_t>(row) * Cfg::kHeadDim) + (lane & 3);
#pragma unroll
      for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
        q_frag[mt][kc][h] = row < seq_len ? __ldg(src + kc * 8) : 0u;
        q_frag[mt][kc][2 + h] = row < seq_len ? __ldg(src + kc * 8 + 4) : 0u;
      }
    }
}

// S = Q_i K_j^T for the warp's rows against kBlockN keys (raw scores: the scale is folded into exp2).
// q_frag holds Q_i when Cfg::kQInRegs; otherwise Q_i is re-read from shared memory at q_lane.
template <class Cfg, class T = __half, class QFrag>
__device__ __forceinline__ void warp_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], const QFrag& q_frag,
                                            uint32_t q_lane, uint32_t k_lane, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[mt][j][r] = 0.f;
  // ldmatrix lanes: Q and K rows are 8-aligned at the tile level, so the swizzle term is lane & 7
  const int q_chunk = lane >> 4;        // matrices 2, 3 of an A fragment: k 8..15
  const int k_chunk = (lane >> 3) & 1;  // matrices 1, 3 of a B pair: k 8..15
#pragma unroll
  for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      if constexpr (Cfg::kQInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][kc][r];
      } else {
        fc::ldmatrix_x4(a[mt], q_lane + mt * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, q_chunk, lane));
      }
    }
#pragma unroll
    for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
      uint32_t b[4];  // b[0], b[1]: n8 tile 2 np; b[2], b[3]: tile 2 np + 1
      fc::ldmatrix_x4(b, k_lane + np * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, k_chunk, lane));
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        Element<T>::mma(s[mt][2 * np], a[mt], b[0], b[1]);
        Element<T>::mma(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// -inf where key >= seq_len or (causal) key > row; only tiles that cross the diagonal or the end call it.
template <class Cfg>
__device__ __forceinline__ void mask_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], int row0, int key0,
                                            int seq_len, bool causal, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row0 + mt * 16 + (lane >> 2) + 8 * (r >> 1);
        const int key = key0 + 8 * j + 2 * (lane & 3) + (r & 1);
        if (key >= seq_len || (causal && key > row)) s[mt][j][r] = -INFINITY;
      }
}

// The attention family's edge mask (flashcore.h's window; mask_scores is its causal case): -inf where key >= seq_len
// or key - (row + offset) lies outside [-window_left, window_right] (diag0 = row0 + offset; an unbounded side is
// INT_MAX). Only tiles that cross a window edge or the sequence end call it.
template <class Cfg>
__device__ __forceinline__ void mask_window_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], int diag0, int key0,
                                                   int seq_len, int window_left, int window_right, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int diag = diag0 + mt * 16 + (lane >> 2) + 8 * (r >> 1);
        const int key = key0 + 8 * j + 2 * (lane & 3) + (r & 1);
        const int d = key - diag;
        if (key >= seq_len || d > window_right || d < -window_left) s[mt][j][r] = -INFINITY;
      }
}

// Softcap on raw scores S = Q K^T in place: S becomes out * tanh(S * in) (fc::tanh_fast; in = scale / c, out = c,
// or c log2 e for a softmax in log2 units).
template <class Cfg>
__device__ __forceinline__ void softcap_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], float in, float out) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[mt][j][r] = out * tanh_fast(s[mt][j][r] * in);
}

// m_new = max(m_i, rowmax(S)); P = exp2(S * scale_log2 - m_i * scale_log2) in place of S;
// O = diag(alpha) O and l_i = alpha l_i with alpha = exp2((m_i - m_new) * scale_log2); accumulate_pv then adds
// rowsum(P) to l_i. m_i is kept in raw-score units (so scale must be > 0). A warp none of whose rows found a new
// max in the tile skips the O rescale (kMTiles * kHeadDim / 2 multiplies per lane), which fires more often the
// further along the row.
template <class Cfg>
__device__ __forceinline__ void online_softmax(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                               float (&o)[Cfg::kMTiles][Cfg::kDTiles][4],
                                               float (&m_i)[Cfg::kMTiles][2], float (&l_i)[Cfg::kMTiles][2],
                                               float scale_log2) {
  float alpha[Cfg::kMTiles][2];
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
      float m_new = m_i[mt][h];
#pragma unroll
      for (int j = 0; j < Cfg::kNTiles; ++j) m_new = fmaxf(m_new, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
      m_new = fc::group_max<4>(m_new);
      // From m_i = -inf any finite m_new moves (inf > 0); while both are -inf the row has seen
      // nothing ((-inf) - (-inf) = NaN compares false) and keeps m_i = -inf.
      alpha[mt][h] = 1.f;
      if ((m_new - m_i[mt][h]) * scale_log2 > 0.f) {
        alpha[mt][h] = exp2f((m_i[mt][h] - m_new) * scale_log2);
        m_i[mt][h] = m_new;
        moved = true;
      }
      // A row with nothing visible yet keeps m = -inf; subtracting 0 then gives exp2(-inf) = 0, not NaN.
      const float m_scaled = m_i[mt][h] == -INFINITY ? 0.f : m_i[mt][h] * scale_log2;
#pragma unroll
      for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
        for (int c = 2 * h; c < 2 * h + 2; ++c) s[mt][j][c] = exp2f(fmaf(s[mt][j][c], scale_log2, -m_scaled));
      l_i[mt][h] *= alpha[mt][h];
    }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        o[mt][d][0] *= alpha[mt][0];
        o[mt][d][1] *= alpha[mt][0];
        o[mt][d][2] *= alpha[mt][1];
        o[mt][d][3] *= alpha[mt][1];
      }
  }
}

// O += P V_j and l_i += rowsum(P): the fp32 C fragments of P, packed to T, are the A fragments (n8 tiles
// 2 kk and 2 kk + 1 make k16 step kk). The row sums come from one more mma per k16 step, P times a column of
// ones, so l_i adds up exactly the fp16 values that P V multiplies: a row whose largest P is not exactly 1
// (m_i * scale_log2 is rounded, so exp2 at the row max is 1 +- 2^-11) still gets O / l = V on a one-hot row,
// where summing the fp32 P put numerator and denominator up to 2^-12 apart (one output ulp at |v| ~ 100).
// The mma also gives each lane its row's whole sum: no quad reduction at the end.
// The A fragment of one k16 step made from the C fragments of two n8 tiles (c_lo: k 0-7, c_hi: k 8-15), packed to
// T: the register identity that lets P V (and the backward's P^T dO, dS^T Q) run from the scores' registers.
template <class T>
__device__ __forceinline__ void pack_a_fragment(uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = Element<T>::pack(c_lo[0], c_lo[1]);
  a[1] = Element<T>::pack(c_lo[2], c_lo[3]);
  a[2] = Element<T>::pack(c_hi[0], c_hi[1]);
  a[3] = Element<T>::pack(c_hi[2], c_hi[3]);
}

// acc[mt][2 dp], acc[mt][2 dp + 1] += a[mt] B for dp < kDPairs: one k16 step whose B ([k16][D] in shared memory,
// b_step = the step's first row plus this lane's row (lane % 8) + 8 ((lane / 8) % 2)) is read by ldmatrix .trans
// from n8 tile 2 (d_pair0 + dp) on (matrices 2, 3 of a pair: the odd d-tile); each B fragment serves every m16 tile.
template <class Cfg, class T, int kDPairs>
__device__ __forceinline__ void mma_trans_b(float (&acc)[Cfg::kMTiles][2 * kDPairs][4],
                                            const uint32_t (&a)[Cfg::kMTiles][4], uint32_t b_step, int d_pair0,
                                            int lane) {
#pragma unroll
  for (int dp = 0; dp < kDPairs; ++dp) {
    uint32_t b[4];  // b[0], b[1]: d-tile 2 dp; b[2], b[3]: d-tile 2 dp + 1
    fc::ldmatrix_x4_trans(b, b_step + fc::ldmatrix_chunk(d_pair0 + dp, lane >> 4, lane));
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      Element<T>::mma(acc[mt][2 * dp], a[mt], b[0], b[1]);
      Element<T>::mma(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
    }
  }
}

template <class Cfg, class T = __half>
__device__ __forceinline__ void accumulate_pv(const float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                              float (&o)[Cfg::kMTiles][Cfg::kDTiles][4],
                                              float (&l_i)[Cfg::kMTiles][2], uint32_t v_lane, int lane) {
  constexpr uint32_t kOnes = Element<T>::kOnes;  // two 1.0: the B fragment of a ones column
  float row_sum[Cfg::kMTiles][4] = {};          // c0 = c1: row g, c2 = c3: row g + 8
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    uint32_t pa[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) pack_a_fragment<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
    mma_trans_b<Cfg, T, Cfg::kDTiles / 2>(o, pa, v_lane + kk * 16 * Cfg::kRowBytes, 0, lane);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) Element<T>::mma(row_sum[mt], pa[mt], kOnes, kOnes);
  }
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
    l_i[mt][0] += row_sum[mt][0];
    l_i[mt][1] += row_sum[mt][2];
  }
}

}  // namespace fc
