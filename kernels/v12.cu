// v12.cu — FlashAttention-3 on Hopper (sm_90a): TMA, wgmma, warp-specialized warpgroups, persistent CTAs.
//
// Idea: one persistent CTA per SM deals out work items of 128 (or 192) query rows. One producer thread streams
// each item's Q_i, then K_j and V_j by TMA (cp.async.bulk.tensor, 128-byte swizzle) into a 2-slot ring on
// full/empty mbarriers. Two (or three) consumer warpgroups own 64 rows each and run both GEMMs on wgmma: S = Q K^T
// from shared memory through descriptors, O += P V with P straight from the S accumulators (packed to fp16 A
// fragments, no shuffles) and V read transposed. setmaxnreg moves registers from the producer to the consumers.
// Overlaps: ping-pong (named barriers give the consumers turns, so one's exp2 runs while another's GEMMs do),
// intra-warpgroup (S_{j+1} is issued with P_j V_j and its softmax runs while P_j V_j is in flight), and across
// items (the next Q_i loads once every consumer's last S has landed, during the last P V and the epilogue, which
// stages O in a tile of its own and stores it by TMA). Primitives: hopper.cuh, tma.cuh.
//
// Change from v11 (mma.sync, every warp loads and computes): wgmma (HGMMA) instead of HMMA + ldmatrix, TMA
// instead of cp.async, producer/consumer roles (the seeds' v9 and v10 ideas) on the hardware made for them.
// l rides in P V: a panel of fp16 ones follows each V slot and P V reads it as 8 more columns, so l sums the same
// fp16 P as the numerator: one-hot and uniform rows are exact (q = k = v = randn * 30: error 0) with no FADDs.
// Causal: tiles past an item's last row are never loaded; only tiles crossing the diagonal (or S_kv) are masked,
// in a second copy of the softmax. The item list goes longest first and is dealt in snake order (item_at).
// Grouped-query heads, S_kv != S (causal bottom-right) and the row log-sum-exp: the producer loads K/V head
// bh / (H / H_kv), key tiles run over S_kv, LSE = (m + log2 l) ln 2 from the ones columns. Same run beside the
// build before (H200, cold): 2,16,4096,128 413.8 vs 433.3 us, 2,16,4096,64 280.5 vs 280.6, 1,8,512,64 9.2 vs 9.1;
// chunked prefill 1,32:8,512:8192,128 111.7 us against cuDNN's 113.4 (docs/results/h200.json).
//
// Configuration: 128 keys per K/V tile. D=128: 2 consumers (225 KB of shared memory). D=64: 2 or 3 consumers,
// and with 3 the list may end each head with 128-row items run by two: plan_d64 replays the rounds for each
// candidate list and keeps the one whose busiest CTA finishes first; 1 consumer and 4 slots when the grid is
// one wave of 64-row items (short sequences, below).
// ptxas (nvcc 13.0, sm_90a; 0 spills, 0 stack, 1 CTA/SM; the __half and __nv_bfloat16 kernels alike), template
// <D, keys per tile, consumers, slots>:
//   v12_fwd<64, 128, 2, 2>   168 regs at entry (producer 24, consumers 240)  129.1 KB dynamic smem, 384 threads
//   v12_fwd<64, 128, 3, 2>   128 regs at entry (producer 32, consumers 160)  145.1 KB, 512 threads
//   v12_fwd<64, 128, 1, 4>   240 regs at entry (producer 24, consumer 240)   209.1 KB, 256 threads
//   v12_fwd<128, 128, 2, 2>  168 regs at entry (producer 24, consumers 240)  225.1 KB, 384 threads
//
// Run:  flashcore test v12 && flashcore bench v12 --shape 2,16,4096,128 && flashcore sass v12
//
// Measured (H200, `flashcore bench`, L2 flushed, cold mode; the record docs/results/h200.json of this build
// beside two runs of the build before the TMA-store epilogue; ranges cover all three):
//   shape              v12 TFLOP/s   SDPA default (cuDNN)   SDPA flash (FA2)   v12 / SDPA default
//   2,16,4096,64       488           458-464                 292-295           1.05-1.07x
//     causal           387-389       367-372                 231-235           1.04-1.06x
//   2,16,4096,128      633-656       637-658                 346-351           1.00x (0.997, 1.001, 1.004; 0.99)
//     causal           568-577       508-518                 269-273           1.11-1.12x
//   1,16,16384,64      508-520       458-472                 300-306           1.10-1.12x
//     causal           484-542       438-453                 279-281           1.10-1.21x
//   1,8,512,64         9.1-9.2 us    10.9-11.0 us            13.9-14.5 us      0.83x of SDPA's time
// Steps (TFLOP/s at 2,16,4096,64 | causal | 2,16,4096,128 | causal; docs/ladder.md): one CTA per tile 421 | 348
// | 630 | 513; mixed 192/128-row lists 449 | 345 | 634 | 526; persistent CTAs 482-486 | 350 | 657 | 520; every
// consumer takes every turn 490 | 345 | 650 | 523; snake rounds 488 | 389 | 650 | 574; TMA-store epilogue
// 494 | 394 | 646.
// Short sequences (D=64, one wave of 64-row items): one consumer per CTA, 64-row items, 4 ring slots (a 512-key
// head's K and V all in flight at once), no turns, its first loads issued before the ones panels are written:
// 1,8,512,64 9.1-9.2 us (two 128-row consumers: 10.7-10.9; graph 6.2 vs 8.2). Past one wave it loses (2,8,1024,64:
// 21.6 vs 16.8 us). v11's split-key kernel (8.0-8.1 us) stays the fastest rung there; the 0.6x target is not met
// (docs/ladder.md: the steps, ncu figures and the floor).
//
// ncu on the committed build: D=128 421 us, tensor pipe 79.5% active, top stalls wait 2.45, long scoreboard 0.86,
// barrier 0.60 per instruction (a tie with cuDNN, not a margin); D=64 280 us, tensor pipe 59.6%.
// Where the time went at D=64 (ncu, first version): ALU the busiest pipe, 60% issue slots busy against cuDNN's
// 51%; the masked/unmasked split and the ones columns took the tile from 810 to ~520 SASS instructions. A 192-row
// item takes 1.32-1.37x a 128-row one (3 consumers keep the tensor pipe fed through the softmax), which is why
// D=64 prefers them once the rounds come out even.
//
// Tried and not kept (TFLOP/s, same run as the baseline beside it):
//   - exponent exact by rounding S * c first (FMUL + FADD per element): 379 vs 396 at D=64, 565 vs 606 at D=128.
//   - 192 keys per tile at D=64: 394 vs 418; 176 at D=128: 541 vs 540 (and no room next to the ones panels).
//   - 3 K/V slots at D=64: 408 vs 420 (2,16,4096,64), 454 vs 469 (1,16,16384,64).
//   - 3 consumers at causal 2,16,4096,64 (one CTA per tile): 336 vs 343.
#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "flashcore.h"
#include "hopper.cuh"

constexpr int kSchedBarrier = 1;  // named barriers 1 .. kConsumers: the consumers' GEMM turns; then one per consumer

template <int kHeadDim_, int kBlockN_, int kConsumers_, int kStages_>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;  // keys per K/V tile
  static constexpr int kConsumers = kConsumers_;                           // consumer warpgroups, 64 rows each
  static constexpr int kStages = kStages_;  // K/V ring slots (2 for long runs: 3 at D = 64 measured 408 vs 420)
  static constexpr int kBlockM = 64 * kConsumers;                          // Br: query rows per CTA
  static constexpr int kThreads = fc::kWarpgroupThreads * (1 + kConsumers);  // + the producer warpgroup
  // setmaxnreg: what the producer keeps and what each consumer grows to (the register file is 64 K).
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "register file");
  static constexpr int kPanels = kHeadDim / 64;           // 128-byte panels of 64 columns per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  // Each V slot is followed by a panel of ones, which P V reads as 8 more columns of V: those columns of O
  // accumulate l = sum_j P_ij from the same fp16 P as the rest of O (so numerator and denominator agree
  // exactly: one-hot and uniform rows come out exact), with no FADD for the row sum.
  static constexpr int kVSlotBytes = kKVBytes + kBlockN * 128;
  static constexpr int kOCols = kHeadDim + 8;             // O's columns in registers: D, then l (x 8)
  // Shared memory: Q_i | K_j x kStages | (V_j, ones) x kStages | O | mbarriers; 1024-byte aligned (swizzle atom).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kOOffset = kVOffset + kStages * kVSlotBytes;  // O's staging tile, laid out as Q_i's
  static constexpr int kBarOffset = kOOffset + kQBytes;
  static constexpr int kSmemBytes = kBarOffset + 8 * (2 + 4 * kStages) + 1024;  // + alignment slack
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles keep the 1024-byte swizzle alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory: at most 227 KB per block on sm_90");
};

template <int kStages>
struct Barriers {
  uint64_t q_full, q_empty;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
};

struct Maps {
  CUtensorMap q, k, v, o;
};

// The work: a list of items, `big` items of kBlockM query rows per head, every head's, then `small` items of
// kBlockM - 64 rows per head (mixed grids only, D = 64: three consumers, so the small items run with one
// fewer and fill the last round). The CTAs are persistent, one per SM, and deal the list out in rounds that
// alternate direction: in round r CTA c runs item r * #CTAs + c (r even) or r * #CTAs + #CTAs - 1 - c (r odd).
// Causal lists go longest first, so the snake pairs a CTA's heavy items with light ones (2,16,4096 causal, the
// busiest CTA's load in 128-row tiles: 144 dealt straight, 128 by the snake, 128 the mean).
struct Items {
  int big, small;  // items per head
};

// One item: its head, first query row and how many consumers have rows in it (64 each).
struct Item {
  int bh, m0, consumers;
};

__host__ __device__ __forceinline__ int snake_index(int round, int cta, int ctas) {
  return round * ctas + ((round & 1) ? ctas - 1 - cta : cta);
}

template <int kBlockM>
__host__ __device__ __forceinline__ Item item_at(const FlashcoreParams& p, Items items, int index) {
  const int heads = p.batch * p.heads;
  Item it;
  int rows = kBlockM;
  if (index < items.big * heads) {
    if (p.causal) {  // longest rows first, across every head: the last round gets the light items
      it.m0 = (items.big - 1 - index / heads) * kBlockM;
      it.bh = index % heads;
    } else {  // a head's query tiles side by side: they walk its K and V together through L2
      it.bh = index / items.big;
      it.m0 = (index % items.big) * kBlockM;
    }
  } else {
    index -= items.big * heads;
    rows = kBlockM - 64;
    it.bh = index / items.small;
    it.m0 = items.big * kBlockM + (index % items.small) * rows;
  }
  it.consumers = min(rows, p.seq_len - it.m0 + 63) / 64;  // a consumer whose 64 rows all lie past S sits out
  return it;
}

// K/V tiles an item reads: every tile of S_kv keys, or (causal) those left of its last row's diagonal, which
// the offset S_kv - S shifts; none when S > S_kv and its rows all lie above the first key's diagonal.
template <int kBlockN>
__host__ __device__ __forceinline__ int item_tiles(const FlashcoreParams& p, const Item& it) {
  const int keys = p.causal ? min(p.seq_len_kv, it.m0 + 64 * it.consumers + fc::causal_offset(p)) : p.seq_len_kv;
  return fc::ceil_div(max(keys, 0), kBlockN);
}

// Whether K/V tile n needs the mask for a warpgroup whose first row sees keys up to first_diag (its row +
// S_kv - S): the tile reaches past S_kv or (causal) right of that diagonal. Every other tile is visible whole
// to each of the warpgroup's rows.
template <int kBlockN>
__host__ __device__ __forceinline__ bool tile_needs_mask(const FlashcoreParams& p, int n, int first_diag) {
  const int last_col = (n + 1) * kBlockN - 1;
  return last_col >= p.seq_len_kv || (p.causal && last_col > first_diag);
}

// The K/V head of query head bh = b * H + h (grouped-query: H / H_kv query heads share one): b * H_kv + h / (H /
// H_kv), which is bh / (H / H_kv) since H_kv divides H.
__host__ __device__ __forceinline__ int kv_head(const FlashcoreParams& p, int bh) {
  return bh / (p.heads / p.heads_kv);
}

// Row state of one thread: it owns rows r and r + 8 of its warp's 16 (see hopper.cuh's fragment layout).
struct RowState {
  float m[2];  // running max of S * scale * log2(e) per row (l lives in O's extra columns)
};

// P = exp2(S * c - m) for one score tile in place, with the mask applied first where the tile needs it;
// returns each row's rescale factor exp2(m_old - m_new) and updates m. Needs c > 0 (max commutes).
// diag0: the last key this thread's first row sees under causal (its row + S_kv - S; its second row's is + 8).
template <int kBlockN, bool kMask>
__device__ __forceinline__ void online_softmax(float (&s)[kBlockN / 2], RowState& st, float (&alpha)[2], float c,
                                               int diag0, int col0, int seq_len_kv, bool causal) {
  if (kMask) {  // -inf past the keys and (causal) right of the diagonal
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = col0 + 8 * j + 2 * (threadIdx.x % 4) + (e & 1);
        const int diag = diag0 + (e >> 1) * 8;
        if (col >= seq_len_kv || (causal && col > diag)) s[4 * j + e] = -INFINITY;
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
    // A row with nothing visible yet keeps m = -inf; subtract 0 then so that exp2 gives 0, not NaN. Causal keys
    // are a prefix, so a row with none in tile 0 (S > S_kv) never gets one: it ends with O = 0 and l = 0.
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

template <class Cfg, typename T>
const char* launch(const FlashcoreParams& p, Items items, cudaStream_t stream) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM;
  constexpr CUtensorMapDataType kType =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const auto kernel = v12_fwd<kHeadDim, kBlockN, Cfg::kConsumers, Cfg::kStages, T>;
  if (const char* err = fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes)) return err;
  const int bh = p.batch * p.heads, bh_kv = p.batch * p.heads_kv;
  Maps maps;
  if (!fc::encode_panel_map(&maps.q, kType, p.q, bh, p.seq_len, kHeadDim, kBlockM, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.k, kType, p.k, bh_kv, p.seq_len_kv, kHeadDim, kBlockN, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.v, kType, p.v, bh_kv, p.seq_len_kv, kHeadDim, kBlockN, Cfg::kPanels) ||
      !fc::encode_panel_map(&maps.o, kType, p.o, bh, p.seq_len, kHeadDim, 64, 1)) {
    return fc::message("v12: the driver refused a TMA tensor map (is the driver new enough, the tensor 16-byte aligned?)");
  }
  const int num_items = (items.big + items.small) * bh;
  kernel<<<std::min(num_items, fc::sm_count()), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps, items);
  return fc::launch_status();
}

// Tiles: 128 keys per K/V tile everywhere (192 measured 394 vs 418 TFLOP/s at 2,16,4096,64; 176 at D = 128
// does not fit next to the ones panels).
constexpr int kKeysPerTile = 128;
using Cfg64 = Config<64, kKeysPerTile, 2, 2>;
using Cfg64Wide = Config<64, kKeysPerTile, 3, 2>;
using Cfg128 = Config<128, kKeysPerTile, 2, 2>;
// Grids of one wave of 64-row items (1,8,512,64: 64 on 132 SMs, where 128-row items made 32): one consumer per
// CTA, twice the CTAs, and four slots, so a 512-key head's K and V are all in flight at once.
using Cfg64Short = Config<64, kKeysPerTile, 1, 4>;

// D = 64's grid. Three consumers (192 rows) do more per SM than two: a 192-row item takes ~1.33x a 128-row
// one (measured 1.32-1.37x), but 192-row items quantize the work into fewer, longer rounds. So the item list
// is chosen by replaying the persistent CTAs' rounds (snake_index) with those costs: the
// plan whose busiest CTA finishes first wins (ties: the plain 2-consumer list). Candidates: plain lists of
// 128 or 192 rows, and mixed lists that end every head with 128-row items instead of its last k 192-row ones.
struct Plan {
  int consumers;  // 1, 2 or 3: the kernel
  Items items;
};

template <int kBlockM>
static double items_makespan(const FlashcoreParams& p, Items items, int sms) {
  static constexpr double kCost[4] = {0.0, 0.7, 1.0, 1.33};  // by consumers with rows, in 128-row item times
  const int num_items = (items.big + items.small) * p.batch * p.heads;
  const int ctas = std::min(num_items, sms);
  std::vector<double> busy(ctas, 0.0);  // each persistent CTA's total
  for (int round = 0; round * ctas < num_items; ++round)
    for (int cta = 0; cta < ctas; ++cta) {
      const int index = snake_index(round, cta, ctas);
      if (index < num_items) busy[cta] += kCost[item_at<kBlockM>(p, items, index).consumers];
    }
  return *std::max_element(busy.begin(), busy.end());
}

static Plan plan_d64(const FlashcoreParams& p) {
  const int sms = fc::sm_count();
  const long bh = static_cast<long>(p.batch) * p.heads;
  const int tiles128 = fc::ceil_div(p.seq_len, 128), tiles192 = fc::ceil_div(p.seq_len, 192);
  Plan plain2 = {2, {tiles128, 0}}, plain3 = {3, {tiles192, 0}};
  // One wave of 64-row items (1,8,512,64: 64 CTAs): the one-consumer kernel. Past one wave it lost: 2,8,1024,64
  // (256 items, two rounds) 21.6 us against 16.8 for one round of 128 two-consumer items.
  const int tiles64 = fc::ceil_div(p.seq_len, 64);
  if (bh * tiles64 <= sms) return {1, {tiles64, 0}};
  if (p.causal) return tiles192 * bh >= 8L * sms ? plain3 : plain2;  // causal: 336 vs 343 TFLOP/s at 4096 rows
  if (bh * tiles128 > 24L * sms) return plain3;  // 24+ waves: quantization is noise, 192 rows win per SM
  // The last plan asked for, kept: replaying ~10 plans of up to 24 rounds costs tens of microseconds a call.
  static std::mutex mutex;
  static long last_key[3] = {-1, -1, -1};
  static Plan last_plan;
  const std::lock_guard<std::mutex> lock(mutex);
  if (last_key[0] == bh && last_key[1] == p.seq_len && last_key[2] == sms) return last_plan;
  Plan best = plain2;
  double best_time = items_makespan<128>(p, plain2.items, sms);
  auto consider = [&](Plan plan) {
    const double t = items_makespan<192>(p, plan.items, sms);
    if (t < best_time - 1e-9) best = plan, best_time = t;
  };
  consider(plain3);
  for (int k = 1; k <= 8 && p.seq_len / 192 - k >= 1; ++k) {
    const int big = p.seq_len / 192 - k;
    consider({3, {big, fc::ceil_div(p.seq_len - 192 * big, 128)}});
  }
  last_key[0] = bh, last_key[1] = p.seq_len, last_key[2] = sms;
  last_plan = best;
  return best;
}

// The kernel (consumers) and work list for these parameters; D = 128 always takes plain 128-row items.
static Plan plan_for(const FlashcoreParams& p) {
  return p.head_dim == 64 ? plan_d64(p) : Plan{2, {fc::ceil_div(p.seq_len, 128), 0}};
}

int flashcore_dtypes() { return (1 << kFlashcoreFloat16) | (1 << kFlashcoreBFloat16); }

int flashcore_features() { return kFlashcoreGqa | kFlashcoreSeqLenKv | kFlashcoreLse; }

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (head_dim == 64 && max_plans >= 6) {
    plans[0] = {"v12_fwd<64, 128, 2, 2, __half>", Cfg64::kThreads, Cfg64::kSmemBytes};
    plans[1] = {"v12_fwd<64, 128, 3, 2, __half>", Cfg64Wide::kThreads, Cfg64Wide::kSmemBytes};
    plans[2] = {"v12_fwd<64, 128, 1, 4, __half>", Cfg64Short::kThreads, Cfg64Short::kSmemBytes};
    plans[3] = {"v12_fwd<64, 128, 2, 2, __nv_bfloat16>", Cfg64::kThreads, Cfg64::kSmemBytes};
    plans[4] = {"v12_fwd<64, 128, 3, 2, __nv_bfloat16>", Cfg64Wide::kThreads, Cfg64Wide::kSmemBytes};
    plans[5] = {"v12_fwd<64, 128, 1, 4, __nv_bfloat16>", Cfg64Short::kThreads, Cfg64Short::kSmemBytes};
    return 6;
  }
  if (head_dim == 128 && max_plans >= 2) {
    plans[0] = {"v12_fwd<128, 128, 2, 2, __half>", Cfg128::kThreads, Cfg128::kSmemBytes};
    plans[1] = {"v12_fwd<128, 128, 2, 2, __nv_bfloat16>", Cfg128::kThreads, Cfg128::kSmemBytes};
    return 2;
  }
  return 0;
}

template <typename T>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: {
      const Plan plan = plan_for(p);
      switch (plan.consumers) {
        case 1: return launch<Cfg64Short, T>(p, plan.items, stream);
        case 3: return launch<Cfg64Wide, T>(p, plan.items, stream);
        default: return launch<Cfg64, T>(p, plan.items, stream);
      }
    }
    case 128: return launch<Cfg128, T>(p, plan_for(p).items, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  if (!(p.scale > 0.f)) return fc::message("v12 needs a positive softmax scale (got %g)", p.scale);
  return p.dtype == kFlashcoreBFloat16 ? forward<__nv_bfloat16>(p, stream) : forward<__half>(p, stream);
}
