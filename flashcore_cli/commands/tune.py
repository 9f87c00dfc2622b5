"""`flashcore tune`: search a variant's declared -D parameters; store the fastest correct one for this GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from flashcore_cli.commands.options import (DEFAULT_REPS, DEFAULT_WARMUP, Arch, Causal, Mode, Name, Reps, Warmup,
                                            check_counts)
from flashcore_cli.core.console import console, progress, styled
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, EXIT_OK, FlashcoreError
from flashcore_cli.core.statuses import OK
from flashcore_cli.measure.modes import DEFAULT_MODE


def tune(
    ctx: typer.Context,
    name: Name,
    *,
    param: Annotated[Optional[list[str]], typer.Option("--param", help="NAME=v1,v2 (repeat; default: the registry's values)")] = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D to time at (default: 1,8,512,64)")] = None,
    causal: Causal = False,
    reps: Reps = DEFAULT_REPS,
    warmup: Warmup = DEFAULT_WARMUP,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per trial (after its build)")] = 600.0,
    arch: Arch = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the grid, constraints and ptxas limits only (no GPU)")] = False,
    mode: Mode = DEFAULT_MODE,
) -> int:
    """Search a variant's declared -D parameters; store the fastest correct one for this GPU."""
    return run_tune(ctx.obj["registry"], name, param, shape, causal, reps, warmup, timeout, arch, dry_run, mode)


def run_tune(registry_path, name, param_values, shape_text, causal, reps, warmup, timeout, arch_text, dry_run, mode_text=DEFAULT_MODE) -> int:
    from flashcore_cli.check.correctness import new_seed
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.measure.tune import TrialJob, best_per_gpu, check_cases, grid, parse_params, probe_limits
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.core.records import save_record
    from flashcore_cli.registry.variants import load_registry
    from flashcore_cli.registry.shapes import MISSION_SHAPE, Case, parse_shape
    from flashcore_cli.core.gpu import clocks
    from flashcore_cli.measure.modes import parse_modes
    from flashcore_cli.builder.tuned import store_tuned

    (mode,) = parse_modes(mode_text, several=False)
    reg = load_registry(registry_path)
    variant = reg.get(name)
    params = parse_params(param_values, variant.tune, variant.name)
    candidates = grid(params, variant.tune.constraints)
    shape = parse_shape(shape_text or MISSION_SHAPE)
    reason = variant.unsupported_reason(shape.head_dim, causal, gqa=shape.gqa, seqlen_kv=shape.other_kv_len, seq_len=shape.seq_len)
    if reason:
        raise FlashcoreError(reason)
    check_counts(reps, warmup, timeout)
    arch = target_arch(arch_text)
    sizes = " x ".join(f"{k} ({len(v)})" for k, v in params.items())
    rejected = sum(bool(c.skipped) for c in candidates)
    console.print(f"tune {variant.name}: {sizes} = {len(candidates)} combination(s), {rejected} rejected by the constraints")
    if not dry_run:
        require_gpu("tune")
    with progress() as bar:
        task = bar.add_task(f"ptxas probe on {arch}: registers, shared memory, spills", total=len(candidates) - rejected)
        probe_limits(variant, arch, shape.head_dim, candidates, on_done=lambda c: bar.advance(task))
    runnable = [c for c in candidates if not c.skipped]
    console.print(f"{len(runnable)} to run on the GPU; {len(candidates) - len(runnable)} skipped")
    if dry_run or not runnable:
        render_ranking(candidates, variant.name, f"{shape}{' causal' if causal else ''}", None, mode)
        if not runnable:
            console.print("[bold red]no combination is left to run[/]")
        return EXIT_OK if dry_run else EXIT_CHECK_FAILED

    seed = new_seed()
    case = Case(shape, causal, seed)
    cases = tuple(c.as_dict() for c in check_cases(variant, shape, seed + 1))
    environments, lanes = trials_with_progress(TrialJob(str(reg.path), variant.name, arch, (), cases, case.as_dict(), reps, warmup, timeout, mode),
                                     runnable)  # fmt: skip
    winners = best_per_gpu(candidates)
    record = {
        "kind": "flashcore-tune",
        "mode": mode,
        "variant": variant.name,
        "arch": arch,
        "case": case.as_dict(),
        "check_cases": list(cases),
        "params": params,
        "constraints": variant.tune.constraints,
        "candidates": [c.as_dict() for c in candidates],
        "winners": {gpu: c.defines for gpu, c in winners.items()},
        **lanes,
        "environment": next((e for e in environments if e), {}),
        "clocks_after": clocks(),
    }
    saved = save_record(record, "tune", variant.name)
    render_ranking(candidates, variant.name, case.label(), saved, mode)
    if len({c.lane for c in runnable}) > 1:
        console.print("trials ran on several GPUs of the host: chip-to-chip differences are part of the comparison")
    if not winners:
        console.print("[bold red]no combination passed its checks: nothing stored[/]")
        return EXIT_CHECK_FAILED
    for gpu, c in winners.items():
        path = store_tuned(variant.name, gpu, {k: str(v) for k, v in c.defines.items()},
                           {"median_us": c.median, "mode": mode, "case": case.as_dict(), "key": c.key, "record": str(saved)})  # fmt: skip
        console.print(f"winner on {gpu}: [bold]{c.label}[/] ({c.median:.1f} us); stored in {path}: "
                      f"`flashcore build/test/bench {variant.name}` on this GPU now use it")  # fmt: skip
    return 0


def trials_with_progress(template, runnable: list) -> tuple[list[dict], dict]:
    """measure.tune.run_trials over every visible GPU, under a progress bar with one line per trial."""
    from flashcore_cli.measure.gpus import visible_gpus
    from flashcore_cli.measure.modes import MODES
    from flashcore_cli.measure.tune import run_trials
    from flashcore_cli.registry.shapes import Case

    gpus = visible_gpus() or ["0"]
    console.print(f"trials: check {len(template.cases)} case(s), then time {Case.from_dict(template.case).label()} "
                  f"({template.reps} samples, {MODES[template.mode].title}); {len(gpus)} GPU(s); seed {template.case['seed']}")  # fmt: skip
    with progress() as bar:
        task = bar.add_task(f"{len(runnable)} trial(s)", total=len(runnable))

        def on_trial(c):
            bar.advance(task)
            bar.console.print(f"  {c.label} (gpu {c.lane}): {f'{c.median:.1f} us' if c.median else c.status}")

        return run_trials(template, runnable, gpus, on_trial=on_trial)


def render_ranking(candidates: list, variant: str, case_label: str, saved, mode: str = DEFAULT_MODE) -> None:
    from flashcore_cli.measure.timing import timing_verdict
    from flashcore_cli.measure.tune import ranked

    order = ranked(candidates)
    best = order[0] if order and order[0].median else None
    table = Table(title=f"tune {variant} at {case_label}, {mode} mode" + (f" (record: {saved})" if saved else ""))
    for col, just in (("#", "right"), ("parameters", "left"), ("status", "left"), ("median us", "right"),
                      ("p10-p90 us", "right"), ("vs best", "right"), ("ptxas (kernels used)", "left"), ("note", "left")):  # fmt: skip
        table.add_column(col, justify=just, overflow="fold")
    for rank, c in enumerate(order, 1):
        if c.median:
            same = best is not c and timing_verdict(best.timing, c.timing).word == "same"
            vs = f"{c.median / best.median:.2f}x" + (" (same)" if same else "")
            table.add_row(str(rank), c.label, styled(OK), f"{c.median:.1f}", f"{c.timing['p10_us']:.1f}-{c.timing['p90_us']:.1f}",
                          vs, c.resources, f"gpu {c.lane}")  # fmt: skip
        else:
            status = styled(c.status) if c.status else "[dim]skipped[/]" if c.skipped else "[dim]to run[/]"
            note = c.skipped or (c.detail.splitlines()[0][:120] if c.detail else "")
            table.add_row("-", c.label, status, "-", "-", "-", c.resources, escape(note))
    console.print(table)
    if best:
        console.print("vs best: this median / the best median; (same): within the two runs' p10-p90 spread (compare's rule)")

