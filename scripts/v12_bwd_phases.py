"""v12's backward, phase by phase: where each consumer warpgroup's cycles go in a step.

Writes a copy of kernels/ (default out/phases/kernels) in which thread 0 of each consumer warpgroup reads %clock at
every phase boundary of its step loop (the dQ lag's) and adds the difference to a counter
in spare shared memory, and the producer thread, the K/V thread and the dQ warp's lane 0 time their own waits; a
registry beside it names the copy `v12phases`. On a GPU it then runs each shape's backward 12 times, first with the
plain v12 and then with the copy, and prints cycles per step per phase: sums over every CTA and call, which a
one-thread kernel launched after the main kernel (when V12_PROF_PRINT is set) prints and zeroes.

    python3 scripts/v12_bwd_phases.py [SHAPE[c] ...] [--dir out/phases] [--make-only]    (default 2,16,4096,128)

A trailing c makes a shape causal. The instrumented kernel runs 7-8% slower than v12: each boundary is a
read-modify-write of shared memory, whose latency lands in the phase after it. Compare phases between builds
measured the same way, not as absolute times (docs/results/v12-bwd-phase-clocks-2026-11-27.txt). The copy is made
by inserting code at named places in sm90/mainloop_bwd_sm90.cuh, sm90/producer_bwd_sm90.cuh, sm90/bwd_dq_sm90.cuh and sm90/v12_bwd.cu;
when one of them has changed, the script stops and prints the text it could not find."""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PHASES = {0: "wait full (Q_i, dO_i)", 1: "S^T, dP^T wgmma (issue to wait)", 2: "P^T, dS^T math, dV issue",
          3: "wait ds_empty", 4: "store dS (stmatrix)", 5: "wait ds_full", 6: "dQ, dK issue + wait<1>",
          7: "wait for the dQ warp (kDqEmpty)", 8: "stage dQ (STS)", 10: "wait<0> dK, release the stage",
          9: "wait kv_full (tile start)", 13: "tile tail: last dQ", 11: "tile tail: dK/dV stores"}
STEPS, TILES = 14, 15  # the consumers' counters of steps and tiles


def sub(text: str, old: str, new: str) -> str:
    if old not in text:
        sys.exit(f"v12_bwd_phases.py: the kernels no longer hold this text, where it instruments them:\n{old}")
    return text.replace(old, new, 1)


def make(root: str) -> None:
    """The instrumented copy at root/kernels and root/registry.yaml naming it."""
    dst = os.path.join(root, "kernels")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(REPO / "kernels", dst)
    # v12's own entry (what the kernel declares: dtypes, features, head dims), renamed and pointed at the copy
    import yaml

    entry = next(e for e in yaml.safe_load((REPO / "variants.yaml").read_text())["variants"] if e["name"] == "v12")
    entry = {k: v for k, v in entry.items() if k not in ("aliases", "notes")}
    entry.update(name="v12phases", sources=list(entry["sources"]),
                 summary="v12 with clock reads at each phase of its backward's step (scripts/v12_bwd_phases.py)")
    with open(os.path.join(root, "registry.yaml"), "w") as f:
        yaml.safe_dump({"variants": [entry]}, f, sort_keys=False, width=1000)

    hdr = r'''
// ---- profiling (diagnostic copy only) ----
#define PROF_N 16
__device__ unsigned long long g_prof[3][PROF_N];
__device__ __forceinline__ unsigned prof_clock() { unsigned c; asm volatile("mov.u32 %0, %%clock;" : "=r"(c)::"memory"); return c; }
// in the unused bytes between the mbarriers and the next 1024-byte boundary (static shared memory would not fit)
#define s_prof() reinterpret_cast<unsigned*>(fc::dynamic_smem_1024() + Cfg::kBarOffset + 256)
#define PACC(row, cat) do { const unsigned _n = prof_clock(); if (prof_on) s_prof()[(row) * PROF_N + (cat)] += _n - _pt; _pt = prof_clock(); } while (0)
template <class Cfg>
__device__ __forceinline__ void prof_flush(int row) {
  unsigned* s = s_prof();
  for (int c = 0; c < PROF_N; ++c) atomicAdd(&g_prof[row][c], static_cast<unsigned long long>(s[row * PROF_N + c]));
}
__global__ void prof_print() {
  for (int r = 0; r < 3; ++r) {
    printf("PROF row %d:", r);
    for (int c = 0; c < PROF_N; ++c) { printf(" %llu", g_prof[r][c]); g_prof[r][c] = 0; }
    printf("\n");
  }
}
'''
    p = open(f"{dst}/sm90/producer_bwd_sm90.cuh").read()
    p = sub(p, '__device__ __forceinline__ unsigned char* v12_bwd_smem()', hdr + '\n__device__ __forceinline__ unsigned char* v12_bwd_smem()')
    p = sub(p, '''      fc::mbarrier_wait_parity(&bars.empty[s], ((it >> 1) & 1) ^ 1);''', '''      { const unsigned _a = prof_clock();
      fc::mbarrier_wait_parity(&bars.empty[s], ((it >> 1) & 1) ^ 1);
      s_prof()[2 * PROF_N + 0] += prof_clock() - _a; s_prof()[2 * PROF_N + 6] += 1; }''')
    p = sub(p, '''    fc::mbarrier_wait_parity(&bars.kv_empty, (round & 1) ^ 1);''', '''    { const unsigned _a = prof_clock();
    fc::mbarrier_wait_parity(&bars.kv_empty, (round & 1) ^ 1);
    s_prof()[2 * PROF_N + 1] += prof_clock() - _a; }''')
    open(f"{dst}/sm90/producer_bwd_sm90.cuh", "w").write(p)
    d = open(f"{dst}/sm90/bwd_dq_sm90.cuh").read()
    d = sub(d, '''        if (leader) fc::tma_store_wait_read<0>();''', '''        { const unsigned _a = prof_clock();
        if (leader) fc::tma_store_wait_read<0>();
        if (leader) s_prof()[2 * PROF_N + 2] += prof_clock() - _a; }''')
    d = sub(d, '''        fc::named_barrier_sync(kDqFull + g, fc::kWarpgroupThreads + 32);
        if (leader) reduce_add_dq_tile<Cfg>(maps, smem, g, m0, bh);''', '''        { const unsigned _a = prof_clock();
        fc::named_barrier_sync(kDqFull + g, fc::kWarpgroupThreads + 32);
        if (leader) s_prof()[2 * PROF_N + 3 + g] += prof_clock() - _a; }
        if (leader) reduce_add_dq_tile<Cfg>(maps, smem, g, m0, bh);''')
    open(f"{dst}/sm90/bwd_dq_sm90.cuh", "w").write(d)
    m = open(f"{dst}/sm90/mainloop_bwd_sm90.cuh").read()
    m = sub(m, '''  int it = 0;
  BwdTile tile;
  for (int round = 0; bwd_take_tile<Cfg>(p, round, tile); ++round) {''', '''  int it = 0;
  BwdTile tile;
  const bool prof_on = tid0;
  unsigned _pt = prof_clock();
  for (int round = 0; bwd_take_tile<Cfg>(p, round, tile); ++round) {''')
    m = sub(m, '''    fc::mbarrier_wait_parity(&bars.kv_full, round & 1);
    for (int step = 0;''', '''    fc::mbarrier_wait_parity(&bars.kv_full, round & 1);
    PACC(g, 9);
    for (int step = 0;''')
    m = sub(m, '''      fc::mbarrier_wait_parity(&bars.full[s], (it >> 1) & 1);''', '''      fc::mbarrier_wait_parity(&bars.full[s], (it >> 1) & 1);
      PACC(g, 0);''')
    m = sub(m, '''      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(st);
      fc::wgmma_fence_operands(dpt);
      to_probabilities();''', '''      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(st);
      fc::wgmma_fence_operands(dpt);
      PACC(g, 1);
      to_probabilities();''')
    m = sub(m, '''      if (it > 0) fc::mbarrier_wait_parity(&bars.ds_empty[s], ((it - 1) >> 1) & 1);
      store_ds(dsa, s);
      fc::mbarrier_arrive(&bars.ds_full[s]);
      if (step > 0) fc::mbarrier_wait_parity(&bars.ds_full[s ^ 1], ((it - 1) >> 1) & 1);''', '''      PACC(g, 2);
      if (it > 0) fc::mbarrier_wait_parity(&bars.ds_empty[s], ((it - 1) >> 1) & 1);
      PACC(g, 3);
      store_ds(dsa, s);
      fc::mbarrier_arrive(&bars.ds_full[s]);
      PACC(g, 4);
      if (step > 0) fc::mbarrier_wait_parity(&bars.ds_full[s ^ 1], ((it - 1) >> 1) & 1);
      PACC(g, 5);''')
    m = sub(m, '''      fc::mbarrier_arrive(&bars.ds_empty[s ^ 1]);
      if (step > 0) hand_over_dq<Cfg>(dq_stage, dq, g, it - 1, warp, lane());
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(dk);
      fc::wgmma_fence_operands(dsa);
      fc::mbarrier_arrive(&bars.empty[s]);
    }''', '''      fc::mbarrier_arrive(&bars.ds_empty[s ^ 1]);
      PACC(g, 6);
      if (step > 0) {
        if (it - 1 > 0) fc::named_barrier_sync(kDqEmpty + g, fc::kWarpgroupThreads + 32);
        PACC(g, 7);
        stage_dq<Cfg>(dq_stage, dq, warp, lane());
        fc::fence_proxy_async_shared();
        fc::named_barrier_arrive(kDqFull + g, fc::kWarpgroupThreads + 32);
        PACC(g, 8);
      }
      fc::wgmma_wait<0>();
      fc::wgmma_fence_operands(dk);
      fc::wgmma_fence_operands(dsa);
      fc::mbarrier_arrive(&bars.empty[s]);
      PACC(g, 10);
      if (prof_on) s_prof()[g * PROF_N + 14] += 1;
    }''')
    m = sub(m, '''    fc::mbarrier_arrive(&bars.kv_empty);  // every thread''', '''    PACC(g, 13);
    fc::mbarrier_arrive(&bars.kv_empty);  // every thread''')
    m = sub(m, '''      store_rows_direct<Cfg, T>(dv, 1.f, fc::tensor<T>(b.dv) + kv_base, n0, p.seq_len_kv, key_row());
    }
  }
  if (Cfg::kEpiStaged && tid0) fc::tma_store_wait<0>();  // the last tile's dK, dV written before the CTA ends
}''', '''      store_rows_direct<Cfg, T>(dv, 1.f, fc::tensor<T>(b.dv) + kv_base, n0, p.seq_len_kv, key_row());
    }
    PACC(g, 11);
    if (prof_on) s_prof()[g * PROF_N + 15] += 1;
  }
  if (prof_on) {
    s_prof()[g * PROF_N + 12] += prof_clock() - _pt;
    prof_flush<Cfg>(g);
  }
  if (Cfg::kEpiStaged && tid0) fc::tma_store_wait<0>();
}''')
    m = sub(m, '''    fc::fence_mbarrier_init();
  }
  __syncthreads();''', '''    fc::fence_mbarrier_init();
    for (int i = 0; i < 3 * PROF_N; ++i) s_prof()[i] = 0;
  }
  __syncthreads();''')
    m = sub(m, '''    if (threadIdx.x / 32 == 1) bwd_dq_writer<Cfg>(b, maps);''', '''    if (threadIdx.x / 32 == 1) { bwd_dq_writer<Cfg>(b, maps); if (threadIdx.x % 32 == 0) prof_flush<Cfg>(2); }''')
    open(f"{dst}/sm90/mainloop_bwd_sm90.cuh", "w").write(m)
    v = open(f"{dst}/sm90/v12_bwd.cu").read()
    v = sub(v, '''  kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(b, w, maps);
  if (const char* err = fc::launch_status()) return err;''', '''  kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(b, w, maps);
  if (const char* err = fc::launch_status()) return err;
  if (getenv("V12_PROF_PRINT")) prof_print<<<1, 1, 0, stream>>>();''')
    v = sub(v, '#include <cstdio>', '#include <cstdio>\n#include <cstdlib>')
    open(f"{dst}/sm90/v12_bwd.cu", "w").write(v)


def table(rows: dict[int, list[int]]) -> str:
    lines = ["    phase                                 consumer 0        consumer 1   (cycles per step, share)"]
    totals = [sum(rows[g][c] for c in PHASES) for g in (0, 1)]
    steps = [max(rows[g][STEPS], 1) for g in (0, 1)]
    for c, name in PHASES.items():
        cells = [f"{rows[g][c] / steps[g]:6.0f} {100 * rows[g][c] / max(totals[g], 1):5.1f}%" for g in (0, 1)]
        lines.append(f"    {name:36s} " + "   ".join(cells))
    lines.append(f"    {'attributed, per step':36s} {totals[0] / steps[0]:6.0f}          {totals[1] / steps[1]:6.0f}")
    x = rows[2]
    n = max(x[6], 1)
    lines.append(f"  per step: producer waits on empty {x[0] / n:.0f}; K/V thread on kv_empty {x[1] / n:.0f}; "
                 f"dQ warp on the reduce-add's read {x[2] / n:.0f}, on consumer 0 {x[3] / n:.0f}, "
                 f"on consumer 1 {x[4] / n:.0f}")
    return "\n".join(lines)


def run(root: str, shapes: list[str]) -> None:
    """Each shape: 12 backwards of v12, then of v12phases, whose last call prints the counters (read here from a
    child process's stdout: device printf goes to the C stream)."""
    import torch

    from flashcore_cli.api import load_variant
    from flashcore_cli.registry.shapes import parse_shape

    registry = os.path.join(root, "registry.yaml")
    variants = [("v12", load_variant("v12")), ("v12phases", load_variant("v12phases", registry=registry))]
    for spec in shapes:
        causal = spec.endswith("c")
        s = parse_shape(spec.rstrip("c"))
        half = {"device": "cuda", "dtype": torch.float16, "requires_grad": True}
        q = torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, **half)
        k = torch.randn(s.batch, s.heads_kv, s.seq_len_kv, s.head_dim, **half)
        v = torch.randn_like(k, requires_grad=True)
        d_o = torch.randn_like(q)
        for name, attn in variants:
            out = attn(q, k, v, causal=causal)
            times = []
            for call in range(12):
                if name == "v12phases" and call == 11:
                    os.environ["V12_PROF_PRINT"] = "1"
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
                end.record()
                torch.cuda.synchronize()
                ctypes.CDLL(None).fflush(None)  # the device printf's lines, before this process's next print
                os.environ.pop("V12_PROF_PRINT", None)
                times.append(start.elapsed_time(end) * 1000)
            print(f"SHAPE {spec} {name}: backward median {sorted(times)[6]:.1f} us (warm L2)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=["2,16,4096,128"])
    ap.add_argument("--dir", default="out/phases")
    ap.add_argument("--make-only", action="store_true", help="write the copy and its registry, run nothing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        from flashcore_cli.core.errors import FlashcoreError

        try:
            run(args.dir, args.shapes)
        except (FlashcoreError, RuntimeError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    make(args.dir)
    if args.make_only:
        print(f"wrote {args.dir}/kernels and {args.dir}/registry.yaml (variant v12phases)")
        return
    child = subprocess.run([sys.executable, __file__, "--child", "--dir", args.dir, *args.shapes],
                           capture_output=True, text=True)
    rows: dict[int, list[int]] = {}
    for line in child.stdout.splitlines():
        if line.startswith("PROF row"):
            r = int(line.split()[2].rstrip(":"))
            rows[r] = [int(x) for x in line.split(":", 1)[1].split()]
            if r == 2:
                print(table(rows))
        elif line.startswith("SHAPE"):
            print(line)
    if child.returncode != 0:
        last = [line for line in child.stderr.splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
        sys.exit(f"v12_bwd_phases.py: the run failed: {last[0]}")


if __name__ == "__main__":
    main()
