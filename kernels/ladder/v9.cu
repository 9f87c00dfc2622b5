// ladder/v9.cu — rung 9: warp specialization. One producer warp streams K_j/V_j; four consumer warps only compute.
//
// Idea: loading and computing stop taking turns. The CTA's last warp copies K and V tiles into a ring of
// up to 8 shared-memory stages, as far ahead as the ring allows; the four consumer warps wait only for the
// stage they need next and hand it back when done. The hand-offs are mbarriers -- "full[s]" (the copies of
// stage s landed) and "empty[s]" (every consumer thread has finished reading it) -- so the loop has no
// __syncthreads at all, and a consumer never waits on a load the producer could have issued earlier.
//
// Change from v8 (48x32 tiles, every warp loads then computes, 2 cp.async stages, one __syncthreads per tile):
//   - the loads move to a dedicated warp, the ring deepens to 4-8 stages, and the K/V rows of each CTA's own
//     query range are prefetched into L2 at start (as v8 does);
//   - each consumer warp owns whole rows and a private scratch for S and P (softmax lanes 2r and 2r + 1
//     reduce row r), so consumer warps never meet inside the loop; Q_i lives in registers; O_i's per-row
//     rescale is a shuffle, using the accumulator's element -> row map read once through the WMMA API;
//   - two CTA shapes, picked per launch. Grids that fill the GPU: 32 query rows per warp at D=64 (128 per
//     CTA, 32-key tiles), so every K/V fragment read from shared memory feeds two MMAs: 20 KB of shared-memory
//     traffic per 32x32 warp tile against 28 KB for the same FLOPs as 16-row warps (v8's ratio); D=128 keeps
//     16 rows per warp (64 per CTA). Grids smaller than the GPU (1,8,512,64 makes 32 CTAs of 128 rows for
//     132 SMs): CTAs of 32 rows, and the warps pair up on 16 rows, each taking one half of every 64-key tile
//     (32 of a 32-key tile at D=128), merging (m, l, O) at the end through two named barriers of the pair
//     (bar.sync, 64 threads): 128 CTAs, one warp per SM sub-partition, each warp's chain of tiles halved;
//   - where a warp is alone on its sub-partition (16-row warps), S of tile t + 1 goes to the tensor cores
//     while the softmax of tile t runs; 32-row warps have no registers left for it (and have a neighbour).
//
// The seeds' v9 hung forever: its producer and consumer warps spun on volatile shared-memory flags (no
// ordering between the flag and the data, flags read before anyone set them, spin loops in divergent warps).
// Here nothing polls an ordinary flag, and the invariant is that every wait has exactly one matching phase
// completion whose arrivals all happen, with counts equal to the init counts:
//   - full[s] is initialised to 32 = the producer's lanes; each lane arrives once per fill, through
//     cp.async.mbarrier.arrive.noinc, i.e. when its own copies have landed (which also makes them visible).
//     empty[s] is initialised to 128 = every consumer thread; each arrives once per tile it was handed, after
//     its last read of that stage (every thread, since an arrive releases only the arriving thread's reads).
//   - Tile t lives in stage t % kStages on lap t / kStages. Consumers wait for full's phase of parity
//     (lap & 1); the producer, from lap 1 on, waits for empty's phase of parity ((lap - 1) & 1). A barrier
//     can never run two phases ahead of its waiter (a refill needs the release, the release needs the
//     fill), so one parity bit names the phase without ambiguity.
//   - Producer and consumers count tiles with one function (kv_tile_count). A consumer warp with nothing to
//     add to a tile (causal, its rows before the tile's keys) still waits for it and releases it. A warp
//     holds tile t while it waits for t + 1; that needs kStages >= 2 (static_assert), since filling t + 1
//     needs only the release of tile t + 1 - kStages.
//   - Thread 0 initialises the mbarriers before the kernel's one __syncthreads, which comes before the
//     role split; no role's branch has a __syncthreads. The ring has one writer (the producer); Q_i is
//     loaded and O_i stored by the warp that owns those rows, through its own scratch.
// Checked on the CPU before any GPU run (a model of these barriers under random interleavings, and a numpy
// emulation of the index math and numerics; docs/ladder.md). Rejected by estimate, not measured: 16-row warps
// for large grids (28 KB vs 20 KB of shared-memory traffic per 262K FLOPs), the key split for every grid (~6 TB/s
// of L2 reads at 2,16,4096,64), the S look-ahead for 32-row warps (~230 registers, over the 204 of 2 CTAs/SM).
// Scale may have any sign: scores are scaled before the row max.
//
// Run:  flashcore test v9 && flashcore bench v9 --shape 1,8,512,64 && flashcore bench v9 --shape 2,16,4096,64
//
// ptxas (nvcc 13.0), registers sm_90 | sm_89, dynamic smem, no static smem or spills: <64, 1> 168 | 168, 94,336 B
//   (8 stages of 32 keys); <64, 2> 160 | 153, 92,224 B (4 x 64); <128, 1> 168 | 168 and <128, 2> 166 | 161, 88,128 B.
// Measured (H200, `flashcore bench --all`, L2 flushed before each call, median of 200 / 100 calls):
//   1,8,512,64:   11.6 us (1.38x faster than v8; 1.03x SDPA default)
//   2,16,4096,64: 723 us, 190.1 TFLOP/s (1.55x v8)
// Stress (scripts/stress.py): 2,000 launches over random shapes (S in [1, 1100], S=1 every 20th, causal and not), all
// OK; compute-sanitizer memcheck, racecheck, synccheck clean on 1,2,97,64 causal, racecheck also on 1,132,97,64 and
// 1,2,97,128.
// Parts: ladder/v9_traits.cuh (configuration, shared-memory layout), ladder/v9_producer.cuh (the producer warp),
// ladder/v9_consumer.cuh (a consumer warp's main loop, merge and store) with ladder/v9_warp.cuh (its scores, reductions
// and O store); this file holds the kernel, its launcher and the contract's entry points.
#include "flashcore.h"
#include "ladder/v9_consumer.cuh"
#include "ladder/v9_producer.cuh"
#include "ladder/v9_traits.cuh"

template <int kHeadDim, int kKeySplit>
__global__ void __launch_bounds__(kThreads, 2) v9_fwd(FlashcoreParams p) {
  using C = Config<kHeadDim, kKeySplit>;
  using L = SmemLayout<kHeadDim, kKeySplit>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* K_ring = reinterpret_cast<__half*>(smem + L::kK);          // [kStages][kBlockN][kKvStride]
  __half* V_ring = reinterpret_cast<__half*>(smem + L::kV);          // [kStages][kBlockN][kKvStride]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);    // [kStages]
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);  // [kStages]

  const int warp = threadIdx.x / fc::kWarpSize;
  const int lane = threadIdx.x % fc::kWarpSize;
  // Heaviest causal query tiles first, so the last wave is made of short ones.
  const int row0 = (gridDim.x - 1 - blockIdx.x) * C::kBlockM;
  const int n_tiles = kv_tile_count<C::kBlockM, C::kBlockN>(p, row0);
  const size_t base = fc::head_offset(p, blockIdx.z, blockIdx.y);

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      fc::mbarrier_init(&full[s], kProducerThreads);
      fc::mbarrier_init(&empty[s], kConsumerThreads);
    }
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before either role touches them

  if (warp == kConsumerWarps) {
    produce_kv<kHeadDim, kKeySplit>(p, fc::tensor<__half>(p.k) + base, fc::tensor<__half>(p.v) + base, K_ring, V_ring,
                                    full, empty, row0, n_tiles, lane);
  } else {
    consume_kv<kHeadDim, kKeySplit>(p, fc::tensor<__half>(p.q) + base, fc::tensor<__half>(p.o) + base, K_ring, V_ring,
                                    smem + L::kScratch, full, empty, row0, n_tiles, warp, lane);
  }
}

template <int kHeadDim, int kKeySplit>
static const char* launch_config(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemLayout<kHeadDim, kKeySplit>::kBytes;
  if (const char* err = fc::allow_dynamic_smem(v9_fwd<kHeadDim, kKeySplit>, kSmem)) return err;
  v9_fwd<kHeadDim, kKeySplit>
      <<<fc::query_tile_grid(p, Config<kHeadDim, kKeySplit>::kBlockM), kThreads, kSmem, stream>>>(p);
  return fc::launch_status();
}

// The key split when whole-tile CTAs would leave SMs idle (1,8,512,64: 32 CTAs of 128 rows on 132 SMs
// becomes 128 CTAs of 32 rows, each warp walking half the keys).
template <int kHeadDim>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return fc::message("could not read the device's SM count: %s", cudaGetErrorString(cudaGetLastError()));
  }
  const dim3 grid = fc::query_tile_grid(p, Config<kHeadDim, 1>::kBlockM);
  const long long ctas = static_cast<long long>(grid.x) * grid.y * grid.z;
  return ctas < sms ? launch_config<kHeadDim, 2>(p, stream) : launch_config<kHeadDim, 1>(p, stream);
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  if (max_plans < 2) return 0;
  if (head_dim == 64) {
    plans[0] = {FC_PLAN_NAME(v9_fwd, 64, 1), kThreads, SmemLayout<64, 1>::kBytes};
    plans[1] = {FC_PLAN_NAME(v9_fwd, 64, 2), kThreads, SmemLayout<64, 2>::kBytes};
  } else if (head_dim == 128) {
    plans[0] = {FC_PLAN_NAME(v9_fwd, 128, 1), kThreads, SmemLayout<128, 1>::kBytes};
    plans[1] = {FC_PLAN_NAME(v9_fwd, 128, 2), kThreads, SmemLayout<128, 2>::kBytes};
  } else {
    return 0;
  }
  return 2;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch<64>(p, stream);
    case 128: return launch<128>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
