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
// And their warps load Q_i straight from global memory into registers (Q_i never touches shared memory),
// which leaves room at D=64 for a third 32 KB ring stage under the L4's 99 KB.
// On sm_90 the short D=64 kernel is v11_fwd_tma: thread 0 loads each stage's K and V with two TMA tensor
// copies (a 3-D map [B*H][S][64], 128-byte swizzle: exactly the chunk ^ (row & 7) layout) onto the stage's
// mbarrier, and prefetches the later tiles to L2 with TMA too. Why: a timeline of the cp.async kernel
// (per-warp %globaltimer stamps) showed each 32 KB refill costing the tile that issues it ~250 ns: 2,048
// LDGSTS per stage go through the same MIO queue as the tile's ldmatrix loads, which wait behind them. With
// the copies off the warps, wider tiles pay (2 key groups x 64 keys, 3 stages, 4 warps; measured below).
// Its loop is software-pipelined: S of tile t + 1 is computed in the same basic block as tile t's softmax and
// P V, so the scheduler interleaves the HMMAs of one with the MUFU and shuffles of the other (each warp is
// alone on its scheduler, so nothing else hides their latency); all three stages load up front, and a stage
// is refilled only after the barrier that shows every warp is past it (one barrier at S = 512, not four).
// Under causal masking, tiles past a warp's last row are skipped, only tiles that cross the diagonal or the
// sequence end build element masks, and the query tiles launch heaviest-first (grid x = batch * head,
// y = query tile, reversed).
//
// On sm_90 there is a second short-sequence kernel, off by default: cluster split-K (v11_cluster_fwd). The
// ceil(S / CHUNK_N) CTAs of a query tile form a cluster along the keys (at 1,8,512,64: pairs of 64-row CTAs,
// 256 keys each, 128 CTAs in 64 clusters, all co-resident). Inside a CTA, SPLIT groups of warps take a
// quarter of the chunk each; every group loads its own keys at once (no ring, one DRAM round trip: 72 KB
// per SM with Q_i, against ~132 KB per SM for the in-CTA split) and meets only at its own named barrier.
// The groups merge through shared memory; then each rank pushes the rows the other ranks own to them, one
// bulk copy per peer (cp.async.bulk shared::cta -> shared::cluster, counted on the owner's mbarrier), and
// each owner merges its rows and writes them. Used when built with -D V11_CLUSTER=1, the regime is short,
// S <= 8 chunks (a portable cluster) and the device and the build are sm_90; causal is supported (keys past
// a tile's diagonal load nothing and contribute m = -inf). It replaced a 4-rank version with 8-byte DSMEM
// stores between two cluster barriers, which measured 11.5 us against 10.5 for the in-CTA split then.
// Why it is still off: 10.8 us at 1,8,512,64 against 9.5 for the in-CTA split (one bench run on the H200; 11.0
// and 10.9 in its two validation runs). Its timeline, from a harness outside the product that stamps
// %globaltimer per CTA (medians over 128 CTAs x 5 runs, L2 flushed; ns after the first CTA starts): loads issued
// 1,120 (Q_i first); group 0's K_0 landed 1,890; S = Q K_0^T done 3,460; softmax 3,870; V_0 landed and P V done
// 4,800; partials written 5,340; in-CTA merge done 6,340; pushed partials landed 7,070; owner merge done 7,580;
// end 7,800. So the two merges cost ~2.8 us, more than the loads save: each merge moves fp32 partials through
// shared memory (the in-CTA one 64 rows x 4 groups x 288 B = 74 KB written and read). Run twice in a row, the
// in-CTA merge took 0.96 and 0.86 us, the owner's 0.96 and 0.54: not instruction fetch, mostly (warming the code
// into L2 before the launch changed nothing either). The first S also comes ~1.6 us after its K_0 lands,
// probably because 16 warps share the tensor pipe and the ldmatrix bandwidth (each K, V byte is read by 4
// row-warps); not probed further.
// It is correct (28 default cases, 1,000 random shapes, memcheck / racecheck / synccheck clean on
// 1,8,512,64, 1,4,1000,128 and 1,2,97,64, causal) and kept as the experiment to finish: the merge is where.
// Measured later (H200, one run of each shape twice, beside the in-CTA TMA kernel at 8.7-8.8 us): tilings
// that put two CTAs on an SM, each within 99 KB: 32 rows x 256 keys, 2 groups, 4 warps, 2 tiles per warp
// 10.0 us; 64 rows with 2 groups 10.2-10.3; 4 ranks of 128 keys 13.1-13.3. With the loads moved to TMA (an
// experiment outside the product: one mbarrier per group tile, no LDGSTS from the warps) the first of those
// took 9.2-9.4 and this default 9.8-9.9: the warps' LDGSTS cost it 0.7-1.0 us, and the two merges still
// leave it 0.4-0.5 us behind.
//
// Configuration: one per head dim and regime, each overridable with -D (V11_<SLOT>_<PARAM>, below):
//   slot        used when (pick_regime)                D   BLOCK_M BLOCK_N WARP_M STAGES SPLIT MIN_BLOCKS warps smem
//   LONG_D64    B*H*ceil(S/128) >= SMs (fills the GPU)  64     128     64     32      2     1      2        4  48 KB
//   LONG_D128                                          128     128     48     32      2     1      2        4  80 KB
//   SHORT_D64   fewer CTAs than SMs: it would idle      64      32     32     16      3     4      1        8  96 KB
//   SHORT_D128                                         128      32     16     16      2     4      1        8  69 KB
//   SHORT_TMA_D64  short, D=64, sm_90 (v11_fwd_tma)     64      32     64     16      3     2      1        4  96 KB
//   CLUSTER_D64  short, sm_90, S <= 8 * CHUNK_N         64      64     64     16      -     4      1       16  94 KB
//   CLUSTER_D128                                       128      32     32     16      -     4      1        8  90 KB
//   (cluster: CHUNK_N = 256 keys per CTA at D=64, 128 at D=128, all loaded at once; SPLIT groups take
//   CHUNK_N / SPLIT keys each, in tiles of BLOCK_N)
// Why: 32 rows per warp (FA2's choice on sm_90: 128 rows, 4 warps) reads each K/V fragment once for two m16
// tiles. At 16 rows every mma needs 256 B of ldmatrix traffic, and 128 B/clk of shared-memory bandwidth caps
// the mma at ~470 TFLOP/s on an H100 before any softmax work; at 32 rows the tensor pipe is the limit. The
// register file sets the rest: O_i + S take 128 + 64 fp32 at D=64 x 64 keys (240 registers with Q_i held in
// registers: 2 CTAs/SM); at D=128, O_i alone is 128, so Q_i is re-read by ldmatrix each tile, and the tile
// is 48 keys (255 registers, no spills: 16 S registers fewer than FA2's 64-key tile). Tuned at 2,16,4096,128
// (`flashcore tune`, one run): 32 keys 832 us, 32 keys x 3 stages 822, 48 keys 777, 64 keys 779 (96 KB);
// 48 takes the least shared memory of the two that tie. (An earlier kernel body spilled at 48 and 64 keys,
// which is why 32 was the default until this measurement.) Short: 32 rows per CTA puts 128 CTAs (one
// per SM) on 1,8,512,64; 4 key groups of 2 warps each walk 128 keys in 4 tiles of 32, three 128-key stages
// (Q_i from global memory: 9.5 us against 9.7 with two stages, one bench run; a load-only model of the ring,
// below, had predicted 0.76 us).
// Tuned at 1,8,512,64 (`flashcore tune`, one run, 20 configurations, each checked first): 4 groups x 32
// keys 9.5 us; 8 x 16 (the previous default, 16 warps) 10.6; 2 x 64 9.8; 3 x 32 and 2 x 32 with 3-4 stages
// 10.4-10.8; 4 x 16 with 2-5 stages 10.3-10.8; 32-row warps 9.6-13.0. Fewer groups, a smaller merge (with
// 8 groups it took 1.1 us of the kernel); fewer than 4 make each warp's chain of tiles too long. 64 and 48
// rows per CTA (fewer CTAs, each K, V byte shared by more rows) were slower: 10.5-12.3 us against 9.7
// (one run, two stages then). At
// D=128 a 128-key stage is 64 KB, so 4 groups x 16 keys and two stages.
// Cluster: 64 rows x 256 keys per CTA makes 64 clusters of 2 at 1,8,512,64, and 66 fit at once
// (cudaOccupancyMaxActiveClusters), so one wave. (The previous version's 128-row CTAs in clusters of 4 fit
// only 30 clusters: two waves.) SPLIT 2 (8 warps) and 32-key tiles measured 12.5 and 13.4 us in the probe
// harness against 12.9 for this default, before the fixes above.
//
// Tuning (-D V11_<SLOT>_<PARAM>=value; SLOT = LONG_D64, LONG_D128, SHORT_D64, SHORT_D128, SHORT_TMA_D64):
//   BLOCK_M     query rows per CTA              a multiple of WARP_M
//   BLOCK_N     keys per warp per tile          a multiple of 16 in 16..128
//   WARP_M      query rows per warp             16 or 32
//   STAGES      cp.async ring depth             >= 2
//   SPLIT       key groups per CTA              >= 1 (1: no merge, no L2 prefetch)
//   MIN_BLOCKS  __launch_bounds__ min CTAs/SM   >= 1 (caps registers at 64K / (threads * MIN_BLOCKS))
//   and V11_SPLIT_BELOW_WAVES (default 1): SHORT when B*H*ceil(S/LONG BLOCK_M) < that many waves of SMs;
//   V11_RESCALE_LOG2 (default 0.f; 8.f is FlashAttention-4's lazy rescale, see online_softmax);
//   V11_TMA (default 1; 0: the cp.async kernel on sm_90 too). SHORT_TMA_D64 also needs SPLIT > 1 (Q_i in
//   registers, so the ring starts at offset 0) and SPLIT * BLOCK_N <= 256 (one TMA box); static_asserts.
//   Cluster path (SLOT = CLUSTER_D64, CLUSTER_D128): BLOCK_M (query rows per CTA, a multiple of WARP_M),
//   CHUNK_N (keys per CTA, a multiple of SPLIT * BLOCK_N, at most 8 tiles per warp), SPLIT (key groups per
//   CTA, 1..15), BLOCK_N (16..128), WARP_M (16 or 32, WARP_M * D <= 2048), MIN_BLOCKS (__launch_bounds__);
//   V11_CLUSTER (default 0; 1 builds and uses the path), V11_CLUSTER_MAX (default 8, at most 8: the
//   largest cluster, so the path takes S <= CLUSTER_MAX * CHUNK_N). Shared memory: max(4*CHUNK_N*D,
//   8*SPLIT*BLOCK_M + SPLIT*BLOCK_M*4*(D+8)) + (BLOCK_M + CLUSTER_MAX - 1)*4*(D+8) + 16 <= 101376 B
//   (static_assert in V11ClusterConfig).
// Restrictions (static_asserts in V11Config): (BLOCK_M / WARP_M) * SPLIT <= 16 warps; shared memory
// BLOCK_M*D*2 (0 when SPLIT > 1 and WARP_M * D <= 2048: Q_i from global memory) + STAGES*4*SPLIT*BLOCK_N*D
// <= 101376 B, and for SPLIT > 1 the merge buffer SPLIT*BLOCK_M*(8 + 4*(D+8)) too; threads / (D/8) a
// multiple of 8. Not asserted, check ptxas: spills (WARP_M=32 with BLOCK_N >= 128 at D=64 spills; so does
// MIN_BLOCKS above what the registers allow).
// Rejected: one ring per split group with named barriers — the same bytes in flight as one shared ring of
// kSplit * kBlockN keys, for more code.
//
// Run:  flashcore test v11 && flashcore bench v11 --shape 1,8,512,64 && flashcore bench v11 --shape 2,16,4096,64
//
// ptxas (nvcc 13.0, -O3 --use_fast_math -lineinfo; no static shared memory, 0 spill bytes, no stack frame):
//   kernel                                threads  dynamic smem  registers sm_90 | sm_89
//   v11_fwd<64, 128, 64, 32, 2, 1, 2>              128      49,152 B        240 | 232    (2 CTAs/SM)
//   v11_fwd<64, 32, 32, 16, 3, 4, 1>               256      98,304 B        140 | 133
//   v11_fwd<128, 128, 48, 32, 2, 1, 2>             128      81,920 B        255 | 254    (2 CTAs/SM)
//   v11_fwd<128, 32, 16, 16, 2, 4, 1>              256      70,656 B        184 | 177
//   v11_fwd_tma<64, 32, 64, 16, 3, 2, 1>           128      98,328 B        182 | 4      (sm_89: a trap stub)
//   v11_cluster_fwd<64, 64, 256, 4, 64, 16, 1>     512      96,240 B        109 | 4      (sm_89: a trap stub)
//   v11_cluster_fwd<128, 32, 128, 4, 32, 16, 1>    256      91,888 B        133 | 4
// SASS (sm_90, cuobjdump): HMMA.16816.F32, LDSM.16.M88.4 / LDSM.16.MT88.4, LDGSTS.E.BYPASS.128, CCTL.E.PF2
// (the L2 prefetch), LDG.E.CONSTANT (Q_i in the short kernels); no LDL / STL. TMA kernel: UTMALDG.3D (the
// stage copies), UTMAPF.L2.3D (the prefetch), SYNCS.ARRIVE.TRANS64 / SYNCS.PHASECHK.TRANS64.TRYWAIT (the
// stage mbarriers), FENCE.VIEW.ASYNC.S, and no LDGSTS. Cluster kernel: UCGABAR_ARV /
// UCGABAR_WAIT (twice), UBLKCP.S.S (the bulk pushes), SYNCS.ARRIVE.TRANS / SYNCS.PHASECHK.TRANS (the
// mbarrier), FENCE.VIEW.ASYNC.S, BAR.SYNC (the groups' named barriers), STG.E.128 (an inline st.global.v4:
// nvcc splits a uint4 built from packed halves into four STG.E); no MEMBAR.ALL.GPU.
// Measured on the lent GPU (an NVIDIA H200; `flashcore bench v11 --shape ...`, one run per shape beside SDPA's
// backends and Triton, L2 flushed before each call, median of 200 / 100 calls):
//   shape              v11                      SDPA default   SDPA flash (FA2)   target              met
//   1,8,512,64         9.3 us (TMA kernel)      12.0 us        15.6 us            <= 0.6x SDPA's time  no: 0.78x
//   1,8,512,64 causal  8.8 us                   12.2 us        16.0 us
//   2,16,4096,64       444.3 us, 309.3 TFLOP/s  458.4          294.5              >= FA2               yes: 1.05x
//     causal           236.5 us, 290.6 TFLOP/s  366.1          229.7              >= FA2               yes: 1.27x
//   2,16,4096,128      778.9 us, 352.9 TFLOP/s  645.5          332.7              >= FA2               yes: 1.06x
//     causal           413.3 us, 332.5 TFLOP/s  510.6          270.4              >= FA2               yes: 1.23x
// (The same session's four other runs at 1,8,512,64 gave 8.8-8.9 us against SDPA's 11.8-12.0: 0.73x-0.75x;
// causal 8.9-9.1 against 12.0-12.1. The long kernels' SASS has not changed since the runs before, which gave
// 1.03x-1.06x at D=128 non-causal in six runs. The cp.async short kernel: 9.4 us, 0.79x, same session. A later
// session, same SASS: five bench runs at 1,8,512,64 gave 8.8-9.2 us against SDPA's 11.7-12.4, 0.73x-0.77x.)
// Where the mission-shape time goes. An empty kernel measures 3.46-3.55 us in this timing, so the 0.6x target
// (7.0-7.2 us) leaves ~3.5 us for the kernel itself; the cp.async kernel takes ~6. A load-only model of the
// short kernel (outside the product: 128 CTAs, 16 per head, each walking its head's 128 KB of K, V in 32 KB
// stages, no math; event-timed as the bench; ns after the first CTA starts):
//   - the first stage lands after 1.09-1.25 us from DRAM (0.70-0.80 us when L2 is warm);
//   - the ring as it was (2 stages + L2 prefetch) lands its 4 stages at 1.25 / 1.82 / 2.37 / 2.91 us: 7.58 us
//     event time; 3 stages 6.82, all 4 at once (128 KB, more than the L4 allows) 6.85; without the L2
//     prefetch 8.54; with L2 warm 6.46;
//   - 64 CTAs (half the CTAs sharing each byte) take the same time as 128 (6.69 vs 6.85 all at once): an
//     SM takes in ~50-60 B per clock however many SMs read the line, so bytes per SM is what counts, and
//     v11's 32 rows x 512 keys per SM is ~132 KB; halving the keys per CTA (the cluster's 64 KB) gave 6.14;
//   - without sharing (every CTA its own bytes from DRAM) 11.0-11.8 us: the L2 sharing is what makes it fast.
// Per SM the math is also ~1 us at best: 1,024 HMMA.16816 (32 rows x 512 keys x 64 x 2 matmuls), 256 KB of
// ldmatrix (each K, V byte read by the two 16-row warps: 128 B/clk) and 16K exp2 (MUFU, 16/clk). The
// kernel's ~6 us is the first load (~1.2 us), the ring's refills and the 4 dependent tiles per warp that
// these do not fully hide, and the merge (~0.5 us, below). Earlier ncu of the 8 x 16 version
// (--clock-control none): 8.38 us of kernel, SM throughput 34.5%, tensor pipe 13.6%, DRAM 4.0%, L2 12.1%,
// achieved occupancy 23%. ncu of this version: 1,735 warp instructions per warp (128 of them HMMA) at 6.15 cycles
// each, 2.05 resident warps per scheduler and 0.45 eligible; stalls per issued instruction: fixed-latency
// dependency (wait) 1.50, MUFU / shared memory (short scoreboard) 0.83, MIO queue 0.64. It is latency-bound:
// each warp is one chain S -> max -> exp2 -> P V per tile and 2 warps per scheduler cannot cover it.
// What each part costs, by ablation (a harness outside the product that removes one part and times the
// rest like the bench, results wrong by design; medians of 300 calls, two runs):
//   empty kernel (128 x 256 threads) 3.42-3.62; one 16-byte Q load and O store per thread 4.61-4.80 (the
//   floor of any kernel here); v11 9.38-9.47; without S 8.64-8.80, without the softmax 8.80-8.96, without
//   P V 9.18-9.28; without any math (loads, barriers, merge) 6.91-7.39; without loads (math on stale shared
//   memory) 8.38; without the merge 8.86-8.99; without the Q_i load 9.02; neither loads nor math 5.82-5.98,
//   and also without the merge and Q_i 4.42-4.51.
// So the loads with no math at all already take 0.58-0.62x of SDPA's 11.8-12.1 us (its bench runs that
// day): the 0.6x target needs the math (~2.4 us now) almost wholly hidden under the loads, or fewer bytes
// per SM and a merge much cheaper than ~0.5 us. Tried and not kept, on the H200:
//   - S of the next tile issued before this tile's softmax (the ring then refills a tile later): 10.6 us
//     against 9.5 in one bench run; 10.6-10.7 in the harness with the softmax first instead;
//   - Q_i through cp.async into the last ring stage instead of global loads: 9.4 against 9.5 (noise);
//   - the cluster kernel as 4-rank clusters of 128-row x 128-key CTAs pushing their rows straight from
//     registers (st.async, no in-CTA merge): 13.3 us; its first S was done 1.2 us after K_0 landed, one
//     warp per scheduler.
// The cp.async kernel's timeline (a harness outside the product: per-warp %globaltimer stamps held in
// registers and written at exit, which inflates 9.4 to 10.4 us; medians over 1,024 warps x 20 runs, ns after
// the first warp starts): the prologue's loads are issued by 1,120-1,180 (an SM takes no more LDGSTS until
// data returns), tile 0 passes its barrier at 1,570, then S 480 ns (tile 2's refill is issued first),
// softmax 320-350, P V 225; tile 1 (with tile 3's refill) 960 ns, tiles 2 and 3 (no refill) 700 each; merge
// and store 550. L2 warm instead of flushed: the same within 0.1 us. So a 32-key tile costs ~700 ns, 1,400
// cycles, for 2 warps per scheduler with 32 HMMA and 18 MUFU each; measured on this GPU (clock64 loops)
// HMMA.16816.F32 issues every 6.2-7.0 cycles per scheduler (latency 25) and MUFU.EX2 every 8 (latency 18),
// so the tile runs at about half its issue bound. Also tried this session, none faster at 1,8,512,64 (one
// bench run each, v11 9.3-9.5 beside them): all four 128-key tiles in flight at once (5 stages, 160 KB) 9.2-9.5;
// 2 tiles of 64 keys 9.4; 32-row warps (halving ldmatrix traffic) 9.8-10.8; 16 warps 10.2-11.3; per-stage
// mbarriers instead of the per-tile __syncthreads (warps out of lockstep) 9.9-10.4; the refill issued after
// S, the softmax or P V 9.5-9.6 (at D=128, where every tile refills, after S gave 14.4 against 15.1 us);
// ex2.approx.f16x2 is two MUFU.EX2.F16 on sm_90, no saving. TMA took the refills off the warps: 9.1-9.2 with
// the same tiles, 8.3-8.7 with wider ones that need 128-192 KB (more than the L4's 99 KB, not used), 9.0-9.2
// with SHORT_TMA_D64's, which fit; and at 1,4,2048,64 (short regime, 16 tiles) 23.5 against 36.3 us.
// The TMA kernel's timeline before its loop was pipelined (the same stamps; 9.0 us -> 10.4 in the harness;
// medians over 512 warps x 20 runs, ns): prologue issued 450, tile 0 landed 1,540 (990 with L2 warm, and the
// event time moved with it, 10.37 -> 9.79: here the first tile's DRAM trip is on the path), then per 64-key
// tile S 290, softmax 350, P V 260 (tile 0: 930; tiles 1-3: 830-860 each, ~100 between them), merge and
// store 480. ncu of that kernel: 2,011 instructions per warp at 6.4 cycles each; stalls per issued
// instruction: fixed-latency dependency (wait) 2.00, short scoreboard 0.91, long scoreboard 0.81 (the
// first tile, Q_i), no instruction 0.35, branch 0.24, barrier 0.21. One warp per scheduler, so every
// dependency shows. Pipelining S (predicted -0.5 us) measured 8.8-9.0 against 9.0-9.2 for the loop before
// (four bench runs side by side); at 1,4,2048,64 23.3 against 23.7. Tried beside it and not kept (one or two
// bench runs each, the old loop at 9.0-9.1): the prologue's TMA issued before the CTA barrier plus
// prefetch.tensormap 9.0; no per-tile barrier where no refill follows 8.8-9.0 (22.8 at 2,048: folded into
// the pipelined loop); with the pipelined loop, 8 warps (4 groups x 32 keys) 9.1-9.2, 32-row warps 9.4-9.5,
// 96-key tiles in 2 stages 9.5-9.6, 16-row CTAs two per SM (each 96 KB) 9.0-9.3 (causal 8.5-8.9 against 9.0:
// finer skipping of masked tiles; the target shape is not causal, so not taken).
// The floor, measured (scripts/floor_v11.py: kernels with this partition that skip part of the work, timed
// in one process by the bench's own time_callable; H200, three runs): SDPA 11.74-11.78 us, v11 8.74-8.78
// (0.74x-0.75x), an empty kernel 3.42-3.49 (0.29x); the K/V loads (128 KB per CTA, all at once) with Q_i, the
// merge and the store 5.52-5.57 (0.47x); those plus this kernel's mma.sync work with P = fp16(S) and no
// softmax at all 7.30 (0.62x), 7.26 with nothing ordering the HMMAs, 7.17 (0.61x) over two stages of 256
// keys, the best of the schedules tried (outside the repo, beside 7.26 for four stages: K and V on separate
// barriers 7.30-7.33, 8 stages 7.58, 8 warps 7.55, 32-row warps 7.68-7.71); the same math with no K or V to
// wait for 6.27 (0.53x). So the loads and the tensor work alone, with more shared memory than the L4 allows,
// already sit above the 0.6x target (7.05 us); v11 adds ~1.5 us of softmax to that. The load-only models and
// the timelines above come from harnesses that test a __device__ pointer at entry (the ablations do not): one
// DRAM round trip after the flush, so their absolute times read ~0.7 us high (the same floor kernels with the
// test compiled out: loads only 6.37-6.42 -> 5.76-5.79 us, with the HMMA work 8.10-8.13 -> 7.36-7.39);
// comparisons within a harness stand.
#include "flashcore.h"
#include "mbarrier.cuh"
#include "mma_sm80.cuh"
#include "primitives.cuh"
#include "tma.cuh"

#include <cstdint>
#include <type_traits>

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
#define V11_SHORT_D64_STAGES 3
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
#ifndef V11_TMA
#define V11_TMA 1  // sm_90: the short D=64 kernel loads K, V by TMA (0: cp.async everywhere)
#endif
#ifndef V11_SHORT_TMA_D64_BLOCK_M
#define V11_SHORT_TMA_D64_BLOCK_M 32
#endif
#ifndef V11_SHORT_TMA_D64_BLOCK_N
#define V11_SHORT_TMA_D64_BLOCK_N 64
#endif
#ifndef V11_SHORT_TMA_D64_WARP_M
#define V11_SHORT_TMA_D64_WARP_M 16
#endif
#ifndef V11_SHORT_TMA_D64_STAGES
#define V11_SHORT_TMA_D64_STAGES 3
#endif
#ifndef V11_SHORT_TMA_D64_MIN_BLOCKS
#define V11_SHORT_TMA_D64_MIN_BLOCKS 1
#endif
#ifndef V11_SHORT_TMA_D64_SPLIT
#define V11_SHORT_TMA_D64_SPLIT 2
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
#define V11_CLUSTER_D64_CHUNK_N 256
#endif
#ifndef V11_CLUSTER_D64_SPLIT
#define V11_CLUSTER_D64_SPLIT 4
#endif
#ifndef V11_CLUSTER_D64_BLOCK_N
#define V11_CLUSTER_D64_BLOCK_N 64
#endif
#ifndef V11_CLUSTER_D64_WARP_M
#define V11_CLUSTER_D64_WARP_M 16
#endif
#ifndef V11_CLUSTER_D64_MIN_BLOCKS
#define V11_CLUSTER_D64_MIN_BLOCKS 1
#endif
#ifndef V11_CLUSTER_D128_BLOCK_M
#define V11_CLUSTER_D128_BLOCK_M 32
#endif
#ifndef V11_CLUSTER_D128_CHUNK_N
#define V11_CLUSTER_D128_CHUNK_N 128
#endif
#ifndef V11_CLUSTER_D128_SPLIT
#define V11_CLUSTER_D128_SPLIT 4
#endif
#ifndef V11_CLUSTER_D128_BLOCK_N
#define V11_CLUSTER_D128_BLOCK_N 32
#endif
#ifndef V11_CLUSTER_D128_WARP_M
#define V11_CLUSTER_D128_WARP_M 16
#endif
#ifndef V11_CLUSTER_D128_MIN_BLOCKS
#define V11_CLUSTER_D128_MIN_BLOCKS 1
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

  // A split CTA (no Q_i staging in its epilogue) with Q_i in registers loads Q_i straight from global
  // memory, and its shared-memory bytes go to the ring instead (three 128-key stages fit 99 KB at D=64).
  static constexpr bool kQFromGlobal = kSplit > 1 && kQInRegs;
  static constexpr int kQBytes = kQFromGlobal ? 0 : kBlockM * kRowBytes;
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
// sm_90's short D=64 kernel (v11_fwd_tma): K and V arrive by TMA, so a wider, shallower tiling pays off.
using ShortTmaD64 = V11Config<64, V11_SHORT_TMA_D64_BLOCK_M, V11_SHORT_TMA_D64_BLOCK_N, V11_SHORT_TMA_D64_WARP_M,
                              V11_SHORT_TMA_D64_STAGES, V11_SHORT_TMA_D64_SPLIT, V11_SHORT_TMA_D64_MIN_BLOCKS>;

// Shared memory of a TMA kernel: the ring and merge bytes, then one mbarrier per stage.
template <class Cfg>
constexpr int tma_smem_bytes() {
  return Cfg::kSmemBytes + 8 * Cfg::kStages;
}
// What the TMA path relies on: 128-byte rows (one box row is one swizzle row), Q_i in registers (the ring
// starts at offset 0, every stage and its V half on 1024-byte boundaries), a box of at most 256 rows.
static_assert(ShortTmaD64::kHeadDim == 64 && ShortTmaD64::kQFromGlobal && ShortTmaD64::kTileN <= 256 &&
                  ShortTmaD64::kKvBytes % 1024 == 0,
              "SHORT_TMA_D64: D = 64, SPLIT > 1 with Q_i in registers, SPLIT * BLOCK_N <= 256 keys");
static_assert(tma_smem_bytes<ShortTmaD64>() <= kMaxSmemBytes, "SHORT_TMA_D64: at most 99 KB per block");

// The cluster split-K configuration (sm_90, short sequences). The ceil(S / kChunkN) CTAs of one query tile
// form a cluster along the keys: rank r takes keys [r, r + 1) * kChunkN, and inside the CTA kSplit groups
// of warps take consecutive kGroupN = kChunkN / kSplit of them, each group loading its own keys at once
// (no ring) and walking them in tiles of kBlockN. Q_i goes straight from global memory into registers.
// The members the shared device helpers read (kBlockN, kMTiles, kNTiles, kQInRegs, ...) mean what they
// mean in V11Config. Shared-memory layout (byte offsets):
//   main loop  group g's K, V [g * kGroupBytes, + kGroupBytes)    K [kGroupN][D] then V, fp16, swizzled
//   merge      stats          [0, kStatsBytes)                    [kSplit][kBlockM] float2 (m_i scale log2 e, l_i)
//   (reuses    O parts        [kStatsBytes, kPartsEnd)            [kSplit][kBlockM][kOStride] fp32; after
//    the loop)                                                    the in-CTA merge group 0's rows hold the
//                                                                 CTA's partial, (m, l) in columns D, D + 1
//   receive    [kPartsEnd, kBarOffset)   n slots of ceil(kBlockM / n) rows of kOStride fp32: slot s is what
//                                        rank s pushed for this rank's rows (never overlaps the loop bytes:
//                                        a fast peer may push while this CTA still computes)
//   barrier    [kBarOffset, + 8)         the mbarrier those pushes complete on
template <int kHeadDim_, int kBlockM_, int kChunkN_, int kSplit_, int kBlockN_, int kWarpM_, int kMinBlocks_>
struct V11ClusterConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // Br: query rows per CTA (and per cluster)
  static constexpr int kChunkN = kChunkN_;  // keys per CTA: the cluster's rank r takes keys [r, r + 1) * kChunkN
  static constexpr int kSplit = kSplit_;    // key groups per CTA
  static constexpr int kBlockN = kBlockN_;  // Bc: keys per warp per tile (one cp.async group each for K, V)
  static constexpr int kWarpM = kWarpM_;    // query rows per warp
  static constexpr int kMaxCluster = V11_CLUSTER_MAX;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__ min CTAs/SM

  static constexpr int kMTiles = kWarpM / 16;
  static constexpr int kNTiles = kBlockN / 8;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKChunks = kHeadDim / 16;
  static constexpr int kGroupN = kChunkN / kSplit;  // keys per group
  static constexpr int kTiles = kGroupN / kBlockN;  // tiles per warp
  static constexpr int kRowWarps = kBlockM / kWarpM;
  static constexpr int kWarps = kRowWarps * kSplit;
  static constexpr int kThreads = kWarps * fc::kWarpSize;
  static constexpr int kGroupThreads = kRowWarps * fc::kWarpSize;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr bool kQInRegs = true;  // loaded from global memory, never staged in shared memory

  static constexpr int kKvBytes = kGroupN * kRowBytes;
  static constexpr int kGroupBytes = 2 * kKvBytes;
  static constexpr int kLoopBytes = kSplit * kGroupBytes;
  static constexpr int kOStride = kHeadDim + 8;  // as V11Config; columns D, D + 1 carry a row's (m, l)
  static constexpr int kRowPartBytes = kOStride * 4;
  static constexpr int kStatsBytes = (kSplit * kBlockM * 8 + 127) / 128 * 128;
  static constexpr int kPartsBytes = kStatsBytes + kSplit * kBlockM * kRowPartBytes;
  static constexpr int kPartsEnd = kLoopBytes > kPartsBytes ? kLoopBytes : kPartsBytes;
  // receive slots: n * ceil(kBlockM / n) <= kBlockM + n - 1 rows
  static constexpr int kBarOffset = kPartsEnd + (kBlockM + kMaxCluster - 1) * kRowPartBytes;
  static constexpr int kSmemBytes = kBarOffset + 16;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarpM == 16 || kWarpM == 32, "CLUSTER WARP_M: 16 or 32 query rows per warp");
  static_assert(kMTiles * kHeadDim <= 128, "CLUSTER WARP_M x D: Q_i's fragments must fit the registers");
  static_assert(kBlockM % kWarpM == 0 && kBlockM >= kWarpM, "CLUSTER BLOCK_M: a multiple of WARP_M");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "CLUSTER BLOCK_N: a multiple of 16 in 16..128");
  static_assert(kSplit >= 1 && kSplit <= 15, "CLUSTER SPLIT: 1..15 groups (one named barrier each)");
  static_assert(kChunkN % (kSplit * kBlockN) == 0, "CLUSTER CHUNK_N: a multiple of SPLIT * BLOCK_N");
  static_assert(2 * kTiles <= 16, "CLUSTER CHUNK_N / (SPLIT * BLOCK_N): at most 8 tiles (cp_async_wait_n's range)");
  static_assert(kMaxCluster >= 1 && kMaxCluster <= 8, "CLUSTER_MAX: 1..8 CTAs (the portable cluster size)");
  static_assert(kWarps <= kMaxWarps, "CLUSTER (BLOCK_M / WARP_M) * SPLIT: at most 16 warps per CTA");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory: at most 99 KB per block (the L4's limit)");
};

using ClusterD64 = V11ClusterConfig<64, V11_CLUSTER_D64_BLOCK_M, V11_CLUSTER_D64_CHUNK_N, V11_CLUSTER_D64_SPLIT,
                                    V11_CLUSTER_D64_BLOCK_N, V11_CLUSTER_D64_WARP_M, V11_CLUSTER_D64_MIN_BLOCKS>;
using ClusterD128 = V11ClusterConfig<128, V11_CLUSTER_D128_BLOCK_M, V11_CLUSTER_D128_CHUNK_N, V11_CLUSTER_D128_SPLIT,
                                     V11_CLUSTER_D128_BLOCK_N, V11_CLUSTER_D128_WARP_M, V11_CLUSTER_D128_MIN_BLOCKS>;

// The copy geometry copy_rows_async needs when a subset of the CTA's threads copies a tile.
template <int kHeadDim_, int kThreads_>
struct CopyShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kRowBytes = kHeadDim * 2;
};

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
  if constexpr (kRowsPerPass % 8 != 0) {
    // Fewer than 8 rows per pass (a 64-thread copy group at D=128): the XOR changes from pass to pass.
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      unsigned char* s = tile + fc::swizzle(row, chunk, Cfg::kRowBytes);
      if ((kRows * Cfg::kChunks) % Cfg::kThreads == 0 || row < kRows) {
        if (first_row + row < valid_rows) {
          fc::cp_async_16(s, g + pass * kRowsPerPass * Cfg::kHeadDim, true);
        } else {
          *reinterpret_cast<uint4*>(s) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    return;
  }
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

// The same fragments straight from global memory (the cluster kernel never stages Q_i in shared memory):
// lane (g, t) of an m16 tile holds rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9 of each k16
// step, four 4-byte loads per step. Rows at or past seq_len read as zeros.
template <class Cfg>
__device__ __forceinline__ void load_q_fragments_global(QFragments<Cfg>& q_frag, const __half* q, int row0,
                                                        int seq_len, int lane) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + mt * 16 + (lane >> 2) + 8 * h;
      const uint32_t* src =
          reinterpret_cast<const uint32_t*>(q + static_cast<size_t>(row) * Cfg::kHeadDim) + (lane & 3);
#pragma unroll
      for (int kc = 0; kc < Cfg::kKChunks; ++kc) {
        q_frag[mt][kc][h] = row < seq_len ? __ldg(src + kc * 8) : 0u;
        q_frag[mt][kc][2 + h] = row < seq_len ? __ldg(src + kc * 8 + 4) : 0u;
      }
    }
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

// The split kernels' partials: each warp's unnormalised (m_i, l_i, O_i) rows into shared memory, row
// `group * kBlockM + r` of stats ([kSplit][kBlockM] float2: m_i * scale log2 e, l_i) and of o_part
// ([kSplit][kBlockM][kOStride] fp32).
template <class Cfg>
__device__ __forceinline__ void store_partials(float2* stats, float* o_part,
                                               const float (&o)[Cfg::kMTiles][Cfg::kDTiles][4],
                                               const float (&m_i)[Cfg::kMTiles][2], const float (&l_i)[Cfg::kMTiles][2],
                                               int group, int row_warp, float scale_log2, int lane) {
  const int g = lane >> 2;
  const int tq = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = group * Cfg::kBlockM + row_warp * Cfg::kWarpM + mt * 16 + g + 8 * h;
      if (tq == 0) stats[row] = make_float2(m_i[mt][h] * scale_log2, l_i[mt][h]);
#pragma unroll
      for (int d = 0; d < Cfg::kDTiles; ++d) {
        *reinterpret_cast<float2*>(o_part + row * Cfg::kOStride + 8 * d + 2 * tq) =
            make_float2(o[mt][d][2 * h], o[mt][d][2 * h + 1]);
      }
    }
}

// Columns 8c .. 8c + 7 of one row merged over kParts partials, part p present when p < n: stat(p) gives its
// (m, l) with m in log2 units, row(p) its unnormalised O row. Returns m = max_p m_p (-inf when no part saw
// a key) and leaves l = sum_p exp2(m_p - m) l_p and acc = sum_p exp2(m_p - m) O_p; with m = -inf every
// weight is 0, not NaN.
template <int kParts, class Stat, class Row>
__device__ __forceinline__ float merge_parts(int n, Stat stat, Row row, int c, float& l_all, float (&acc)[8]) {
  float m_all = -INFINITY;
#pragma unroll
  for (int sp = 0; sp < kParts; ++sp)
    if (sp < n) m_all = fmaxf(m_all, stat(sp).x);
  const float m_ref = m_all == -INFINITY ? 0.f : m_all;
  l_all = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
#pragma unroll
  for (int sp = 0; sp < kParts; ++sp) {
    if (sp < n) {
      const float2 st = stat(sp);
      const float w = exp2f(st.x - m_ref);
      l_all += w * st.y;
      const float4* part = reinterpret_cast<const float4*>(row(sp) + c * 8);
      const float4 lo = part[0];
      const float4 hi = part[1];
      acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
      acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
    }
  }
  return m_all;
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

// The cluster barrier in two halves; every thread of every CTA takes part, and the two alternate. The
// arrive is relaxed: a release arrive compiles to MEMBAR.ALL.GPU, a wait for all of the thread's memory
// traffic. What the peers must see is published otherwise: the mbarrier's initialisation by
// fence.mbarrier_init, the pushed partials by the mbarrier's transaction count. (Changed together with
// issuing Q_i's loads first: the kernel went from 12.2 to 10.8 us at 1,8,512,64, and S = Q K_0^T from
// 4.1 to 3.5 us after the start.)
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of `smem_address` (a shared::cta address of this CTA) in CTA `rank`.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t smem_address, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_address), "r"(rank));
  return r;
}

// One thread: an mbarrier that completes once `bytes` of bulk copies have landed in this CTA, made visible
// to the cluster (peers' copies count down on it).
__device__ __forceinline__ void mbarrier_init_expect_bytes(uint64_t* bar, uint32_t bytes) {
  fc::mbarrier_init(bar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  fc::mbarrier_arrive_expect_bytes(bar, bytes);
}

// `bytes` (a multiple of 16) from this CTA's shared memory at src into a peer's at dst, as one bulk copy
// that counts down the peer's mbarrier at bar (dst and bar: shared::cluster addresses from map_to_rank).
__device__ __forceinline__ void push_bulk(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "r"(src), "r"(bytes), "r"(bar)
               : "memory");
}

#endif

// Grid order, measured at 2,16,4096 on the lent H200: at D=64 non-causal, x = query tile and y = batch * heads
// (every query tile of a few heads per wave) ran 438 us (314 TFLOP/s) against 458 us (300) with batch * heads
// on x; at D=128 the same change went the other way, 820 -> 837 us. (Predicted +3% at D=128 from L2: the
// CTAs of a head walk K/V in lockstep either order, so the working set is a window, not all 64 MB of K/V.)
// So query tile first only for D=64 non-causal. Causal keeps x = batch * heads, y = query tile reversed:
// a wave holds the same heavy tile of many heads and the last wave is made of light tiles.
__host__ __device__ constexpr bool query_tile_fastest(bool causal, int head_dim) { return !causal && head_dim == 64; }
// The in-CTA kernels' body. kTma (v11_fwd_tma, sm_90): K and V arrive by TMA through the tensor maps,
// issued by thread 0 and counted on one mbarrier per stage, instead of 16-byte cp.async from every thread;
// all kStages stages are loaded up front, and the loop computes S of tile t + 1 in the same basic block as
// tile t's softmax and P V, so the scheduler can interleave the two (one warp per scheduler has little else
// to hide latency with).
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks, bool kTma>
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
  const int head = tile_fastest ? blockIdx.y : blockIdx.x;  // b * H + h: the tensor maps' third coordinate
  auto load_tile = [&](int tile, int stage) {
    unsigned char* k_s = k_stage(stage);
    if constexpr (kTma) {
      // One thread; rows past kv_end but before seq_len arrive too (the masks hide them), rows past seq_len
      // arrive as zeros.
      if (tid == 0) {
        fc::mbarrier_arrive_expect_bytes(&stage_full[stage], Cfg::kStageBytes);
        fc::tma_load_3d(k_s, tmap_k, 0, tile * Cfg::kTileN, head, &stage_full[stage]);
        fc::tma_load_3d(k_s + Cfg::kKvBytes, tmap_v, 0, tile * Cfg::kTileN, head, &stage_full[stage]);
      }
      return;
    }
    copy_rows_async<Cfg, Cfg::kTileN>(k_s, k, tile * Cfg::kTileN, kv_end, tid);
    copy_rows_async<Cfg, Cfg::kTileN>(k_s + Cfg::kKvBytes, v, tile * Cfg::kTileN, kv_end, tid);
  };

  // Q_i straight into registers when it never touches shared memory: issued first, it is needed first.
  QFragments<Cfg> q_frag;
  if constexpr (Cfg::kQFromGlobal) load_q_fragments_global<Cfg>(q_frag, q, m0 + row_warp * kWarpM, seq_len, lane);

  // Prologue: Q_i and the first kStages - 1 tiles in flight at once (Q_i rides in tile 0's group); by TMA
  // all kStages (its loop refills a stage only after every warp is done with it, not a tile ahead).
  if constexpr (!Cfg::kQFromGlobal) copy_rows_async<Cfg, kBlockM>(q_s, q, m0, seq_len, tid);
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
  if constexpr (kTma) {
    // The same L2 prefetch as below, a tile at a time: CTA i of the head takes tiles i, i + tiles, ...
    if (tid == 0) {
      for (int tile = kPrologueTiles + tile_index; tile < n_tiles; tile += tiles) {
        fc::tma_prefetch_3d(tmap_k, 0, tile * Cfg::kTileN, head);
        fc::tma_prefetch_3d(tmap_v, 0, tile * Cfg::kTileN, head);
      }
    }
  } else if constexpr (kSplit > 1) {
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

  using Scores = float[Cfg::kMTiles][Cfg::kNTiles][4];
  // This warp's keys in tile t, key0(t) .. key0(t) + kBlockN - 1, and its ldmatrix rows of K and V in a stage.
  auto key0_of = [&](int t) { return t * Cfg::kTileN + group * kBlockN; };
  auto k_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage)) + (group * kBlockN + k_row) * Cfg::kRowBytes;
  };
  auto v_lane_of = [&](int stage) {
    return fc::smem_addr(k_stage(stage) + Cfg::kKvBytes) + (group * kBlockN + a_row) * Cfg::kRowBytes;
  };
  // Only tiles crossing the diagonal or the sequence end carry invisible keys.
  auto mask_edge = [&](Scores& s, int key0) {
    if (key0 + kBlockN > seq_len || (p.causal && key0 + kBlockN - 1 > warp_row0)) {
      mask_scores<Cfg>(s, warp_row0, key0, seq_len, p.causal, lane);
    }
  };
  // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O, then O = O + P V_j.
  auto softmax_pv = [&](Scores& s, int stage) {
    online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
    accumulate_pv<Cfg>(s, o_acc, v_lane_of(stage), lane);
  };

  if constexpr (kTma) {
    // S of the next tile is computed before this tile's softmax and P V, all in one basic block: the tile's
    // mask comes first, and the branches that decide whether a next tile exists wrap the whole block.
    auto visible = [&](int t) { return t < n_tiles && key0_of(t) < warp_kv_end; };
    auto wait_tile = [&](int t) { fc::mbarrier_wait_parity(&stage_full[t % kStages], (t / kStages) & 1); };
    Scores s, s_next;
    if (visible(0)) {
      wait_tile(0);
      warp_scores<Cfg>(s, q_frag, q_lane, k_lane_of(0), lane);
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
      if (!visible(t)) continue;  // not break: later iterations may still hold a barrier
      mask_edge(s, key0_of(t));
      if (visible(t + 1)) {
        wait_tile(t + 1);
        warp_scores<Cfg>(s_next, q_frag, q_lane, k_lane_of((t + 1) % kStages), lane);
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
  } else {
    int compute_stage = 0;
    int load_stage = kStages - 1;
    for (int t = 0; t < n_tiles; ++t) {
      fc::cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
      __syncthreads();                   // everyone's have, and every warp is done with tile t - 1's stage
      if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, load_stage);
      fc::cp_async_commit();  // an empty group at the tail keeps the wait count uniform
      load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;

      if constexpr (Cfg::kQInRegs && !Cfg::kQFromGlobal) {
        if (t == 0) load_q_fragments<Cfg>(q_frag, q_lane, lane);
      }

      const int key0 = key0_of(t);
      if (key0 < warp_kv_end) {
        // S = Q_i K_j^T
        Scores s;
        warp_scores<Cfg>(s, q_frag, q_lane, k_lane_of(compute_stage), lane);
        mask_edge(s, key0);
        softmax_pv(s, compute_stage);
      }
      compute_stage = compute_stage + 1 == kStages ? 0 : compute_stage + 1;
    }
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
    // (TMA: every tile loaded was waited on by some warp, since group 0 of the last row warp with rows
    // before seq_len sees every key below kv_end, so no copy is still landing past this barrier.)
    if constexpr (!kTma) fc::cp_async_wait<0>();
    __syncthreads();  // every warp has left the loop: the ring's bytes are free for the merge
    float2* stats = reinterpret_cast<float2*>(smem);                       // [kSplit][kBlockM]
    float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);    // [kSplit][kBlockM][kOStride]
    store_partials<Cfg>(stats, o_part, o_acc, m_i, l_i, group, row_warp, scale_log2, lane);
    __syncthreads();
    constexpr int kBlockChunks = kBlockM * Cfg::kChunks;
    for (int i = tid; i < kBlockChunks; i += Cfg::kThreads) {
      const int r = i / Cfg::kChunks;
      const int c = i % Cfg::kChunks;
      if (m0 + r >= seq_len) continue;
      float l_all;
      float acc[8];
      merge_parts<kSplit>(
          kSplit, [&](int sg) { return stats[sg * kBlockM + r]; },
          [&](int sg) { return o_part + (sg * kBlockM + r) * Cfg::kOStride; }, c, l_all, acc);
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

template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks) v11_fwd(FlashcoreParams p) {
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, false>(p, nullptr, nullptr);
}

// sm_90's short D=64 kernel: the tensor maps are kernel parameters (__grid_constant__: TMA reads them
// where they are). Built for an older GPU its body traps; the launcher never picks it there.
template <int kHeadDim, int kBlockM, int kBlockN, int kWarpM, int kStages, int kSplit, int kMinBlocks>
__global__ void __launch_bounds__(V11Config<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks>::kThreads,
                                  kMinBlocks)
    v11_fwd_tma(FlashcoreParams p, const __grid_constant__ CUtensorMap tmap_k,
                const __grid_constant__ CUtensorMap tmap_v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  v11_forward<kHeadDim, kBlockM, kBlockN, kWarpM, kStages, kSplit, kMinBlocks, true>(p, &tmap_k, &tmap_v);
#else
  __trap();
#endif
}

// Cluster split-K (sm_90, short sequences). Grid: x = key chunk (the cluster axis: gridDim.x = cluster size
// = ceil(S / kChunkN), so rank = blockIdx.x), y = query tile, z = batch * heads. Each group of warps loads
// its kGroupN keys' K and V at once and runs FA2 over them with Q_i in registers; the groups merge inside
// the CTA through shared memory; then each rank pushes the rows other ranks own to them with one bulk
// copy per peer (distributed shared memory, counted on the owner's mbarrier), and each owner merges its
// rows and writes them with 16-byte stores.
template <int kHeadDim, int kBlockM, int kChunkN, int kSplit, int kBlockN, int kWarpM, int kMinBlocks>
__global__ void __launch_bounds__(
    V11ClusterConfig<kHeadDim, kBlockM, kChunkN, kSplit, kBlockN, kWarpM, kMinBlocks>::kThreads,
    kMinBlocks) v11_cluster_fwd(FlashcoreParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = V11ClusterConfig<kHeadDim, kBlockM, kChunkN, kSplit, kBlockN, kWarpM, kMinBlocks>;
  using GroupCopy = CopyShape<kHeadDim, Cfg::kGroupThreads>;
  extern __shared__ __align__(1024) unsigned char smem[];  // the alignment every kernel here declares

  const int tid = threadIdx.x;
  const int lane = tid % fc::kWarpSize;
  const int warp = tid / fc::kWarpSize;
  const int group = warp / Cfg::kRowWarps;     // which kGroupN keys of the chunk this warp takes
  const int row_warp = warp % Cfg::kRowWarps;  // which kWarpM rows of Q_i this warp owns
  const int group_tid = tid % Cfg::kGroupThreads;
  const int rank = static_cast<int>(cluster_rank());
  const int n_ranks = static_cast<int>(cluster_size());
  const int seq_len = p.seq_len;
  const int m_block = p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int m0 = m_block * kBlockM;
  const size_t base = static_cast<size_t>(blockIdx.z) * seq_len * kHeadDim;
  const __half* __restrict__ q = p.q + base;  // [S, D] of this (b, h)
  const __half* __restrict__ k = p.k + base;  // [S, D]
  const __half* __restrict__ v = p.v + base;  // [S, D]
  __half* __restrict__ o = p.o + base;        // [S, D]

  // Rank r owns rows [r, r + 1) * rows_per_rank of the tile for the cluster merge; the last may own fewer.
  const int rows_per_rank = fc::ceil_div(kBlockM, n_ranks);
  auto rows_of = [&](int r) { return max(0, min(rows_per_rank, kBlockM - r * rows_per_rank)); };
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Cfg::kBarOffset);
  if (tid == 0) mbarrier_init_expect_bytes(bar, (n_ranks - 1) * rows_of(rank) * Cfg::kRowPartBytes);

  // Q_i first (the first thing every warp needs), straight into registers.
  const int warp_row0 = m0 + row_warp * kWarpM;
  QFragments<Cfg> q_frag;
  load_q_fragments_global<Cfg>(q_frag, q, warp_row0, seq_len, lane);

  // This group's keys [g0, g1): its share of the chunk, cut at the sequence end and (causal) past the
  // tile's last row. Prologue: all of them at once, one cp.async group per tile and operand in the order
  // they are consumed ({K_0}, {V_0}, {K_1}, ...); rows past g1 in the last tile are zeroed (a NaN pattern
  // in V would survive P = 0), tiles wholly past it are neither loaded nor read.
  const int kv_end = p.causal ? min(seq_len, m0 + kBlockM) : seq_len;
  const int g0 = rank * kChunkN + group * Cfg::kGroupN;
  const int g1 = min(g0 + Cfg::kGroupN, kv_end);
  unsigned char* k_s = smem + group * Cfg::kGroupBytes;  // [kGroupN][D]
  unsigned char* v_s = k_s + Cfg::kKvBytes;              // [kGroupN][D]
#pragma unroll
  for (int t = 0; t < Cfg::kTiles; ++t) {
    const bool loaded = g0 + t * kBlockN < g1;
    const int row0 = g0 + t * kBlockN;
    if (loaded) copy_rows_async<GroupCopy, kBlockN>(k_s + t * kBlockN * Cfg::kRowBytes, k, row0, g1, group_tid);
    fc::cp_async_commit();
    if (loaded) copy_rows_async<GroupCopy, kBlockN>(v_s + t * kBlockN * Cfg::kRowBytes, v, row0, g1, group_tid);
    fc::cp_async_commit();
  }
  cluster_arrive_relaxed();  // (1) this CTA's mbarrier is initialised; waited for just before the pushes

  const int warp_kv_end = warp_row0 >= seq_len ? 0 : p.causal ? min(seq_len, warp_row0 + kWarpM) : seq_len;
  const int warp_key_end = min(g1, warp_kv_end);  // this warp's keys: [g0, warp_key_end)
  const float scale_log2 = p.scale * kLog2e;
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;

  float o_acc[Cfg::kMTiles][Cfg::kDTiles][4];
  float m_i[Cfg::kMTiles][2];
  float l_i[Cfg::kMTiles][2];
  init_rows<Cfg>(o_acc, m_i, l_i);

  // A group's warps meet at their own named barrier (1 + group): groups never wait for each other's bytes.
  auto group_sync = [&] {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "r"(Cfg::kGroupThreads) : "memory");
  };
#pragma unroll
  for (int t = 0; t < Cfg::kTiles; ++t) {
    cp_async_wait_n(2 * (Cfg::kTiles - t) - 1);  // this thread's copies of K_t have landed
    group_sync();                                 // the group's have
    const int key0 = g0 + t * kBlockN;  // this tile's keys: key0 .. key0 + kBlockN - 1
    const bool active = key0 < warp_key_end;
    float s[Cfg::kMTiles][Cfg::kNTiles][4];
    if (active) {
      // S = Q_i K_t^T
      warp_scores<Cfg>(s, q_frag, 0u, fc::smem_addr(k_s) + (t * kBlockN + k_row) * Cfg::kRowBytes, lane);
      if (key0 + kBlockN > seq_len || (p.causal && key0 + kBlockN - 1 > warp_row0)) {
        mask_scores<Cfg>(s, warp_row0, key0, seq_len, p.causal, lane);
      }
      // P = exp(S * scale - m_new), O = diag(exp(m_i - m_new)) O
      online_softmax<Cfg>(s, o_acc, m_i, l_i, scale_log2);
    }
    cp_async_wait_n(2 * (Cfg::kTiles - t) - 2);  // V_t has landed
    group_sync();
    if (active) {
      // O = O + P V_t
      accumulate_pv<Cfg>(s, o_acc, fc::smem_addr(v_s) + (t * kBlockN + a_row) * Cfg::kRowBytes, lane);
    }
  }
  sum_row_quads<Cfg>(l_i);

  // In-CTA merge: every group's (m_i, l_i, O_i) rows into shared memory (the K, V bytes are free once every
  // group has left its loop), then one thread per (row, 8 columns) combines the groups into group 0's rows,
  // unnormalised, with the row's (m, l) in columns D, D + 1: m = max_g m_g, l = sum_g exp2(m_g - m) l_g,
  // O = sum_g exp2(m_g - m) O_g. A row no group saw keeps m = -inf (weight 0 in the cluster merge).
  __syncthreads();
  float2* stats = reinterpret_cast<float2*>(smem);                     // [kSplit][kBlockM]
  float* o_part = reinterpret_cast<float*>(smem + Cfg::kStatsBytes);  // [kSplit][kBlockM][kOStride]
  store_partials<Cfg>(stats, o_part, o_acc, m_i, l_i, group, row_warp, scale_log2, lane);
  __syncthreads();
  for (int i = tid; i < kBlockM * Cfg::kChunks; i += Cfg::kThreads) {
    const int r = i / Cfg::kChunks;
    const int c = i % Cfg::kChunks;
    float l_all;
    float acc[8];
    const float m_all = merge_parts<kSplit>(
        kSplit, [&](int sg) { return stats[sg * kBlockM + r]; },
        [&](int sg) { return o_part + (sg * kBlockM + r) * Cfg::kOStride; }, c, l_all, acc);
    float4* merged = reinterpret_cast<float4*>(o_part + r * Cfg::kOStride + c * 8);
    merged[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    merged[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    if (c == 0) *reinterpret_cast<float2*>(o_part + r * Cfg::kOStride + kHeadDim) = make_float2(m_all, l_all);
  }

  // Cluster merge: push each peer the rows it owns (contiguous in group 0's slot: one bulk copy), into
  // receive slot [this rank] of its shared memory, counted down on its mbarrier.
  fc::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t recv = fc::smem_addr(smem + Cfg::kPartsEnd);
  cluster_wait();  // (1): every peer's mbarrier is initialised
  if (tid < n_ranks && tid != rank && rows_of(tid) > 0) {
    push_bulk(map_to_rank(recv + rank * rows_per_rank * Cfg::kRowPartBytes, tid),
              fc::smem_addr(o_part + tid * rows_per_rank * Cfg::kOStride), rows_of(tid) * Cfg::kRowPartBytes,
              map_to_rank(fc::smem_addr(bar), tid));
  }
  fc::mbarrier_wait_parity(bar, 0);  // every peer's rows for this rank have landed
  cluster_arrive_relaxed();          // (2) and so their sources are read: the peers may exit

  // m = max_r m_r, l = sum_r exp2(m_r - m) l_r, O = sum_r exp2(m_r - m) O_r / l over the ranks' partials.
  const float* received = reinterpret_cast<const float*>(smem + Cfg::kPartsEnd);
  const int r_begin = rank * rows_per_rank;
  const int my_rows = rows_of(rank);
  for (int i = tid; i < my_rows * Cfg::kChunks; i += Cfg::kThreads) {
    const int lr = i / Cfg::kChunks;
    const int c = i % Cfg::kChunks;
    if (m0 + r_begin + lr >= seq_len) continue;
    auto part_of = [&](int sr) {
      return sr == rank ? o_part + (r_begin + lr) * Cfg::kOStride
                        : received + (sr * rows_per_rank + lr) * Cfg::kOStride;
    };
    float l_all;
    float acc[8];
    merge_parts<Cfg::kMaxCluster>(
        n_ranks, [&](int sr) { return *reinterpret_cast<const float2*>(part_of(sr) + kHeadDim); }, part_of, c,
        l_all, acc);
    const float inv_l = l_all > 0.f ? 1.f / l_all : 0.f;
    st_global_16(o + static_cast<size_t>(m0 + r_begin + lr) * kHeadDim + c * 8,
                 fc::pack_half2(acc[0] * inv_l, acc[1] * inv_l), fc::pack_half2(acc[2] * inv_l, acc[3] * inv_l),
                 fc::pack_half2(acc[4] * inv_l, acc[5] * inv_l), fc::pack_half2(acc[6] * inv_l, acc[7] * inv_l));
  }
  cluster_wait();  // (2): no CTA leaves while a push out of its shared memory may still be reading it
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
  explicit KernelName(const char* kernel) {
    snprintf(text, sizeof(text), "%s<%d, %d, %d, %d, %d, %d, %d>", kernel, Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN,
             Cfg::kWarpM, Cfg::kStages, Cfg::kSplit, Cfg::kMinBlocks);
  }
};

template <class Cfg>
static const char* kernel_name() {
  static const KernelName<Cfg> name("v11_fwd");
  return name.text;
}

template <class Cfg>
static const char* tma_kernel_name() {
  static const KernelName<Cfg> name("v11_fwd_tma");
  return name.text;
}

template <class Cfg>
struct ClusterKernelName {
  char text[64];
  ClusterKernelName() {
    snprintf(text, sizeof(text), "v11_cluster_fwd<%d, %d, %d, %d, %d, %d, %d>", Cfg::kHeadDim, Cfg::kBlockM,
             Cfg::kChunkN, Cfg::kSplit, Cfg::kBlockN, Cfg::kWarpM, Cfg::kMinBlocks);
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
static constexpr auto tma_kernel_of() {
  return v11_fwd_tma<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, Cfg::kWarpM, Cfg::kStages, Cfg::kSplit,
                     Cfg::kMinBlocks>;
}

// Raising a kernel's shared-memory limit is a driver call of about a microsecond: at 1,8,512,64 that would be
// a visible part of the whole run, so it is done once per process and kernel, as PyTorch does.
template <auto kKernel, int kBytes>
static const char* allow_smem_once() {
  static const bool ready = fc::allow_dynamic_smem(kKernel, kBytes) == nullptr;
  return ready ? nullptr : fc::allow_dynamic_smem(kKernel, kBytes);
}

// The in-CTA kernels' grid: query tiles by batch * heads, the order query_tile_fastest picks.
template <class Cfg>
static const char* query_grid(const FlashcoreParams& p, dim3* grid) {
  const unsigned tiles = fc::ceil_div(p.seq_len, Cfg::kBlockM), heads = p.batch * p.heads;
  *grid = query_tile_fastest(p.causal, Cfg::kHeadDim) ? dim3(tiles, heads) : dim3(heads, tiles);
  if (grid->y > 65535) return fc::message("v11: grid y of %u exceeds the limit (65535)", grid->y);
  return nullptr;
}

template <class Cfg>
static const char* launch(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = kernel_of<Cfg>();
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
  dim3 grid;
  if (const char* err = query_grid<Cfg>(p, &grid)) return err;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return fc::launch_status();
}

// A [B * H][S][D] fp16 tensor as a 3-D map whose boxes are `rows` x D (D = 64: one 128-byte row per box
// row), swizzled 128 bytes (the chunk ^ (row & 7) layout the kernel reads), zeros past S. False when the
// driver refuses it (a misaligned base, say); the caller then takes the cp.async kernel.
static bool encode_rows_map(CUtensorMap* map, const void* base, const FlashcoreParams& p, int rows) {
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(p.head_dim) * sizeof(__half);
  return fc::encode_tensor_map<3>(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, base,
                                  {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.seq_len),
                                   static_cast<cuuint64_t>(p.batch) * p.heads},
                                  {row_bytes, row_bytes * p.seq_len},  // bytes, dims 1 and 2
                                  {static_cast<cuuint32_t>(p.head_dim), static_cast<cuuint32_t>(rows), 1},
                                  CU_TENSOR_MAP_SWIZZLE_128B);
}

// Whether `kernel` can run here: an sm_90 device and an sm_90 build of it (an older build's body traps).
template <class Kernel>
static bool runs_sm90_image(Kernel kernel) {
  int device = 0, major = 0;
  cudaFuncAttributes attributes{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9 ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();  // a missing sm_90 image is an answer here, not a sticky error for the next launch
    return false;
  }
  return attributes.binaryVersion >= 90;
}

// The TMA kernel also needs the driver's encoder: asked once per process.
template <class Cfg>
static bool tma_ready() {
  static const bool ready = runs_sm90_image(tma_kernel_of<Cfg>()) && fc::tensor_map_encoder() != nullptr;
  return ready;
}

// The TMA kernel's launch. *launched stays false when the maps could not be made (no error then: the caller
// takes the cp.async kernel).
template <class Cfg>
static const char* launch_tma(const FlashcoreParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  constexpr auto kernel = tma_kernel_of<Cfg>();
  constexpr int smem = tma_smem_bytes<Cfg>();
  if (const char* err = allow_smem_once<kernel, smem>()) return err;
  dim3 grid;
  if (const char* err = query_grid<Cfg>(p, &grid)) return err;
  // The maps are made on the host for each new pair of tensors; a loop over the same ones reuses them.
  static thread_local struct {
    const void* k = nullptr;
    const void* v = nullptr;
    int batch = 0, heads = 0, seq_len = 0;
    CUtensorMap map_k, map_v;
  } last;
  if (last.k != p.k || last.v != p.v || last.batch != p.batch || last.heads != p.heads || last.seq_len != p.seq_len) {
    last.k = nullptr;  // no valid pair until both maps are made
    if (!encode_rows_map(&last.map_k, p.k, p, Cfg::kTileN) || !encode_rows_map(&last.map_v, p.v, p, Cfg::kTileN)) {
      return nullptr;
    }
    last.k = p.k;
    last.v = p.v;
    last.batch = p.batch;
    last.heads = p.heads;
    last.seq_len = p.seq_len;
  }
  *launched = true;
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p, last.map_k, last.map_v);
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
  return v11_cluster_fwd<Cfg::kHeadDim, Cfg::kBlockM, Cfg::kChunkN, Cfg::kSplit, Cfg::kBlockN, Cfg::kWarpM,
                         Cfg::kMinBlocks>;
}

// The cluster path needs an sm_90 device and an sm_90 build of the kernel (an older build's body traps):
// asked once per process and kernel, like sm_count().
template <class Cfg>
static bool cluster_ready() {
  static const bool ready = runs_sm90_image(cluster_kernel_of<Cfg>());
  return ready;
}

template <class Cfg>
static const char* launch_cluster(const FlashcoreParams& p, cudaStream_t stream) {
  constexpr auto kernel = cluster_kernel_of<Cfg>();
  if (const char* err = allow_smem_once<kernel, Cfg::kSmemBytes>()) return err;
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

// Short sequences on sm_90 take the cluster path when the sequence fits one cluster of kMaxCluster chunks
// (-D V11_CLUSTER=1), else at D=64 the TMA kernel (ShortTma; void at D=128); the in-CTA cp.async kernel
// remains for older GPUs, D=128 and -D V11_TMA=0.
template <class Long, class Short, class ShortTma, class Cluster>
static const char* forward(const FlashcoreParams& p, cudaStream_t stream) {
  if (pick_regime(p.batch * p.heads, p.seq_len, Long::kBlockM, sm_count()) == Regime::kShort) {
#if V11_CLUSTER
    if (p.seq_len <= Cluster::kMaxCluster * Cluster::kChunkN && cluster_ready<Cluster>()) {
      return launch_cluster<Cluster>(p, stream);
    }
#endif
    if constexpr (V11_TMA && !std::is_void_v<ShortTma>) {
      if (tma_ready<ShortTma>()) {
        bool launched = false;
        const char* err = launch_tma<ShortTma>(p, stream, &launched);
        if (launched || err != nullptr) return err;
      }
    }
    return launch<Short>(p, stream);
  }
  return launch<Long>(p, stream);
}

template <class Cfg>
static FlashcoreKernelPlan plan_of() {
  return {kernel_name<Cfg>(), Cfg::kThreads, Cfg::kSmemBytes};
}

template <class Cfg>
static FlashcoreKernelPlan tma_plan_of() {
  return {tma_kernel_name<Cfg>(), Cfg::kThreads, tma_smem_bytes<Cfg>()};
}

template <class Cfg>
static FlashcoreKernelPlan cluster_plan_of() {
  return {cluster_kernel_name<Cfg>(), Cfg::kThreads, Cfg::kSmemBytes};
}

int flashcore_plan(int head_dim, FlashcoreKernelPlan* plans, int max_plans) {
  FlashcoreKernelPlan all[4];
  int count = 0;
  if (head_dim == 64) {
    all[count++] = plan_of<LongD64>();
    all[count++] = plan_of<ShortD64>();
#if V11_TMA
    all[count++] = tma_plan_of<ShortTmaD64>();
#endif
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
    case 64: return forward<LongD64, ShortD64, ShortTmaD64, ClusterD64>(p, stream);
    case 128: return forward<LongD128, ShortD128, void, ClusterD128>(p, stream);
    default: return fc::unsupported_head_dim(p.head_dim);
  }
}
