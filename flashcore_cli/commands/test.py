"""`flashcore test`: check variants against the fp32 reference, each in its own process under a timeout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from flashcore_cli.commands.options import (All, Arch, JsonOut, Names, Seed, Sinks, Softcap, Window, check_timeout,
                                            family_options, usable_paths)
from flashcore_cli.core.console import console, progress, styled
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, EXIT_OK
from flashcore_cli.core.events import Event
from flashcore_cli.core.statuses import BUILD_FAIL, CRASH, MISMATCH, NOT_RUN, OK, SKIP, TIMEOUT
from flashcore_cli.registry.archs import target_arch
from flashcore_cli.registry.family import DENSE
from flashcore_cli.registry.shapes import Case, Shape
from flashcore_cli.registry.variants import load_registry, require_runnable


def test(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    shapes: Annotated[
        Optional[list[str]], typer.Option("--shapes", help="B,H,S,D or B,Hq:Hkv,Sq:Sk,D shapes (repeat, or separate with ';'); "
                                          "default: the standard set")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant (after its build) before it is killed")] = 120.0,
    json_path: JsonOut = None,
    seed: Seed = None,
    arch: Arch = None,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """Check variants against an fp32 reference, each in its own process under a timeout. With --window, --softcap or
    --sinks every case runs under them; without, a variant that takes any of them also runs the family's odd cases."""
    family = family_options(window, softcap, sinks)
    return cmd_test(ctx.obj["registry"], names, all_, shapes, timeout, json_path, seed, arch,
                    None if family == DENSE else family)  # fmt: skip


def cmd_test(registry_path, names, all_, shapes_text, timeout, json_path, seed, arch, family=None) -> int:
    from flashcore_cli.check.correctness import new_seed, plan_cases, run_variant, write_json
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.registry.shapes import parse_shapes

    reg = load_registry(registry_path)
    variants = reg.select(names, all_)
    shapes = parse_shapes(shapes_text)
    check_timeout(timeout)
    arch = target_arch(arch)
    if shapes or family is not None:
        require_runnable(variants, shapes or [Shape(1, 8, 512, d) for v in variants for d in v.head_dims], causal=None,
                         family=family)  # fmt: skip
    usable_paths(json_path, create=False)  # the arguments first, then the GPU: a bad value is named as one
    require_gpu("test")
    usable_paths(json_path)
    seed = seed if seed is not None else new_seed()
    console.print(f"seed {seed} (case i uses seed {seed}+i); timeout {timeout:.0f} s per variant after its build; arch {arch}")
    outcomes = []
    with progress() as bar:
        for v in variants:
            cases = plan_cases(v, shapes, seed, family=family)
            task = bar.add_task(f"{v.name}: building", total=len(cases))

            def on_event(e, task=task, name=v.name):
                kind = e.get("event")
                if kind == Event.BUILT:
                    bar.update(task, description=f"{name}: checking")
                elif kind == Event.CASE:
                    bar.advance(task)
                elif kind == Event.CASE_START:
                    c = e["case"]
                    label = Case.from_dict(c).label()
                    bar.update(task, description=f"{name}: {label}")

            outcome = run_variant(reg, v, cases, arch=arch, timeout=timeout, on_event=on_event)
            bar.update(task, completed=len(cases))
            bar.console.print(f"  {v.name}: {styled(outcome.status)} ({outcome.seconds:.1f} s)")
            outcomes.append(outcome)
    _render_test(outcomes)
    if json_path:
        write_json(json_path, {"kind": "flashcore-test", "seed": seed, "arch": arch, "variants": [o.as_dict() for o in outcomes]})
        console.print(f"wrote {json_path}")
    return EXIT_CHECK_FAILED if any(o.failed for o in outcomes) else EXIT_OK


def _render_test(outcomes) -> None:
    table = Table(title="correctness against an fp32 reference: out within max(1 ulp at 1.0, 2 x SDPA's error in the same dtype); "
                        "gradients by FlashAttention-3's rule (docs/usage.md)")
    for col, just in (("variant", "left"), ("status", "left"), ("dtypes", "left"), (OK, "right"), (MISMATCH, "right"),
                      ("TIMEOUT/CRASH/BUILD", "right"), ("SKIP/NOT-RUN", "right"), ("worst err/tol", "right"),
                      ("time", "right")):  # fmt: skip
        table.add_column(col, justify=just)
    for o in outcomes:
        count = lambda *s: str(sum(c.status in s for c in o.cases))  # noqa: E731
        ratio = o.worst_ratio()
        table.add_row(
            o.variant, styled(o.status), ", ".join(dict.fromkeys(c.case.dtype for c in o.cases)), count(OK), count(MISMATCH), count(TIMEOUT, CRASH, BUILD_FAIL),
            count(SKIP, NOT_RUN), "-" if ratio is None else f"{ratio:.2f}", f"{o.seconds:.1f} s",
        )  # fmt: skip
    console.print(table)
    for o in outcomes:
        shown = 0
        for c in o.cases:
            if c.status in (OK, NOT_RUN) or (c.status == SKIP and shown):
                continue
            if c.status == SKIP:
                console.print(f"[dim]{o.variant}: SKIP {c.case.label()}: {c.detail}[/]")
                shown += 1
                continue
            console.print(f"{o.variant}: {styled(c.status)} {c.case.label()} seed {c.case.seed}")
            if c.max_error is not None:
                console.print(f"    max error {c.max_error:.4g}, tolerance {c.tolerance:.4g}; {c.detail}")
            elif c.detail:
                console.print("    " + c.detail.replace("\n", "\n    "), markup=False)
            for m in c.mismatches:
                b, h, s, d = m["index"]
                console.print(f"    (b={b}, h={h}, s={s}, d={d}): expected {m['expected']:.5g}, got {m['got']:.5g}")
            if c.status in (BUILD_FAIL, CRASH, TIMEOUT) and c.detail:
                break  # the same detail for the rest of the variant's cases

