// sm90/consumer_sm90.cuh — the steps of v12's consumer warpgroups: the online softmax on wgmma's accumulator layout
// (soft-capped where the call asks, masked where a tile needs it), P packed into wgmma A fragments, the two GEMMs
// (S = Q K^T from shared memory, O += P V with P from registers) and a ring slot's release.
#pragma once

#include "flashcore.h"
#include "common/family.cuh"
#include "common/hopper.cuh"

#include <cstdint>

// Row state of one thread: it owns rows r and r + 8 of its warp's 16 (see common/hopper.cuh's fragment layout).
struct RowState {
  float m[2];  // running max of the score in log2 units (S * scale * log2(e), or the capped score's) per row
               // (l lives in O's extra columns)
};

// P = exp2(S * c - m) for one score tile in place, with the mask applied first where the tile needs it;
// returns each row's rescale factor exp2(m_old - m_new) and updates m. Needs c > 0 (max commutes).
// kSoftcap: S becomes tanh(S * cap_in) first (cap_in = scale / cap, and c = cap * log2(e)): the capped score
// cap * tanh(S * scale / cap) in log2 units is then S * c again, and the mask, max and exp2 below run on it.
// diag0: this thread's first row's diagonal key (its row + S_kv - S; its second row's is + 8). The mask keeps key
// col of a row with diagonal diag iff diag - window_left <= col <= diag + window_right (a bound < 0: none) and
// col < S_kv (fc::key_visible), each bound compared so that a window up to 2^31 - 1 does not overflow.
// kMask: which of those bounds the tile needs (kMaskLeft | kMaskRight; 0: none): a tile that lies right of every
// row's first key needs only the right one (the diagonal under causal), one left of every row's end only the left
// one (a window's left edge), so each masked element costs one compare, not two (mask_edges says which).
constexpr int kMaskLeft = 1, kMaskRight = 2;
template <int kBlockN, int kMask, bool kSoftcap>
__device__ __forceinline__ void online_softmax(float (&s)[kBlockN / 2], RowState& st, float (&alpha)[2], float c,
                                               float cap_in, int diag0, int col0, const FlashcoreParams& p) {
  if (kSoftcap) {  // before the mask: tanh(-inf) would make a masked score -cap
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = fc::tanh_fast(s[i] * cap_in);
  }
  if (kMask) {  // -inf outside each row's keys [lo, hi], as offsets from this thread's first column
    const int base = col0 + 2 * (threadIdx.x % 4);
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int diag = diag0 + 8 * h;
      const int last_key = p.seq_len_kv - 1;
      const bool to_end = p.window_right < 0 || diag >= last_key - p.window_right;
      const bool from_start = p.window_left < 0 || diag <= p.window_left;
      lo[h] = (from_start ? 0 : diag - p.window_left) - base;
      hi[h] = (to_end ? last_key : diag + p.window_right) - base;
    }
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int off = 8 * j + (e & 1);
        const bool cut = ((kMask & kMaskLeft) && off < lo[e >> 1]) || ((kMask & kMaskRight) && off > hi[e >> 1]);
        if (cut) s[4 * j + e] = -INFINITY;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // m_new = max(m_old, rowmax(S) * c) over the quad that shares a row
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(st.m[h], fc::group_max<4>(mx) * c);
    // A row with nothing visible yet keeps m = -inf; subtract 0 then so that exp2 gives 0, not NaN (its P is all
    // 0, and alpha = 0 once a later tile shows it a key; a row that never sees one ends with O = 0 and l = 0).
    const float m_use = mx == -INFINITY ? 0.f : mx;
    alpha[h] = exp2f(st.m[h] - m_use);
    st.m[h] = mx;
    // P = exp2(S * c - m), one FFMA each. At the row's max this leaves the rounding of m (up to 2^-24 |m|,
    // 3e-4 at |S * c| ~ 1e4), a factor common to the whole row that cancels against l (same fp16 P).
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      s[4 * j + 2 * h] = exp2f(fmaf(s[4 * j + 2 * h], c, -m_use));
      s[4 * j + 2 * h + 1] = exp2f(fmaf(s[4 * j + 2 * h + 1], c, -m_use));
    }
  }
}

// Two floats rounded to one packed pair of the element type T (__half or __nv_bfloat16), and T's 1.0 twice.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The pair back in fp32 (what the rounding kept).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}
template <typename T>
constexpr uint32_t kOnePair = 0x3C003C00u;  // fp16 1.0, 1.0
template <>
constexpr uint32_t kOnePair<__nv_bfloat16> = 0x3F803F80u;  // bf16 1.0, 1.0

// The P tile as wgmma A fragments: k-step kk packs score chunks 2kk and 2kk + 1 (no shuffles needed).
template <typename T, int kBlockN>
__device__ __forceinline__ void pack_p(const float (&s)[kBlockN / 2], uint32_t (&pa)[kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * kk + half;
      pa[kk][2 * half] = pack2<T>(s[4 * j], s[4 * j + 1]);
      pa[kk][2 * half + 1] = pack2<T>(s[4 * j + 2], s[4 * j + 3]);
    }
  }
}

// S = Q_i K_j^T for this warpgroup's 64 rows: kHeadDim / 16 k-steps, both operands K-major in 128-byte
// panels (a k-step moves 32 bytes along the row; every 4 steps the next panel). Descriptors are built once
// per tile base and stepped by adding the byte offset >> 4 to their start-address field.
template <typename T, int kHeadDim, int kBlockN, int kBlockM>
__device__ __forceinline__ void gemm_qk(float (&s)[kBlockN / 2], uint64_t desc_q, uint64_t desc_k) {
  fc::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const int panel = kk / 4, within = (kk % 4) * 32;
    fc::wgmma_ss<kBlockN, T>(s, desc_q + ((panel * kBlockM * 128 + within) >> 4),
                          desc_k + ((panel * kBlockN * 128 + within) >> 4), kk > 0);
  }
  fc::wgmma_commit();
}

// O += P V_j: kBlockN / 16 k-steps over the keys; V is read transposed (N-major: its rows are keys, its
// 64-column panels lie kBlockN * 128 bytes apart), 16 keys = 2048 bytes per step.
template <typename T, int kOCols, int kBlockN>
__device__ __forceinline__ void gemm_pv(float (&o)[kOCols / 2], const uint32_t (&pa)[kBlockN / 16][4], uint64_t desc_v) {
  fc::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) fc::wgmma_rs<kOCols, T>(o, pa[kk], desc_v + ((kk * 2048) >> 4), 1);
  fc::wgmma_commit();
}

// One consumer warpgroup releases a ring slot: lane 0 of each of its warps arrives (count 4 per consumer).
__device__ __forceinline__ void release(uint64_t* bar) {
  if (threadIdx.x % 32 == 0) fc::mbarrier_arrive(bar);
}
