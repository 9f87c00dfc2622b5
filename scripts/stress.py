"""Stress a variant: launch it N times over random shapes (S = 1 and lengths that are no multiple of any
tile included, causal and not, every head dim it declares, grouped-query heads and other key lengths, sliding
windows, softcaps and sinks where it takes them) in one isolated worker under a timeout, every launch checked against the fp32 reference (and its
gradients, for a variant with a backward).

    python3 scripts/stress.py v9 v10 --launches 2000 --timeout 600

Exit codes as flashcore's (README, "Exit codes"): 0 every launch OK, 1 a launch failed, 2 bad input or a machine
that cannot run it (an unknown variant, --launches 0, no GPU, a CPU build of torch: one line), 130 Ctrl-C.
nvcc is found as flashcore finds it (PATH, or CUDA_HOME); the checks below run before the worker, so a CPU
torch is named as the cause instead of torch's own "CUDA_HOME environment variable is not set".
"""

from __future__ import annotations

import argparse
import random
import sys

from flashcore_cli.registry.archs import parse_archs
from flashcore_cli.check.correctness import new_seed, run_variant
from flashcore_cli.core.errors import EXIT_INTERRUPTED, FlashcoreError
from flashcore_cli.registry.variants import load_registry
from flashcore_cli.registry.family import Family
from flashcore_cli.registry.shapes import Case, Shape


def random_cases(variant, launches: int, seed: int) -> list[Case]:
    """Random shapes the variant takes: Sq = 1 regularly and lengths that are no multiple of any tile; with
    `gqa`, query heads 1-8 times the key/value heads; with `seqlen_kv`, an independent key length (a decode
    rung's `max_seq_len` bounds the queries); with `window`, `softcap`, `sinks`, each drawn in some launches (windows
    of every width, one-sided and two-sided, some leaving rows empty); with `backward`, the gradients checked too."""
    rng = random.Random(seed)
    cases = []
    for i in range(launches):
        if i % 20 == 0:
            s = 1  # the degenerate single-row sequence, regularly
        else:
            s = rng.choice([rng.randint(2, 130), rng.randint(131, 1100), rng.randint(1, 64) * 16 + rng.randint(1, 15)])
        if variant.max_seq_len:
            s = rng.randint(1, variant.max_seq_len)
        heads_kv = rng.randint(1, 6)
        heads = heads_kv * (rng.randint(1, 8) if variant.supports("gqa") else 1)
        s_kv = rng.choice([s, rng.randint(1, 1100), rng.randint(1, 4100)]) if variant.supports("seqlen_kv") else s
        shape = Shape(rng.randint(1, 3), heads, s, rng.choice(variant.head_dims), heads_kv, s_kv)
        cases.append(Case(shape, rng.random() < 0.5, seed + i, grads=variant.supports("backward"),
                          family=random_family(variant, rng, s_kv)))  # fmt: skip
    return cases


def random_family(variant, rng: random.Random, s_kv: int) -> Family:
    """A window, softcap and sinks each drawn in about a third of the launches, where the variant takes them."""
    left = right = -1
    if variant.supports("window") and rng.random() < 0.4:
        left = rng.choice([-1, 0, rng.randint(1, 64), rng.randint(1, s_kv + 16)])
        right = rng.choice([-1, 0, 0, rng.randint(1, 32)])
    softcap = round(rng.uniform(5.0, 60.0), 2) if variant.supports("softcap") and rng.random() < 0.3 else 0.0
    sinks = variant.supports("sinks") and rng.random() < 0.3
    return Family(left, right, softcap, sinks)


def stress(args) -> int:
    if args.launches < 1:
        raise FlashcoreError(f"--launches {args.launches}: give at least 1 launch")
    if not args.timeout > 0:
        raise FlashcoreError(f"--timeout {args.timeout:g}: give a positive number of seconds")
    registry = load_registry(args.registry)
    variants = [registry.get(name) for name in args.variants]  # every name checked before any work
    import torch

    from flashcore_cli.builder.toolchain import find_nvcc, require_cuda_torch
    from flashcore_cli.core.records import usable_cache

    find_nvcc()
    require_cuda_torch()
    if not torch.cuda.is_available():
        raise FlashcoreError("scripts/stress.py runs kernels and needs a CUDA GPU; none is visible here")
    usable_cache()
    seed = args.seed if args.seed is not None else new_seed()
    failed = False
    for variant in variants:
        name = variant.name
        cases = random_cases(variant, args.launches, seed)
        outcome = run_variant(registry, variant, cases, arch=parse_archs(None)[0], timeout=args.timeout)
        counts: dict[str, int] = {}
        for c in outcome.cases:
            counts[c.status] = counts.get(c.status, 0) + 1
        lengths = sorted({c.shape.seq_len for c in cases})
        grouped = sum(c.shape.gqa for c in cases)
        uneven = sum(c.shape.other_kv_len for c in cases)
        print(f"{name}: {len(cases)} launches{' with gradients' if variant.supports('backward') else ''}, seed {seed}, "
              f"{len(lengths)} distinct S in [{lengths[0]}, {lengths[-1]}], {sum(c.causal for c in cases)} causal, "
              f"{grouped} grouped-query, {uneven} with S_kv != S: {counts} in {outcome.seconds:.1f} s; "
              f"worst err/tol {outcome.worst_ratio() or float('nan'):.2f}")  # fmt: skip
        for c in [c for c in outcome.cases if c.status != "OK"][:5]:
            failed = True
            print(f"  {c.status} {c.case.label()} seed {c.case.seed}: {c.detail}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--registry", default=None, help="registry file (default: as flashcore finds it)")
    args = parser.parse_args()
    try:
        return stress(args)
    except FlashcoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
