// stream_probe.cu — how fast a decode-shaped grid of CTAs streams K and V from HBM, by load form (the
// measurements behind docs/ladder.md, decode, "Load forms and the cold flush"; not part of any variant).
// Each CTA streams its own run of a [keys, 128] fp16 slice of K and of V in 64-key tiles through a 96 KB ring
// (3 stages of K 16 KB + V 16 KB; two CTAs per SM), one producer lane, four consumer warps that only wait and
// release (no math), as kernels/decode/decode.cu's split kernel does.
// Forms (each with and without an L2::evict_first cache hint):
//   tma3d  a 3-D map, one 64-column box per panel (two per tile): the decode rung's form before 2026-11-27
//   tma4d  a 4-D map (64, 2, keys, heads): one box per tile, in memory order
//   bulk   cp.async.bulk of the tile's contiguous 16 KB (no tensor map)
//   ldg    16-byte loads by the 128 consumer threads, 8 in flight each, no shared memory
//   cp.async  16-byte cp.async.cg by one warp into the swizzled panel layout (no hint)
// Each is timed after the bench's cold flush (write: a 2 x L2 buffer zeroed, the L2 left full of dirty lines)
// and after a clean one (that, then a 2 x L2 read), by CUDA events around the launch, median of 30.
// Build and run on the GPU machine, from the repository root:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Ikernels scripts/stream_probe.cu -o /tmp/probe
//   /tmp/probe HEADS KEYS SPLITS [PROMOTION [FORMS]]
// HEADS x KEYS per tensor, SPLITS CTAs per head; PROMOTION the tensor maps' CUtensorMapL2promotion (0 none,
// 1 64 B, 2 128 B, 3 256 B; default 3); FORMS the digits of the forms to run (0 tma3d, 1 tma4d, 2 bulk, 3 ldg,
// 4 cp.async; default all). E.g. `/tmp/probe 512 4096 1 2 01` is the 64,32:8,1:4096,128 decode row's bytes.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/mbarrier.cuh"
#include "common/tma.cuh"

constexpr int kStages = 3, kTileKeys = 64, kD = 128, kTileBytes = kTileKeys * kD * 2, kStageBytes = 2 * kTileBytes;
constexpr int kSmem = kStages * kStageBytes + 1024;

__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

template <int kHint>
__device__ __forceinline__ void tma3(void* dst, const CUtensorMap* m, int c0, int c1, int c2, uint64_t* bar, uint64_t pol) {
  if (kHint)
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
                 ::"r"(fc::smem_addr(dst)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(fc::smem_addr(bar)), "l"(pol) : "memory");
  else
    fc::tma_load_3d(dst, m, c0, c1, c2, bar);
}
template <int kHint>
__device__ __forceinline__ void tma4(void* dst, const CUtensorMap* m, int c0, int c1, int c2, int c3, uint64_t* bar, uint64_t pol) {
  if (kHint)
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
                 ::"r"(fc::smem_addr(dst)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(fc::smem_addr(bar)), "l"(pol) : "memory");
  else
    fc::tma_load_4d(dst, m, c0, c1, c2, c3, bar);
}
template <int kHint>
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  if (kHint)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
                 ::"r"(fc::smem_addr(dst)), "l"(src), "r"(bytes), "r"(fc::smem_addr(bar)), "l"(pol) : "memory");
  else
    fc::bulk_load(dst, src, bytes, bar);
}

// CTA c streams keys [split * keys, (split + 1) * keys) of head c / splits.
template <int kForm, int kHint>
__global__ void __launch_bounds__(160, 2) stream(const __grid_constant__ CUtensorMap mk3, const __grid_constant__ CUtensorMap mv3,
                                                 const __grid_constant__ CUtensorMap mk4, const __grid_constant__ CUtensorMap mv4,
                                                 const __half* k, const __half* v, int seq, int keys, int splits, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int head = blockIdx.x / splits, key0 = (blockIdx.x % splits) * keys, tiles = keys / kTileKeys;
  const int tid = threadIdx.x, warp = tid / 32;
  if constexpr (kForm == 3) {
    if (warp == 4) return;
    const uint4* pk = reinterpret_cast<const uint4*>(k + (static_cast<size_t>(head) * seq + key0) * kD);
    const uint4* pv = reinterpret_cast<const uint4*>(v + (static_cast<size_t>(head) * seq + key0) * kD);
    const int n = keys * kD / 8;  // uint4 per slice
    uint32_t acc = 0;
    const uint64_t pol = kHint ? policy_evict_first() : 0;
    for (int i = tid; i < n; i += 128 * 4) {
      uint4 a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int j = i + u * 128;
        if (kHint) {
          asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(a[u].x), "=r"(a[u].y), "=r"(a[u].z), "=r"(a[u].w) : "l"(pk + j), "l"(pol));
          asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(b[u].x), "=r"(b[u].y), "=r"(b[u].z), "=r"(b[u].w) : "l"(pv + j), "l"(pol));
        } else {
          a[u] = __ldg(pk + j);
          b[u] = __ldg(pv + j);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) acc ^= a[u].x ^ a[u].w ^ b[u].y ^ b[u].z;
    }
    if (acc == 0x12345678u) sink[0] = 1.f;
    return;
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      fc::mbarrier_init(&full[s], kForm == 4 ? 32 : 1);
      fc::mbarrier_init(&empty[s], 128);
    }
    fc::fence_proxy_async_shared();
  }
  __syncthreads();
  if (kForm == 4 && warp == 4) {  // cp.async.cg 16 B by the 32 lanes into the swizzled panel layout
    const int lane = tid % 32;
    int stage = 0;
    uint32_t phase = 0;
    for (int t = 0; t < tiles; ++t) {
      if (t >= kStages) fc::mbarrier_wait_parity(&empty[stage], phase ^ 1);
      unsigned char* ks = smem + stage * kStageBytes;
      const size_t off = (static_cast<size_t>(head) * seq + key0 + t * kTileKeys) * kD;
      for (int i = lane; i < kTileKeys * 16; i += 32) {  // chunk i: key i / 16, 16-byte column i % 16
        const int r = i / 16, c = i % 16, panel = c / 8, cc = c % 8;
        const uint32_t dst = panel * 8192 + r * 128 + ((cc ^ (r & 7)) * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(fc::smem_addr(ks + dst)), "l"(k + off + i * 8) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(fc::smem_addr(ks + kTileBytes + dst)), "l"(v + off + i * 8) : "memory");
      }
      fc::cp_async_mbarrier_arrive_noinc(&full[stage]);
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
    fc::cp_async_wait_all();
    return;
  }
  if (warp == 4) {
    if (tid % 32 != 0) return;
    const uint64_t pol = kHint ? policy_evict_first() : 0;
    int stage = 0;
    uint32_t phase = 0;
    for (int t = 0; t < tiles; ++t) {
      if (t >= kStages) fc::mbarrier_wait_parity(&empty[stage], phase ^ 1);
      unsigned char* ks = smem + stage * kStageBytes;
      fc::mbarrier_arrive_expect_bytes(&full[stage], kStageBytes);
      const int key = key0 + t * kTileKeys;
      if constexpr (kForm == 0) {
        for (int p = 0; p < 2; ++p) {
          tma3<kHint>(ks + p * 8192, &mk3, 64 * p, key, head, &full[stage], pol);
          tma3<kHint>(ks + kTileBytes + p * 8192, &mv3, 64 * p, key, head, &full[stage], pol);
        }
      } else if constexpr (kForm == 1) {
        tma4<kHint>(ks, &mk4, 0, 0, key, head, &full[stage], pol);
        tma4<kHint>(ks + kTileBytes, &mv4, 0, 0, key, head, &full[stage], pol);
      } else if constexpr (kForm == 2) {
        const size_t off = (static_cast<size_t>(head) * seq + key) * kD;
        bulk<kHint>(ks, k + off, kTileBytes, &full[stage], pol);
        bulk<kHint>(ks + kTileBytes, v + off, kTileBytes, &full[stage], pol);
      }
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
    return;
  }
  int stage = 0;
  uint32_t phase = 0;
  float acc = 0.f;
  for (int t = 0; t < tiles; ++t) {
    fc::mbarrier_wait_parity(&full[stage], phase);
    acc += reinterpret_cast<const float*>(smem + stage * kStageBytes)[tid * 33];
    fc::mbarrier_arrive(&empty[stage]);
    if (++stage == kStages) { stage = 0; phase ^= 1; }
  }
  if (acc == 1234.5f) sink[0] = acc;
}

__global__ void read_all(const float4* x, size_t n, float* sink) {
  float a = 0.f;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a += x[i].x;
  if (a == 1234.5f) sink[0] = a;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

int main(int argc, char** argv) {
  const int heads = argc > 1 ? atoi(argv[1]) : 512, seq = argc > 2 ? atoi(argv[2]) : 4096, splits = argc > 3 ? atoi(argv[3]) : 1;
  const int reps = 30, keys = seq / splits;
  const auto promo = static_cast<CUtensorMapL2promotion>(argc > 4 ? atoi(argv[4]) : 3);
  const char* only = argc > 5 ? argv[5] : "01234567";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t l2 = prop.l2CacheSize, n = static_cast<size_t>(heads) * seq * kD;
  __half *k, *v;
  float *flush, *cleanbuf, *sink;
  CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2));
  CK(cudaMalloc(&flush, 2 * l2)); CK(cudaMalloc(&cleanbuf, 2 * l2)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(k, 0x11, n * 2)); CK(cudaMemset(v, 0x22, n * 2)); CK(cudaMemset(cleanbuf, 0, 2 * l2));
  CUtensorMap mk3, mv3, mk4, mv4;
  const cuuint64_t rb = kD * 2;
  bool ok = fc::encode_tensor_map<3>(&mk3, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, k, {128, (cuuint64_t)seq, (cuuint64_t)heads}, {rb, rb * seq}, {64, 64, 1}, CU_TENSOR_MAP_SWIZZLE_128B, promo) &&
            fc::encode_tensor_map<3>(&mv3, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, v, {128, (cuuint64_t)seq, (cuuint64_t)heads}, {rb, rb * seq}, {64, 64, 1}, CU_TENSOR_MAP_SWIZZLE_128B, promo) &&
            fc::encode_tensor_map<4>(&mk4, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, k, {64, 2, (cuuint64_t)seq, (cuuint64_t)heads}, {128, rb, rb * seq}, {64, 2, 64, 1}, CU_TENSOR_MAP_SWIZZLE_128B, promo) &&
            fc::encode_tensor_map<4>(&mv4, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, v, {64, 2, (cuuint64_t)seq, (cuuint64_t)heads}, {128, rb, rb * seq}, {64, 2, 64, 1}, CU_TENSOR_MAP_SWIZZLE_128B, promo);
  if (!ok) { printf("tensor maps refused\n"); return 1; }
  using K = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, const __half*, const __half*, int, int, int, float*);
  struct { const char* name; K fn; } forms[] = {
      {"tma3d 2 boxes", stream<0, 0>}, {"tma3d 2 boxes evict_first", stream<0, 1>},
      {"tma4d 1 box", stream<1, 0>},   {"tma4d 1 box evict_first", stream<1, 1>},
      {"bulk 16 KB", stream<2, 0>},    {"bulk 16 KB evict_first", stream<2, 1>},
      {"ldg", stream<3, 0>},           {"ldg evict_first", stream<3, 1>},
      {"cp.async 16 B, 1 warp", stream<4, 0>}};
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  printf("%d heads x %d keys, %d splits: %d CTAs, K+V %.1f MB, L2 %.0f MB\n", heads, seq, splits, heads * splits, 4.0 * n / 1e6, l2 / 1e6);
  printf("tensor-map L2 promotion %d\n", static_cast<int>(promo));
  int fi = -1;
  for (auto& f : forms) {
    ++fi;
    if (!strchr(only, '0' + fi / 2)) continue;
    CK(cudaFuncSetAttribute(f.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<float> t;
      for (int r = 0; r < reps + 2; ++r) {
        CK(cudaMemsetAsync(flush, 0, 2 * l2));
        if (mode == 1) read_all<<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const float4*>(cleanbuf), 2 * l2 / 16, sink);
        CK(cudaEventRecord(a));
        f.fn<<<heads * splits, 160, kSmem>>>(mk3, mv3, mk4, mv4, k, v, seq, keys, splits, sink);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 2) t.push_back(ms * 1000.f);
      }
      CK(cudaGetLastError());
      std::sort(t.begin(), t.end());
      const float med = t[t.size() / 2];
      printf("  %-28s %-5s %8.1f us (p10 %7.1f p90 %7.1f)  %6.0f GB/s\n", f.name, mode ? "clean" : "write", med, t[t.size() / 10],
             t[t.size() * 9 / 10], 4.0 * n / med / 1e3);
    }
  }
  return 0;
}
