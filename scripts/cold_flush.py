"""What the cold mode's L2 flush costs a bandwidth-bound call, and where the decode rung's time goes (split kernel,
combine, the gap between them), at the inference issue's five decode rows (docs/ladder.md, decode, "Load forms
and the cold flush"). Diagnostic: not part of any command.

Flushes: write = the bench's (measure/timing.py's L2Flusher: a 2 x L2 buffer zeroed, the L2 left full of dirty
         lines); clean = that, then a read of another 2 x L2 buffer (the L2 left full of clean lines); none.
Calls:   each variant named (default: decode), SDPA's cuDNN backend (enable_gqa), and `read`: one sum over an fp16
         buffer of K and V's bytes. Each timed as the bench's cold mode does (blocking start, events, median).
Then one torch.profiler trace per call under the write flush: each kernel's start and duration in the call.

    python3 scripts/cold_flush.py OUT_DIR [REGISTRY [VARIANT,...]]
"""
import json
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashcore_cli.api import load_variant
from flashcore_cli.check.case import sdpa as sdpa_forward
from flashcore_cli.measure import blocking_start
from flashcore_cli.measure.timing import L2Flusher, gated_us

SHAPES = [(8, 32, 8, 1, 8192), (64, 32, 8, 1, 4096), (1, 32, 8, 1, 131072), (16, 64, 8, 1, 16384), (4, 32, 8, 4, 16384)]
D = 128
REPS = int(os.environ.get("REPS", "60"))
out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
registry = sys.argv[2] if len(sys.argv) > 2 else None
names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["decode"]

flusher = L2Flusher()
clean = torch.ones_like(flusher.buffer)
gate = blocking_start.shared()


def flush(mode):
    if mode in ("write", "clean"):
        flusher.flush()
    if mode == "clean":
        clean.sum()


def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2], xs[len(xs) // 10], xs[(9 * len(xs)) // 10]


variants = {n: load_variant(n, registry=registry) for n in names}
results = []
for B, H, Hkv, S, Skv in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, Hkv, Skv, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    x = torch.randn(2 * k.numel(), device="cuda", dtype=torch.float16)
    kv_bytes = 2 * k.numel() * 2
    io_bytes = kv_bytes + 2 * q.numel() * 2
    calls = {n: (lambda a=a: a(q, k, v, causal=False)) for n, a in variants.items()}

    calls["cudnn"] = lambda: sdpa_forward(q, k, v, False, None)  # the bench's SDPA call, in the cuDNN backend below
    calls["read"] = lambda: x.sum(dtype=torch.float32)
    label = f"{B},{H}:{Hkv},{S}:{Skv},{D}"
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            gated_us(gate, fn)
            for mode in ("write", "clean", "none"):
                samples = []
                for _ in range(REPS):
                    flush(mode)
                    t = gated_us(gate, fn)
                    if t is not None:
                        samples.append(t)
                m, p10, p90 = med(samples)
                nbytes = kv_bytes if name == "read" else io_bytes
                row = dict(shape=label, call=name, mode=mode, median_us=m, p10=p10, p90=p90, gbps=nbytes / m / 1e3)
                results.append(row)
                print(f"{label:22s} {name:8s} {mode:6s} {m:8.1f} us  p10 {p10:8.1f} p90 {p90:8.1f}  {nbytes / m / 1e3:6.0f} GB/s",
                      flush=True)
        # kernel-level split of the decode call and cuDNN's, under the bench's flush
        for name in list(variants) + ["cudnn"]:
            fn = calls[name]
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    flush("write")
                    fn()
                    torch.cuda.synchronize()
            path = os.path.join(out_dir, f"trace-{name}-{label.replace(',', '_').replace(':', '-')}.json")
            prof.export_chrome_trace(path)
            ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
            ev.sort(key=lambda e: e["ts"])
            reps, cur = [], None
            for e in ev:
                if "Fill" in e["name"] or "fill" in e["name"]:
                    cur = []
                    reps.append(cur)
                elif cur is not None:
                    cur.append(e)
            spans, parts = [], {}
            for r in reps:
                if not r:
                    continue
                spans.append(r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"])
                for i, e in enumerate(r):
                    key = f"{i}:{e['name'][:60]}"
                    parts.setdefault(key, []).append((e["ts"] - r[0]["ts"], e["dur"]))
            print(f"  trace {label} {name}: span median {med(spans)[0]:.1f} us over {len(spans)} reps", flush=True)
            for key, vals in parts.items():
                st = med([a for a, _ in vals])[0]
                du = med([b for _, b in vals])[0]
                print(f"    {key:64s} start +{st:7.1f} dur {du:7.1f}", flush=True)
            os.remove(path)
json.dump(results, open(os.path.join(out_dir, "decode_flush.json"), "w"), indent=1)
