// sm80/v11.cu — FlashAttention-2 on raw mma.sync: scores, softmax and P V never leave the registers.
//
// Idea: each warp owns 16 or 32 query rows and their whole softmax, as in FlashAttention-2. S = Q K_j^T runs
// on mma.sync m16n8k16 into fp32 C fragments; a row's max takes two shuffles in the quad of lanes that holds
// it; P = exp2(S * scale * log2 e - m) is packed to fp16 in place, and since the C fragments of two n8
// tiles ARE the A fragment of the next mma, P V runs straight from those registers. K_j and V_j stream through
// a cp.async ring in XOR-swizzled shared memory, read by ldmatrix .x4 (.trans for V) free of bank conflicts.
// Parts: sm80/v11_traits.cuh (tile configurations), sm80/forward_sm80.cuh (a CTA's prologue, main loop, epilogue),
// common/fa2_fragments.cuh (the warp's fragments), sm80/launch_fwd_sm80.cuh (kernels and launcher, instantiated here
// for fp16 at D=64, in sm80/v11_bf16.cu for bf16 and in sm80/v11_d128.cu for D=128: translation units that compile in
// parallel); this file holds the contract's entry points. Backward: sm80/v11_bwd.cu.
//
// Change from the rungs below (v8-v10, WMMA): WMMA's fragment layout is unspecified, so they sent every tile's
// scores through shared memory for the softmax, and P again for P V, with barriers between; PTX specifies
// mma's layouts, so v11 has no round trip. A warp none of whose rows found a new max skips the O rescale.
// Short sequences are a latency problem (1,8,512,64 is one short wave): when the long grid would not fill the
// GPU, 32-row CTAs split each ring stage's keys between groups of warps and merge (m_i, l_i, O_i) through
// shared memory at the end; Q_i goes from global memory straight to registers, and the CTAs of a head prefetch
// its K, V into L2. On sm_90 at D=64 the short kernel is v11_fwd_tma: thread 0 loads each stage by TMA onto an
// mbarrier, so the warps issue no LDGSTS (each 32 KB cp.async refill cost its tile ~250 ns in the MIO queue),
// and its loop is software-pipelined (S of tile t + 1 in the same basic block as tile t's softmax and P V).
// The long D=64 kernel does the same on sm_90 (LongTmaD64: LongD64's tiles, one S at a time, 221 registers).
// Causal: tiles past a warp's last row are skipped, only diagonal tiles build masks, heaviest query tiles first.
// bf16: every kernel also exists as *_bf16 (mma .bf16, P and O rounded to bf16, a bf16 ones column for l_i,
// BFLOAT16 tensor maps, in sm80/v11_bf16.cu); the fp16 kernels are unchanged (same SASS opcodes; sm_90's LongD128
// swaps two registers).
// Grouped-query heads and S_kv != S: a CTA of query head h reads K/V head h / (H / H_kv), key tiles run over S_kv
// and the causal mask is bottom-right (row i sees keys j <= i + S_kv - S); the row LSE is written when asked (the
// backward, sm80/v11_bwd.cu, reads it). Same run beside the build before (H200, cold): 1,8,512,64 8.2 vs 8.2 us,
// 2,16,4096,64 420.9 vs 430.8, 2,16,4096,128 756.3 vs 767.8. A CTA that sees no key (causal, S > S_kv) waits for
// Q_i's copies before staging O over them (docs/ladder.md, "A CTA that sees no key").
// The attention family (docs/family.md): a CTA walks only the key tiles its rows see, masks only the tiles a window
// cuts, and folds a sink in at a row's end (every kernel). Windows and softcap run on v11_fwd*_family (softcap a uniform
// branch per tile; D=128's long windowed calls on v11_fwd_window*); the dense kernels keep the loop they had before
// the family (its per-tile window work cost them 6-9% at 2,16,4096,128). Backward: v11_bwd (dense), v11_bwd_window,
// v11_bwd_softcap (recomputes tanh for dS); dL/dsinks is common/bwd_passes.cuh's prep.
//
// Configuration (V11Config<D, BLOCK_M, BLOCK_N, WARP_M, STAGES, SPLIT, MIN_BLOCKS>; tune space: variants.yaml):
//   slot         used when                          D  BLOCK_M BLOCK_N WARP_M STAGES SPLIT MIN warps  smem
//   LongD64      B*H*ceil(S/128) >= SMs             64    128     64     32      2     1    2    4   48 KB
//   LongD128                                       128    128     48     32      2     1    2    4   80 KB
//   ShortD64     fewer CTAs than SMs                64     32     32     16      3     4    1    8   96 KB
//   ShortD128                                      128     32     16     16      2     4    1    8   69 KB
//   ShortTmaD64  short, D=64, sm_90+ build          64     32     64     16      3     2    1    4   96 KB
//   LongTmaD64   long, D=64, sm_90+ build           64    128     64     32      2     1    2    4   48 KB
//   LongFamilyD128  long, D=128, softcap       128    128     32     32      2     1    2    4   64 KB
// Why: 32-row warps read each K/V fragment once for two m16 tiles (16-row warps: ldmatrix caps the mma near
// 470 TFLOP/s on an H100); registers set the rest (D=128: 48-key tiles, 777 us at 2,16,4096,128 vs 832 for 32).
// Short: 4 groups x 32 keys 9.5 us at 1,8,512,64 vs 8 x 16 10.6, 2 x 64 9.8 (`flashcore tune`, 20 configurations).
//
// Run:  flashcore test v11 && flashcore bench v11 --shape 1,8,512,64 && flashcore bench v11 --shape 2,16,4096,64
//
// Accuracy: l_i sums the fp16 P that P V multiplies (one more mma per k16 step: P times a ones column), so
// one-hot rows (q = k = v = randn * 30) are exact, as in SDPA (summing fp32 P: 0.0625). It cost 3.6% at
// 2,16,4096,64 (457 vs 441 us, a ptxas schedule); K and V by TMA in the long D=64 kernel won it back (433-436
// us). Five other exact forms, their costs and the schedule study: docs/ladder.md, "Accuracy".
//
// ptxas: no static smem, spills or stack (`flashcore ptxas v11`; registers per kernel: docs/ladder.md).
// Measured (H200, `flashcore bench`, L2 flushed, blocking start; the record docs/results/h200.json, and
// runs of this build beside the build before the l_i change, which reads v11b):
//   shape              v11                     SDPA default   SDPA flash (FA2)
//   1,8,512,64         8.1 us (0.74x), v11b 8.1   11.0 us     14.5 us   target <= 0.6x SDPA's time: not met
//     graph mode       5.5 us, v11b 5.5           8.9 us     10.3 us
//   2,16,4096,64       433-436 us, 315-318 TFLOP/s; v11b 436  462 TFLOP/s   294  (cp.async: 456-460 us)
//     causal           230 us, 298 TFLOP/s; v11b 234          368          233  (cp.async: 244 us)
//   2,16,4096,128      359 TFLOP/s (bf16 360)     639 (661)   346 (341)  1.04x FA2 (bf16 1.06x)
// Where the 1,8,512,64 time goes (timelines, ablations, the floor): docs/ladder.md.
// Tried and not kept (H200, 1,8,512,64; each with its figures in docs/ladder.md): clusters along the keys (DSMEM
// merge) and of query tiles (TMA multicast), tensor-map prefetch, cp.async short kernel on sm_90, next S before
// this softmax, wider TMA tiles, 16-row CTAs two per SM, FlashAttention-4's lazy rescale: none beat the kept kernels.
#include "flashcore.h"
#include "sm80/launch_fwd_sm80.cuh"

// The bf16 half (sm80/v11_bf16.cu; D=128 in sm80/v11_d128.cu) and the backward (sm80/v11_bwd.cu), each its own
// translation unit.
const char* v11_forward_bf16(const FlashcoreParams& p, cudaStream_t stream);
int v11_plan_bf16(int head_dim, FlashcoreKernelPlan* plans);
int v11_backward_plan(int head_dim, FlashcoreKernelPlan* plans);

// The forward's fp16 kernels, then its bf16 ones, then the backward's (sm80/v11_bwd.cu).
int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  FlashcoreKernelPlan all[kFlashcoreMaxPlans];
  int count = plan_dtype<__half>(head_dim, all);
  if (count == 0) return 0;
  count += v11_plan_bf16(head_dim, all + count);
  count += v11_backward_plan(head_dim, all + count);
  const int n = max_plans < count ? max_plans : count;
  for (int i = 0; i < n; ++i) plans[i] = all[i];
  return n;
}

const char* flashcore_forward(const FlashcoreParams& p, cudaStream_t stream) {
  v11_forward_note() = nullptr;
  // The running max is kept in raw-score units, which orders like the scaled scores only for scale > 0.
  if (!(p.scale > 0.f)) return fc::message("v11 needs a softmax scale > 0 (got %g)", p.scale);
  if (p.seq_len < 1 || p.batch < 1 || p.heads < 1) return nullptr;
  if (p.seq_len_kv < 1) return "v11: k and v have no rows";
  return p.dtype != kFlashcoreBFloat16 ? forward_dtype<__half>(p, stream) : v11_forward_bf16(p, stream);
}

// Set when an sm_90 build's TMA kernel fell back to its cp.async twin (a driver without the tensor-map entry
// point, or maps it could not make), so the row that timed it names the kernel that ran.
const char* flashcore_forward_note() { return v11_forward_note(); }

// fp16 and bf16: the same kernels, instantiated for each (v11_fwd*_bf16).
int flashcore_dtypes() { return (1 << kFlashcoreFloat16) | (1 << kFlashcoreBFloat16); }

// Grouped-query heads and S_kv != S (each query head reads its K/V head; the causal mask is bottom-right), the
// row log-sum-exp when asked, the backward in sm80/v11_bwd.cu, and the attention family (sliding windows, softcap,
// sinks) in both directions.
int flashcore_features() {
  return kFlashcoreGqa | kFlashcoreSeqLenKv | kFlashcoreLse | kFlashcoreBackward | kFlashcoreWindow | kFlashcoreSoftcap |
         kFlashcoreSinks;
}
