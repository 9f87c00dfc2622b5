// common/mma_sm80.cuh — the sm_80+ tensor-core instructions FlashAttention-2 is built on, as thin PTX wrappers:
// mma.sync m16n8k16 (fp16 inputs, fp32 accumulators), ldmatrix .x4 (plain and .trans) and the XOR swizzle
// that keeps both ldmatrix and 16-byte cp.async free of shared-memory bank conflicts.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16x16, row-major)  a0: (g,   2t..2t+1)   a1: (g+8, 2t..2t+1)   a2: (g, 2t+8..)   a3: (g+8, 2t+8..)
//   B (16x8,  "col")      b0: (k = 2t..2t+1, n = g)                     b1: (k = 2t+8.., n = g)
//   C (16x8,  fp32)       c0, c1: (g, 2t..2t+1)                        c2, c3: (g+8, 2t..2t+1)
// Each 32-bit register holds two fp16 values, the lower column (or k) in the low half. The C fragment of two
// neighbouring n8 tiles, packed to fp16, is exactly an A fragment: that is how P = softmax(S) feeds P V
// straight from registers.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace fc {

// D = A B + D for one 16x8x16 tile.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 fp16 matrices from shared memory: lanes 8i..8i+7 give the row addresses of matrix i, and lane
// l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each matrix in r[i].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

// As ldmatrix_x4, transposed: lane l receives column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address));
}

// Two floats as an fp16x2 register, `lo` in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are `row_bytes` long (a multiple
// of 128). The chunk index is XORed with row % 8, so the eight rows an ldmatrix phase reads (same logical
// chunk, eight consecutive rows) land in eight different 16-byte bank groups, and so do the eight chunks of
// one row that consecutive cp.async lanes write.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

// The same swizzle seen from an ldmatrix lane: the byte offset within a row of chunk 2 * pair + half,
// for a lane whose row is lane % 8 modulo 8. Pairs 4..7 (D=128) sit 128 bytes past pairs 0..3 under the
// same XOR, so a lane has only four distinct offsets: written this way they stay in four registers and the
// rest folds into immediates.
__device__ __forceinline__ uint32_t ldmatrix_chunk(int pair, int half, int lane) {
  return static_cast<uint32_t>((((2 * (pair & 3) + half) ^ (lane & 7)) << 4) + (pair & 4) * 32);
}

// Hint: bring the 32-byte sector at `ptr` into L2; nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr));
}

}  // namespace fc
