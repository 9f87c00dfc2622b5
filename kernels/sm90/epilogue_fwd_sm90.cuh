// sm90/epilogue_fwd_sm90.cuh — v12's epilogue, one consumer warpgroup's rows of an item: O / l rounded to T into the
// warpgroup's rows of O's staging tile (Q_i's swizzled layout), the row LSE (and O's rounding residual where a
// training forward asks for it: flashcore.h's o_residual), then one TMA store per 64-column panel, which clips
// rows past S. O has a tile of its own, so the next item's Q_i lands meanwhile; the first barrier waits for this
// warpgroup's previous store to have read it. With sinks (p.sinks), the query head's sink joins each row's
// denominator here (fc::finish_row_log2): O's factor and the LSE take it; without, the plain code (a uniform branch).
#pragma once

#include "sm90/consumer_sm90.cuh"
#include "flashcore.h"
#include "common/family.cuh"
#include "common/hopper.cuh"
#include "sm90/v12_traits.cuh"

#include <cstdint>

template <class Cfg, typename T>
__device__ __forceinline__ void store_rows(const FlashcoreParams& p, const Maps& maps, unsigned char* smem,
                                           const float (&o)[Cfg::kOCols / 2], const RowState& st, int g, int bh,
                                           int first_row, int tid, int r_local) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockM = Cfg::kBlockM;
  const int epilogue_barrier = kSchedBarrier + Cfg::kConsumers + g;
  unsigned char* rows_base = smem + Cfg::kOOffset + 64 * g * 128;
  // O's factor per row: 1 / l (0 for a row that saw no key, l = 0); with a sink exp2(m - LSE), l having gained
  // exp(sink - m) (flashcore.h), and lse2 that LSE in log2 units for the store below.
  float o_scale[2], lse2[2];
  if (p.sinks != nullptr) {
    const float sink2 = p.sinks[bh % p.heads] * 1.4426950408889634f;  // the query head's sink, in log2 units
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lse2[h] = fc::finish_row_log2(st.m[h], o[4 * (kHeadDim / 8) + 2 * h], sink2, o_scale[h]);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = o[4 * (kHeadDim / 8) + 2 * h];  // every lane holds its rows' l in the ones columns
      o_scale[h] = l > 0.f ? 1.f / l : 0.f;
      lse2[h] = 0.f;  // the LSE below, from l
    }
  }
  fc::named_barrier_sync(epilogue_barrier, fc::kWarpgroupThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r_local + 8 * h;
    const float inv_l = o_scale[h];
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int col = 8 * j + 2 * (tid % 4);
      const int panel = col / 64, chunk = (col % 64) / 8, within = (col % 8) * 2;
      unsigned char* dst = rows_base + panel * kBlockM * 128 + r * 128 + ((chunk ^ (r % 8)) * 16) + within;
      *reinterpret_cast<uint32_t*>(dst) = pack2<T>(o[4 * j + 2 * h] * inv_l, o[4 * j + 2 * h + 1] * inv_l);
    }
  }
  if (p.lse != nullptr && tid % 4 == 0) {
    // LSE = log(sum_j exp(S_ij * scale)) = (m + log2 l) ln 2, m being in log2 units of the (capped) score; +inf
    // for a row that sees no key (l = 0), or its sink. One lane of the quad that shares a row writes it; rows past
    // S are not. l sums P rounded to T, as O's normalization does, so LSE carries that rounding: at worst T's unit
    // roundoff in l (2^-11 fp16, 2^-8 bf16: 5e-4 and 4e-3 in LSE, rounding all one way), not fp32 row sums' 1e-7.
    float* lse = p.lse + static_cast<size_t>(bh) * p.seq_len;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + r_local + 8 * h;
      const float l = o[4 * (kHeadDim / 8) + 2 * h];
      const float lse_log2 = p.sinks != nullptr ? lse2[h] : (l > 0.f ? st.m[h] + __log2f(l) : INFINITY);
      if (row < p.seq_len) lse[row] = lse_log2 * 0.6931471805599453f;
    }
  }
  if (p.o_residual != nullptr) {  // a training forward: what the rounding of O dropped, for the backward's D
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + r_local + 8 * h;
      const float inv_l = o_scale[h];
      if (row >= p.seq_len) continue;
      T* res = fc::tensor<T>(p.o_residual) + (static_cast<size_t>(bh) * p.seq_len + row) * kHeadDim;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const float a = o[4 * j + 2 * h] * inv_l, b = o[4 * j + 2 * h + 1] * inv_l;
        const float2 kept = unpack2<T>(pack2<T>(a, b));
        *reinterpret_cast<uint32_t*>(res + 8 * j + 2 * (tid % 4)) = pack2<T>(a - kept.x, b - kept.y);
      }
    }
  }
  fc::fence_proxy_async_shared();  // the generic-proxy writes above, before the TMA's reads
  fc::named_barrier_sync(epilogue_barrier, fc::kWarpgroupThreads);
  if (tid == 0) {
#pragma unroll
    for (int panel = 0; panel < Cfg::kPanels; ++panel) {
      fc::tma_store_4d(&maps.o, 0, first_row, panel, bh, rows_base + panel * kBlockM * 128);
    }
    fc::tma_store_commit();
    fc::tma_store_wait_read<0>();
  }
}
