// decode/tile.cuh — the decode rung's consumer warps (decode/decode.cu): each folds its share of every key tile into
// its rows: S = Q K^T on mma.sync m16n8k16 with Q_i's fragments in registers, the softcap (an instantiation of
// its own), the masks (the window's two edges, only on the warp steps they cut), the online softmax,
// and O += P V with the row sums from a column of ones (as common/fa2_fragments.cuh's accumulate_pv), over the panel
// layout below; consume_tiles is the loop over a CTA's run of tiles in the ring.
//
// A warp owns the CTA's 16 query rows (one m16 tile) and kWarpKeys = 16 keys of every tile: two n8 tiles of
// S, one k16 step of P V. Each helper is a template over the tile configuration Cfg (decode/decode.cu's
// DecodeConfig) and reads kHeadDim, kDTiles = kHeadDim / 8, kKChunks = kHeadDim / 16, kPanelBytes, and for
// the loop kBlockN, kWarpKeys, kStages, kStageBytes, kKvBytes.
// A lane holds rows g = lane / 4 and g + 8 (index h = 0, 1) and columns 2t, 2t + 1 (t = lane % 4) of every
// n8 tile (common/mma_sm80.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "decode/split.cuh"
#include "common/fa2_fragments.cuh"
#include "common/family.cuh"
#include "common/mbarrier.cuh"
#include "common/mma_sm80.cuh"
#include "common/primitives.cuh"

namespace fc::decode {

// The panel layout of a K (or V) tile: head_dim / 64 panels of [rows][64 elements], panel p holding columns
// 64p .. 64p + 63 in 128-byte rows whose 16-byte chunks are XOR-swizzled with row % 8. It is exactly what a
// TMA box of 64 columns with the 128-byte swizzle writes (one box per panel), so the cp.async loader writes
// it too, and the eight rows an ldmatrix phase reads (one chunk, eight consecutive rows) fall in eight
// different bank groups. (A 256-byte row, v11's D = 128 layout, is not a shape one TMA box can write.)
template <class Cfg>
__device__ __forceinline__ uint32_t panel_offset(int row, int chunk) {
  return (chunk / 8) * Cfg::kPanelBytes + fc::swizzle(row, chunk % 8, 128);
}

// An ldmatrix lane's offset, within its row, of 16-column step `step` (a k16 chunk of Q K^T, a d-tile
// pair of P V); `half` picks its second 8 columns. Rows are 8-aligned per matrix, so the XOR is lane % 8.
template <class Cfg>
__device__ __forceinline__ uint32_t panel_step(int step, int half, int lane) {
  return (step >> 2) * Cfg::kPanelBytes + fc::ldmatrix_chunk(step & 3, half, lane);
}

// A warp's rows: O_i unnormalised in C fragments, m_i, and two row sums.
template <class Cfg>
struct RowState {
  float o[Cfg::kDTiles][4];
  float m_i[2];     // max of the scores seen (raw, or capped: scale > 0 keeps their order); -inf before any key
  float l_i[2];     // sum of the rounded P that P V multiplied: O's denominator (exact one-hot rows)
  float l_fp32[2];  // sum of the unrounded fp32 P over this lane's columns: the LSE's (quad-summed at the end)
};

template <class Cfg>
__device__ __forceinline__ void init_rows(RowState<Cfg>& st) {
#pragma unroll
  for (int d = 0; d < Cfg::kDTiles; ++d)
#pragma unroll
    for (int r = 0; r < 4; ++r) st.o[d][r] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.m_i[h] = -INFINITY;
    st.l_i[h] = 0.f;
    st.l_fp32[h] = 0.f;
  }
}

// S = Q_i K_j^T over the warp's 16 keys (raw scores; the scale is folded into exp2). k_lane: this lane's
// ldmatrix row of the stage's K tile, (warp key0 + lane % 8 + 8 (lane / 16)) * 128 bytes in.
template <class Cfg, class T>
__device__ __forceinline__ void warp_scores(float (&s)[2][4], const uint32_t (&q)[Cfg::kKChunks][4], uint32_t k_lane,
                                            int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[j][r] = 0.f;
  const int half = (lane >> 3) & 1;  // matrices 1, 3: columns 8..15 of the k16 chunk
#pragma unroll
  for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
    uint32_t b[4];  // b[0], b[1]: keys 0..7; b[2], b[3]: keys 8..15
    fc::ldmatrix_x4(b, k_lane + panel_step<Cfg>(kc, half, lane));
    fc::Element<T>::mma(s[0], q[kc], b[0], b[1]);
    fc::Element<T>::mma(s[1], q[kc], b[2], b[3]);
  }
}

// The keys each of a lane's two rows sees, [first_key, last_key] (row r = g * S + i of a group: query i's
// row_keys), and the warp steps that need no mask: key0 in [clear_lo, clear_lo + clear_span], the steps whose
// kWarpKeys keys every query of the group sees (query S - 1's first key to query 0's last). One unsigned compare
// per step, as the single causal edge had; clear_lo = -1, clear_span = 0 masks every step (none qualifies).
// Host code too, so that a host program can check the masks without a GPU.
struct KeyLimits {
  int first_key[2];
  int last_key[2];
  int clear_lo;
  unsigned clear_span;
  __host__ __device__ __forceinline__ bool cut(int key0) const { return static_cast<unsigned>(key0 - clear_lo) > clear_span; }
};

template <int kWarpKeys>
__host__ __device__ __forceinline__ KeyLimits key_limits(const FlashcoreParams& p, int row0, int lane) {
  KeyLimits lim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const RowKeys k = row_keys(p, (row0 + (lane >> 2) + 8 * h) % p.seq_len);
    lim.first_key[h] = k.first;
    lim.last_key[h] = k.last;
  }
  const int lo = row_keys(p, p.seq_len - 1).first, hi = row_keys(p, 0).last - (kWarpKeys - 1);
  lim.clear_lo = hi >= lo ? lo : -1;
  lim.clear_span = hi >= lo ? static_cast<unsigned>(hi - lo) : 0u;
  return lim;
}

// S = -inf where the key is outside the row's [first_key, last_key] (past S_kv included).
__host__ __device__ __forceinline__ void mask_scores(float (&s)[2][4], int key0, const KeyLimits& lim, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = key0 + 8 * j + 2 * (lane & 3) + (r & 1);
      if (key < lim.first_key[r >> 1] || key > lim.last_key[r >> 1]) s[j][r] = -INFINITY;
    }
}

// S = softcap * tanh(S * scale / softcap) (the raw scores, cap_scale = scale / softcap): the capped scores the
// softmax, the masks and the LSE then take, at exp2's factor log2 e.
__device__ __forceinline__ void cap_scores(float (&s)[2][4], float softcap, float cap_scale) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[j][r] = softcap * fc::tanh_fast(s[j][r] * cap_scale);
}

// m_new = max(m_i, rowmax S); P = exp2(S * scale_log2 - m_new * scale_log2); O = diag(alpha) O,
// l = alpha l with alpha = exp2((m_i - m_new) * scale_log2); then O += P V_j and l_i += rowsum(rounded P).
// v_lane: this lane's ldmatrix row of the stage's V tile, (warp key0 + lane % 8 + 8 ((lane / 8) % 2)) * 128.
template <class Cfg, class T>
__device__ __forceinline__ void softmax_pv(float (&s)[2][4], RowState<Cfg>& st, uint32_t v_lane, float scale_log2,
                                           int lane) {
  float alpha[2];
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_new = fmaxf(st.m_i[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
    m_new = fc::group_max<4>(m_new);
    // From -inf any finite max moves; while both are -inf the row has seen nothing (NaN compares false).
    alpha[h] = 1.f;
    if ((m_new - st.m_i[h]) * scale_log2 > 0.f) {
      alpha[h] = exp2f((st.m_i[h] - m_new) * scale_log2);
      st.m_i[h] = m_new;
      moved = true;
    }
    const float m_scaled = st.m_i[h] == -INFINITY ? 0.f : st.m_i[h] * scale_log2;  // exp2(-inf) = 0, not NaN
    float row_sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 2 * h; c < 2 * h + 2; ++c) {
        s[j][c] = exp2f(fmaf(s[j][c], scale_log2, -m_scaled));
        row_sum += s[j][c];
      }
    st.l_i[h] *= alpha[h];
    st.l_fp32[h] = fmaf(st.l_fp32[h], alpha[h], row_sum);
  }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int d = 0; d < Cfg::kDTiles; ++d) {
      st.o[d][0] *= alpha[0];
      st.o[d][1] *= alpha[0];
      st.o[d][2] *= alpha[1];
      st.o[d][3] *= alpha[1];
    }
  }
  // P's C fragments (n8 tiles 0, 1) packed to T are the A fragment of the k16 step.
  uint32_t pa[4];
  pa[0] = fc::Element<T>::pack(s[0][0], s[0][1]);
  pa[1] = fc::Element<T>::pack(s[0][2], s[0][3]);
  pa[2] = fc::Element<T>::pack(s[1][0], s[1][1]);
  pa[3] = fc::Element<T>::pack(s[1][2], s[1][3]);
  const int half = lane >> 4;  // matrices 2, 3 of a .trans pair: d-tile 2 dp + 1
#pragma unroll
  for (int dp = 0; dp < Cfg::kDTiles / 2; ++dp) {
    uint32_t b[4];  // b[0], b[1]: d-tile 2 dp; b[2], b[3]: d-tile 2 dp + 1
    fc::ldmatrix_x4_trans(b, v_lane + panel_step<Cfg>(dp, half, lane));
    fc::Element<T>::mma(st.o[2 * dp], pa, b[0], b[1]);
    fc::Element<T>::mma(st.o[2 * dp + 1], pa, b[2], b[3]);
  }
  float row_sums[4] = {0.f, 0.f, 0.f, 0.f};  // P times a ones column: c0 = row g, c2 = row g + 8, in every lane
  fc::Element<T>::mma(row_sums, pa, fc::Element<T>::kOnes, fc::Element<T>::kOnes);
  st.l_i[0] += row_sums[0];
  st.l_i[1] += row_sums[2];
}

// A consumer warp's run: for each tile [tile_begin, tile_end) of the ring (stage t % kStages, lap parity as in
// decode/load.cuh), wait for it to land, fold this warp's kWarpKeys keys of it into rows, and release it.
// ring: the shared address of stage 0; Q_i's A fragments in q. scale_log2: exp2's factor on a score (scale *
// log2 e on the raw ones; log2 e on kSoftcap's capped ones, cap_scale = scale / softcap).
template <class Cfg, class T, bool kSoftcap>
__device__ __forceinline__ void consume_tiles(RowState<Cfg>& rows, const uint32_t (&q)[Cfg::kKChunks][4],
                                              uint32_t ring, uint64_t* full, uint64_t* empty, int tile_begin,
                                              int tile_end, const KeyLimits& lim, float scale_log2, float softcap,
                                              float cap_scale, int warp, int lane) {
  // ldmatrix rows of this warp's keys: K as B of Q K^T (lane % 8 + 8 (lane / 16)), V as B of P V (.trans,
  // lane % 8 + 8 ((lane / 8) % 2)).
  const int key_in_tile = warp * Cfg::kWarpKeys;
  const uint32_t k_lane = ring + (key_in_tile + (lane & 7) + (lane >> 4) * 8) * 128;
  const uint32_t v_lane = ring + Cfg::kKvBytes + (key_in_tile + (lane & 7) + ((lane >> 3) & 1) * 8) * 128;
  init_rows(rows);
  int stage = 0;
  uint32_t phase = 0;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    fc::mbarrier_wait_parity(&full[stage], phase);
    const int key0 = tile * Cfg::kBlockN + key_in_tile;
    // S = Q_i K_j^T (capped); -inf past S_kv and outside each row's window: the steps at the window's edges only
    float s[2][4];
    warp_scores<Cfg, T>(s, q, k_lane + stage * Cfg::kStageBytes, lane);
    if constexpr (kSoftcap) cap_scores(s, softcap, cap_scale);
    if (lim.cut(key0)) mask_scores(s, key0, lim, lane);
    // P = exp(S - m_new), O = diag(exp(m_i - m_new)) O + P V_j
    softmax_pv<Cfg, T>(s, rows, v_lane + stage * Cfg::kStageBytes, scale_log2, lane);
    fc::mbarrier_arrive(&empty[stage]);  // this thread's reads of the stage are done
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

}  // namespace fc::decode
