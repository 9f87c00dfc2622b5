// common/hopper.cuh — the sm_90a (Hopper) primitives behind v12, each a thin wrapper over one PTX instruction:
// warpgroup matrix multiply (wgmma) with its shared-memory descriptors and fence/commit/wait, register
// reallocation between warpgroups (setmaxnreg), named barriers, the mbarrier-init fence, and the tensor-map
// layout v12 reads [B, H, S, D] tiles in. The TMA copies and tensor-map encoding live in common/tma.cuh, the mbarrier
// operations in common/mbarrier.cuh (both shared with v11).
//
// wgmma and setmaxnreg exist only in the sm_90a target (-gencode arch=compute_90a,code=sm_90a); built for
// any other target these wrappers trap, so a rung that uses them is registered with `archs: [sm_90a]`.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "common/mbarrier.cuh"
#include "common/primitives.cuh"
#include "common/tma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FC_SM90A_ONLY(statement) statement
#else
#define FC_SM90A_ONLY(statement) __trap()
#endif

namespace fc {

// ---- warpgroup shapes ---------------------------------------------------------------------------------
constexpr int kWarpgroupThreads = 128;

// ---- dynamic shared memory ----------------------------------------------------------------------------
// The dynamic shared memory rounded up to 1024 bytes (the 128-byte swizzle atom), as an offset from the shared
// array itself: the compiler then knows every pointer derived from it is shared, and accesses through it are
// LDS/STS on 32-bit addresses. Rounded through uintptr_t, the pointer was generic: LD.E/ST.E on 64-bit ones (v12's
// backward read LSE_i, D_i and staged dQ so; 3-5% of it at D = 64, H100).
__device__ __forceinline__ unsigned char* dynamic_smem_1024() {
  extern __shared__ unsigned char smem_raw[];
  return smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
}

// ---- wgmma shared-memory descriptors ------------------------------------------------------------------
// A 64-bit descriptor tells wgmma where an operand tile lies in shared memory and how it is laid out:
// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle (1 = 128-byte). Tiles here are TMA-written 128-byte-swizzled panels (64 fp16 per row),
// 1024-byte aligned, so the base-offset field stays 0.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* smem, uint32_t lead_bytes, uint32_t stride_bytes) {
  const uint64_t start = (smem_addr(smem) & 0x3FFFF) >> 4;
  return start | (static_cast<uint64_t>(lead_bytes >> 4) << 16) | (static_cast<uint64_t>(stride_bytes >> 4) << 32) |
         (1ull << 62);
}

// ---- wgmma ordering -----------------------------------------------------------------------------------
// wgmma.fence: orders this warpgroup's earlier register writes (accumulators, A fragments) before the
// wgmma that follows reads them. Needed before the first wgmma and after any non-wgmma write to them.
__device__ __forceinline__ void wgmma_fence() { FC_SM90A_ONLY(asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory")); }

// wgmma.commit_group: closes the wgmmas issued so far into one group that wait_group can wait for.
__device__ __forceinline__ void wgmma_commit() {
  FC_SM90A_ONLY(asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"));
}

// wgmma.wait_group N: returns once at most N committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  FC_SM90A_ONLY(asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"));
}

// Keeps the compiler from moving reads or writes of an accumulator across an asynchronous wgmma (it
// cannot see that the hardware writes these registers after the issuing instruction has retired).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A fragments, which the hardware reads until the wgmma completes: keeping them live
// up to the wait stops the compiler from giving their registers to other values meanwhile.
template <int M, int N>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// wgmma_ss<N, T>: D[64 x N] (+)= A[64 x 16] * B[N x 16]^T, A and B both K-major in shared memory (descriptors);
// accumulate = 0 overwrites D. wgmma_rs<N, T>: D[64 x N] (+)= A[64 x 16] * B[16 x N], A from registers (four
// fp16x2 per thread, the mma.sync m16n8k16 A layout per warp), B N-major in shared memory (transposed read).
// The accumulator layout per warp w of the warpgroup: lane t holds rows 16w + t/4 and +8, columns
// 8j + 2(t%4) + {0, 1}: d[4j], d[4j+1] on the first row, d[4j+2], d[4j+3] on the second.
// kTransB = 1 (wgmma_ss only): B is N-major instead (its rows are the k index, as V in wgmma_rs); kTransA = 1: A
// is M-major (its rows are the k index).
template <int N, typename T, int kTransB = 0, int kTransA = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate);
template <int N, typename T>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate);

// The shapes v12 uses (n128: S over 128 keys; n72 / n136: O at D = 64 / 128 plus 8 l columns), for fp16 and
// bf16 operands (T = __half / __nv_bfloat16), fp32 accumulators.
// One definition per shape, instantiated for both element types (the PTX type is the only difference).
#define FC_WGMMA_SS_128(T, TYPE)                                                                                     \
template <>                                                                                                          \
__device__ __forceinline__ void wgmma_ss<128, T>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) { \
  FC_SM90A_ONLY(asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"                                              \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                       \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                             \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                             \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                               \
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                             \
      :                                                                                                              \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),      \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),      \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),      \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),      \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])       \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate)));                                                                 \
}

#define FC_WGMMA_RS_72(T, TYPE)                                                                                            \
template <>                                                                                                                \
__device__ __forceinline__ void wgmma_rs<72, T>(float (&d)[36], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) { \
  FC_SM90A_ONLY(asm volatile(                                                                                              \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"                                                                         \
      "wgmma.mma_async.sync.aligned.m64n72k16.f32." TYPE "." TYPE " {"                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                             \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                   \
      "%32, %33, %34, %35"                                                                                                 \
      "}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"                                                                     \
      :                                                                                                                    \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                    \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),              \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),            \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),            \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])                                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)));                                        \
}

#define FC_WGMMA_RS_136(T, TYPE)                                                                                            \
template <>                                                                                                                 \
__device__ __forceinline__ void wgmma_rs<136, T>(float (&d)[68], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) { \
  FC_SM90A_ONLY(asm volatile(                                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %73, 0;\n"                                                                          \
      "wgmma.mma_async.sync.aligned.m64n136k16.f32." TYPE "." TYPE " {"                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                              \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                    \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                    \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                    \
      "%64, %65, %66, %67"                                                                                                  \
      "}, {%68, %69, %70, %71}, %72, p, 1, 1, 1;\n}\n"                                                                      \
      :                                                                                                                     \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                     \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),               \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),             \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),             \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),             \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),             \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),             \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),             \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)));                                         \
}

// The backward's shapes (sm90/v12_bwd.cu): n64 (S^T, dP^T over 64 queries; dQ's 64 columns, B N-major) and n64 / n128
// register-A products for dV, dK at D = 64 / 128.
// Their operand lists are spelled by the macros below.
#define FC_F8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define FC_F32(d) FC_F8(d, 0), FC_F8(d, 8), FC_F8(d, 16), FC_F8(d, 24)
#define FC_F64(d) FC_F32(d), FC_F8(d, 32), FC_F8(d, 40), FC_F8(d, 48), FC_F8(d, 56)
#define FC_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FC_D64 FC_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// DESCS, ACC: the operand numbers of desc_a, desc_b and accumulate, which follow the REGS accumulators
#define FC_WGMMA_SS(N, REGS, T, TYPE, DLIST, FLIST, DESCS, ACC, TRANS_B, TRANS_A)                                 \
template <>                                                                                                       \
__device__ __forceinline__ void wgmma_ss<N, T, TRANS_B, TRANS_A>(float (&d)[REGS], uint64_t desc_a,               \
                                                                 uint64_t desc_b, int accumulate) {               \
  FC_SM90A_ONLY(asm volatile(                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" DLIST "}, " DESCS ", p, 1, 1, " #TRANS_A \
      ", " #TRANS_B ";\n}\n"                                                                                       \
      : FLIST(d)                                                                                                  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate)));                                                              \
}

// A_OPS, DESC, ACC: the operand numbers of a[], desc_b and accumulate, which follow the REGS accumulators
#define FC_WGMMA_RS(N, REGS, T, TYPE, DLIST, FLIST, A_OPS, DESC, ACC)                                            \
template <>                                                                                                       \
__device__ __forceinline__ void wgmma_rs<N, T>(float (&d)[REGS], const uint32_t (&a)[4], uint64_t desc_b,        \
                                               int accumulate) {                                                  \
  FC_SM90A_ONLY(asm volatile(                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                                             \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" DLIST "}, {" A_OPS "}, " DESC           \
      ", p, 1, 1, 1;\n}\n"                                                                                         \
      : FLIST(d)                                                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)));                               \
}

FC_WGMMA_SS_128(__half, "f16")
FC_WGMMA_SS_128(__nv_bfloat16, "bf16")
FC_WGMMA_RS_72(__half, "f16")
FC_WGMMA_RS_72(__nv_bfloat16, "bf16")
FC_WGMMA_RS_136(__half, "f16")
FC_WGMMA_RS_136(__nv_bfloat16, "bf16")
FC_WGMMA_SS(64, 32, __half, "f16", FC_D32, FC_F32, "%32, %33", "%34", 0, 0)
FC_WGMMA_SS(64, 32, __nv_bfloat16, "bf16", FC_D32, FC_F32, "%32, %33", "%34", 0, 0)
FC_WGMMA_SS(64, 32, __half, "f16", FC_D32, FC_F32, "%32, %33", "%34", 1, 0)
FC_WGMMA_SS(64, 32, __nv_bfloat16, "bf16", FC_D32, FC_F32, "%32, %33", "%34", 1, 0)
FC_WGMMA_RS(64, 32, __half, "f16", FC_D32, FC_F32, "%32, %33, %34, %35", "%36", "%37")
FC_WGMMA_RS(64, 32, __nv_bfloat16, "bf16", FC_D32, FC_F32, "%32, %33, %34, %35", "%36", "%37")
FC_WGMMA_RS(128, 64, __half, "f16", FC_D64, FC_F64, "%64, %65, %66, %67", "%68", "%69")
FC_WGMMA_RS(128, 64, __nv_bfloat16, "bf16", FC_D64, FC_F64, "%64, %65, %66, %67", "%68", "%69")

#undef FC_WGMMA_SS_128
#undef FC_WGMMA_RS_72
#undef FC_WGMMA_RS_136
#undef FC_WGMMA_SS
#undef FC_WGMMA_RS
#undef FC_F8
#undef FC_F32
#undef FC_F64
#undef FC_D32
#undef FC_D64

// ---- shared-memory stores of fragments ----------------------------------------------------------------
// stmatrix.sync.aligned.m8n8.x4.trans.shared.b16: four 8x8 tiles of 16-bit values, each held as mma fragments
// (lane t holds row t/4, columns 2(t%4) and +1 of tile i as the pair r[i]), stored TRANSPOSED: lanes 8i .. 8i+7
// give the shared addresses of tile i's eight stored rows (its columns), 16 bytes each. sm_90.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  FC_SM90_ONLY(asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                            "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                            : "memory"));
}

// stmatrix.sync.aligned.m8n8.x4.shared.b16: the same four tiles stored as they are (lanes 8i .. 8i+7 give the
// addresses of tile i's eight rows, 16 bytes each). sm_90.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  FC_SM90_ONLY(asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                            "r"(r[1]), "r"(r[2]), "r"(r[3])
                            : "memory"));
}

// ---- register reallocation ----------------------------------------------------------------------------
// setmaxnreg.dec / .inc: this warpgroup gives registers back to the pool / takes them from it (a multiple
// of 8 in 24..256; every warp of the warpgroup executes it). Takes effect only in a kernel launched with a
// register cap (__launch_bounds__(threads, 1)).
// The pool is what the CTA was launched with: under __launch_bounds__(threads, 1) ptxas gives each thread
// 65536 / threads registers, rounded down to a multiple of 8 (168 at 384 threads), so the warpgroups' counts
// after the moves must fit threads x that; an .inc beyond the pool waits forever (a hang, not an error).
constexpr bool setmaxnreg_fits(int threads, int producer_regs, int consumer_regs, int consumers) {
  return (producer_regs + consumer_regs * consumers) * kWarpgroupThreads <=
         (65536 / threads < 255 ? 65536 / threads : 255) / 8 * 8 * threads;
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  FC_SM90A_ONLY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs)));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  FC_SM90A_ONLY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs)));
}

// ---- named barriers -----------------------------------------------------------------------------------
// bar.sync id, n: waits until n threads (this one included) have arrived at barrier `id` (1..15; 0 is
// __syncthreads). bar.arrive id, n: counts this thread's arrival without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- mbarrier set-up for the copy engine --------------------------------------------------------------
// fence.mbarrier_init: makes this thread's mbarrier.init visible to the async proxy (the TMA unit) before
// the block's barrier that publishes them.
__device__ __forceinline__ void fence_mbarrier_init() {
  FC_SM90_ONLY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}

// ---- tensor maps over [B, H, S, D] in 128-byte panels (host) ------------------------------------------
// A [B, H, S, D] fp16 tensor seen as 4-D {64, S, D/64, B*H}: a box {64, rows, panels, 1} lands in shared
// memory as `panels` panels of rows x 128 bytes, each 128-byte swizzled (16-byte chunk c of row r stored at
// chunk c ^ (r % 8)), which is the K-major layout wgmma's descriptors read. Rows past S read as zeros and
// are not written by stores. False when the driver refuses (no encoder, a misaligned base).
static inline bool encode_panel_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int batch_heads,
                                    int seq_len, int head_dim, int box_rows, int box_panels) {
  if (head_dim % 64 != 0) return false;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(head_dim) * 2;
  const cuuint64_t dims[4] = {64, static_cast<cuuint64_t>(seq_len), static_cast<cuuint64_t>(head_dim / 64),
                              static_cast<cuuint64_t>(batch_heads)};
  const cuuint64_t strides[3] = {row_bytes, 128, row_bytes * seq_len};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), static_cast<cuuint32_t>(box_panels), 1};
  return encode_tensor_map<4>(map, type, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

}  // namespace fc
