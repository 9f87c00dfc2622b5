// sm80/warp_bwd_sm80.cuh — FlashAttention-2's backward, the warp's part, on mma.sync m16n8k16 fragments (v11's
// backward).
//
// The CTA holds a block of keys K_j, V_j (kBlockN rows, kWarpKeys = 16 or 32 per warp: kMTiles m16 tiles) and
// walks the query blocks Q_i, dO_i (kBlockM rows) that can see them, in slices of kSliceM queries (the whole
// block at 16 keys per warp). A warp computes its keys' rows of the TRANSPOSED score tile,
//   S^T = K_j Q_i^T  and  dP^T = V_j dO_i^T                  (kWarpKeys keys x kSliceM queries, fp32 C fragments)
// so that the C fragments, packed to 16 bits, are directly the A fragments of the two products whose rows
// are keys (the same register identity v11's forward uses for P V):
//   P^T = exp(S^T * scale - LSE)          dS^T = P^T o (dP^T - D),  D = rowsum(dO o O)
//   dV_j += P^T dO_i                      dK_j += dS^T Q_i   (times scale at the end)
// dQ_i = dS K_j needs dS with queries as rows: the warps store dS^T to shared memory (16-bit, swizzled), meet,
// and each warp multiplies its share of dQ_i by K_j from shared memory (ldmatrix .trans on both), adding the
// fp32 result to the dQ accumulator in global memory (red.add: other key blocks add to the same rows).
//
// Fragment and swizzle conventions: common/mma_sm80.cuh; the forward's helpers (warp_scores) are reused with a
// configuration whose "Q" is the warp's 16 key rows (32 keys take scores_t). Cfg members read here
// (sm80/v11_bwd_traits.cuh's V11BwdConfig): kHeadDim, kBlockN (keys per CTA), kBlockM (queries per step), kWarpKeys,
//   kMTiles = kWarpKeys / 16, kSliceM, kNTiles = kSliceM / 8, kDTiles = kHeadDim / 8, kAccDTiles (n8 tiles of dK, dV
//   per warp: kDTiles, or half of them where a pair of warps shares its keys, kDHalves = 2), kKChunks,
//   kRowBytes = 2 kHeadDim, kDsRowBytes = 2 kBlockM, kDqTiles (n8 tiles of dQ per warp), kDqMTiles (m16 tiles
//   of queries in a block).
#pragma once

#include "common/fa2_fragments.cuh"
#include "common/family.cuh"

namespace fc {

// Byte offset of chunk `chunk` of row `row` in the dS^T tile ([kBlockN][kBlockM] 16-bit). Rows of 128 bytes
// or more take the tiles' usual XOR; 64-byte rows (kBlockM = 32) XOR the chunk with (row / 2) % 4, so the
// eight rows one ldmatrix phase or one store reads land in eight different 16-byte bank groups.
template <int kRowBytes>
__device__ __forceinline__ uint32_t ds_offset(int row, int chunk) {
  static_assert(kRowBytes == 64 || kRowBytes % 128 == 0, "dS^T rows of 64 bytes or a multiple of 128");
  if constexpr (kRowBytes == 64) return static_cast<uint32_t>(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
  return swizzle(row, chunk, kRowBytes);
}

// -inf where key > query + offset (causal, bottom-right): only slices crossing the diagonal call it. The
// tile is the warp's kWarpKeys keys from key0 (m16 tile mt: keys key0 + 16 mt ..) against the queries q0 ..
// q0 + kSliceM - 1.
template <class Cfg>
__device__ __forceinline__ void mask_causal_t(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], int key0, int q0, int offset,
                                              int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + (lane >> 2) + 8 * (r >> 1) + 16 * mt;
        const int query = q0 + 8 * j + 2 * (lane & 3) + (r & 1);
        if (key > query + offset) s[mt][j][r] = -INFINITY;
      }
}

// The window's mask (flashcore.h; mask_causal_t is its causal case) on the warp's tile: pairs with key - (query +
// offset) outside [-window_left, window_right] (an unbounded side: INT_MAX); diag0 = q0 + offset, the slice's first
// query's diagonal. Before the probabilities (kZero = false) S^T is set to -inf there; after them (kZero, the softcap
// kernel, where tanh(-inf) would not give P = 0) P^T and dS^T are set to 0.
template <class Cfg, bool kZero>
__device__ __forceinline__ void mask_window_t(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                              float (&ds)[Cfg::kMTiles][Cfg::kNTiles][4], int key0, int diag0,
                                              int window_left, int window_right, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + (lane >> 2) + 8 * (r >> 1) + 16 * mt;
        const int d = key - (diag0 + 8 * j + 2 * (lane & 3) + (r & 1));
        if (d > window_right || d < -window_left) {
          if constexpr (kZero) {
            s[mt][j][r] = 0.f;
            ds[mt][j][r] = 0.f;
          } else {
            s[mt][j][r] = -INFINITY;
          }
        }
      }
}

// S^T = K_j Q_i^T (or dP^T = V_j dO_i^T) for 32 keys per warp at D = 64 (warp pairs at D = 128 take warp_scores):
// the warp's kMTiles m16 tiles of keys (A, re-read at a_lane) against one slice of kSliceM queries (B, from b_lane).
// Unlike warp_scores, the B ldmatrix takes the A and .trans fragments' lane addressing, row (lane % 8) + 8 ((lane
// / 8) % 2) and chunk half lane / 16, so b_lane is accumulate_t's b_lane and the chunk offsets are its offsets:
// fewer live registers beside 128 floats of dK, dV. Lane groups 0..3 then read (queries 0-7, d 0-7), (8-15, 0-7),
// (0-7, 8-15), (8-15, 8-15): n8 tile 2 np takes b[0], b[2] and tile 2 np + 1 takes b[1], b[3], which are not
// neighbouring registers as mma's B operand needs, so ptxas adds two moves per mma (238 per step; kept here, since
// warp_scores' addressing spills this kernel).
template <class Cfg, class T>
__device__ __forceinline__ void scores_t(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], uint32_t a_lane, uint32_t b_lane,
                                         int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[mt][j][r] = 0.f;
  const int half = lane >> 4;
#pragma unroll
  for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      ldmatrix_x4(a[mt], a_lane + mt * 16 * Cfg::kRowBytes + ldmatrix_chunk(kc, half, lane));
    }
#pragma unroll
    for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_lane + np * 16 * Cfg::kRowBytes + ldmatrix_chunk(kc, half, lane));
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        Element<T>::mma(s[mt][2 * np], a[mt], b[0], b[2]);
        Element<T>::mma(s[mt][2 * np + 1], a[mt], b[1], b[3]);
      }
    }
  }
}

// P^T = exp2(S^T * scale_log2 - LSE_q log2 e) in place (lse2: the slice's [kSliceM] LSE * log2 e, +inf for
// padding rows, so their P is 0); then dS^T = P^T o (dP^T - D_q) into dp (dsum: the slice's [kSliceM] D). The
// columns (queries) of a lane are the same in every m16 tile: one load of LSE and D serves them all.
template <class Cfg>
__device__ __forceinline__ void probabilities_and_ds_t(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                                       float (&dp)[Cfg::kMTiles][Cfg::kNTiles][4], const float* lse2,
                                                       const float* dsum, float scale_log2, int lane) {
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
    const float2 l = *reinterpret_cast<const float2*>(lse2 + col);
    const float2 d = *reinterpret_cast<const float2*>(dsum + col);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float p = exp2f(fmaf(s[mt][j][r], scale_log2, -((r & 1) ? l.y : l.x)));
        s[mt][j][r] = p;
        dp[mt][j][r] = p * (dp[mt][j][r] - ((r & 1) ? d.y : d.x));
      }
  }
}

// The softcap kernel's probabilities_and_ds_t: with t = tanh(S^T cap_in) (cap_in = scale / c; fc::tanh_fast),
// P^T = exp2(t cap_out - LSE_q log2 e) (cap_out = c log2 e) in place of S^T and dS^T = P^T o (dP^T - D_q) o (1 - t^2)
// in place of dP^T: the gradient at the scaled score before the cap.
template <class Cfg>
__device__ __forceinline__ void probabilities_and_ds_softcap_t(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                                               float (&dp)[Cfg::kMTiles][Cfg::kNTiles][4],
                                                               const float* lse2, const float* dsum, float cap_in,
                                                               float cap_out, int lane) {
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
    const float2 l = *reinterpret_cast<const float2*>(lse2 + col);
    const float2 d = *reinterpret_cast<const float2*>(dsum + col);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float t = tanh_fast(s[mt][j][r] * cap_in);
        const float p = exp2f(fmaf(t, cap_out, -((r & 1) ? l.y : l.x)));
        s[mt][j][r] = p;
        dp[mt][j][r] = p * (dp[mt][j][r] - ((r & 1) ? d.y : d.x)) * fmaf(-t, t, 1.f);
      }
  }
}

// acc (kWarpKeys keys x D) += A B, where A is the warp's kWarpKeys x kSliceM tile in C fragments (P^T or dS^T),
// packed to T (n8 tiles 2 kk and 2 kk + 1 make k16 step kk over the queries), and B is the slice's [kSliceM][D] in
// shared memory (dO_i or Q_i) read by ldmatrix .trans from b_lane (the slice's first row plus this lane's row
// (lane % 8) + 8 ((lane / 8) % 2)); each B fragment serves every m16 tile of keys.
template <class Cfg, class T>
__device__ __forceinline__ void accumulate_t(const float (&a)[Cfg::kMTiles][Cfg::kNTiles][4],
                                             float (&acc)[Cfg::kMTiles][Cfg::kDTiles][4], uint32_t b_lane, int lane) {
#pragma unroll
  for (int kk = 0; kk < Cfg::kNTiles / 2; ++kk) {
    uint32_t pa[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) pack_a_fragment<T>(pa[mt], a[mt][2 * kk], a[mt][2 * kk + 1]);
    mma_trans_b<Cfg, T, Cfg::kDTiles / 2>(acc, pa, b_lane + kk * 16 * Cfg::kRowBytes, 0, lane);
  }
}

// Warp pairs (kDHalves = 2): acc (kWarpKeys keys x this warp's half of D) += A B, where A is the pair's kWarpKeys x
// kBlockM tile of P^T or dS^T in shared memory (the dS^T layout, rows row0 .., read by plain ldmatrix: keys are its
// rows) and B the step's [kBlockM][D] dO_i or Q_i from b_lane (its first row plus the lane's row, as accumulate_t's),
// columns from n8 tile 2 d_pair0 on. Each B fragment serves every m16 tile of keys.
template <class Cfg, class T>
__device__ __forceinline__ void accumulate_smem_t(const unsigned char* a_tile, int row0,
                                                  float (&acc)[Cfg::kMTiles][Cfg::kAccDTiles][4], uint32_t b_lane,
                                                  int d_pair0, int lane) {
  const uint32_t a_base = smem_addr(a_tile);
  const int a_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8, half = lane >> 4;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      ldmatrix_x4(a[mt], a_base + ds_offset<Cfg::kDsRowBytes>(a_row + 16 * mt, 2 * kk + half));
    }
    mma_trans_b<Cfg, T, Cfg::kAccDTiles / 2>(acc, a, b_lane + kk * 16 * Cfg::kRowBytes, d_pair0, lane);
  }
}

// The warp's dS^T rows (keys row0 .. row0 + kWarpKeys - 1) of one slice (queries from 8 chunk0, the slice's
// first 16-byte chunk of a row) as T into the dS^T tile: lane (g, t) writes keys 16 mt + g and 16 mt + g + 8,
// queries 2t and 2t + 1 of every n8 tile (one 4-byte store each).
template <class Cfg, class T>
__device__ __forceinline__ void store_ds_t(unsigned char* tile, const float (&ds)[Cfg::kMTiles][Cfg::kNTiles][4],
                                           int row0, int chunk0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<uint32_t*>(tile + ds_offset<Cfg::kDsRowBytes>(row0 + g + 8 * h + 16 * mt, j + chunk0) +
                                     4 * t) = Element<T>::pack(ds[mt][j][2 * h], ds[mt][j][2 * h + 1]);
      }
}

// This warp's share of dQ_i = dS K_j (unscaled): query rows m16 tile `mtile` of the block, n8 tiles d_tile0 ..
// d_tile0 + kDqTiles - 1 of D, summed over the kBlockN keys. A = dS from the dS^T tile by ldmatrix .trans (lane:
// key (lane % 8) + 8 (lane / 16), query chunk 2 mtile + (lane / 8) % 2); B = K_j by ldmatrix .trans (the
// forward's V addressing).
template <class Cfg, class T>
__device__ __forceinline__ void dq_partial(float (&acc)[Cfg::kDqTiles][4], const unsigned char* ds_tile,
                                           uint32_t k_tile, int mtile, int d_tile0, int lane) {
#pragma unroll
  for (int j = 0; j < Cfg::kDqTiles; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
  const int a_key = (lane & 7) + (lane >> 4) * 8;
  const int a_chunk = 2 * mtile + ((lane >> 3) & 1);
  const int b_key = (lane & 7) + ((lane >> 3) & 1) * 8;
  const uint32_t ds_base = smem_addr(ds_tile);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, ds_base + ds_offset<Cfg::kDsRowBytes>(kk * 16 + a_key, a_chunk));
#pragma unroll
    for (int dp = 0; dp < Cfg::kDqTiles / 2; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, k_tile + (kk * 16 + b_key) * Cfg::kRowBytes + ldmatrix_chunk(d_tile0 / 2 + dp, lane >> 4, lane));
      Element<T>::mma(acc[2 * dp], a, b[0], b[1]);
      Element<T>::mma(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// dq[row][col], dq[row][col + 1] += (x, y) in global memory: one vector reduction on sm_90, two scalar ones below.
__device__ __forceinline__ void red_add_f32x2(float* dq, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dq), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(dq, x);
  atomicAdd(dq + 1, y);
#endif
}

// The warp's dQ partial (rows q0 .. of one query head, [S, D] fp32 accumulator) added in global memory; rows
// at or past seq_len are dropped.
template <class Cfg>
__device__ __forceinline__ void red_add_dq(float* dq_accum, const float (&acc)[Cfg::kDqTiles][4], int q0, int d_tile0,
                                           int seq_len, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + (lane >> 2) + 8 * h;
    if (row >= seq_len) continue;
    float* dst = dq_accum + static_cast<size_t>(row) * Cfg::kHeadDim + 8 * d_tile0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Cfg::kDqTiles; ++j) red_add_f32x2(dst + 8 * j, acc[j][2 * h], acc[j][2 * h + 1]);
  }
}

// sm_90: the warp's dQ partial into the staging tile ([D / 32][kBlockM][32] fp32: panels of 32 columns, 128-byte
// rows with the 16-byte chunks XORed by row % 8, the layout a 128-byte-swizzled TMA box reads), so the eight rows a
// store instruction writes land in eight bank groups. d_tile0 is a multiple of 4 (n8 tiles 4p .. 4p + 3 make panel p),
// so a lane's row % 8 is g and its chunk within the panel 2 (j % 4) + t / 2: every address is one base plus a
// compile-time offset and one of four XORed chunk terms. Computed per store from the column with signed division and
// modulo, as Cfg::kDqStagePerStore keeps it (below), they cost ~136 more instructions per step at both head dims
// (SASS); that configuration (D = 64, 32 keys per warp, 255 registers) spills 4-8 bytes with the base held.
template <class Cfg>
__device__ __forceinline__ void stage_dq(float* dq_s, const float (&acc)[Cfg::kDqTiles][4], int mtile, int d_tile0,
                                         int lane) {
  static_assert(Cfg::kDqTiles % 4 == 0, "whole 32-column panels per warp");
  const int g = lane >> 2, t = lane & 3;
  unsigned char* tile = reinterpret_cast<unsigned char*>(dq_s);
  if constexpr (Cfg::kDqStagePerStore) {
#pragma unroll
    for (int j = 0; j < Cfg::kDqTiles; ++j) {
      const int col = 8 * (d_tile0 + j) + 2 * t;  // this lane's two columns
      const int panel = col / 32, chunk = (col % 32) / 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * mtile + g + 8 * h;
        *reinterpret_cast<float2*>(tile + panel * Cfg::kBlockM * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) +
                                   8 * (t & 1)) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
      }
    }
  } else {
    const int xor_term = (t >> 1) ^ g;  // (2 (j % 4) + t / 2) XOR g, less the 2 (j % 4)
    unsigned char* base = tile + (d_tile0 / 4) * Cfg::kBlockM * 128 + (16 * mtile + g) * 128 + 8 * (t & 1);
#pragma unroll
    for (int j = 0; j < Cfg::kDqTiles; ++j) {
      const int chunk = (2 * (j % 4)) ^ xor_term;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(base + (j / 4) * Cfg::kBlockM * 128 + h * 8 * 128 + (chunk << 4)) =
            make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
      }
    }
  }
}

// A warp's kWarpKeys rows of dK or dV (C fragments, times `scale`; kAccDTiles n8 tiles of columns from dst's first)
// as T into rows row0 .. of a [S_kv, D] tensor; rows at or past seq_len_kv are not written.
template <class Cfg, class T>
__device__ __forceinline__ void store_rows_t(__half* dst, const float (&acc)[Cfg::kMTiles][Cfg::kAccDTiles][4], float scale,
                                             int row0, int seq_len_kv, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + (lane >> 2) + 8 * h + 16 * mt;
      if (row >= seq_len_kv) continue;
      uint32_t* out = reinterpret_cast<uint32_t*>(dst + static_cast<size_t>(row) * Cfg::kHeadDim) + (lane & 3);
#pragma unroll
      for (int d = 0; d < Cfg::kAccDTiles; ++d)
        out[4 * d] = Element<T>::pack(acc[mt][d][2 * h] * scale, acc[mt][d][2 * h + 1] * scale);
    }
}

}  // namespace fc
