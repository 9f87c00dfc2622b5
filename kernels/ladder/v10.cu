// ladder/v10.cu — rung 10: v8's WMMA FlashAttention with a 3-stage cp.async pipeline and 64 x 64 tiles.
//
// Idea: keep v8's design -- warps that each own a 16-row block of S, a warp-private online softmax, Q_i and
// O_i in WMMA fragments, one barrier per K/V tile, the key slices merged once at the end -- and let K/V run
// two tiles ahead instead of one: the prologue issues tiles 0 and 1 as two cp.async groups, and in the
// steady state every iteration waits for the oldest group (wait_group kStages - 2), meets at the barrier,
// and refills the stage that tile j - 1 just freed with tile j + 2. A tile then has two tiles of compute to
// arrive instead of one.
//
// Change from v8: 3 stages instead of 2, and bigger tiles. kBlockM = 64 (4 row stripes) x kBlockN = 64 keys
// at D=64, each warp owning 32 keys of every tile (8 warps): per warp, half as many tiles and barriers as v8
// for the same keys, and two independent 16 x 16 score blocks in flight in S = Q K^T instead of one; per CTA,
// a 64-row Q tile reads each K/V byte from L2 once per 64 query rows instead of 48. At D=128 a tile holds
// 32 keys (16 per warp), so a stage keeps the same 17 KB: 64-key tiles at D=128 would need 104 KB for the
// three K/V stages alone, past the L4's 99 KB.
//
// Left for a later rung: warps of 32 query rows at D=64 would feed each K/V fragment read from shared
// memory to two MMAs -- about 5 KB of shared-memory traffic per 16 x 16 x 64 block of S instead of 7 KB,
// the bound at 2,16,4096,64 -- at the price of ~170 registers (one CTA per SM) and twice the per-warp
// latency that 1,8,512,64 waits for.
//
// The seed's v10 died with "unspecified launch failure" at 73 KB of shared memory. This one cannot die that
// way: the launcher asks for exactly SmemLayout::kBytes -- the same struct the kernel carves the buffer
// with -- through fc::allow_dynamic_smem, which checks the device's opt-in limit and says so when the tile
// does not fit; static_asserts keep every configuration within the L4's 99 KB; every cp.async source row
// is clamped in bounds (rows past the sequence end are zero-filled); and a stage is refilled only after
// the barrier that proves its previous tile consumed (the stage/group bookkeeping was checked on the CPU
// for S = 1 ... 1025, causal and not, at 2, 3 and 4 stages).
//
// Tuning (-D overrides; flashcore tune): V10_BLOCK_M (query rows per CTA, a multiple of 16),
// V10_BLOCK_N (keys per K/V tile at D=64; D=128 tiles hold half as many), V10_WARPS_N (warps splitting a
// tile's keys; each owns V10_BLOCK_N / V10_WARPS_N keys at D=64, half that at D=128, a multiple of 16),
// V10_STAGES (>= 2), V10_PREFETCH_L2 (1: each CTA prefetches its own rows of K and V into L2 at start, as
// v8 does; 0: not, to measure what that is worth). The static_asserts below state the rest (at most 1024
// threads, 99 KB at D=64 and at D=128).
//
// Code: the kernel body is ladder/wmma_pipeline.cuh's, shared with v8; this file picks the tiles (below) and
// wraps them in v10_fwd. Moving it there left the SASS of every v10 build byte-identical (checked with
// cuobjdump on sm_89 and sm_90, and four V10_* tunings).
//
// Run:  flashcore test v10 && flashcore bench v10 --shape 1,8,512,64
//
// ptxas (nvcc 13.0, -O3 --use_fast_math), default tiles:
//   sm_90 D=64:  127 registers, 0 B static + 84992 B dynamic smem, 0 B spills, 0 B stack (2 CTAs/SM)
//   sm_90 D=128: 172 registers, 0 B static + 81920 B dynamic smem, 0 B spills, 0 B stack (1 CTA/SM)
//   sm_89 D=64:  128 registers, 0 B static + 84992 B dynamic smem, 0 B spills, 0 B stack (1 CTA/SM)
//   sm_89 D=128: 166 registers, 0 B static + 81920 B dynamic smem, 0 B spills, 0 B stack (1 CTA/SM)
// Seed on the L4: crashed (73 KB, 3 stages, no measurement).
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench --all`, all rungs in one run, L2 flushed before
// each call, median of 200 / 100 calls):
//   1,8,512,64:   14.8 us (1.08x faster than v8)
//   2,16,4096,64: 832 us, 165.2 TFLOP/s (1.35x v8)
// Stress: 2,000 random-shape launches all OK; memcheck, racecheck, synccheck clean on 1,2,97,64 causal. `flashcore
// tune v10 --param V10_BLOCK_N=64 --param V10_STAGES=2,3` at 1,8,512,64 ranked V10_BLOCK_M=32 V10_WARPS_N=2
// V10_STAGES=2 first (12.7 us vs 14.7 us for these defaults); the defaults stay 64x64 for the large shape.
#include "ladder/wmma_pipeline.cuh"

#ifndef V10_BLOCK_M
#define V10_BLOCK_M 64
#endif
#ifndef V10_BLOCK_N
#define V10_BLOCK_N 64
#endif
#ifndef V10_WARPS_N
#define V10_WARPS_N 2
#endif
#ifndef V10_STAGES
#define V10_STAGES 3
#endif
#ifndef V10_PREFETCH_L2
#define V10_PREFETCH_L2 1
#endif

constexpr int kBlockM = V10_BLOCK_M;    // Br: query rows per CTA
constexpr int kWarpsN = V10_WARPS_N;    // key slices of every tile
constexpr int kStages = V10_STAGES;     // K/V tiles in shared memory: one computed, the rest landing
constexpr int kThreads = kBlockM / wmma_pipeline::kFrag * kWarpsN * fc::kWarpSize;  // 256 by default

static_assert(kBlockM % wmma_pipeline::kFrag == 0 && kBlockM > 0, "V10_BLOCK_M must be a positive multiple of 16");
static_assert(kWarpsN >= 1, "V10_WARPS_N must be at least 1");
static_assert(kStages >= 2, "V10_STAGES must be at least 2: a stage to compute and one to land");
static_assert(kThreads <= 1024, "V10_BLOCK_M / 16 * V10_WARPS_N must be at most 32 warps");

// Per head dim: the K/V tile holds V10_BLOCK_N keys at D=64 and half as many at D=128, so a stage has the
// same bytes at both. Two CTAs per SM at D=64 cap a 256-thread CTA at 128 registers, which the default tile
// needs (127, no spills); D=128 needs about 170, so one.
template <int kHeadDim>
constexpr int block_n() { return V10_BLOCK_N * 64 / kHeadDim; }  // Bc: keys per K/V tile
template <int kHeadDim>
constexpr int min_blocks_per_sm() { return kHeadDim == 64 && kThreads <= 256 ? 2 : 1; }
static_assert(V10_BLOCK_N * 64 % 128 == 0 && block_n<128>() % (16 * kWarpsN) == 0,
              "each warp's key slice must be a multiple of 16 at D=64 and D=128: "
              "V10_BLOCK_N must be a multiple of 32 * V10_WARPS_N");

template <int kHeadDim>
using Tiles = wmma_pipeline::Pipeline<kHeadDim, kBlockM, block_n<kHeadDim>(), kWarpsN, kStages,
                                      min_blocks_per_sm<kHeadDim>(), V10_PREFETCH_L2 != 0>;

// The one dynamic shared-memory buffer, carved in one place. Byte offsets at the default tiles,
// D = 64 (64-key tiles) | D = 128 (32-key tiles):
//   main loop                                     epilogue (after a barrier, over the same bytes)
//        0 |     0  Q_i [64][kLdTile] half             0 |     0  O_w [2][64][kLdO] float
//     9216 | 17408  K_j [3][Bc][kLdTile] half      34816 | 67584  m_w [2][64] float
//    36864 | 43520  V_j [3][Bc][kLdTile] half      35328 | 68096  l_w [2][64] float
//    64512 | 69632  S/P [8][16][kLdS] float        35840 | 68608  end
//    84992 | 81920  end
// kBytes = 84992 B at D=64, 81920 B at D=128: two CTAs per SM on an H100 at D=64, one on the L4.
// Every region starts on a 128-byte boundary (WMMA wants 32 B, cp.async 16 B). Q/K/V rows are padded by
// 16 bytes so the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<kHeadDim>()) v10_fwd(FlashcoreParams p) {
  Tiles<kHeadDim>::forward(p);
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 1) return 0;
  if (head_dim == 64) plans[0] = {FC_PLAN_NAME(v10_fwd, 64), kThreads, Tiles<64>::SmemLayout::kBytes};
  else if (head_dim == 128) plans[0] = {FC_PLAN_NAME(v10_fwd, 128), kThreads, Tiles<128>::SmemLayout::kBytes};
  else return 0;
  return 1;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return wmma_pipeline::launch<Tiles<64>>(v10_fwd<64>, p, stream);
    case 128: return wmma_pipeline::launch<Tiles<128>>(v10_fwd<128>, p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
