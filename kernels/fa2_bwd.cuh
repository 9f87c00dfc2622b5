// fa2_bwd.cuh — FlashAttention-2's backward, the warp's part, on mma.sync m16n8k16 fragments (v11's backward).
//
// The CTA holds a block of keys K_j, V_j (kBlockN rows, 16 per warp) and walks the query blocks Q_i, dO_i
// (kBlockM rows) that can see them. A warp computes its 16 keys' rows of the TRANSPOSED score tile,
//   S^T = K_j Q_i^T  and  dP^T = V_j dO_i^T                  (16 keys x kBlockM queries, fp32 C fragments)
// so that the C fragments, packed to 16 bits, are directly the A fragments of the two products whose rows
// are keys (the same register identity v11's forward uses for P V):
//   P^T = exp(S^T * scale - LSE)          dS^T = P^T o (dP^T - D),  D = rowsum(dO o O)
//   dV_j += P^T dO_i                      dK_j += dS^T Q_i   (times scale at the end)
// dQ_i = dS K_j needs dS with queries as rows: the warps store dS^T to shared memory (16-bit, swizzled), meet,
// and each warp multiplies its share of dQ_i by K_j from shared memory (ldmatrix .trans on both), adding the
// fp32 result to the dQ accumulator in global memory (red.add: other key blocks add to the same rows).
//
// Fragment and swizzle conventions: mma_sm80.cuh; the forward's helpers (warp_scores) are reused with a
// configuration whose "Q" is the warp's 16 key rows. Cfg members read here (v11_bwd.cu's V11BwdConfig):
//   kHeadDim, kBlockN (keys per CTA), kBlockM (queries per step), kNTiles = kBlockM / 8, kDTiles = kHeadDim / 8,
//   kRowBytes = 2 kHeadDim, kDsRowBytes = 2 kBlockM, kDqTiles (n8 tiles of dQ per warp), kDqMTiles (m16 tiles
//   of queries in a block).
#pragma once

#include "fa2_mma.cuh"

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

// -inf where key > query + offset (causal, bottom-right): only blocks crossing the diagonal call it. The
// tile is the warp's 16 keys from key0 against the queries q0 .. q0 + kBlockM - 1.
template <class Cfg>
__device__ __forceinline__ void mask_causal_t(float (&s)[1][Cfg::kNTiles][4], int key0, int q0, int offset, int lane) {
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = key0 + (lane >> 2) + 8 * (r >> 1);
      const int query = q0 + 8 * j + 2 * (lane & 3) + (r & 1);
      if (key > query + offset) s[0][j][r] = -INFINITY;
    }
}

// P^T = exp2(S^T * scale_log2 - LSE_q log2 e) in place (lse2: the step's [kBlockM] LSE * log2 e, +inf for
// padding rows, so their P is 0); then dS^T = P^T o (dP^T - D_q) into dp (dsum: the step's [kBlockM] D).
template <class Cfg>
__device__ __forceinline__ void probabilities_and_ds_t(float (&s)[1][Cfg::kNTiles][4], float (&dp)[1][Cfg::kNTiles][4],
                                                       const float* lse2, const float* dsum, float scale_log2,
                                                       int lane) {
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
    const float2 l = *reinterpret_cast<const float2*>(lse2 + col);
    const float2 d = *reinterpret_cast<const float2*>(dsum + col);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float p = exp2f(fmaf(s[0][j][r], scale_log2, -((r & 1) ? l.y : l.x)));
      s[0][j][r] = p;
      dp[0][j][r] = p * (dp[0][j][r] - ((r & 1) ? d.y : d.x));
    }
  }
}

// acc (16 keys x D) += A B, where A is the warp's 16 x kBlockM tile in C fragments (P^T or dS^T), packed to T
// (n8 tiles 2 kk and 2 kk + 1 make k16 step kk over the queries), and B is [kBlockM][D] in shared memory (dO_i or
// Q_i) read by ldmatrix .trans from b_lane (the tile's base plus this lane's row (lane % 8) + 8 ((lane / 8) % 2)).
template <class Cfg, class T>
__device__ __forceinline__ void accumulate_t(const float (&a)[1][Cfg::kNTiles][4], float (&acc)[Cfg::kDTiles][4],
                                             uint32_t b_lane, int lane) {
  const int b_chunk = lane >> 4;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk) {
    uint32_t pa[4];
    pa[0] = Element<T>::pack(a[0][2 * kk][0], a[0][2 * kk][1]);
    pa[1] = Element<T>::pack(a[0][2 * kk][2], a[0][2 * kk][3]);
    pa[2] = Element<T>::pack(a[0][2 * kk + 1][0], a[0][2 * kk + 1][1]);
    pa[3] = Element<T>::pack(a[0][2 * kk + 1][2], a[0][2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < Cfg::kDTiles / 2; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_lane + kk * 16 * Cfg::kRowBytes + ldmatrix_chunk(dp, b_chunk, lane));
      Element<T>::mma(acc[2 * dp], pa, b[0], b[1]);
      Element<T>::mma(acc[2 * dp + 1], pa, b[2], b[3]);
    }
  }
}

// The warp's dS^T rows (keys row0 .. row0 + 15) as T into the dS^T tile: lane (g, t) writes keys g and g + 8,
// queries 2t and 2t + 1 of every n8 tile (one 4-byte store each).
template <class Cfg, class T>
__device__ __forceinline__ void store_ds_t(unsigned char* tile, const float (&ds)[1][Cfg::kNTiles][4], int row0,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<uint32_t*>(tile + ds_offset<Cfg::kDsRowBytes>(row0 + g + 8 * h, j) + 4 * t) =
          Element<T>::pack(ds[0][j][2 * h], ds[0][j][2 * h + 1]);
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
// store instruction writes land in eight bank groups.
template <class Cfg>
__device__ __forceinline__ void stage_dq(float* dq_s, const float (&acc)[Cfg::kDqTiles][4], int mtile, int d_tile0,
                                         int lane) {
  unsigned char* base = reinterpret_cast<unsigned char*>(dq_s);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < Cfg::kDqTiles; ++j) {
    const int col = 8 * (d_tile0 + j) + 2 * t;  // this lane's two columns
    const int panel = col / 32, chunk = (col % 32) / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mtile + g + 8 * h;
      *reinterpret_cast<float2*>(base + panel * Cfg::kBlockM * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) +
                                 8 * (t & 1)) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
    }
  }
}

// A warp's 16 rows of dK or dV (C fragments, times `scale`) as T into rows row0 .. of a [S_kv, D] tensor; rows
// at or past seq_len_kv are not written.
template <class Cfg, class T>
__device__ __forceinline__ void store_rows_t(__half* dst, const float (&acc)[Cfg::kDTiles][4], float scale, int row0,
                                             int seq_len_kv, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + (lane >> 2) + 8 * h;
    if (row >= seq_len_kv) continue;
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + static_cast<size_t>(row) * Cfg::kHeadDim) + (lane & 3);
#pragma unroll
    for (int d = 0; d < Cfg::kDTiles; ++d) out[4 * d] = Element<T>::pack(acc[d][2 * h] * scale, acc[d][2 * h + 1] * scale);
  }
}

}  // namespace fc
