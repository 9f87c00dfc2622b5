// v11.cu — FlashAttention-2 on raw mma.sync: scores, softmax and P V never leave the registers.
//
// Idea: each warp owns 16 or 32 query rows and their whole softmax, as in FlashAttention-2. S = Q K_j^T is
// computed with mma.sync m16n8k16 into fp32 C fragments; a row's max and sum need two shuffles inside the
// quad of lanes that holds it; P = exp2(S * scale * log2 e - m) is packed to fp16 in place, and since the C
// fragment of two n8 tiles IS the A fragment of the next mma, P V runs straight from those registers. K_j
// and V_j stream through a cp.async ring in XOR-swizzled shared memory (chunk ^ (row & 7)), read with
// ldmatrix .x4 (.trans for V) free of bank conflicts; O is staged through shared memory for 16-byte stores.
//
// Change from the rungs below: the seeds' WMMA kernels (002-004) could not know which fragment element is
// which row (WMMA's layout is unspecified), so each tile's scores went to shared memory and back for the
// softmax, and P again for P V, with block barriers between. v11 has no such round trip: the PTX fragment
// layouts are specified, so the softmax runs on the fragments. The seeds' v9 deadlock (spin-wait
// producer/consumer) and v10 launch failure (an unchecked 73 KB request) cannot recur: one cp.async ring,
// one __syncthreads per tile that every thread reaches, every shared-memory size a static_assert (<= 99 KB)
// that goes through fc::allow_dynamic_smem.
// Also new: a warp in which no row found a new max in the tile skips the O rescale (64-128 multiplies per
// lane per tile), a vote that fires more often the further along the row; -D V11_RESCALE_LOG2=8 turns on
// FlashAttention-4's lazy rescale on top (see online_softmax for its accuracy cost).
//
// Short sequences are a latency problem, not a throughput one: 1,8,512,64 is 256 warps of 16 rows, each a
// chain of 512 / kBlockN dependent tiles. There the launcher splits the keys inside the CTA: kSplit groups
// of warps share the CTA's query rows, group g takes the g-th kBlockN keys of every ring stage (a stage
// holds kSplit * kBlockN keys), and at the end the groups merge (m_i, l_i, O_i) through shared memory:
// 4x the CTAs (32 rows instead of 128), and at D=64 a quarter of the chain per warp. Those CTAs also
// prefetch the rest of their head's K and V into L2 at the start (each CTA a slice): all CTAs of a head run
// in lockstep, so without it every ring stage would be another DRAM round trip; with it only the first is.
// Under causal masking, tiles past a warp's last row are skipped, only tiles that cross the diagonal or the
// sequence end build element masks, and the query tiles launch heaviest-first (grid x = batch * head,
// y = query tile, reversed).
//
// On sm_90 there is a second short-sequence kernel, off by default: cluster split-K (v11_cluster_fwd) splits
// the (query x key) plane in 2D across SMs. A cluster CTA owns BLOCK_M query rows and one 128-key chunk:
// Q_i and the chunk's K_j, V_j are issued at once (one DRAM round trip, no ring). The ceil(S / 128) chunk
// CTAs of a query tile form one cluster; after a cluster barrier each rank pushes its unnormalised
// (m_i, l_i, O_i) rows into the shared memory of the rank that owns them (st.shared::cluster), and after a
// second barrier each owner merges its 1/n of the rows and writes them with 16-byte stores. Used when
// built with -D V11_CLUSTER=1, the regime is short, S <= 8 chunks (a portable cluster) and the device and
// build are sm_90; causal is supported (chunks past a tile's diagonal load nothing, contribute m = -inf).
// Why it is off, measured at 1,8,512,64 on the H200 (a harness outside the product that stamps %globaltimer
// per CTA at each phase; L2 flushed; an empty kernel measures 3.55 us this way and the short kernel's span from first
// CTA start to last CTA end is 6.75 us of its 10.5):
//   - 128-row CTAs (128 CTAs, 1 per SM by registers): cudaOccupancyMaxActiveClusters says 30 clusters of 4
//     fit, so the 32 clusters ran in two waves (the last CTAs start at 7.4 us): 18.6 us. MIN_BLOCKS 2 lets
//     62 fit, but the scheduler then packs two CTAs on some SMs (120 SMs used): 15.2-16.7 us.
//   - 64-row CTAs, MIN_BLOCKS 2 (the default below; 256 CTAs on 124 SMs): 12.7-12.9 us, vs 11.5 for the
//     in-CTA split (then 8 groups x 16 keys) in the same harness (bench: 11.5 vs 10.5; the split now runs
//     9.5). Timeline medians: Q_i and K_0 land at 1.5 us, V_1 at 3.6 us, every rank done at 4.3 us, the
//     partials exchanged at 6.5 us, the end at 7.0 us.
//   The exchange is the wall: ~2.2 us to move 16 KB per CTA through distributed shared memory, whether
//   pulled, pushed, or pushed with st.async onto the owner's mbarrier (see the merge); the in-CTA split's
//   shared-memory merge of the same partials takes 1.1 us. Loading Q_i, K_j, V_j with cp.async.bulk instead
//   of cp.async was no faster (48 KB per CTA landed 1.54 vs 1.44 us after the start).
// It is correct (28 default cases, 1,000 random shapes, memcheck / racecheck / synccheck clean on
// 1,8,512,64, 1,4,1000,128 and 1,2,97,64 causal) and kept as the experiment to finish.
//
// Configuration: one per head dim and regime, each overridable with -D (V11_<SLOT>_<PARAM>, below):
//   slot        used when (pick_regime)                D   BLOCK_M BLOCK_N WARP_M STAGES SPLIT MIN_BLOCKS warps smem
//   LONG_D64    B*H*ceil(S/128) >= SMs (fills the GPU)  64     128     64     32      2     1      2        4  48 KB
//   LONG_D128                                          128     128     48     32      2     1      2        4  80 KB
//   SHORT_D64   fewer CTAs than SMs: it would idle      64      32     32     16      2     4      1        8  68 KB
//   SHORT_D128                                         128      32     16     16      2     4      1        8  72 KB
//   CLUSTER_D64  short, sm_90, S <= 8 * CHUNK_N         64      64     64     16      -     -      2        4  40 KB
//   CLUSTER_D128                                       128     128     64     16      -     -      1        8  96 KB
//   (cluster: BLOCK_N = keys per warp per tile, CHUNK_N = 128 keys per CTA = per cluster rank, all loaded at once)
// Why: 32 rows per warp (FA2's choice on sm_90: 128 rows, 4 warps) reads each K/V fragment once for two m16
// tiles. At 16 rows every mma needs 256 B of ldmatrix traffic, and 128 B/clk of shared-memory bandwidth caps
// the mma at ~470 TFLOP/s on an H100 before any softmax work; at 32 rows the tensor pipe is the limit. The
// register file sets the rest: O_i + S take 128 + 64 fp32 at D=64 x 64 keys (240 registers with Q_i held in
// registers: 2 CTAs/SM); at D=128, O_i alone is 128, so Q_i is re-read by ldmatrix each tile, and the tile
// is 48 keys (255 registers, no spills: 16 S registers fewer than FA2's 64-key tile). Tuned at 2,16,4096,128
// (`flashcore tune`, one run): 32 keys 832 us, 32 keys x 3 stages 822, 48 keys 777, 64 keys 779 (96 KB);
// 48 takes the least shared memory of the two that tie. (An earlier kernel body spilled at 48 and 64 keys,
// which is why 32 was the default until this measurement.) Short: 32 rows per CTA puts 128 CTAs (one
// per SM) on 1,8,512,64; 4 key groups of 2 warps each walk 128 keys in 4 tiles of 32, two 128-key stages.
// Tuned at 1,8,512,64 (`flashcore tune`, one run, 20 configurations, each checked first): 4 groups x 32
// keys 9.5 us; 8 x 16 (the previous default, 16 warps) 10.6; 2 x 64 9.8; 3 x 32 and 2 x 32 with 3-4 stages
// 10.4-10.8; 4 x 16 with 2-5 stages 10.3-10.8; 32-row warps 9.6-13.0. Fewer groups, a smaller merge (with
// 8 groups it took 1.1 us of the kernel); fewer than 4 make each warp's chain of tiles too long. A third
// 128-key stage would need 100 KB, 1 KB over the L4's limit. At D=128 a 128-key stage is 64 KB, so 4 groups
// x 16 keys.
// Cluster: 64 rows x 128 keys, 2 CTAs/SM, for the wave limit above; each warp walks its chunk in two 64-key
// tiles, each tile's K and V its own cp.async group, so S = Q K_0^T starts when part of the bytes has landed.
// At D=128, 128 rows x 128 keys is 96 KB, under the 99 KB limit.
//
// Tuning (-D V11_<SLOT>_<PARAM>=value; SLOT = LONG_D64, LONG_D128, SHORT_D64, SHORT_D128):
//   BLOCK_M     query rows per CTA              a multiple of WARP_M
//   BLOCK_N     keys per warp per tile          a multiple of 16 in 16..128
//   WARP_M      query rows per warp             16 or 32
//   STAGES      cp.async ring depth             >= 2
//   SPLIT       key groups per CTA              >= 1 (1: no merge, no L2 prefetch)
//   MIN_BLOCKS  __launch_bounds__ min CTAs/SM   >= 1 (caps registers at 64K / (threads * MIN_BLOCKS))
//   and V11_SPLIT_BELOW_WAVES (default 1): SHORT when B*H*ceil(S/LONG BLOCK_M) < that many waves of SMs;
//   V11_RESCALE_LOG2 (default 0.f; 8.f is FlashAttention-4's lazy rescale, see online_softmax).
//   Cluster path (SLOT = CLUSTER_D64, CLUSTER_D128): BLOCK_M (query rows per CTA, a multiple of WARP_M),
//   CHUNK_N (keys per CTA, a multiple of BLOCK_N, at most 8 tiles), BLOCK_N (16..128), WARP_M (16 or 32),
//   MIN_BLOCKS (__launch_bounds__ min CTAs/SM);
//   V11_CLUSTER (default 0; 1 builds and uses the path), V11_CLUSTER_MAX (default 8, at most 8: the
//   largest cluster, so the path takes S <= CLUSTER_MAX * CHUNK_N). Shared memory: max(BLOCK_M*D*2 +
//   2*CHUNK_N*D*2, (BLOCK_M + 8)*(8 + 4*(D+8))) <= 101376 B (static_assert in V11ClusterConfig).
// Restrictions (static_asserts in V11Config): (BLOCK_M / WARP_M) * SPLIT <= 16 warps; shared memory
// BLOCK_M*D*2 + STAGES*4*SPLIT*BLOCK_N*D <= 101376 B, and for SPLIT > 1 the merge buffer
// SPLIT*BLOCK_M*(8 + 4*(D+8)) too; threads / (D/8) a multiple of 8. Not asserted, check ptxas: spills
// (WARP_M=32 with BLOCK_N >= 128 at D=64 spills; so does MIN_BLOCKS above what the registers allow, e.g.
// the 128-row cluster CTA at D=64 with MIN_BLOCKS 2 and BLOCK_N 64: 4 B).
// Rejected: one ring per split group with named barriers — the same bytes in flight as one shared ring of
// kSplit * kBlockN keys, for more code.
//
// Run:  flashcore test v11 && flashcore bench v11 --shape 1,8,512,64 && flashcore bench v11 --shape 2,16,4096,64
//
// ptxas (nvcc 13.0, -O3 --use_fast_math -lineinfo; no static shared memory, 0 spill bytes, no stack frame):
//   kernel                                threads  dynamic smem  registers sm_90 | sm_89
//   v11_fwd<64, 128, 64, 32, 2, 1, 2>         128      49,152 B        240 | 230    (2 CTAs/SM)
//   v11_fwd<64, 32, 32, 16, 2, 4, 1>          256      69,632 B        127 | 121
//   v11_fwd<128, 128, 48, 32, 2, 1, 2>        128      81,920 B        255 | 254    (2 CTAs/SM)
//   v11_fwd<128, 32, 16, 16, 2, 4, 1>         256      73,728 B        173 | 165
//   v11_cluster_fwd<64, 64, 128, 64, 16, 2>   128      40,960 B        146 | 4      (sm_89: a trap stub)
//   v11_cluster_fwd<128, 128, 128, 64, 16, 1> 256      98,304 B        210 | 4
// SASS (sm_90, cuobjdump): HMMA.16816.F32, LDSM.16.M88.4 / LDSM.16.MT88.4, LDGSTS.E.BYPASS.128, CCTL.E.PF2
// (the L2 prefetch); no LDL / STL. Cluster kernel: UCGABAR_ARV / UCGABAR_WAIT (twice), ST.E.64 (the DSMEM
// pushes), STG.E.128 (an inline st.global.v4: nvcc splits a uint4 built from packed halves into four STG.E),
// MEMBAR.ALL.GPU + ERRBAR (each barrier's release) and CCTL.IVALL (its acquire).
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench v11 --shape ...`, one run per shape beside SDPA's
// backends and Triton, L2 flushed before each call, median of 200 / 100 calls):
//   shape              v11                      SDPA default   SDPA flash (FA2)   target              met
//   1,8,512,64         9.5 us                   11.7 us        15.2 us            <= 0.6x SDPA's time  no: 0.81x
//   1,8,512,64 causal  9.4 us                   12.1 us        15.6 us
//   2,16,4096,64       441.5 us, 311.3 TFLOP/s  454.2          291.3              >= FA2               yes: 1.07x
//     causal           237.0 us, 290.0 TFLOP/s  364.9          229.5              >= FA2               yes: 1.26x
//   2,16,4096,128      774.1 us, 355.1 TFLOP/s  638.2          334.6              >= FA2               yes: 1.06x
//     causal           407.0 us, 337.7 TFLOP/s  506.9          270.7              >= FA2               yes: 1.25x
// (D=128 non-causal in three more runs that day: 783.6 us vs FA2 805.3, 794.8 vs 818.7, 781.7 vs 813.5:
// 1.03x-1.04x; with the 32-key tile it was 0.96x-1.00x. 1,8,512,64 in two more: 9.5 vs 12.0, 9.6 vs 11.8.)
// Where the mission-shape time goes (the short kernel before the retune, 8 groups x 16 keys, 10.5 us; per-CTA
// probes as above, medians): the first ring stage (Q_i + 32 KB of K, V from DRAM) lands 1.3 us after the
// CTA starts; each of the next three takes 1.05-1.3 us (32 KB per CTA in flight, ~30 B/ns per SM: latency-
// bound, as a load-only kernel moves 48 KB per SM in 1.0 us); the last tile and its barrier 0.9 us; the
// merge 1.1 us. That is a 6.75 us span, and the measurement adds 3.75 us to it (an empty kernel measures
// 3.55 us). The 0.6x target is 7.0-7.2 us here, ~3.5 us above an empty kernel, for work whose first DRAM
// round trip alone takes 1.3-1.5 us, whose key-split partials take 1.1 us (shared memory) to 2.2 us
// (distributed shared memory) to merge, and whose mma and exp work is an estimated ~1 us per SM. Earlier
// ncu of that kernel (--clock-control none): 8.38 us of kernel, SM throughput 34.5%, tensor pipe 13.6%,
// DRAM 4.0%, L2 12.1%, achieved occupancy 23%.
#include "flashcore.h"
#include "mma_sm80.cuh"
#include "primitives.cuh"

#include <cstdint>

#ifndef V11_LONG_D64_BLOCK_M
#define V11_LONG_D64_BLOCK_M 128
#endif
#ifndef V11_LONG_D64_BLOCK_N
#define V11_LONG_D64_BLOCK_N 64
#endif
#ifndef V11_LONG_D64_WARP_M
#define V11_LONG_D64_WARP_M 32
#endif
#ifndef V11_LONG_D64_STAGES
#define V11_LONG_D64_STAGES 2
#endif
#ifndef V11_LONG_D64_MIN_BLOCKS
#define V11_LONG_D64_MIN_BLOCKS 2
#endif
#ifndef V11_LONG_D64_SPLIT
#define V11_LONG_D64_SPLIT 1
#endif
#ifndef V11_LONG_D128_BLOCK_M
#define V11_LONG_D128_BLOCK_M 128
#endif
#ifndef V11_LONG_D128_BLOCK_N
#define V11_LONG_D128_BLOCK_N 48
#endif
#ifndef V11_LONG_D128_WARP_M
#define V11_LONG_D128_WARP_M 32
#endif
#ifndef V11_LONG_D128_STAGES
#define V11_LONG_D128_STAGES 2
#endif
#ifndef V11_LONG_D128_MIN_BLOCKS
#define V11_LONG_D128_MIN_BLOCKS 2
#endif
#ifndef V11_LONG_D128_SPLIT
#define V11_LONG_D128_SPLIT 1
#endif
#ifndef V11_SHORT_D64_BLOCK_M
#define V11_SHORT_D64_BLOCK_M 32
#endif
#ifndef V11_SHORT_D64_BLOCK_N
#define V11_SHORT_D64_BLOCK_N 32
#endif
#ifndef V11_SHORT_D64_WARP_M
#define V11_SHORT_D64_WARP_M 16
#endif
#ifndef V11_SHORT_D64_STAGES
#define V11_SHORT_D64_STAGES 2
#endif
#ifndef V11_SHORT_D64_MIN_BLOCKS
#define V11_SHORT_D64_MIN_BLOCKS 1
#endif
#ifndef V11_SHORT_D64_SPLIT
#define V11_SHORT_D64_SPLIT 4
#endif
#ifndef V11_SHORT_D128_BLOCK_M
#define V11_SHORT_D128_BLOCK_M 32
#endif
#ifndef V11_SHORT_D128_BLOCK_N
#define V11_SHORT_D128_BLOCK_N 16
#endif
#ifndef V11_SHORT_D128_WARP_M
#define V11_SHORT_D128_WARP_M 16
#endif
#ifndef V11_SHORT_D128_STAGES
#define V11_SHORT_D128_STAGES 2
#endif
#ifndef V11_SHORT_D128_MIN_BLOCKS
#define V11_SHORT_D128_MIN_BLOCKS 1
#endif
#ifndef V11_SHORT_D128_SPLIT
#define V11_SHORT_D128_SPLIT 4
#endif
#ifndef V11_RESCALE_LOG2
#define V11_RESCALE_LOG2 0.f
#endif
#ifndef V11_SPLIT_BELOW_WAVES
#define V11_SPLIT_BELOW_WAVES 1
#endif
#ifndef V11_CLUSTER
#define V11_CLUSTER 0  // off: measured slower than the in-CTA split (see the header)
#endif
#ifndef V11_CLUSTER_MAX
#define V11_CLUSTER_MAX 8
#endif
#ifndef V11_CLUSTER_D64_BLOCK_M
#define V11_CLUSTER_D64_BLOCK_M 64
#endif
#ifndef V11_CLUSTER_D64_CHUNK_N
#define V11_CLUSTER_D64_CHUNK_N 128
#endif
#ifndef V11_CLUSTER_D64_BLOCK_N
#define V11_CLUSTER_D64_BLOCK_N 64
#endif
#ifndef V11_CLUSTER_D64_WARP_M
#define V11_CLUSTER_D64_WARP_M 16
#endif
#ifndef V11_CLUSTER_D64_MIN_BLOCKS
#define V11_CLUSTER_D64_MIN_BLOCKS 2
#endif
#ifndef V11_CLUSTER_D128_MIN_BLOCKS
#define V11_CLUSTER_D128_MIN_BLOCKS 1
#endif
#ifndef V11_CLUSTER_D128_BLOCK_M
#define V11_CLUSTER_D128_BLOCK_M 128
#endif
#ifndef V11_CLUSTER_D128_CHUNK_N
#define V11_CLUSTER_D128_CHUNK_N 128
#endif
#ifndef V11_CLUSTER_D128_BLOCK_N
#define V11_CLUSTER_D128_BLOCK_N 64
#endif
#ifndef V11_CLUSTER_D128_WARP_M
#define V11_CLUSTER_D128_WARP_M 16
#endif

constexpr int kMaxSmemBytes = 101376;  // the L4's 99 KB opt-in limit per block
constexpr int kMaxWarps = 16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kRescaleLog2 = V11_RESCALE_LOG2;

// A tile configuration and everything derived from it. Shared-memory layout (byte offsets):
//   main loop   Q_i      [0, kQBytes)                          [kBlockM][kHeadDim] fp16, swizzled
//               stage s  [kQBytes + s * kStageBytes, + kStageBytes): K_j [kTileN][kHeadDim] fp16, swizzled,
//                        then V_j, same shape, at + kKvBytes
//   split merge (reuses the same bytes once every warp has left the loop; kSplit > 1 only)
//               stats    [0, kStatsBytes)                      [kSplit][kBlockM] float2 (m_i * scale * log2 e, l_i)
//               O parts  [kStatsBytes, kMergeBytes)             [kSplit][kBlockM][kOStride] fp32
// Every region starts on a 128-byte boundary: rows are 128 or 256 bytes and all counts are multiples of 16.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpM_, int kStages_, int kSplit_, int kMinBlocks_>
struct V11Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per warp per tile
  static constexpr int kWarpM = kWarpM_;    // query rows per warp
  static constexpr int kStages = kStages_;
  static constexpr int kSplit = kSplit_;    // key groups per CTA
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the register budget must allow

  static constexpr int kMTiles = kWarpM / 16;        // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp and tile
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O
  static constexpr int kKChunks = kHeadDim / 16;     // k16 steps of Q K^T
  static constexpr int kRowWarps = kBlockM / kWarpM;
  static constexpr int kWarps = kRowWarps * kSplit;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  static constexpr int kTileN = kSplit * kBlockN;   // keys per ring stage
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  // O_i (kMTiles * kDTiles * 4 fp32) plus Q_i held whole in registers must leave room for S and addresses.
  static constexpr bool kQInRegs = kMTiles * kHeadDim <= 128;

  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKvBytes = kTileN * kRowBytes;
  static constexpr int kStageBytes = 2 * kKvBytes;
  static constexpr int kLoopBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kOStride = kHeadDim + 8;  // +8 floats: a half-warp's float2 stores cover the 32 banks once
  static constexpr int kStatsBytes = kSplit * kBlockM * 8;
  static constexpr int kMergeBytes = kSplit > 1 ? kStatsBytes + kSplit * kBlockM * kOStride * 4 : 0;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpM == 16 || kWarpM == 32, "WARP_M: 16 or 32 query rows per warp");
  static_assert(kBlockM % kWarpM == 0 && kBlockM >= kWarpM, "BLOCK_M: a multiple of WARP_M");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "BLOCK_N: a multiple of 16 in 16..128");
  static_assert(kStages >= 2, "STAGES: at least 2 (one tile computes while the next lands)");
  static_assert(kSplit >= 1, "SPLIT: at least 1");
  static_assert(kMinBlocks >= 1, "MIN_BLOCKS: at least 1");
  static_assert(kWarps <= kMaxWarps, "(BLOCK_M / WARP_M) * SPLIT: at most 16 warps per CTA");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0,
                "a CTA-wide copy pass must cover whole 8-row swizzle periods");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

// Configuration slots: the launcher uses exactly these four kernels, and the two cluster ones below.
using LongD64 = V11Config<64, V11_LONG_D64_BLOCK_M, V11_LONG_D64_BLOCK_N, V11_LONG_D64_WARP_M,
                          V11_LONG_D64_STAGES, V11_LONG_D64_SPLIT, V11_LONG_D64_MIN_BLOCKS>;
using LongD128 = V11Config<128, V11_LONG_D128_BLOCK_M, V11_LONG_D128_BLOCK_N, V11_LONG_D128_WARP_M,
                           V11_LONG_D128_STAGES, V11_LONG_D128_SPLIT, V11_LONG_D128_MIN_BLOCKS>;
using ShortD64 = V11Config<64, V11_SHORT_D64_BLOCK_M, V11_SHORT_D64_BLOCK_N, V11_SHORT_D64_WARP_M,
                           V11_SHORT_D64_STAGES, V11_SHORT_D64_SPLIT, V11_SHORT_D64_MIN_BLOCKS>;
using ShortD128 = V11Config<128, V11_SHORT_D128_BLOCK_M, V11_SHORT_D128_BLOCK_N, V11_SHORT_D128_WARP_M,
                            V11_SHORT_D128_STAGES, V11_SHORT_D128_SPLIT, V11_SHORT_D128_MIN_BLOCKS>;

// The cluster split-K configuration (sm_90, short sequences). Each CTA owns kBlockM query rows and one
// chunk of kChunkN keys, loaded whole at once; the ceil(S / kChunkN) CTAs of one query tile form a cluster
// and merge their (m_i, l_i, O_i) through distributed shared memory. The members the shared device
// helpers read (kBlockN = keys per warp per tile, kMTiles, kNTiles, ...) mean what they mean in V11Config.
// Shared-memory layout (byte offsets):
//   main loop   Q_i   [0, kQBytes)                              [kBlockM][kHeadDim] fp16, swizzled
//               K_j   [kQBytes, kQBytes + kKvBytes)             [kChunkN][kHeadDim] fp16, swizzled
//               V_j   [kQBytes + kKvBytes, kLoopBytes)          [kChunkN][kHeadDim] fp16, swizzled
//   merge (reuses the same bytes after a __syncthreads; peers read it between the two cluster barriers)
//               stats [0, kStatsBytes)                          [kBlockM] float2 (m_i * scale * log2 e, l_i)
//               O_i   [kStatsBytes, kMergeBytes)                [kBlockM][kOStride] fp32, unnormalised
// Every region starts on a 128-byte boundary (rows of 128 or 256 bytes, kBlockM a multiple of 16).
template <int kHeadDim_, int kBlockM_, int kChunkN_, int kBlockN_, int kWarpM_, int kMinBlocks_>
struct V11ClusterConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: query rows per CTA (and per cluster)
  static constexpr int kChunkN = kChunkN_;  // keys per CTA: the cluster's rank r takes keys [r, r + 1) * kChunkN
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per warp per tile (one cp.async group each for K, V)
  static constexpr int kWarpM = kWarpM_;    // query rows per warp
  static constexpr int kMaxCluster = V11_CLUSTER_MAX;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__ min CTAs/SM

  static constexpr int kMTiles = kWarpM / 16;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKChunks = kHeadDim / 16;
  static constexpr int kTiles = kChunkN / kBlockN;  // tiles per chunk
  static constexpr int kWarps = kBlockM / kWarpM;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr bool kQInRegs = kMTiles * kHeadDim <= 128;

  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKvBytes = kChunkN * kRowBytes;
  static constexpr int kLoopBytes = kQBytes + 2 * kKvBytes;
  static constexpr int kOStride = kHeadDim + 8;  // as V11Config: float2 fragment stores free of conflicts
  // receive slots: n * ceil(kBlockM / n) <= kBlockM + n - 1 rows
  static constexpr int kMergeRows = kBlockM + kMaxCluster;
  static constexpr int kStatsBytes = (kMergeRows * 8 + 127) / 128 * 128;
  static constexpr int kMergeBytes = kStatsBytes + kMergeRows * kOStride * 4;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpM == 16 || kWarpM == 32, "CLUSTER WARP_M: 16 or 32 query rows per warp");
  static_assert(kBlockM % kWarpM == 0 && kBlockM >= kWarpM, "CLUSTER BLOCK_M: a multiple of WARP_M");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "CLUSTER BLOCK_N: a multiple of 16 in 16..128");
  static_assert(kChunkN % kBlockN == 0, "CLUSTER CHUNK_N: a multiple of BLOCK_N");
  static_assert(2 * kTiles <= 16, "CLUSTER CHUNK_N / BLOCK_N: at most 8 tiles (cp_async_wait_n's range)");
  static_assert(kMaxCluster >= 1 && kMaxCluster <= 8, "CLUSTER_MAX: 1..8 CTAs (the portable cluster size)");
  static_assert(kWarps <= kMaxWarps, "CLUSTER BLOCK_M / WARP_M: at most 16 warps per CTA");
  static_assert(kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0,
                "a CTA-wide copy pass must cover whole 8-row swizzle periods");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

using ClusterD64 = V11ClusterConfig<64, V11_CLUSTER_D64_BLOCK_M, V11_CLUSTER_D64_CHUNK_N, V11_CLUSTER_D64_BLOCK_N,
                                    V11_CLUSTER_D64_WARP_M, V11_CLUSTER_D64_MIN_BLOCKS>;
using ClusterD128 = V11ClusterConfig<128, V11_CLUSTER_D128_BLOCK_M, V11_CLUSTER_D128_CHUNK_N,
                                     V11_CLUSTER_D128_BLOCK_N, V11_CLUSTER_D128_WARP_M, V11_CLUSTER_D128_MIN_BLOCKS>;

// kRows x kChunks 16-byte chunks of a [S, D] slice, rows first_row.., into a swizzled tile. Rows at or past
// valid_rows are zeroed with a plain shared store instead (never read from global memory), so the copies
// of one thread all address off one pointer with immediate offsets.
template <class Cfg, int kRows>
__device__ __forceinline__ void copy_rows_async(unsigned char* tile, const __half* src, int first_row,
                                                int valid_rows, int tid) {
  constexpr int kPasses = fc::ceil_div(kRows * Cfg::kChunks, Cfg::kThreads);
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunks;
  const int row0 = tid / Cfg::kChunks;
  const int chunk = tid % Cfg::kChunks;
  const __half* g = src + static_cast<size_t>(first_row + row0) * Cfg::kHeadDim + chunk * 8;
  unsigned char* s = tile + fc::swizzle(row0, chunk, Cfg::kRowBytes);  // row0 + k * kRowsPerPass: same XOR
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    if ((kRows * Cfg::kChunks) % Cfg::kThreads == 0 || row < kRows) {
      if (first_row + row < valid_rows) {
        fc::cp_async_16(s + pass * kRowsPerPass * Cfg::kRowBytes, g + pass * kRowsPerPass * Cfg::kHeadDim, true);
      } else {
        *reinterpret_cast<uint4*>(s + pass * kRowsPerPass * Cfg::kRowBytes) = make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// The per-warp row state both kernels keep in registers: O_i = 0, m_i = -inf, l_i = 0 to start.
template <class Cfg>
__device__ __forceinline__ void init_rows(float (&o)[Cfg::kMTiles][Cfg::kDTiles][4], float (&m_i)[Cfg::kMTiles][2],
                                          float (&l_i)[Cfg::kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int d = 0; d < Cfg::kDTiles; ++d)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[mt][d][r] = 0.f;
    m_i[mt][0] = m_i[mt][1] = -INFINITY;
    l_i[mt][0] = l_i[mt][1] = 0.f;
  }
}

// Q_i's A fragments for the warp's rows when they are held in registers (Cfg::kQInRegs); one placeholder
// register set otherwise (warp_scores then re-reads Q_i from shared memory).
template <class Cfg>
using QFragments = uint32_t[Cfg::kQInRegs ? Cfg::kMTiles : 1][Cfg::kQInRegs ? Cfg::kKChunks : 1][4];

template <class Cfg>
__device__ __forceinline__ void load_q_fragments(QFragments<Cfg>& q_frag, uint32_t q_lane, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int kc = 0; kc < Cfg::kKChunks; ++kc)
      fc::ldmatrix_x4(q_frag[mt][kc], q_lane + mt * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, lane >> 4, lane));
}

// l_i: the four lanes of a row each summed a quarter of its columns.
template <class Cfg>
__device__ __forceinline__ void sum_row_quads(float (&l_i)[Cfg::kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
    l_i[mt][0] = fc::group_sum<4>(l_i[mt][0]);
    l_i[mt][1] = fc::group_sum<4>(l_i[mt][1]);
  }
}

// S = Q_i K_j^T for the warp's rows against kBlockN keys (raw scores: the scale is folded into exp2).
// q_frag holds Q_i when Cfg::kQInRegs; otherwise Q_i is re-read from shared memory at q_lane.
template <class Cfg, class QFrag>
__device__ __forceinline__ void warp_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], const QFrag& q_frag,
                                            uint32_t q_lane, uint32_t k_lane, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[mt][j][r] = 0.f;
  // ldmatrix lanes: Q and K rows are 8-aligned at the tile level, so the swizzle term is lane & 7
  const int q_chunk = lane >> 4;        // matrices 2, 3 of an A fragment: k 8..15
  const int k_chunk = (lane >> 3) & 1;  // matrices 1, 3 of a B pair: k 8..15
#pragma unroll
  for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      if constexpr (Cfg::kQInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][kc][r];
      } else {
        fc::ldmatrix_x4(a[mt], q_lane + mt * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, q_chunk, lane));
      }
    }
#pragma unroll
    for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
      uint32_t b[4];  // b[0], b[1]: n8 tile 2 np; b[2], b[3]: tile 2 np + 1
      fc::ldmatrix_x4(b, k_lane + np * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(kc, k_chunk, lane));
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        fc::mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
        fc::mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// -inf where key >= seq_len or (causal) key > row; only tiles that cross the diagonal or the end call it.
template <class Cfg>
__device__ __forceinline__ void mask_scores(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4], int row0, int key0,
                                            int seq_len, bool causal, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row0 + mt * 16 + (lane >> 2) + 8 * (r >> 1);
        const int key = key0 + 8 * j + 2 * (lane & 3) + (r & 1);
        if (key >= seq_len || (causal && key > row)) s[mt][j][r] = -INFINITY;
      }
}

// m_new = max(m_i, rowmax(S)); P = exp2(S * scale_log2 - m_i * scale_log2) in place of S;
// l_i = alpha l_i + rowsum(P); O = diag(alpha) O with alpha = exp2((m_i - m_new) * scale_log2).
// m_i is kept in raw-score units (so scale must be > 0). It moves when the row max grows by more than
// V11_RESCALE_LOG2 (log2 units), and a warp none of whose rows moved skips the O rescale (kMTiles * kHeadDim
// / 2 multiplies per lane). At 0 (default) the numerics are FlashAttention-2's exactly and the skip fires
// whenever no row of the warp found a new max in the tile (more often the further along the row).
// At 8 (FlashAttention-4's threshold) a stale max lets P reach 2^8 and the rescale almost never runs, but
// a peaked row's dominant P is then rounded to fp16 instead of being exactly 1: up to one more output ulp
// (1.75x FA2's error on softmax-peaked inputs in the CPU emulation, equal on randn inputs).
// l_i stays a per-lane partial sum: alpha is the same for the four lanes of a row, so the quad reduction
// can wait until the end.
template <class Cfg>
__device__ __forceinline__ void online_softmax(float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                               float (&o)[Cfg::kMTiles][Cfg::kDTiles][4],
                                               float (&m_i)[Cfg::kMTiles][2], float (&l_i)[Cfg::kMTiles][2],
                                               float scale_log2) {
  float alpha[Cfg::kMTiles][2];
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
      float m_new = m_i[mt][h];
#pragma unroll
      for (int j = 0; j < Cfg::kNTiles; ++j) m_new = fmaxf(m_new, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
      m_new = fc::group_max<4>(m_new);
      // From m_i = -inf any finite m_new moves (inf > threshold); while both are -inf the row has seen
      // nothing ((-inf) - (-inf) = NaN compares false) and keeps m_i = -inf.
      alpha[mt][h] = 1.f;
      if ((m_new - m_i[mt][h]) * scale_log2 > kRescaleLog2) {
        alpha[mt][h] = exp2f((m_i[mt][h] - m_new) * scale_log2);
        m_i[mt][h] = m_new;
        moved = true;
      }
      // A row with nothing visible yet keeps m = -inf; subtracting 0 then gives exp2(-inf) = 0, not NaN.
      const float m_scaled = m_i[mt][h] == -INFINITY ? 0.f : m_i[mt][h] * scale_log2;
      float row_sum = 0.f;
#pragma unroll
      for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
        for (int c = 2 * h; c < 2 * h + 2; ++c) {
          s[mt][j][c] = exp2f(fmaf(s[mt][j][c], scale_log2, -m_scaled));
          row_sum += s[mt][j][c];
        }
      l_i[mt][h] = l_i[mt][h] * alpha[mt][h] + row_sum;
    }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        o[mt][d][0] *= alpha[mt][0];
        o[mt][d][1] *= alpha[mt][0];
        o[mt][d][2] *= alpha[mt][1];
        o[mt][d][3] *= alpha[mt][1];
      }
  }
}

// O += P V_j: the fp32 C fragments of P, packed to fp16, are the A fragments (n8 tiles 2 kk and 2 kk + 1
// make k16 step kk).
template <class Cfg>
__device__ __forceinline__ void accumulate_pv(const float (&s)[Cfg::kMTiles][Cfg::kNTiles][4],
                                              float (&o)[Cfg::kMTiles][Cfg::kDTiles][4], uint32_t v_lane,
                                              int lane) {
  const int v_chunk = lane >> 4;  // matrices 2, 3 of a .trans pair: d-tile 2 dp + 1
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    uint32_t pa[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      pa[mt][0] = fc::pack_half2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][1] = fc::pack_half2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][2] = fc::pack_half2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][3] = fc::pack_half2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < Cfg::kDTiles / 2; ++dp) {
      uint32_t b[4];  // b[0], b[1]: d-tile 2 dp; b[2], b[3]: d-tile 2 dp + 1
      fc::ldmatrix_x4_trans(b, v_lane + kk * 16 * Cfg::kRowBytes + fc::ldmatrix_chunk(dp, v_chunk, lane));
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        fc::mma_16816(o[mt][2 * dp], pa[mt], b[0], b[1]);
        fc::mma_16816(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
      }
    }
  }
}

// cp.async.wait_group with a count known only after unrolling (the switch folds away).
__device__ __forceinline__ void cp_async_wait_n(int pending) {
  switch (pending) {
    case 0: fc::cp_async_wait<0>(); break;
    case 1: fc::cp_async_wait<1>(); break;
    case 2: fc::cp_async_wait<2>(); break;
    case 3: fc::cp_async_wait<3>(); break;
    case 4: fc::cp_async_wait<4>(); break;
    case 5: fc::cp_async_wait<5>(); break;
    case 6: fc::cp_async_wait<6>(); break;
    case 7: fc::cp_async_wait<7>(); break;
    case 8: fc::cp_async_wait<8>(); break;
    case 9: fc::cp_async_wait<9>(); break;
    case 10: fc::cp_async_wait<10>(); break;
    case 11: fc::cp_async_wait<11>(); break;
    case 12: fc::cp_async_wait<12>(); break;
    case 13: fc::cp_async_wait<13>(); break;
    case 14: fc::cp_async_wait<14>(); break;
    default: fc::cp_async_wait<15>(); break;
  }
}

// One 16-byte global store of four registers (a uint4 assembled from computed halves is split by nvcc
// into four 4-byte stores).
__device__ __forceinline__ void st_global_16(void* ptr, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Thread-block clusters (sm_90): this CTA's rank, the cluster's size, a cluster-wide barrier whose arrive
// releases and whose wait acquires this CTA's shared-memory writes, and loads from a peer's shared memory.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of `smem_address` (a shared::cta address of this CTA) in CTA `rank`.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t smem_address, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_address), "r"(rank));
  return r;
}

__device__ __forceinline__ void st_cluster_f2(uint32_t address, float x, float y) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(x), "f"(y) : "memory");
}

#endif

// Grid order, measured at 2,16,4096 on the lent H200: at D=64 non-causal, x = query tile and y = batch * heads
// (every query tile of a few heads per wave) ran 438 us (314 TFLOP/s) against 458 us (300) with batch * heads
// on x; at D=128 the same change went the other way, 820 -> 837 us. (Predicted +3% at D=128 from L2: the
// CTAs of a head walk K/V in lockstep either order, so the working set is a window, not all 64 MB of K/V.)
// So query tile first only for D=64 non-causal. Causal keeps x = batch * heads, y = query tile reversed:
// a wave holds the same heavy tile of many heads and the last wave is made of light tiles.
__host__ __device__ constexpr bool query_tile_fastest(bool causal, int head_dim) { return !causal && head_dim == 64; }
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd(FlashcoreParams p) {
  using Cfg = V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid % fc::kWarpSize;
  const int warp = tid / fc::kWarpSize;
  const int group = warp / Cfg::kRowWarps;     // which kBlockN keys of every stage this warp takes
  const int row_warp = warp % Cfg::kRowWarps;  // which kWarpM rows of Q_i this warp owns
  const int seq_len = p.seq_len;
  // Heaviest query tiles first under causal masking: the last tile sees every key.
  const bool tile_fastest = query_tile_fastest(p.causal, kHeadDim);
  const int tile_index = tile_fastest ? blockIdx.x : blockIdx.y;  // this CTA's place among its head's CTAs
  const int tiles = tile_fastest ? gridDim.x : gridDim.y;
  const int m_block = p.causal ? tiles - 1 - tile_index : tile_index;
  const int m0 = m_block * kBlockM;
  const size_t base = static_cast<size_t>(tile_fastest ? blockIdx.y : blockIdx.x) * seq_len * kHeadDim;
  const __half* __restrict__ q = p.q + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = p.k + base;  // [S, D]
  const __half* __restrict__ v = p.v + base;  // [S, D]
  __half* __restrict__ o = p.o + base;        // [S, D]

  unsigned char* q_s = smem;                                                     // [kBlockM][D]
  auto k_stage = [&](int stage) { return smem + Cfg::kQBytes + stage * Cfg::kStageBytes; };  // [kTileN][D]

  // Keys at or past kv_end are invisible to every row of the CTA: never loaded (zero-filled) nor visited.
  const int kv_end = p.causal ? min(seq_len, m0 + kBlockM) : seq_len;
  const int n_tiles = fc::ceil_div(kv_end, Cfg::kTileN);
  auto load_tile = [&](int tile, int stage) {
    unsigned char* k_s = k_stage(stage);
    copy_rows_async<Cfg, Cfg::kTileN>(k_s, k, tile * Cfg::kTileN, kv_end, tid);
    copy_rows_async<Cfg, Cfg::kTileN>(k_s + Cfg::kKvBytes, v, tile * Cfg::kTileN, kv_end, tid);
  };

  // Prologue: Q_i and the first kStages - 1 tiles in flight at once (Q_i rides in tile 0's group).
  copy_rows_async<Cfg, kBlockM>(q_s, q, m0, seq_len, tid);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) load_tile(st, st);
    fc::cp_async_commit();
  }
  if constexpr (kSplit > 1) {
    // Short sequences: the CTAs of a head split the rest of its K and V into slices and prefetch them to
    // L2 now, so later stages hit L2 instead of each paying a DRAM round trip in lockstep.
    const long long first = static_cast<long long>(min(seq_len, (kStages - 1) * Cfg::kTileN)) * Cfg::kRowBytes / 32;
    const long long sectors = static_cast<long long>(seq_len) * Cfg::kRowBytes / 32 - first;
    const long long begin = first + sectors * tile_index / tiles;
    const long long end = first + sectors * (tile_index + 1) / tiles;
    for (long long sector = begin + tid; sector < end; sector += Cfg::kThreads) {
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(k) + sector * 32);
      fc::prefetch_l2(reinterpret_cast<const unsigned char*>(v) + sector * 32);
    }
  }

  // Rows of this warp, and the keys any of them can see (none for a warp wholly past the sequence end).
  const int warp_row0 = m0 + row_warp * kWarpM;
  const int warp_kv_end = warp_row0 >= seq_len ? 0 : p.causal ? min(seq_len, warp_row0 + kWarpM) : seq_len;
  const float scale_log2 = p.scale * kLog2e;

  // Per-lane ldmatrix row addresses (tile-relative rows are multiples of 8, so row & 7 = lane & 7):
  // A fragments and V (.trans) take rows lane % 8 + 8 * ((lane / 8) % 2); K takes lane % 8 + 8 * (lane / 16).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t q_lane = fc::smem_addr(q_s) + (row_warp * kWarpM + a_row) * Cfg::kRowBytes;

  float o_acc[Cfg::kMTiles][Cfg::kDTiles][4];
  float m_i[Cfg::kMTiles][2];
  float l_i[Cfg::kMTiles][2];
  init_rows<Cfg>(o_acc, m_i, l_i);
  QFragments<Cfg> q_frag;

  int compute_stage = 0;
  int load_stage = kStages - 1;
  for (int t = 0; t < n_tiles; ++t) {
    fc::cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
    __syncthreads();                   // everyone's have, and every warp is done with tile t - 1's stage
    if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, load_stage);
    fc::cp_async_commit();  // an empty group at the tail keeps the wait count uniform
    load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;

    if constexpr (Cfg::kQInRegs) {
      if (t == 0) load_q_fragments<Cfg>(q_frag, q_lane, lane);
    }

    const int key0 = t * Cfg::kTileN + group * kBlockN;  // this warp's keys: key0 .. key0 + kBlockN - 1
    if (key0 < warp_kv_end) {
      const unsigned char* k_s = k_stage(compute_stage);
      const uint32_t k_lane = fc::smem_addr(k_s) + (group * kBlockN + k_row) * Cfg::kRowBytes;
      const uint32_t v_lane = fc::smem_addr(k_s + Cfg::kKvBytes) + (group * kBlockN + a_row) * Cfg::kRowBytes;

      // S = Q_i K_j^T
      float s[Cfg::kMTiles][Cfg::kNTiles][4];
      warp_scores<Cfg>(s, q_frag, q_lane, k_lane, lane);
      // only tiles crossing the diagonal or the sequence end carry invisible keys
      if (key0 + kBlockN > seq_len || (p.causal && key0 + kBlockN - 1 > warp_row0)) {
        mask_scores<Cfg>(s, warp_row0, key0, seq_len, p.causal, lane);
      }
      // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O
      online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
      // O = O + P V_j
      accumulate_pv<Cfg>(s, o_acc, v_lane, lane);
    }
    compute_stage = compute_stage + 1 == kStages ? 0 : compute_stage + 1;
  }

  sum_row_quads<Cfg>(l_i);
  const int g = lane >> 2;   // fragment row (and row + 8)
  const int tq = lane & 3;   // fragment column pair

  if constexpr (kSplit == 1) {
    // O_i = diag(1 / l_i) O_i, staged as fp16 over this warp's own Q_i rows (only this warp ever reads
    // them), then written back with 16-byte coalesced stores.
    __syncwarp();  // every lane's last ldmatrix of those rows is done
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv_l = l_i[mt][h] > 0.f ? 1.f / l_i[mt][h] : 0.f;
        const int row = row_warp * kWarpM + mt * 16 + g + 8 * h;
#pragma unroll
        for (int d = 0; d < Cfg::kDTiles; ++d) {
          *reinterpret_cast<uint32_t*>(q_s + fc::swizzle(row, d, Cfg::kRowBytes) + 4 * tq) =
              fc::pack_half2(o_acc[mt][d][2 * h] * inv_l, o_acc[mt][d][2 * h + 1] * inv_l);
        }
      }
    __syncwarp();
    constexpr int kWarpChunks = kWarpM * Cfg::kChunks;
#pragma unroll
    for (int i = lane; i < kWarpChunks; i += fc::kWarpSize) {
      const int r = i / Cfg::kChunks;
      const int c = i % Cfg::kChunks;
      const int row = warp_row0 + r;
      if (row < seq_len) {
        *reinterpret_cast<uint4*>(o + static_cast<size_t>(row) * kHeadDim + c * 8) =
            *reinterpret_cast<const uint4*>(q_s + fc::swizzle(row_warp * kWarpM + r, c, Cfg::kRowBytes));
      }
    }
  } else {
    // Merge the kSplit groups: m = max_g m_g, l = sum_g exp2(m_g - m) l_g, O = sum_g exp2(m_g - m) O_g / l.
    fc::cp_async_wait<0>();
    __syncthreads();  // every warp has left the loop: the ring's bytes are free for the merge
    float2* stats = reinterpret_cast<float2*>(smem);                       // [kSplit][kBlockM]
    float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);    // [kSplit][kBlockM][kOStride]
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = group * kBlockM + row_warp * kWarpM + mt * 16 + g + 8 * h;
        if (tq == 0) stats[row] = make_float2(m_i[mt][h] * scale_log2, l_i[mt][h]);
#pragma unroll
        for (int d = 0; d < Cfg::kDTiles; ++d) {
          *reinterpret_cast<float2*>(o_part + row * Cfg::kOStride + 8 * d + 2 * tq) =
              make_float2(o_acc[mt][d][2 * h], o_acc[mt][d][2 * h + 1]);
        }
      }
    __syncthreads();
    constexpr int kBlockChunks = kBlockM * Cfg::kChunks;
    for (int i = tid; i < kBlockChunks; i += Cfg::kThreads) {
      const int r = i / Cfg::kChunks;
      const int c = i % Cfg::kChunks;
      if (m0 + r >= seq_len) continue;
      float m_all = -INFINITY;
#pragma unroll
      for (int sg = 0; sg < kSplit; ++sg) m_all = fmaxf(m_all, stats[sg * kBlockM + r].x);
      if (m_all == -INFINITY) m_all = 0.f;  // (no group saw a key: every weight is 0, not NaN)
      float l_all = 0.f;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int sg = 0; sg < kSplit; ++sg) {
        const float2 st = stats[sg * kBlockM + r];
        const float w = exp2f(st.x - m_all);
        l_all += w * st.y;
        const float4* part = reinterpret_cast<const float4*>(o_part + (sg * kBlockM + r) * Cfg::kOStride + c * 8);
        const float4 lo = part[0];
        const float4 hi = part[1];
        acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
        acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
      }
      const float inv_l = l_all > 0.f ? 1.f / l_all : 0.f;
      uint4 out;
      out.x = fc::pack_half2(acc[0] * inv_l, acc[1] * inv_l);
      out.y = fc::pack_half2(acc[2] * inv_l, acc[3] * inv_l);
      out.z = fc::pack_half2(acc[4] * inv_l, acc[5] * inv_l);
      out.w = fc::pack_half2(acc[6] * inv_l, acc[7] * inv_l);
      *reinterpret_cast<uint4*>(o + static_cast<size_t>(m0 + r) * kHeadDim + c * 8) = out;
    }
  }
}

// Cluster split-K (sm_90, short sequences). Grid: x = key chunk (the cluster axis: gridDim.x = cluster size
// = ceil(S / kChunkN), so rank = blockIdx.x), y = query tile, z = batch * heads. Each CTA loads Q_i and its
// whole K_j, V_j chunk in one burst (one DRAM round trip, no ring refills), runs FA2 over it, and leaves
// unnormalised (m_i, l_i, O_i) in its own shared memory; after a cluster barrier, rank r merges rows
// [r, r + 1) * ceil(kBlockM / n) of all n ranks' partials over DSMEM and writes them; a second cluster
// barrier keeps every CTA (and its shared memory) alive until all its readers are done.
template <int kHeadDim, int kBlockM, int kChunkN, int kBlockN, int kWarpM, int kMinBlocks>
__global__ void __launch_bounds__(V11ClusterConfig<kHeadDim, kBlockM, kChunkN, kBlockN, kWarpM, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_cluster_fwd(FlashcoreParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = V11ClusterConfig<kHeadDim, kBlockM, kChunkN, kBlockN, kWarpM, kMinBlocks>;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid % fc::kWarpSize;
  const int warp = tid / fc::kWarpSize;
  const uint32_t rank = cluster_rank();
  const uint32_t n_ranks = cluster_size();
  const int seq_len = p.seq_len;
  const int m_block = p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int m0 = m_block * kBlockM;
  const size_t base = static_cast<size_t>(blockIdx.z) * seq_len * kHeadDim;
  const __half* __restrict__ q = p.q + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = p.k + base;  // [S, D]
  const __half* __restrict__ v = p.v + base;  // [S, D]
  __half* __restrict__ o = p.o + base;        // [S, D]

  unsigned char* q_s = smem;                         // [kBlockM][D]
  unsigned char* k_s = smem + Cfg::kQBytes;          // [kChunkN][D]
  unsigned char* v_s = k_s + Cfg::kKvBytes;          // [kChunkN][D]

  // This CTA's keys [c0, c1): its chunk, cut at the sequence end and (causal) past the tile's last row.
  const int kv_end = p.causal ? min(seq_len, m0 + kBlockM) : seq_len;
  const int c0 = static_cast<int>(rank) * kChunkN;
  const int c1 = min(c0 + kChunkN, kv_end);

  // Prologue: everything at once, one group per tile and operand in the order they are consumed:
  // {Q_i, K_0}, {V_0}, {K_1}, {V_1}, ... Tiles past c1 are neither loaded nor read; rows past c1 in the
  // last tile are zeroed (a NaN pattern in V would survive P = 0).
  if (c0 < c1) copy_rows_async<Cfg, kBlockM>(q_s, q, m0, seq_len, tid);
#pragma unroll
  for (int t = 0; t < Cfg::kTiles; ++t) {
    const bool loaded = c0 + t * kBlockN < c1;
    if (loaded) copy_rows_async<Cfg, kBlockN>(k_s + t * kBlockN * Cfg::kRowBytes, k, c0 + t * kBlockN, c1, tid);
    fc::cp_async_commit();
    if (loaded) copy_rows_async<Cfg, kBlockN>(v_s + t * kBlockN * Cfg::kRowBytes, v, c0 + t * kBlockN, c1, tid);
    fc::cp_async_commit();
  }

  const int warp_row0 = m0 + warp * kWarpM;
  const int warp_kv_end = warp_row0 >= seq_len ? 0 : p.causal ? min(seq_len, warp_row0 + kWarpM) : seq_len;
  const int warp_key_end = min(c1, warp_kv_end);  // this warp's keys: [c0, warp_key_end)
  const float scale_log2 = p.scale * kLog2e;

  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t q_lane = fc::smem_addr(q_s) + (warp * kWarpM + a_row) * Cfg::kRowBytes;

  float o_acc[Cfg::kMTiles][Cfg::kDTiles][4];
  float m_i[Cfg::kMTiles][2];
  float l_i[Cfg::kMTiles][2];
  init_rows<Cfg>(o_acc, m_i, l_i);
  QFragments<Cfg> q_frag;

#pragma unroll
  for (int t = 0; t < Cfg::kTiles; ++t) {
    cp_async_wait_n(2 * (Cfg::kTiles - t) - 1);  // this thread's Q_i (t = 0) and K_t have landed
    __syncthreads();                              // everyone's have
    if constexpr (Cfg::kQInRegs) {
      if (t == 0) load_q_fragments<Cfg>(q_frag, q_lane, lane);
    }
    const int key0 = c0 + t * kBlockN;  // this tile's keys: key0 .. key0 + kBlockN - 1
    const bool active = key0 < warp_key_end;
    float s[Cfg::kMTiles][Cfg::kNTiles][4];
    if (active) {
      // S = Q_i K_t^T
      warp_scores<Cfg>(s, q_frag, q_lane, fc::smem_addr(k_s) + (t * kBlockN + k_row) * Cfg::kRowBytes, lane);
      if (key0 + kBlockN > seq_len || (p.causal && key0 + kBlockN - 1 > warp_row0)) {
        mask_scores<Cfg>(s, warp_row0, key0, seq_len, p.causal, lane);
      }
      // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O
      online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
    }
    cp_async_wait_n(2 * (Cfg::kTiles - t) - 2);  // V_t has landed
    __syncthreads();
    if (active) {
      // O = O + P V_t
      accumulate_pv<Cfg>(s, o_acc, fc::smem_addr(v_s) + (t * kBlockN + a_row) * Cfg::kRowBytes, lane);
    }
  }

  sum_row_quads<Cfg>(l_i);
  const int g = lane >> 2;
  const int tq = lane & 3;

  // Merge over the n ranks, pushed: rank r owns rows [r, r + 1) * ceil(kBlockM / n) of the tile. After barrier
  // A (every rank has left its main loop, so every CTA's Q_i, K, V bytes are free), each rank stores its
  // partials (m_i, l_i, unnormalised O_i) for every row straight into the owner's shared memory with
  // st.shared::cluster; barrier B releases them; each owner then merges from its own shared memory:
  // m = max_r m_r, l = sum_r exp2(m_r - m) l_r, O = sum_r exp2(m_r - m) O_r / l. Nothing touches a peer
  // after B, so no exit barrier is needed (the first version pulled with ld.shared::cluster and needed one).
  // Measured at 1,8,512,64 (64-row CTAs, probe timeline): the exchange takes ~2.2 us however it is done,
  // pulled 2.4, pushed 2.3, pushed with st.async counted on the owner's mbarrier (no release/acquire
  // barrier, no MEMBAR.ALL.GPU) 2.2: 16 KB per CTA, ~2 CTAs per SM, so distributed shared memory moved
  // ~16 B/ns per SM. The st.async form is also invalid in a cluster of one CTA (compute-sanitizer: "Cluster
  // needs to have at least 2 blocks"), so this form stays.
  cluster_sync();  // A
  const int rows_per_rank = fc::ceil_div(kBlockM, static_cast<int>(n_ranks));
  const uint32_t stats_addr = fc::smem_addr(smem);                   // [n * rows_per_rank] float2
  const uint32_t o_in_addr = fc::smem_addr(smem + Cfg::kStatsBytes);  // [n * rows_per_rank][kOStride] fp32
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * kWarpM + mt * 16 + g + 8 * h;
      const int owner = row / rows_per_rank;
      const int slot = static_cast<int>(rank) * rows_per_rank + row - owner * rows_per_rank;
      if (tq == 0) st_cluster_f2(map_to_rank(stats_addr, owner) + slot * 8, m_i[mt][h] * scale_log2, l_i[mt][h]);
      const uint32_t dst = map_to_rank(o_in_addr, owner) + (slot * Cfg::kOStride + 2 * tq) * 4;
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        st_cluster_f2(dst + 8 * d * 4, o_acc[mt][d][2 * h], o_acc[mt][d][2 * h + 1]);
      }
    }
  cluster_sync();  // B: every rank's pushes have landed and are visible to their owners

  const float2* stats = reinterpret_cast<const float2*>(smem);
  const float* o_in = reinterpret_cast<const float*>(smem + Cfg::kStatsBytes);
  const int r_begin = static_cast<int>(rank) * rows_per_rank;
  const int my_rows = min(kBlockM - r_begin, rows_per_rank);
  for (int i = tid; i < my_rows * Cfg::kChunks; i += Cfg::kThreads) {
    const int lr = i / Cfg::kChunks;
    const int c = i % Cfg::kChunks;
    if (m0 + r_begin + lr >= seq_len) continue;
    float m_all = -INFINITY;
#pragma unroll
    for (int sr = 0; sr < Cfg::kMaxCluster; ++sr)
      if (sr < static_cast<int>(n_ranks)) m_all = fmaxf(m_all, stats[sr * rows_per_rank + lr].x);
    if (m_all == -INFINITY) m_all = 0.f;  // (no rank saw a key: every weight is 0, not NaN)
    float l_all = 0.f;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int sr = 0; sr < Cfg::kMaxCluster; ++sr) {
      if (sr < static_cast<int>(n_ranks)) {
        const float2 st = stats[sr * rows_per_rank + lr];
        const float w = exp2f(st.x - m_all);
        l_all += w * st.y;
        const float4* part = reinterpret_cast<const float4*>(o_in + (sr * rows_per_rank + lr) * Cfg::kOStride + c * 8);
        const float4 lo = part[0];
        const float4 hi = part[1];
        acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
        acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
      }
    }
    const float inv_l = l_all > 0.f ? 1.f / l_all : 0.f;
    st_global_16(o + static_cast<size_t>(m0 + r_begin + lr) * kHeadDim + c * 8,
                 fc::pack_half2(acc[0] * inv_l, acc[1] * inv_l), fc::pack_half2(acc[2] * inv_l, acc[3] * inv_l),
                 fc::pack_half2(acc[4] * inv_l, acc[5] * inv_l), fc::pack_half2(acc[6] * inv_l, acc[7] * inv_l));
  }
#else
  __trap();  // sm_90 only: the launcher never starts it on an older device
#endif
}

// The configuration heuristic, in one place. Split the keys inside the CTA only when the long
// configuration's grid would not fill the GPU once: below that the run is one short wave whose length is
// the per-warp chain, so more CTAs, each with a fraction of the chain, is the win; above it every SM
// already has work and the merge would be pure overhead. Causal masking does not change the choice (it halves the
// work of both regimes alike).
enum class Regime { kLong, kShort };

static Regime pick_regime(int batch_heads, int seq_len, int long_block_m, int num_sms) {
  const long long long_ctas = static_cast<long long>(batch_heads) * fc::ceil_div(seq_len, long_block_m);
  return long_ctas < static_cast<long long>(V11_SPLIT_BELOW_WAVES) * num_sms ? Regime::kShort : Regime::kLong;
}

// The kernel's name as c++filt prints it, for the plan (e.g. "v11_fwd<64, 128, 64, 32, 2, 1, 2>").
template <class Cfg>
struct KernelName {
  char text[64];
  KernelName() {
    snprintf(text, sizeof(text), "v11_fwd<%d, %d, %d, %d, %d, %d, %d>", Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN,
             Cfg::kWarpM, Cfg::kStages, Cfg::kSplit, Cfg::kMinBlocks);
  }
};

template <class Cfg>
static const char* kernel_name() {
  static const KernelName<Cfg> name;
  return name.text;
}

template <class Cfg>
struct ClusterKernelName {
  char text[64];
  ClusterKernelName() {
    snprintf(text, sizeof(text), "v11_cluster_fwd<%d, %d, %d, %d, %d, %d>", Cfg::kHeadDim, Cfg::kBlockM,
             Cfg::kChunkN, Cfg::kBlockN, Cfg::kWarpM, Cfg::kMinBlocks);
  }
};

template <class Cfg>
static const char* cluster_kernel_name() {
  static const ClusterKernelName<Cfg> name;
  return name.text;
}

template <class Cfg>
static constexpr auto kernel_of() {
  return v11_fwd<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                 Cfg::kMinBlocks>;
}

template <class Cfg>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = kernel_of<Cfg>();
  // Raising the shared-memory limit is a driver call of about a microsecond: at 1,8,512,64 that would be a
  // visible part of the whole run, so it is done once per process (and per kernel), as PyTorch does.
  static const bool smem_ready = fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes) == nullptr;
  if (!smem_ready) return fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  const unsigned tiles = fc::ceil_div(p.seq_len, Cfg::kBlockM), heads = p.batch * p.heads;
  const dim3 grid = query_tile_fastest(p.causal, Cfg::kHeadDim) ? dim3(tiles, heads) : dim3(heads, tiles);
  if (grid.y > 65535) return fc::message("v11: grid y of %u exceeds the limit (65535)", grid.y);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return fc::launch_status();
}

static int sm_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 132;  // an H100's count; only the regime choice depends on it
    }
    return sms;
  }();
  return count;
}

#if V11_CLUSTER
template <class Cfg>
static constexpr auto cluster_kernel_of() {
  return v11_cluster_fwd<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kChunkN, Cfg::kBlockN, Cfg::kWarpM, Cfg::kMinBlocks>;
}

// The cluster path needs an sm_90 device and an sm_90 build of the kernel (an older build's body traps):
// asked once per process and kernel, like sm_count().
template <class Cfg>
static bool cluster_ready() {
  static const bool ready = [] {
    int device = 0, major = 0;
    cudaFuncAttributes attributes{};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9 ||
        cudaFuncGetAttributes(&attributes, cluster_kernel_of<Cfg>()) != cudaSuccess) {
      cudaGetLastError();  // a missing sm_90 image is an answer here, not a sticky error for the next launch
      return false;
    }
    return attributes.binaryVersion >= 90;
  }();
  return ready;
}

template <class Cfg>
static const char* launch_cluster(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = cluster_kernel_of<Cfg>();
  static const bool smem_ready = fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes) == nullptr;
  if (!smem_ready) return fc::allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  const unsigned ranks = fc::ceil_div(p.seq_len, Cfg::kChunkN);  // <= kMaxCluster: the caller checked
  const dim3 grid(ranks, fc::ceil_div(p.seq_len, Cfg::kBlockM), p.batch * p.heads);
  if (grid.y > 65535 || grid.z > 65535) return fc::message("v11: cluster grid (%u, %u, %u) too large", grid.x, grid.y, grid.z);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = ranks;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fc::message("v11: cluster launch failed: %s", cudaGetErrorString(err));
  }
  return fc::launch_status();
}
#endif

// Short sequences on sm_90 take the cluster path when the sequence fits one cluster of kMaxCluster chunks;
// the in-CTA split path remains for older GPUs, longer sequences and -D V11_CLUSTER=0.
template <class Long, class Short, class Cluster>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  if (pick_regime(p.batch * p.heads, p.seq_len, Long::kBlockM, sm_count()) == Regime::kShort) {
#if V11_CLUSTER
    if (p.seq_len <= Cluster::kMaxCluster * Cluster::kChunkN && cluster_ready<Cluster>()) {
      return launch_cluster<Cluster>(p, stream);
    }
#endif
    return launch<Short>(p, stream);
  }
  return launch<Long>(p, stream);
}

template <class Cfg>
static FlashcoreKernelPlan plan_of() {
  return {kernel_name<Cfg>(), Cfg::kThreads, Cfg::kSmemBytes};
}

template <class Cfg>
static FlashcoreKernelPlan cluster_plan_of() {
  return {cluster_kernel_name<Cfg>(), Cfg::kThreads, Cfg::kSmemBytes};
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  FlashcoreKernelPlan all[3];
  int count = 0;
  if (head_dim == 64) {
    all[count++] = plan_of<LongD64>();
    all[count++] = plan_of<ShortD64>();
#if V11_CLUSTER
    all[count++] = cluster_plan_of<ClusterD64>();
#endif
  } else if (head_dim == 128) {
    all[count++] = plan_of<LongD128>();
    all[count++] = plan_of<ShortD128>();
#if V11_CLUSTER
    all[count++] = cluster_plan_of<ClusterD128>();
#endif
  } else {
    return 0;
  }
  const int n = max_plans < count ? max_plans : count;
  for (int i = 0; i < n; ++i) plans[i] = all[i];
  return n;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  // The running max is kept in raw-score units, which orders like the scaled scores only for scale > 0.
  if (!(p.scale > 0.f)) return fc::message("v11 needs a softmax scale > 0 (got %g)", p.scale);
  if (p.seq_len < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  switch (p.head_dim) {
    case 64: return forward<LongD64, ShortD64, ClusterD64>(p, stream);
    case 128: return forward<LongD128, ShortD128, ClusterD128>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
