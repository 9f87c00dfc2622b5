"""The floor under issue 5's target: what parts of v11's work cost at 1,8,512,64, timed as the bench times.

    python scripts/floor_v11.py [--runs 2] [--reps 200] [--json PATH]

Builds scripts/floor_v11.cu (sm_90 only: its loads are cp.async.bulk) and times, in one process and with
flashcore's own time_callable (L2 flushed before each call, CUDA events, median of --reps calls), SDPA's
default backend, v11, an empty kernel and five stripped kernels that keep v11's partition but skip work
(see the .cu's header): loads only; v11's HMMA work with no softmax, as v11 orders it, with nothing ordering
the HMMAs, and over two larger stages; and the HMMA work with no K or V to wait for. Each run prints every
row's median and its ratio to SDPA's.
The stripped kernels compute garbage on purpose; v11 is checked against an fp32 reference first.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SHAPE = (1, 8, 512, 64)
FLOORS = [
    (-1, "empty kernel (128 CTAs x 128 threads)"),
    (0, "floor: K/V loads + Q + merge + store"),
    (1, "floor: + v11's HMMA work, no softmax"),
    (2, "floor: same, HMMAs unordered by S"),
    (3, "floor: HMMA work, no K/V to wait for"),
    (4, "floor: hmma, two stages of 256 keys"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="timing passes over every row (default 2)")
    ap.add_argument("--reps", type=int, default=200, help="timed calls per row and pass (default 200)")
    ap.add_argument("--json", type=pathlib.Path, help="write every sample here")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.reps < 10:
        print("error: --runs must be >= 1 and --reps >= 10", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("error: the floor kernels need an sm_90 GPU (H100 / H200)", file=sys.stderr)
        return 2
    import torch.nn.functional as F
    from torch.utils.cpp_extension import load

    from flashcore_cli.api import load_variant
    from flashcore_cli.check import check_case
    from flashcore_cli.shapes import Case, Shape
    from flashcore_cli.timing import L2Flusher, time_callable

    print("building scripts/floor_v11.cu ...", flush=True)
    ext = load(
        name="flashcore_floor_v11",
        sources=[str(HERE / "floor_v11.cu")],
        extra_include_paths=[str(HERE.parent / "kernels")],
        extra_cuda_cflags=["-O3", "--use_fast_math", "-std=c++17", "-gencode=arch=compute_90,code=sm_90"],
        verbose=False,
    )
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    v11 = load_variant("v11")
    check = check_case(v11, Case(Shape(*SHAPE), causal=False, seed=0))  # the test command's own check
    if check.status != "OK":
        print(f"error: v11 fails its check at {Shape(*SHAPE)}: {check.detail}; not timing it", file=sys.stderr)
        return 1
    err = check.max_error

    rows = [
        ("sdpa (default)", lambda: F.scaled_dot_product_attention(q, k, v)),
        ("v11", lambda: v11(q, k, v, out=out)),
    ]
    rows += [(name, lambda mode=mode: ext.launch(mode, q, k, v, out)) for mode, name in FLOORS]

    flusher = L2Flusher()
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": SHAPE, "v11_max_abs_err": err,
              "runs": []}
    print(f"{record['gpu']}, torch {torch.__version__}, shape {Shape(*SHAPE)}; "
          f"v11 max abs error {err:.1e} (tolerance {check.tolerance:.1e})")
    for run in range(args.runs):
        times = {name: time_callable(fn, reps=args.reps, flusher=flusher) for name, fn in rows}
        sdpa = times["sdpa (default)"].median
        print(f"run {run + 1}: median us (p10, p90), and as a fraction of SDPA's time")
        for name, t in times.items():
            spread = f"({t.percentile(0.1):5.2f}, {t.percentile(0.9):5.2f})"
            print(f"  {name:40s} {t.median:6.2f} {spread}  {t.median / sdpa:5.2f}x")
        record["runs"].append({name: t.as_dict() for name, t in times.items()})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1))
        print(f"record: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
