// sm80/forward_sm80.cuh — v11's forward in one CTA on mma.sync (sm_80+; K and V by TMA on sm_90): the
// prologue (Q_i, the first K/V stages, the L2 prefetch of short sequences), the main loop over key tiles in
// its three forms (cp.async; TMA one tile at a time; TMA with the next S computed beside this tile's softmax
// and P V), and the epilogue (O_i normalised and stored, or the key groups merged; the row LSE when asked).
// The warp-level fragment code is common/fa2_fragments.cuh; the configuration sm80/v11_traits.cuh; kernels and launcher
// sm80/v11.cu.
#pragma once

#include "common/fa2_fragments.cuh"
#include "common/family.cuh"
#include "sm80/epilogue_fwd_sm80.cuh"
#include "flashcore.h"
#include "common/mbarrier.cuh"
#include "common/mma_sm80.cuh"
#include "common/primitives.cuh"
#include "common/tma.cuh"
#include "sm80/v11_traits.cuh"

#include <climits>
#include <cstdint>

// The in-CTA kernels' body. kTma (v11_fwd_tma, sm_90): K and V arrive by TMA through the tensor maps,
// issued by thread 0 and counted on one mbarrier per stage, instead of 16-byte cp.async from every thread;
// all kStages stages are loaded up front. The short kernel's loop (kSplit > 1) computes S of tile t + 1 in the
// same basic block as tile t's softmax and P V, so the scheduler can interleave the two (one warp per scheduler
// has little else to hide latency with); the long one (two CTAs per SM, 32-row warps) has no registers for a
// second S and takes one tile at a time, Q_i by cp.async into shared memory as in the cp.async kernel.
// The attention family (flashcore.h): a CTA walks only the key tiles fc::visible_keys gives its rows, a warp
// computes only the tiles its own rows see, and only tiles outside the keys every row of the warp sees
// (fc::fully_visible_keys) build per-element masks; causal is the window (-1, 0). kSoftcap (the family kernels,
// v11_fwd*_family): where p.softcap > 0, each score becomes c log2 e tanh(S scale / c) as it leaves the mma (before the
// mask), so the softmax runs on it with a scale of 1 (log2 units); a uniform branch per tile. kWindow (implied by
// kSoftcap): the window machinery above; without it (the dense kernels) the kernel takes only dense and causal calls
// (window (-1, -1) or (-1, 0), no softcap) and its loop is the pre-family one: tiles 0 .. n_tiles - 1 up to the causal
// edge, one key bound per warp held across the loop, the causal mask_scores. Sinks: folded into each row's end
// (fold_warp_sink; the split merge's row_end_log2), only where p.sinks is given, in every instantiation.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks, bool kTma,
          class T, bool kSoftcap = false, bool kWindow = kSoftcap>
__device__ __forceinline__ void v11_forward(FlashcoreParams p, const CUtensorMap* tmap_k, const CUtensorMap* tmap_v) {
  using Cfg = V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>;
  // 1024-byte aligned: TMA's 128-byte swizzle is a function of address bits 7-9, so a stage must start on a
  // 1024-byte boundary to get the layout the ldmatrix addressing assumes. (The cp.async kernels' SASS is the
  // same as with 128.)
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* stage_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBytes);  // [kStages], kTma only

  const int tid = threadIdx.x;
  const int lane = tid % fc::kWarpSize;
  const int warp = tid / fc::kWarpSize;
  const int group = warp / Cfg::kRowWarps;     // which kBlockN keys of every stage this warp takes
  const int row_warp = warp % Cfg::kRowWarps;  // which kWarpM rows of Q_i this warp owns
  const int seq_len = p.seq_len;        // S: query rows
  const int seq_len_kv = p.seq_len_kv;  // S_kv: key rows
  const int offset = fc::causal_offset(p);  // causal: row i sees keys j <= i + offset
  // Heaviest query tiles first under causal masking: the last tile sees every key.
  const bool tile_fastest = query_tile_fastest(p.causal, kHeadDim);
  const int tile_index = tile_fastest ? blockIdx.x : blockIdx.y;  // this CTA's place among its head's CTAs
  const int tiles = tile_fastest ? gridDim.x : gridDim.y;
  const int m_block = p.causal ? tiles - 1 - tile_index : tile_index;
  const int m0 = m_block * kBlockM;
  const int bh = tile_fastest ? blockIdx.y : blockIdx.x;  // b * H + h
  // b * H_kv + h / (H / H_kv): the key/value head this query head reads (the tensor maps' third coordinate); the
  // divisions only where the heads are grouped (they cost a short run ~0.1 us at the start of every CTA)
  const int head = p.heads_kv == p.heads ? bh : (bh / p.heads) * p.heads_kv + (bh % p.heads) / (p.heads / p.heads_kv);
  const size_t base = static_cast<size_t>(bh) * seq_len * kHeadDim;
  const size_t kv_base = static_cast<size_t>(head) * seq_len_kv * kHeadDim;
  const __half* __restrict__ q = fc::tensor<__half>(p.q) + base;     // [S, D] of this (b, h)
  const __half* __restrict__ k = fc::tensor<__half>(p.k) + kv_base;  // [S_kv, D]
  const __half* __restrict__ v = fc::tensor<__half>(p.v) + kv_base;  // [S_kv, D]
  __half* __restrict__ o = fc::tensor<__half>(p.o) + base;           // [S, D]
  // [S, D]: O's rounding residual, written only by a training forward
  __half* residual = p.o_residual != nullptr ? fc::tensor<__half>(p.o_residual) + base : nullptr;

  unsigned char* q_s = smem;                                                     // [kBlockM][D]
  auto k_stage = [&](int stage) { return smem + Cfg::kQBytes + stage * Cfg::kStageBytes; };  // [kTileN][D]

  // The keys the CTA's rows see, [kv_begin, kv_end) (fc::visible_keys; causal: [0, m0 + kBlockM + offset)): only
  // the ring tiles tile_begin .. tile_begin + n_tiles - 1 that hold them are loaded and visited (the TMA loops' index
  // t is tile tile_begin + t), and rows at or past kv_end are zero-filled. Every tile of that range holds a key some
  // warp of the CTA sees: the warps' key ranges (below) overlap or touch, since each spans at least its kWarpM
  // diagonals, and their union is the CTA's.
  // Dense (!kWindow): keys at or past kv_end are invisible to every row of the CTA, tile_begin = 0.
  static_assert(kWindow || !kSoftcap, "the softcap kernels take windows too");
  int kv_end, tile_begin, n_tiles;
  if constexpr (kWindow) {
    const fc::Range kv = fc::visible_keys(p, m0, min(m0 + kBlockM, seq_len));
    kv_end = kv.end;
    tile_begin = kv.begin < kv.end ? kv.begin / Cfg::kTileN : 0;
    n_tiles = kv.begin < kv.end ? fc::ceil_div(kv.end, Cfg::kTileN) - tile_begin : 0;
  } else {
    kv_end = p.causal ? max(0, min(seq_len_kv, m0 + kBlockM + offset)) : seq_len_kv;
    tile_begin = 0;
    n_tiles = fc::ceil_div(kv_end, Cfg::kTileN);
  }
  auto load_rows = [&](int row0, int stage) {  // row0: the ring tile's first key, a multiple of kTileN
    unsigned char* k_s = k_stage(stage);
    if constexpr (kTma) {
      // One thread; rows outside [kv_begin, kv_end) but inside S_kv arrive too (the masks hide them), rows past
      // S_kv arrive as zeros.
      if (tid == 0) {
        fc::mbarrier_arrive_expect_bytes(&stage_full[stage], Cfg::kStageBytes);
        fc::tma_load_3d(k_s, tmap_k, 0, row0, head, &stage_full[stage]);
        fc::tma_load_3d(k_s + Cfg::kKvBytes, tmap_v, 0, row0, head, &stage_full[stage]);
      }
      return;
    }
    // kWindow: the thread's copy terms (row, chunk, swizzle) from an opaque copy of tid, recomputed at each refill:
    // none is held across the loop (the long D=128 kernel, at 255 registers, spilled one).
    int copy_tid = tid;
    if constexpr (kWindow) asm volatile("mov.b32 %0, %0;" : "+r"(copy_tid));
    fc::copy_rows_async<Cfg, Cfg::kTileN>(k_s, k, row0, kv_end, copy_tid);
    fc::copy_rows_async<Cfg, Cfg::kTileN>(k_s + Cfg::kKvBytes, v, row0, kv_end, copy_tid);
  };
  auto load_tile = [&](int t, int stage) { load_rows((tile_begin + t) * Cfg::kTileN, stage); };
  const bool sees_no_key = n_tiles == 0;

  // Q_i straight into registers when it never touches shared memory: issued first, it is needed first.
  fc::QFragments<Cfg> q_frag;
  if constexpr (Cfg::kQFromGlobal) fc::load_q_fragments_global<Cfg>(q_frag, q, m0 + row_warp * kWarpM, seq_len, lane);

  // Prologue: Q_i and the first kStages - 1 tiles in flight at once (Q_i rides in tile 0's group); by TMA
  // all kStages (its loop refills a stage only after every warp is done with it, not a tile ahead).
  if constexpr (!Cfg::kQFromGlobal) fc::copy_rows_async<Cfg, kBlockM>(q_s, q, m0, seq_len, tid);
  if constexpr (kTma && !Cfg::kQFromGlobal) fc::cp_async_commit();
  if constexpr (kTma) {
    if (tid == 0) {
      if (fc::smem_addr(smem) & 1023u) __trap();  // never seen; a wrong layout would be silent
#pragma unroll
      for (int st = 0; st < kStages; ++st) fc::mbarrier_init(&stage_full[st], 1);
      fc::fence_proxy_async_shared();  // the TMA unit must see the barriers initialised
    }
    __syncthreads();
  }
  constexpr int kPrologueTiles = kTma ? kStages : kStages - 1;
#pragma unroll
  for (int st = 0; st < kPrologueTiles; ++st) {
    if (st < n_tiles) load_tile(st, st);
    if constexpr (!kTma) fc::cp_async_commit();
  }
  if constexpr (kTma && kSplit > 1) {
    // The same L2 prefetch as below, a tile at a time: CTA i of the head takes tiles i, i + tiles, ...
    if (tid == 0) {
      for (int tile = kPrologueTiles + tile_index; tile < n_tiles; tile += tiles) {
        fc::tma_prefetch_3d(tmap_k, 0, (tile_begin + tile) * Cfg::kTileN, head);
        fc::tma_prefetch_3d(tmap_v, 0, (tile_begin + tile) * Cfg::kTileN, head);
      }
    }
  } else if constexpr (kSplit > 1) {
    // Short sequences: the CTAs of a head split the rest of its K and V into slices and prefetch them to
    // L2 now, so later stages hit L2 instead of each paying a DRAM round trip in lockstep.
    const long long first = static_cast<long long>(min(seq_len_kv, (kStages - 1) * Cfg::kTileN)) * Cfg::kRowBytes / 32;
    const long long sectors = static_cast<long long>(seq_len_kv) * Cfg::kRowBytes / 32 - first;
    const long long begin = first + sectors * tile_index / tiles;
    const long long end = first + sectors * (tile_index + 1) / tiles;
    for (long long sector = begin + tid; sector < end; sector += Cfg::kThreads) {
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(k) + sector * 32);
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(v) + sector * 32);
    }
  }

  // Rows of this warp. kWindow: the keys any of them see (fc::visible_keys; none for a warp wholly past the sequence
  // end) and those all of them see (fc::fully_visible_keys: a tile inside needs no mask) are recomputed at each tile
  // from warp_row0 and the params, through an opaque copy of warp_row0 so that the compiler holds no more registers
  // across the loop than before (LongD128 spilled 44 bytes with them held): a few integer operations per tile.
  // Dense: the keys any of them can see end at warp_kv_end, held across the loop.
  const int warp_row0 = m0 + row_warp * kWarpM;
  const int warp_kv_end = kWindow                ? 0
                          : warp_row0 >= seq_len ? 0
                          : p.causal             ? max(0, min(seq_len_kv, warp_row0 + kWarpM + offset))
                                                 : seq_len_kv;
  auto opaque_row0 = [&] {
    int row0 = warp_row0;
    asm volatile("mov.b32 %0, %0;" : "+r"(row0));
    return row0;
  };
  // The score's units in the softmax: S * scale * log2 e, or (softcap) the capped score in log2 units already.
  const float scale_log2 = kSoftcap && p.softcap > 0.f ? 1.f : p.scale * kLog2e;

  // Per-lane ldmatrix row addresses (tile-relative rows are multiples of 8, so row & 7 = lane & 7):
  // A fragments and V (.trans) take rows lane % 8 + 8 * ((lane / 8) % 2); K takes lane % 8 + 8 * (lane / 16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t q_lane = fc::smem_addr(q_s) + (row_warp * kWarpM + a_row) * Cfg::kRowBytes;

  float o_acc[Cfg::kMTiles][Cfg::kDTiles][4];
  float m_i[Cfg::kMTiles][2];
  float l_i[Cfg::kMTiles][2];
  fc::init_rows<Cfg>(o_acc, m_i, l_i);

  using Scores = float[Cfg::kMTiles][Cfg::kNTiles][4];
  // This warp's keys in tile t, key0(t) .. key0(t) + kBlockN - 1, and its ldmatrix rows of K and V in a stage.
  auto key0_of = [&](int t) { return (tile_begin + t) * Cfg::kTileN + group * kBlockN; };
  // Whether the warp's rows see any of its keys key0 .. key0 + kBlockN - 1 (the tiles a warp sees are consecutive).
  auto warp_sees = [&](int key0) {
    if constexpr (kWindow) {
      const int row0 = opaque_row0();
      const fc::Range keys = fc::visible_keys(p, row0, min(row0 + kWarpM, seq_len));
      return row0 < seq_len && key0 < keys.end && key0 + kBlockN > keys.begin;
    } else {
      return key0 < warp_kv_end;
    }
  };
  auto k_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage)) + (group * kBlockN + k_row) * Cfg::kRowBytes;
  };
  auto v_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage) + Cfg::kKvBytes) + (group * kBlockN + a_row) * Cfg::kRowBytes;
  };
  // Only tiles crossing a window edge (the diagonal under causal) or the sequence end carry invisible keys.
  auto mask_edge = [&](Scores& s, int key0) {
    if constexpr (kWindow) {
      const int row0 = opaque_row0();
      const fc::Range full = fc::fully_visible_keys(p, row0, row0 + kWarpM);
      if (key0 < full.begin || key0 + kBlockN > full.end) {
        // key j is visible to row i iff -window_left <= j - (i + offset) <= window_right (unbounded sides: INT_MAX)
        const int window_left = p.window_left < 0 ? INT_MAX : p.window_left;
        const int window_right = p.window_right < 0 ? INT_MAX : p.window_right;
        fc::mask_window_scores<Cfg>(s, row0 + offset, key0, seq_len_kv, window_left, window_right, lane);
      }
    } else if (key0 + kBlockN > seq_len_kv || (p.causal && key0 + kBlockN - 1 > warp_row0 + offset)) {
      fc::mask_scores<Cfg>(s, warp_row0 + offset, key0, seq_len_kv, p.causal, lane);  // dense: the causal mask
    }
  };
  // Softcap: S becomes c log2 e tanh(S scale / c) as it leaves the mma (the mask then sets -inf over it).
  auto scores = [&](Scores& s, uint32_t k_lane) {
    fc::warp_scores<Cfg, T>(s, q_frag, q_lane, k_lane, lane);
    if (kSoftcap && p.softcap > 0.f) {
      float cap_in, cap_out;  // scale / c and c log2 e, recomputed here (volatile: not held across the loop)
      asm volatile("div.approx.f32 %0, %1, %2;" : "=f"(cap_in) : "f"(p.scale), "f"(p.softcap));
      asm volatile("mul.f32 %0, %1, %2;" : "=f"(cap_out) : "f"(p.softcap), "f"(kLog2e));
      fc::softcap_scores<Cfg>(s, cap_in, cap_out);
    }
  };
  // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O, then O = O + P V_j.
  auto softmax_pv = [&](Scores& s, int stage) {
    fc::online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
    fc::accumulate_pv<Cfg, T>(s, o_acc, l_i, v_lane_of(stage), lane);
  };

  if constexpr (kTma && !Cfg::kQFromGlobal) {
    // Q_i's cp.async copies, then its fragments: the rest of the loop waits on mbarriers only.
    fc::cp_async_wait<0>();
    __syncthreads();
    fc::load_q_fragments<Cfg>(q_frag, q_lane, lane);
  }
  if constexpr (kTma && kSplit == 1) {
    // The long TMA kernel (two 32-row m16 pairs per warp): no room for a second S, so one tile at a time.
    auto wait_tile = [&](int t) { fc::mbarrier_wait_parity(&stage_full[t % kStages], (t / kStages) & 1); };
    for (int t = 0; t < n_tiles; ++t) {
      if (t >= 1 && t - 1 + kStages < n_tiles) {  // uniform across the CTA, as below
        __syncthreads();
        if (tid == 0) {
          fc::fence_proxy_async_shared();
          load_tile(t - 1 + kStages, (t - 1) % kStages);
        }
      }
      const int key0 = key0_of(t);
      if (!warp_sees(key0)) continue;
      wait_tile(t);
      Scores s;
      scores(s, k_lane_of(t % kStages));
      mask_edge(s, key0);
      softmax_pv(s, t % kStages);
    }
  } else if constexpr (kTma) {
    // S of the next tile is computed before this tile's softmax and P V, all in one basic block: the tile's
    // mask comes first, and the branches that decide whether a next tile exists wrap the whole block.
    auto visible = [&](int t) { return t < n_tiles && warp_sees(key0_of(t)); };
    auto wait_tile = [&](int t) { fc::mbarrier_wait_parity(&stage_full[t % kStages], (t / kStages) & 1); };
    Scores s, s_next;
    if (visible(0)) {
      wait_tile(0);
      scores(s, k_lane_of(0));
    }
    for (int t = 0; t < n_tiles; ++t) {
      // Tile t - 1's stage is free once every warp is past it: refill it with tile t - 1 + kStages. (The
      // condition is the same for the whole CTA, so every thread reaches the barrier or none does.)
      if (t >= 1 && t - 1 + kStages < n_tiles) {
        __syncthreads();
        if (tid == 0) {
          fc::fence_proxy_async_shared();  // the warps' reads of the stage come before the TMA's writes into it
          load_tile(t - 1 + kStages, (t - 1) % kStages);
        }
      }
      if (!visible(t)) {  // not break: later iterations may still hold a barrier
        // kWindow: the warp's first tile (a window's left edge): its S, as before the loop. (Dense: a warp's
        // visible tiles start at tile 0.)
        if (kWindow && visible(t + 1)) {
          wait_tile(t + 1);
          scores(s, k_lane_of((t + 1) % kStages));
        }
        continue;
      }
      mask_edge(s, key0_of(t));
      if (visible(t + 1)) {
        wait_tile(t + 1);
        scores(s_next, k_lane_of((t + 1) % kStages));
        softmax_pv(s, t % kStages);
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[mt][j][r] = s_next[mt][j][r];
      } else {
        softmax_pv(s, t % kStages);
      }
    }
  } else if constexpr (!kWindow) {
    // Dense: tiles 0 .. n_tiles - 1, as before the family.
    int compute_stage = 0;
    int load_stage = kStages - 1;
    for (int t = 0; t < n_tiles; ++t) {
      fc::cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
      __syncthreads();                   // everyone's have, and every warp is done with tile t - 1's stage
      if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, load_stage);
      fc::cp_async_commit();  // an empty group at the tail keeps the wait count uniform
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;

      if constexpr (Cfg::kQInRegs && !Cfg::kQFromGlobal) {
        if (t == 0) fc::load_q_fragments<Cfg>(q_frag, q_lane, lane);
      }

      const int key0 = key0_of(t);
      if (warp_sees(key0)) {
        // S = Q_i K_j^T
        Scores s;
        scores(s, k_lane_of(compute_stage));
        mask_edge(s, key0);
        softmax_pv(s, compute_stage);
      }
      compute_stage = compute_stage + 1 == kStages ? 0 : compute_stage + 1;
    }
  } else {
    int compute_stage = 0;
    int load_stage = kStages - 1;
    // The loop runs over each tile's first key, row (the tiles start before kv_end): no tile index, count or
    // tile_begin held across it (the long D=128 kernel is at 255 registers). A tile starts before kv_end exactly
    // when its index is below tile_begin + n_tiles.
    const int first_row = n_tiles > 0 ? tile_begin * Cfg::kTileN : kv_end;
    for (int row = first_row; row < kv_end; row += Cfg::kTileN) {
      fc::cp_async_wait<kStages - 2>();  // this thread's copies of this tile have landed
      __syncthreads();                   // everyone's have, and every warp is done with the last tile's stage
      const int next_row = row + (kStages - 1) * Cfg::kTileN;
      if (next_row < kv_end) load_rows(next_row, load_stage);
      fc::cp_async_commit();  // an empty group at the tail keeps the wait count uniform
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;

      if constexpr (Cfg::kQInRegs && !Cfg::kQFromGlobal) {
        if (row == first_row) fc::load_q_fragments<Cfg>(q_frag, q_lane, lane);
      }

      const int key0 = row + group * kBlockN;
      if (warp_sees(key0)) {
        // S = Q_i K_j^T
        Scores s;
        scores(s, k_lane_of(compute_stage));
        mask_edge(s, key0);
        softmax_pv(s, compute_stage);
      }
      compute_stage = compute_stage + 1 == kStages ? 0 : compute_stage + 1;
    }
  }

  if constexpr (kSplit == 1) {
    if constexpr (!kTma && !Cfg::kQFromGlobal) {
      // A CTA that sees no key (causal, S > S_kv: its rows come before the first visible one) never entered
      // the loop, whose first wait covers Q_i's cp.async copies: wait here, or they land over the staged O.
      if (sees_no_key) {
        fc::cp_async_wait<0>();
        __syncthreads();
      }
    }
    // The head's sink joins each row's (m_i, l_i) in place (no more registers beside O_i), then
    // O_i = diag(1 / l_i) O_i, staged as fp16 over this warp's own Q_i rows (only this warp ever reads them).
    if (p.sinks != nullptr) fc::fold_warp_sink<Cfg>(m_i, l_i, scale_log2, fc::sink_log2(p.sinks, bh, p.heads));
    fc::store_warp_rows<Cfg, T>(q_s, row_warp * kWarpM, o, residual, warp_row0, seq_len, o_acc, l_i, lane);
    if (p.lse != nullptr) {
      fc::store_warp_lse<Cfg>(p.lse + static_cast<size_t>(bh) * seq_len, warp_row0, seq_len, m_i, l_i, scale_log2, lane);
    }
  } else {
    // Merge the kSplit groups: m = max_g m_g, l = sum_g exp2(m_g - m) l_g, O = sum_g exp2(m_g - m) O_g / l.
    // (TMA: every tile loaded was waited on by some warp, since each holds a key that some warp's rows see and
    // the key groups split every tile, so no copy is still landing past this barrier.)
    if constexpr (!kTma) fc::cp_async_wait<0>();
    __syncthreads();  // every warp has left the loop: the ring's bytes are free for the merge
    float2* stats = reinterpret_cast<float2*>(smem);                       // [kSplit][kBlockM]
    float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);    // [kSplit][kBlockM][kOStride]
    fc::store_partials<Cfg>(stats, o_part, o_acc, m_i, l_i, group, row_warp, scale_log2, lane);
    __syncthreads();
    fc::merge_split_rows<Cfg, T>(stats, o_part, o, residual, m0, seq_len, tid, p.sinks, bh, p.heads);
    if (p.lse != nullptr) {
      fc::merge_split_lse<Cfg>(stats, p.lse + static_cast<size_t>(bh) * seq_len, m0, seq_len, tid, p.sinks, bh, p.heads);
    }
  }
}
