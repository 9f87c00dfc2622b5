// ladder/v9_consumer.cuh — v9's consumer warp: its query rows end to end (Q_i into registers, the main loop over the
// ring's tiles with the online softmax and P V, the key-split pair's merge of (m, l, O), the O store). The
// pieces it calls are ladder/v9_warp.cuh's; the ring's barriers and layout ladder/v9_traits.cuh's.
#pragma once

#include "common/mbarrier.cuh"
#include "common/primitives.cuh"
#include "ladder/v9_traits.cuh"
#include "ladder/v9_warp.cuh"

#include <cmath>

// Consumer warp: owns its query rows end to end (Q_i load, every tile of its key slice, O_i store). S and P
// go through its private scratch, so consumer warps never wait for one another inside the loop.
template <int kHeadDim, int kKeySplit>
__device__ __forceinline__ void consume_kv(const FlashcoreParams& p,
                                           const __half* __restrict__ q,  // [S, D] of this (b, h)
                                           __half* __restrict__ o,        // [S, D]
                                           const __half* K_ring,          // [kStages][kBlockN][kKvStride]
                                           const __half* V_ring,          // [kStages][kBlockN][kKvStride]
                                           unsigned char* scratch_base,   // [kConsumerWarps][kScratchBytes]
                                           uint64_t* full, uint64_t* empty, int row0, int n_tiles, int warp,
                                           int lane) {
  using namespace nvcuda;
  using C = Config<kHeadDim, kKeySplit>;
  using L = SmemLayout<kHeadDim, kKeySplit>;
  constexpr int kRowFrags = C::kRowFrags;
  constexpr int kDFrags = C::kDFrags;
  constexpr int kNFrags = C::kNFrags;
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kColsPerLane = C::kSliceN / 2;  // softmax: lanes 2r and 2r + 1 share row r, 4 columns of 8 each

  const int row_warp = warp % C::kRowWarps;
  const int key_half = warp / C::kRowWarps;     // which key slice of every tile (always 0 without the split)
  const int qr0 = row0 + row_warp * C::kWarpRows;  // this warp's first query row
  const int first_key = key_half * C::kSliceN;         // this warp's first key within a tile
  float* scratch = reinterpret_cast<float*>(scratch_base + warp * L::kScratchBytes);
  __half* Q_w = reinterpret_cast<__half*>(scratch);  // [16 kRowFrags][kQStride]
  float* S_w = scratch;                              // [16 kRowFrags][kSStride]
  __half* P_w = reinterpret_cast<__half*>(scratch);  // [16 kRowFrags][kPStride]
  auto K_slice = [&](int t) {  // [kSliceN][kKvStride]
    return K_ring + ((t % L::kStages) * C::kBlockN + first_key) * L::kKvStride;
  };
  auto V_slice = [&](int t) {  // [kSliceN][kKvStride]
    return V_ring + ((t % L::kStages) * C::kBlockN + first_key) * L::kKvStride;
  };
  auto wait_full = [&](int t) {  // then reconverge: the WMMA calls that follow are warp-wide
    fc::mbarrier_wait_parity(&full[t % L::kStages], (t / L::kStages) & 1);
    __syncwarp();
  };
  // Every consumer thread arrives: an arrive releases only the arriving thread's own reads.
  auto release = [&](int t) { fc::mbarrier_arrive(&empty[t % L::kStages]); };

  // Q_i: this warp's rows, zero past the sequence end, into registers for the whole loop
  for (int c = lane; c < C::kWarpRows * kChunksPerRow; c += fc::kWarpSize) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = qr0 + r < p.seq_len;
    fc::cp_async_16(Q_w + r * L::kQStride + col, q + (valid ? static_cast<size_t>(qr0 + r) * kHeadDim : 0) + col,
                    valid);
  }
  fc::cp_async_commit();
  fc::cp_async_wait<0>();
  __syncwarp();
  RowFrag q_frag[kRowFrags][kDFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
    for (int kk = 0; kk < kDFrags; ++kk) {
      wmma::load_matrix_sync(q_frag[rf][kk], Q_w + rf * kFrag * L::kQStride + kk * kFrag, L::kQStride);
    }
  }
  __syncwarp();

  // Which of the 16 rows each accumulator element holds: WMMA leaves the mapping unspecified but fixed for a
  // fragment type, so load a matrix whose entries are their own row index. Scaling O_i's rows is then a
  // shuffle from the softmax lane that owns the row, with no round trip through shared memory.
  for (int i = lane; i < kFrag * kFrag; i += fc::kWarpSize) scratch[(i / kFrag) * kOStride + i % kFrag] = i / kFrag;
  __syncwarp();
  AccFrag probe;
  wmma::load_matrix_sync(probe, scratch, kOStride, wmma::mem_row_major);
  int owner_lane[AccFrag::num_elements];  // the softmax lane (2 r) of element i's row r
#pragma unroll
  for (int i = 0; i < AccFrag::num_elements; ++i) owner_lane[i] = 2 * static_cast<int>(probe.x[i]);
  __syncwarp();

  const int my_row = lane / 2;        // softmax: the row of each row fragment this lane reduces
  const int my_col = (lane % 2) * 4;  // and its first column within every group of 8
  const float scale_log2 = p.scale * static_cast<float>(M_LOG2E);
  float m_i[kRowFrags];  // running row max of S * scale, log2 units (same in both lanes of a row)
  float l_i[kRowFrags];  // this lane's share of the running row sum of P
  AccFrag o_frag[kRowFrags][kDFrags];
  AccFrag s_frag[kRowFrags][kNFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
    m_i[rf] = -INFINITY;
    l_i[rf] = 0.f;
#pragma unroll
    for (int n = 0; n < kDFrags; ++n) wmma::fill_fragment(o_frag[rf][n], 0.f);
  }

  // Softmax and P V of tile t, whose S is in s_frag; with a next tile, its S is computed into s_frag meanwhile.
  auto softmax_pv = [&](int t, auto next) {
    constexpr bool kHasNext = decltype(next)::value;
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int n = 0; n < kNFrags; ++n) {
        wmma::store_matrix_sync(S_w + rf * kFrag * L::kSStride + n * kFrag, s_frag[rf][n], L::kSStride,
                                wmma::mem_row_major);
      }
    }
    __syncwarp();
    if constexpr (kHasNext) wait_full(t + 1);

    // m_new = max(m_i, rowmax(S * scale)), masked past the sequence end and (causal) past the diagonal
    const int key0 = t * C::kBlockN + first_key;  // this warp's first key of tile t
    float x[kRowFrags][kColsPerLane];
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int g = 0; g < kColsPerLane / 4; ++g) {
        const float4 s4 =
            *reinterpret_cast<const float4*>(S_w + (rf * kFrag + my_row) * L::kSStride + g * 8 + my_col);
        x[rf][4 * g + 0] = s4.x * scale_log2;
        x[rf][4 * g + 1] = s4.y * scale_log2;
        x[rf][4 * g + 2] = s4.z * scale_log2;
        x[rf][4 * g + 3] = s4.w * scale_log2;
      }
    }
    if (key0 + C::kSliceN > p.seq_len || (p.causal && key0 + C::kSliceN - 1 > qr0)) {  // warp-uniform
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        const int row = qr0 + rf * kFrag + my_row;
        const int key_end = p.causal ? min(p.seq_len, row + 1) : p.seq_len;
#pragma unroll
        for (int j = 0; j < kColsPerLane; ++j) {
          if (key0 + (j / 4) * 8 + my_col + j % 4 >= key_end) x[rf][j] = -INFINITY;
        }
      }
    }
    if constexpr (kHasNext) warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(t + 1));

    // P = exp(S * scale - m_new); l_i = alpha l_i + rowsum(P)
    float alpha[kRowFrags];
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
      float m_tile = tree_max(x[rf]);
      m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
      const float m_new = fmaxf(m_i[rf], m_tile);
      const float m_base = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: no (-inf) - (-inf)
      alpha[rf] = exp2f(m_i[rf] - m_base);
#pragma unroll
      for (int j = 0; j < kColsPerLane; ++j) x[rf][j] = exp2f(x[rf][j] - m_base);
      l_i[rf] = l_i[rf] * alpha[rf] + tree_sum(x[rf]);
      m_i[rf] = m_new;
    }
    __syncwarp();  // every lane has read its scores before P overwrites them
#pragma unroll
    for (int rf = 0; rf < kRowFrags; ++rf) {
#pragma unroll
      for (int g = 0; g < kColsPerLane / 4; ++g) {
        const uint2 packed = {fc::pack_half2(x[rf][4 * g], x[rf][4 * g + 1]),
                              fc::pack_half2(x[rf][4 * g + 2], x[rf][4 * g + 3])};
        *reinterpret_cast<uint2*>(P_w + (rf * kFrag + my_row) * L::kPStride + g * 8 + my_col) = packed;
      }
    }
    __syncwarp();

    // O_i = diag(alpha) O_i + P V_j
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        const float a = __shfl_sync(0xffffffffu, alpha[rf], owner_lane[i]);
#pragma unroll
        for (int n = 0; n < kDFrags; ++n) o_frag[rf][n].x[i] *= a;
      }
    }
    const __half* V_j = V_slice(t);  // [kSliceN][kKvStride]
#pragma unroll
    for (int kk = 0; kk < kNFrags; ++kk) {
      RowFrag p_frag[kRowFrags];
#pragma unroll
      for (int rf = 0; rf < kRowFrags; ++rf) {
        wmma::load_matrix_sync(p_frag[rf], P_w + rf * kFrag * L::kPStride + kk * kFrag, L::kPStride);
      }
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) {
        VFrag v_frag;
        wmma::load_matrix_sync(v_frag, V_j + kk * kFrag * L::kKvStride + n * kFrag, L::kKvStride);
#pragma unroll
        for (int rf = 0; rf < kRowFrags; ++rf) wmma::mma_sync(o_frag[rf][n], p_frag[rf], v_frag, o_frag[rf][n]);
      }
    }
    __syncwarp();  // P is read by every lane before the next tile's S overwrites it
    release(t);    // this thread's reads of tile t (its K slice, maybe one step ago, and its V slice) are done
  };

  // Causal: tiles whose slice starts after the warp's last row add nothing; the warp only passes them back.
  const int last_row = qr0 + C::kWarpRows - 1;
  const int n_active = !p.causal ? n_tiles
                       : last_row < first_key ? 0
                                              : min(n_tiles, (last_row - first_key) / C::kBlockN + 1);
  if (n_active > 0) {
    if constexpr (C::kLookahead) {
      wait_full(0);
      warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(0));
      int t = 0;
      for (; t + 1 < n_active; ++t) softmax_pv(t, HasNextTile{});
      softmax_pv(t, LastTile{});
    } else {
      for (int t = 0; t < n_active; ++t) {
        wait_full(t);
        warp_scores<kHeadDim, kKeySplit>(s_frag, q_frag, K_slice(t));
        softmax_pv(t, LastTile{});
      }
    }
  }
  for (int t = n_active; t < n_tiles; ++t) {
    wait_full(t);
    release(t);
  }

  float l_row[kRowFrags];
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) l_row[rf] = l_i[rf] + __shfl_xor_sync(0xffffffffu, l_i[rf], 1);

  if constexpr (kKeySplit == 2) {
    // Merge the pair: O = (e^(m_0 - m) O_0 + e^(m_1 - m) O_1) / (e^(m_0 - m) l_0 + e^(m_1 - m) l_1), m = max.
    // Half 1 leaves (m_1, l_1, O_1) in the pair's scratch once half 0 is out of its loop; half 0 merges.
    // Two named barriers of the pair: "free" (half 0 is done with its scratch), then "ready".
    static_assert(C::kRowWarps == 2, "pair barriers have ids for two pairs");
    float* staging0 = reinterpret_cast<float*>(scratch_base + row_warp * L::kScratchBytes);  // [16][kOStride]
    float* staging1 = reinterpret_cast<float*>(scratch_base + (row_warp + C::kRowWarps) * L::kScratchBytes);
    auto o1_columns = [&](int n) {  // where O_1's column block n lives: blocks 4+ (D=128) in half 0's scratch
      return (n < 4 ? staging1 : staging0) + (n % 4) * kFrag;
    };
    // Both halves pass both barriers at the same two points (the half-specific work sits between them):
    // compute-sanitizer's synccheck reports a bar.sync reached from different instructions as divergent
    // (256 errors), and its racecheck does not model a one-sided bar.arrive (17 hazards on this handoff),
    // though the PTX memory model orders both.
    pair_barrier_sync<kBarPairFree>(row_warp);
    if (key_half == 1) {
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) {
        wmma::store_matrix_sync(o1_columns(n), o_frag[0][n], kOStride, wmma::mem_row_major);
      }
      if (lane % 2 == 0) {
        staging1[my_row * kOStride + 64] = m_i[0];
        staging1[my_row * kOStride + 65] = l_row[0];
      }
    }
    pair_barrier_sync<kBarPairReady>(row_warp);
    if (key_half == 1) return;
    const float m_other = staging1[my_row * kOStride + 64];
    const float l_other = staging1[my_row * kOStride + 65];
    const float m_new = fmaxf(m_i[0], m_other);
    const float m_base = m_new == -INFINITY ? 0.f : m_new;
    const float a_mine = exp2f(m_i[0] - m_base);
    const float a_other = exp2f(m_other - m_base);
    l_row[0] = a_mine * l_row[0] + a_other * l_other;
    float a_mine_e[AccFrag::num_elements], a_other_e[AccFrag::num_elements];
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
      a_mine_e[i] = __shfl_sync(0xffffffffu, a_mine, owner_lane[i]);
      a_other_e[i] = __shfl_sync(0xffffffffu, a_other, owner_lane[i]);
    }
#pragma unroll
    for (int n = 0; n < kDFrags; ++n) {
      AccFrag o1;
      wmma::load_matrix_sync(o1, o1_columns(n), kOStride, wmma::mem_row_major);
#pragma unroll
      for (int i = 0; i < AccFrag::num_elements; ++i) {
        o_frag[0][n].x[i] = a_mine_e[i] * o_frag[0][n].x[i] + a_other_e[i] * o1.x[i];
      }
    }
    __syncwarp();  // O_1's columns in this warp's scratch are read before the store below reuses it
  }

  // O_i = diag(1 / l_i) O_i
#pragma unroll
  for (int rf = 0; rf < kRowFrags; ++rf) {
    const float inv_l = l_row[rf] > 0.f ? 1.f / l_row[rf] : 0.f;
#pragma unroll
    for (int i = 0; i < AccFrag::num_elements; ++i) {
      const float r = __shfl_sync(0xffffffffu, inv_l, owner_lane[i]);
#pragma unroll
      for (int n = 0; n < kDFrags; ++n) o_frag[rf][n].x[i] *= r;
    }
    store_rows<kHeadDim>(p, o, o_frag[rf], scratch, qr0 + rf * kFrag, lane);
  }
}
