// sm80/epilogue_fwd_sm80.cuh — the end of FlashAttention-2's forward on mma.sync fragments (v11, decode): O_i
// normalised and stored with coalesced 16-byte stores, the row log-sum-exp, and the merge of key-split partials
// (a CTA's key groups in shared memory, or a decode rung's splits) by their (m, l). The main loop's fragment code
// is common/fa2_fragments.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/fa2_fragments.cuh"
#include "common/family.cuh"

namespace fc {

// O's value in the element type, or (kResidual) its rounding residual: what fp32 O loses when rounded to T, so
// that O + residual gives the backward the fp32 O (flashcore.h's o_residual).
template <class T, bool kResidual>
__device__ __forceinline__ uint32_t pack_output(float lo, float hi) {
  if constexpr (kResidual) return Element<T>::pack(lo - Element<T>::round(lo), hi - Element<T>::round(hi));
  return Element<T>::pack(lo, hi);
}

// O_i = diag(1 / l_i) O_i for one warp's kWarpM rows: staged as T in rows tile_row0.. of a swizzled tile that
// only this warp reads, then written to rows row0.. of o ([S, D]) with 16-byte coalesced stores; rows at or past
// seq_len are not written. A training forward (residual not nullptr) also writes O's rounding residual to the
// same rows of `residual`, straight from the fragments (4-byte stores: staging it too would keep O_i live past
// the first copy, and the D = 128 kernel has no registers left for that).
template <class Cfg, class T = __half>
__device__ __forceinline__ void store_warp_rows(unsigned char* tile, int tile_row0, __half* o, __half* residual,
                                                int row0, int seq_len,
                                                const float (&o_acc)[Cfg::kMTiles][Cfg::kDTiles][4],
                                                const float (&l_i)[Cfg::kMTiles][2], int lane) {
  const int g = lane >> 2;   // fragment row (and row + 8)
  const int tq = lane & 3;   // fragment column pair
  __syncwarp();  // every lane's last ldmatrix of those rows is done
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv_l = l_i[mt][h] > 0.f ? 1.f / l_i[mt][h] : 0.f;
      const int row = tile_row0 + mt * 16 + g + 8 * h;
      const int out_row = row0 + mt * 16 + g + 8 * h;
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        const float lo = o_acc[mt][d][2 * h] * inv_l, hi = o_acc[mt][d][2 * h + 1] * inv_l;
        *reinterpret_cast<uint32_t*>(tile + swizzle(row, d, Cfg::kRowBytes) + 4 * tq) = pack_output<T, false>(lo, hi);
        if (residual != nullptr && out_row < seq_len) {
          *reinterpret_cast<uint32_t*>(residual + static_cast<size_t>(out_row) * Cfg::kHeadDim + 8 * d + 2 * tq) =
              pack_output<T, true>(lo, hi);
        }
      }
    }
  __syncwarp();
  constexpr int kWarpChunks = Cfg::kWarpM * Cfg::kChunks;
#pragma unroll
  for (int i = lane; i < kWarpChunks; i += kWarpSize) {
    const int r = i / Cfg::kChunks;
    const int c = i % Cfg::kChunks;
    const int row = row0 + r;
    if (row < seq_len) {
      *reinterpret_cast<uint4*>(o + static_cast<size_t>(row) * Cfg::kHeadDim + c * 8) =
          *reinterpret_cast<const uint4*>(tile + swizzle(tile_row0 + r, c, Cfg::kRowBytes));
    }
  }
}

// A row's log-sum-exp in natural-log units from its max m (in log2 units: S * scale * log2 e) and its sum
// l = sum_j exp2(S_j * scale * log2 e - m): LSE = (m + log2 l) ln 2; +inf for a row that saw no key (l = 0),
// so that a backward's P = exp(S - LSE) is 0 there.
__device__ __forceinline__ float row_lse(float m_log2, float l) {
  return l > 0.f ? (m_log2 + __log2f(l)) * 0.6931471805599453f : INFINITY;
}

// A row's end in log2 units from its max m2 (log2 units, -inf when it saw no key) and l = sum_j exp2(s2_j - m2):
// returns its LSE times log2 e (+inf for a row that saw no key, where it has no sink) and sets o_scale, the factor
// that turns its accumulator into O: 1 / l (0 for l = 0) without a sink, fc::finish_row_log2's with one (sink2:
// the head's sink logit times log2 e).
__device__ __forceinline__ float row_end_log2(float m2, float l, bool has_sink, float sink2, float& o_scale) {
  if (has_sink) return finish_row_log2(m2, l, sink2, o_scale);
  o_scale = l > 0.f ? 1.f / l : 0.f;
  return l > 0.f ? m2 + __log2f(l) : INFINITY;
}

// The sink of query head bh % heads (bh = b H + h) times log2 e, where the call has sinks (-inf otherwise: unused).
__device__ __forceinline__ float sink_log2(const float* sinks, int bh, int heads) {
  return sinks != nullptr ? sinks[bh % heads] * 1.4426950408889634f : -INFINITY;
}

// A sink (sink2: its logit times log2 e) folded into the warp's row state in place, so that store_warp_rows and
// store_warp_lse then write O and the LSE with it: l_i += exp2(sink2 - m_i scale_log2) for a row that saw a key (O's
// factor 1 / l_i and LSE = m + log2 l as fc::finish_row_log2 gives them, unless the sink exceeds the row's max by
// more than 2^7 in log2 units, ~88 nats, where l overflows: O = 0 as it should be, but LSE = +inf); a row that saw no
// key gets l_i = 1 and m_i = sink2 / scale_log2, so O = 0 (its accumulator is 0) and LSE = the sink (+inf where the
// sink is -inf).
template <class Cfg>
__device__ __forceinline__ void fold_warp_sink(float (&m_i)[Cfg::kMTiles][2], float (&l_i)[Cfg::kMTiles][2],
                                               float scale_log2, float sink2) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (l_i[mt][h] > 0.f) {
        l_i[mt][h] += exp2f(sink2 - m_i[mt][h] * scale_log2);
      } else if (sink2 > -INFINITY) {  // a sink of -inf is none: the row keeps l = 0, LSE = +inf
        l_i[mt][h] = 1.f;
        m_i[mt][h] = sink2 / scale_log2;
      }
    }
}

// The warp's rows' LSE ([S] of this head) from its row state (m_i in raw-score units), one lane per row.
template <class Cfg>
__device__ __forceinline__ void store_warp_lse(float* lse, int row0, int seq_len, const float (&m_i)[Cfg::kMTiles][2],
                                               const float (&l_i)[Cfg::kMTiles][2], float scale_log2, int lane) {
  if ((lane & 3) != 0) return;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * h;
      if (row < seq_len) lse[row] = row_lse(m_i[mt][h] * scale_log2, l_i[mt][h]);
    }
}

// The split kernels' partials: each warp's unnormalised (m_i, l_i, O_i) rows into shared memory, row
// `group * kBlockM + r` of stats ([kSplit][kBlockM] float2: m_i * scale log2 e, l_i) and of o_part
// ([kSplit][kBlockM][kOStride] fp32).
template <class Cfg>
__device__ __forceinline__ void store_partials(float2* stats, float* o_part,
                                               const float (&o)[Cfg::kMTiles][Cfg::kDTiles][4],
                                               const float (&m_i)[Cfg::kMTiles][2], const float (&l_i)[Cfg::kMTiles][2],
                                               int group, int row_warp, float scale_log2, int lane) {
  const int g = lane >> 2;
  const int tq = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = group * Cfg::kBlockM + row_warp * Cfg::kWarpM + mt * 16 + g + 8 * h;
      if (tq == 0) stats[row] = make_float2(m_i[mt][h] * scale_log2, l_i[mt][h]);
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        *reinterpret_cast<float2*>(o_part + row * Cfg::kOStride + 8 * d + 2 * tq) =
            make_float2(o[mt][d][2 * h], o[mt][d][2 * h + 1]);
      }
    }
}

// Columns 8c .. 8c + 7 of one row merged over kParts partials, part p present when p < n: stat(p) gives its
// (m, l) with m in log2 units, row(p) its unnormalised O row. Returns m = max_p m_p (-inf when no part saw
// a key) and leaves l = sum_p exp2(m_p - m) l_p and acc = sum_p exp2(m_p - m) O_p; with m = -inf every
// weight is 0, not NaN.
template <int kParts, class Stat, class Row>
__device__ __forceinline__ float merge_parts(int n, Stat stat, Row row, int c, float& l_all, float (&acc)[8]) {
  float m_all = -INFINITY;
#pragma unroll
  for (int sp = 0; sp < kParts; ++sp)
    if (sp < n) m_all = fmaxf(m_all, stat(sp).x);
  const float m_ref = m_all == -INFINITY ? 0.f : m_all;
  l_all = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
#pragma unroll
  for (int sp = 0; sp < kParts; ++sp) {
    if (sp < n) {
      const float2 st = stat(sp);
      const float w = exp2f(st.x - m_ref);
      l_all += w * st.y;
      const float4* part = reinterpret_cast<const float4*>(row(sp) + c * 8);
      const float4 lo = part[0];
      const float4 hi = part[1];
      acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
      acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
    }
  }
  return m_all;
}

// The split CTA's output, once every group's partials are in stats / o_part (store_partials, then a
// barrier): one thread per (row, 8 columns) merges the kSplit groups, normalises and writes 16 bytes of
// rows m0.. of o ([S, D]), and of its rounding residual where residual is not nullptr; rows at or past
// seq_len are not written. Where sinks is not nullptr, the sink of query head bh % heads joins each merged row's end.
template <class Cfg, class T = __half>
__device__ __forceinline__ void merge_split_rows(const float2* stats, const float* o_part, __half* o, __half* residual,
                                                 int m0, int seq_len, int tid, const float* sinks, int bh, int heads) {
  const bool has_sink = sinks != nullptr;
  const float sink2 = sink_log2(sinks, bh, heads);
  constexpr int kBlockChunks = Cfg::kBlockM * Cfg::kChunks;
  for (int i = tid; i < kBlockChunks; i += Cfg::kThreads) {
    const int r = i / Cfg::kChunks;
    const int c = i % Cfg::kChunks;
    if (m0 + r >= seq_len) continue;
    float l_all;
    float acc[8];
    const float m_all = merge_parts<Cfg::kSplit>(
        Cfg::kSplit, [&](int sg) { return stats[sg * Cfg::kBlockM + r]; },
        [&](int sg) { return o_part + (sg * Cfg::kBlockM + r) * Cfg::kOStride; }, c, l_all, acc);
    float inv_l;
    row_end_log2(m_all, l_all, has_sink, sink2, inv_l);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] *= inv_l;
    const size_t at = static_cast<size_t>(m0 + r) * Cfg::kHeadDim + c * 8;
    *reinterpret_cast<uint4*>(o + at) = make_uint4(pack_output<T, false>(acc[0], acc[1]), pack_output<T, false>(acc[2], acc[3]),
                                                   pack_output<T, false>(acc[4], acc[5]), pack_output<T, false>(acc[6], acc[7]));
    if (residual != nullptr) {
      *reinterpret_cast<uint4*>(residual + at) =
          make_uint4(pack_output<T, true>(acc[0], acc[1]), pack_output<T, true>(acc[2], acc[3]),
                     pack_output<T, true>(acc[4], acc[5]), pack_output<T, true>(acc[6], acc[7]));
    }
  }
}

// The split CTA's LSE ([S] of this head, rows m0..): each row's groups merged as in merge_split_rows, stats only.
template <class Cfg>
__device__ __forceinline__ void merge_split_lse(const float2* stats, float* lse, int m0, int seq_len, int tid,
                                                const float* sinks, int bh, int heads) {
  const bool has_sink = sinks != nullptr;
  const float sink2 = sink_log2(sinks, bh, heads);
  for (int r = tid; r < Cfg::kBlockM && m0 + r < seq_len; r += Cfg::kThreads) {
    float m_all = -INFINITY;
#pragma unroll
    for (int sg = 0; sg < Cfg::kSplit; ++sg) m_all = fmaxf(m_all, stats[sg * Cfg::kBlockM + r].x);
    const float m_ref = m_all == -INFINITY ? 0.f : m_all;
    float l_all = 0.f;
#pragma unroll
    for (int sg = 0; sg < Cfg::kSplit; ++sg) {
      const float2 st = stats[sg * Cfg::kBlockM + r];
      l_all += exp2f(st.x - m_ref) * st.y;
    }
    float o_scale;
    lse[m0 + r] = row_end_log2(m_all, l_all, has_sink, sink2, o_scale) * 0.6931471805599453f;
  }
}

}  // namespace fc
