// mainloop_fwd_sm90.cuh — v12's kernel: a persistent CTA of one producer warpgroup (TMA loads of Q_i, K_j, V_j
// into the ring) and consumer warpgroups (ping-pong turns, the main loop over key tiles, the epilogue staging O
// and storing it by TMA, the row LSE), composed of tile_scheduler_sm90.cuh's work list and consumer_sm90.cuh's
// steps.
#pragma once

#include "consumer_sm90.cuh"
#include "flashcore.h"
#include "hopper.cuh"
#include "tile_scheduler_sm90.cuh"
#include "v12_traits.cuh"

#include <cstdint>

template <int kHeadDim, int kBlockN, int kConsumers, int kStages, typename T>
__global__ void __launch_bounds__(Config<kHeadDim, kBlockN, kConsumers, kStages>::kThreads, 1)
    v12_fwd(const FlashcoreParams p, const __grid_constant__ Maps maps, const Items items) {
  using Cfg = Config<kHeadDim, kBlockN, kConsumers, kStages>;
  using Barriers = ::Barriers<kStages>;
  constexpr int kBlockM = Cfg::kBlockM;
  extern __shared__ unsigned char smem_raw[];
  // Everything below is derived again after each role's setmaxnreg (from the parameters and smem_raw): a
  // value kept across it would be spilled, since the producer keeps only 24-32 registers.
  auto smem = [] { return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023)); };
  auto num_items = [&] { return (items.big + items.small) * p.batch * p.heads; };

  if (threadIdx.x == 0) {
    Barriers& b = *reinterpret_cast<Barriers*>(smem() + Cfg::kBarOffset);
    fc::mbarrier_init(&b.q_full, 1);
    fc::mbarrier_init(&b.q_empty, 4 * kConsumers);
    for (int s = 0; s < kStages; ++s) {
      fc::mbarrier_init(&b.k_full[s], 1);
      fc::mbarrier_init(&b.v_full[s], 1);
      fc::mbarrier_init(&b.k_empty[s], 4 * kConsumers);
      fc::mbarrier_init(&b.v_empty[s], 4 * kConsumers);
    }
    fc::fence_mbarrier_init();
  }
  // The ones panels after each V slot, written once (from thread `first`, `stride` apart); the tensor cores
  // read them through the async proxy, hence the fence before the threads meet. The long kernels write
  // them with every thread here; the short one (one consumer, a latency-bound wave) leaves them to its
  // consumer after the roles split, so the producer's first loads go out first: 1,8,512,64 9.1-9.2 us vs
  // 9.5 (graph 6.2 vs 6.5). The same order in the long kernels read 284 vs 281 us at 2,16,4096,64 and 429
  // vs 423 at D = 128 (ptxas scheduled their loops differently), so they keep this one.
  auto write_ones = [&](int first, int stride) {
    for (int slot = 0; slot < kStages; ++slot) {
      uint4* ones = reinterpret_cast<uint4*>(smem() + Cfg::kVOffset + slot * Cfg::kVSlotBytes + Cfg::kKVBytes);
      for (int i = first; i < kBlockN * 128 / 16; i += stride) {
        ones[i] = make_uint4(kOnePair<T>, kOnePair<T>, kOnePair<T>, kOnePair<T>);
      }
    }
    fc::fence_proxy_async_shared();
  };
  if constexpr (kConsumers > 1) write_ones(threadIdx.x, Cfg::kThreads);
  __syncthreads();

  if (threadIdx.x < fc::kWarpgroupThreads) {
    // ---- producer: one thread streams each item's Q_i, then its K_j and V_j through the ring. Q_i of the
    // next item goes in as soon as every consumer has issued its last S of this one (q_empty), so it lands
    // during this item's last softmax, P V and stores ----
    fc::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      Barriers& bars = *reinterpret_cast<Barriers*>(smem() + Cfg::kBarOffset);
      __half* q_tile = reinterpret_cast<__half*>(smem() + Cfg::kQOffset);
      __half* k_tiles = reinterpret_cast<__half*>(smem() + Cfg::kKOffset);
      __half* v_tiles = reinterpret_cast<__half*>(smem() + Cfg::kVOffset);
      fc::tma_prefetch_descriptor(&maps.q);
      fc::tma_prefetch_descriptor(&maps.k);
      fc::tma_prefetch_descriptor(&maps.v);
      fc::tma_prefetch_descriptor(&maps.o);
      int t = 0;  // K/V tiles issued by this CTA so far: the ring's slot and lap
      for (int round = 0, index = blockIdx.x; index < num_items(); index = snake_index(++round, blockIdx.x, gridDim.x)) {
        const Item it = item_at<kBlockM>(p, items, index);
        const int num_n = item_tiles<kBlockN>(p, it);
        const int kv_bh = kv_head(p, it.bh);  // K and V are [B * H_kv][S_kv][D]
        fc::mbarrier_wait_parity(&bars.q_empty, (round & 1) ^ 1);
        fc::mbarrier_arrive_expect_bytes(&bars.q_full, Cfg::kQBytes);
        fc::tma_load_4d(q_tile, &maps.q, 0, it.m0, 0, it.bh, &bars.q_full);
        for (int n = 0; n < num_n; ++n, ++t) {
          const int s = t % kStages;
          const uint32_t lap = (t / kStages) & 1;
          fc::mbarrier_wait_parity(&bars.k_empty[s], lap ^ 1);
          fc::mbarrier_arrive_expect_bytes(&bars.k_full[s], Cfg::kKVBytes);
          fc::tma_load_4d(k_tiles + s * (Cfg::kKVBytes / 2), &maps.k, 0, n * kBlockN, 0, kv_bh, &bars.k_full[s]);
          fc::mbarrier_wait_parity(&bars.v_empty[s], lap ^ 1);
          fc::mbarrier_arrive_expect_bytes(&bars.v_full[s], Cfg::kKVBytes);
          fc::tma_load_4d(v_tiles + s * (Cfg::kVSlotBytes / 2), &maps.v, 0, n * kBlockN, 0, kv_bh, &bars.v_full[s]);
        }
      }
    }
    return;
  }

  // ---- consumers: warpgroup g owns query rows 64g .. 64g + 63 of each item ----
  fc::setmaxnreg_inc<Cfg::kConsumerRegs>();
  // The warpgroup index through a shuffle: the compiler then knows it is warp-uniform and keeps it, and the
  // item values derived from it, in uniform registers (without this, the 3-consumer kernel spilled).
  const int g = __shfl_sync(0xffffffffu, threadIdx.x / fc::kWarpgroupThreads, 0) - 1;
  Barriers& bars = *reinterpret_cast<Barriers*>(smem() + Cfg::kBarOffset);
  __half* q_tile = reinterpret_cast<__half*>(smem() + Cfg::kQOffset);
  __half* k_tiles = reinterpret_cast<__half*>(smem() + Cfg::kKOffset);
  __half* v_tiles = reinterpret_cast<__half*>(smem() + Cfg::kVOffset);
  const int tid = threadIdx.x % fc::kWarpgroupThreads;
  const int r_local = 16 * (tid / 32) + (tid % 32) / 4;  // this thread's rows in the warpgroup: r_local, + 8
  const float c = p.scale * 1.4426950408889634f;          // exp(x) = exp2(x * log2(e))
  // Descriptors: Q_i's rows of this warpgroup (panel 0, row 64g), and each ring slot's K_j and V_j.
  const uint64_t desc_q = fc::wgmma_desc_sw128(q_tile + 64 * g * 64, 16, 1024);
  const uint64_t desc_k0 = fc::wgmma_desc_sw128(k_tiles, 16, 1024);
  const uint64_t desc_v0 = fc::wgmma_desc_sw128(v_tiles, kBlockN * 128, 1024);
  constexpr uint64_t kKSlotStep = Cfg::kKVBytes >> 4;  // one ring slot further, in descriptor units
  constexpr uint64_t kVSlotStep = Cfg::kVSlotBytes >> 4;

  if constexpr (kConsumers == 1) {  // the short kernel's ones panels, while the first loads fly
    write_ones(tid, fc::kWarpgroupThreads);
    fc::named_barrier_sync(kSchedBarrier, fc::kWarpgroupThreads);  // one consumer takes no turns: id free
  }

  const int my_turn = kSchedBarrier + g, next_turn = kSchedBarrier + (g + 1) % kConsumers;
  int t = 0;  // K/V tiles of this CTA's earlier items: tile n of this item sits in slot (t + n) % kStages
  for (int round = 0, index = blockIdx.x; index < num_items(); index = snake_index(++round, blockIdx.x, gridDim.x)) {
    const uint32_t q_lap = round & 1;
    const Item it = item_at<kBlockM>(p, items, index);
    const int num_n = item_tiles<kBlockN>(p, it);
    auto slot = [&](int n) { return (t + n) % kStages; };
    auto lap = [&](int n) { return static_cast<uint32_t>((t + n) / kStages) & 1; };
    // Ping-pong: the consumers take turns issuing GEMMs (named barriers my_turn / next_turn), so one's softmax
    // runs while another's GEMMs do. Each item starts afresh: its last consumer lets the first go first, and
    // the last turn passes none on. Every consumer takes every turn, even with no rows in the item: a ring
    // whose members changed from item to item let a consumer's first arrival of one item land on a barrier
    // still counting the last item's turns (a hang at 3,16,3000,64).
    // (One consumer has no one to take turns with.)
    auto take_turn = [&] {
      if constexpr (kConsumers > 1) fc::named_barrier_sync(my_turn, 2 * fc::kWarpgroupThreads);
    };
    auto pass_turn = [&] {
      if constexpr (kConsumers > 1) fc::named_barrier_arrive(next_turn, 2 * fc::kWarpgroupThreads);
    };
    // An item with no K/V tiles (causal, S > S_kv: its rows see no key) has no turns either: every consumer
    // skips them alike, so the counts stay matched; each still takes Q_i's lap, and those with rows write them.
    if (g == kConsumers - 1 && num_n > 0) pass_turn();
    if (g >= it.consumers) {
      // No rows in this item: relay the turns, and release each slot as it fills, so every barrier's count
      // stays 4 per consumer. Waiting for each fill keeps this warpgroup within one lap of the producer.
      fc::mbarrier_wait_parity(&bars.q_full, q_lap);
      release(&bars.q_empty);
      for (int n = 0; n < num_n; ++n) {
        fc::mbarrier_wait_parity(&bars.k_full[slot(n)], lap(n));
        take_turn();
        pass_turn();
        release(&bars.k_empty[slot(n)]);
        if (n > 0) {
          fc::mbarrier_wait_parity(&bars.v_full[slot(n - 1)], lap(n - 1));
          release(&bars.v_empty[slot(n - 1)]);
        }
      }
      if (num_n > 0) {
        fc::mbarrier_wait_parity(&bars.v_full[slot(num_n - 1)], lap(num_n - 1));
        take_turn();
        if (g + 1 < kConsumers) pass_turn();
        release(&bars.v_empty[slot(num_n - 1)]);
      }
      t += num_n;
      continue;
    }
    const int first_row = it.m0 + 64 * g;  // this warpgroup's first query row
    // Causal, bottom-right: row i sees keys j <= i + S_kv - S. The last key this warpgroup's first row sees, and
    // this thread's first row.
    const int first_diag = first_row + fc::causal_offset(p);
    const int diag0 = first_diag + r_local;

    float o[Cfg::kOCols / 2];  // O_i's fragment, then the l columns
#pragma unroll
    for (int i = 0; i < Cfg::kOCols / 2; ++i) o[i] = 0.f;
    float s[kBlockN / 2];
    uint32_t pa[kBlockN / 16][4];
    RowState st = {{-INFINITY, -INFINITY}};
    float alpha[2];
    // Two copies of the softmax, so that the tiles that need no mask (all but the last one or two) run
    // none of its index arithmetic: predicated off, it still took issue slots (ncu: ALU the busiest pipe).
    auto softmax = [&](int n) {
      if (tile_needs_mask<kBlockN>(p, n, first_diag)) {
        online_softmax<kBlockN, true>(s, st, alpha, c, diag0, n * kBlockN, p.seq_len_kv, p.causal);
      } else {
        online_softmax<kBlockN, false>(s, st, alpha, c, diag0, n * kBlockN, p.seq_len_kv, p.causal);
      }
    };

    fc::mbarrier_wait_parity(&bars.q_full, q_lap);
    if (num_n == 0) {
      release(&bars.q_empty);  // no row sees a key: O = 0 and l = 0 (LSE +inf), straight to the epilogue
    } else {
      // Tile 0: S = Q_i K_0^T, then its softmax.
      fc::mbarrier_wait_parity(&bars.k_full[slot(0)], lap(0));
      take_turn();
      gemm_qk<T, kHeadDim, kBlockN, kBlockM>(s, desc_q, desc_k0 + slot(0) * kKSlotStep);
      fc::wgmma_fence_operands(s);
      pass_turn();
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(s);
      release(&bars.k_empty[slot(0)]);
      softmax(0);
      pack_p<T, kBlockN>(s, pa);

      for (int n = 1; n < num_n; ++n) {
        const int sk = slot(n), sv = slot(n - 1);
        // Issue S_next = Q_i K_n^T, then O += P V_{n-1}; the softmax of S_next overlaps P V_{n-1}.
        fc::mbarrier_wait_parity(&bars.k_full[sk], lap(n));
        take_turn();
        gemm_qk<T, kHeadDim, kBlockN, kBlockM>(s, desc_q, desc_k0 + sk * kKSlotStep);
        fc::wgmma_fence_operands(s);
        fc::mbarrier_wait_parity(&bars.v_full[sv], lap(n - 1));
        gemm_pv<T, Cfg::kOCols, kBlockN>(o, pa, desc_v0 + sv * kVSlotStep);
        fc::wgmma_fence_operands(o);
        pass_turn();
        fc::wgmma_wait<1>();  // S_next has landed; P V may still run
        fc::wgmma_fence_operands(s);
        release(&bars.k_empty[sk]);
        softmax(n);
        fc::wgmma_wait<0>();  // P V_{n-1} done: P and V_{n-1}'s slot are free
        fc::wgmma_fence_operands(o);
        fc::wgmma_fence_operands(pa);  // the wgmma read pa until here: keep its registers from being reused
        release(&bars.v_empty[sv]);
        // O = diag(alpha) O (l included)
#pragma unroll
        for (int j = 0; j < Cfg::kOCols / 8; ++j) {
          o[4 * j] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
        pack_p<T, kBlockN>(s, pa);
      }
      release(&bars.q_empty);  // every S of this item has landed: the producer may load the next Q_i
      // The last tile's O += P V.
      const int sv = slot(num_n - 1);
      fc::mbarrier_wait_parity(&bars.v_full[sv], lap(num_n - 1));
      take_turn();
      gemm_pv<T, Cfg::kOCols, kBlockN>(o, pa, desc_v0 + sv * kVSlotStep);
      fc::wgmma_fence_operands(o);
      if (g + 1 < kConsumers) pass_turn();  // the last turn passes none on
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(o);
      fc::wgmma_fence_operands(pa);
      release(&bars.v_empty[sv]);
    }
    t += num_n;

    // ---- epilogue: O / l rounded to T into this warpgroup's rows of O's staging tile (Q_i's swizzled layout),
    // then one TMA store per 64-column panel, which clips rows past S. O has a tile of its own, so the next
    // item's Q_i lands meanwhile; the first barrier waits for this warpgroup's previous store to have read it ----
    const int bh = item_at<kBlockM>(p, items, index).bh;  // recomputed: one register fewer through the loop
    const int epilogue_barrier = kSchedBarrier + kConsumers + g;
    unsigned char* rows_base = smem() + Cfg::kOOffset + 64 * g * 128;
    fc::named_barrier_sync(epilogue_barrier, fc::kWarpgroupThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_local + 8 * h;
      const float l = o[4 * (kHeadDim / 8) + 2 * h];  // every lane holds its rows' l in the ones columns
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const int col = 8 * j + 2 * (tid % 4);
        const int panel = col / 64, chunk = (col % 64) / 8, within = (col % 8) * 2;
        unsigned char* dst = rows_base + panel * kBlockM * 128 + r * 128 + ((chunk ^ (r % 8)) * 16) + within;
        *reinterpret_cast<uint32_t*>(dst) = pack2<T>(o[4 * j + 2 * h] * inv_l, o[4 * j + 2 * h + 1] * inv_l);
      }
    }
    if (p.lse != nullptr && tid % 4 == 0) {
      // LSE = log(sum_j exp(S_ij * scale)) = (m + log2 l) ln 2, m being in units of S * scale * log2(e); +inf for
      // a row that sees no key (l = 0). One lane of the quad that shares a row writes it; rows past S are not.
      // l sums P rounded to T, as O's normalization does, so LSE carries that rounding: at worst T's unit roundoff
      // in l (2^-11 fp16, 2^-8 bf16: 5e-4 and 4e-3 in LSE, rounding all one way), not fp32 row sums' 1e-7.
      float* lse = p.lse + static_cast<size_t>(bh) * p.seq_len;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = first_row + r_local + 8 * h;
        const float l = o[4 * (kHeadDim / 8) + 2 * h];
        if (row < p.seq_len) lse[row] = l > 0.f ? (st.m[h] + __log2f(l)) * 0.6931471805599453f : INFINITY;
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
}
