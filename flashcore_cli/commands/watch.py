"""`flashcore watch`: on every save of a variant's sources, rebuild, check and (--bench) time."""

from __future__ import annotations

import math
import time
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from flashcore_cli.commands.options import (DEFAULT_REPS, Arch, Causal, Dtype, Name, Reps, Sinks, Softcap, Window, check_positive,
                                            check_reps, check_timeout, family_options)
from flashcore_cli.core.console import console, styled
from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.errors import EXIT_INTERRUPTED
from flashcore_cli.core.statuses import BUILD_FAIL, SKIP


def watch(
    ctx: typer.Context,
    name: Name,
    *,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="B,H,S,D to check at (repeat; default 1,8,512,64); the first is timed")] = None,
    causal: Causal = False,
    bench: Annotated[bool, typer.Option("--bench", help="also time the first shape (cold) beside SDPA and the previous build")] = False,
    dtype: Dtype = DEFAULT_DTYPE,
    arch: Arch = None,
    interval: Annotated[float, typer.Option("--interval", help="seconds between two looks at the files")] = 0.2,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per check or timing (after its build)")] = 120.0,
    reps: Reps = DEFAULT_REPS,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """On every save of a variant's sources: rebuild, check, (--bench) time; errors shown, the loop goes on."""
    return run_watch(ctx.obj["registry"], name, shape, causal, bench, dtype, arch, interval, timeout, reps,
                     family_options(window, softcap, sinks))  # fmt: skip


def render_iteration(console, it, history: list, *, title: str, clear: bool) -> None:
    """A compact screen: build, status, max error vs tolerance, the time beside SDPA and the previous build,
    the ptxas deltas, the first errors or mismatches; one line of history."""
    from flashcore_cli.loop.watch import BENCH_MODE

    if clear:
        console.clear()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("changed", f"{escape(', '.join(it.changed))}  [dim]{time.strftime('%H:%M:%S')}, iteration took {it.seconds:.1f} s[/]")
    b = it.build
    if b:
        built = "cached" if b.get("cached") else f"built in {b.get('build_seconds', 0):.1f} s"
        binding = b.get("binding") or {}
        if binding and not binding.get("cached", True):
            built += f" (+ the shared binding, {binding.get('build_seconds', 0):.1f} s)"
        grid.add_row("build", f"{built}  [dim]key {b.get('key', '')}[/]")
    elif it.status == BUILD_FAIL:
        grid.add_row("build", "[bold yellow]failed[/] (the compiler's first errors below)")
    counts = {}
    for c in it.cases:
        counts[c.status] = counts.get(c.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    grid.add_row("status", f"{styled(it.status)}" + (f"  [dim]({summary})[/]" if summary else ""))
    worst = it.worst
    if worst is not None:
        ratio = worst.max_error / worst.tolerance
        grid.add_row("max error", f"{worst.max_error:.3g} vs tolerance {worst.tolerance:.3g} ({ratio:.2f}x)  [dim]{escape(worst.case.label())}[/]")
    if it.median_us is not None:
        parts = [f"{it.median_us:.1f} us median ({BENCH_MODE})"]
        if it.sdpa_us:
            parts.append(f"vs SDPA {it.sdpa_us:.1f} us: {it.sdpa_us / it.median_us:.2f}x")
        if it.previous_us:
            parts.append(f"vs previous {it.previous_us:.1f} us: {_change(it)}")
        grid.add_row("time", "   ".join(parts))
    elif it.bench_note:
        grid.add_row("time", escape(it.bench_note))
    if it.resources is not None:
        if it.deltas:
            grid.add_row("ptxas", escape("\n".join(it.deltas)))
        else:
            grid.add_row("ptxas", escape(_resources_line(it.resources)) + ("" if len(history) < 2 else "  [dim](no change)[/]"))
    if it.errors:
        grid.add_row("errors" if it.status != SKIP else "skip", f"[red]{escape(it.errors)}[/]" if it.status != SKIP else escape(it.errors))
    mismatches = it.mismatch_lines()
    if mismatches:
        grid.add_row("mismatch", f"[red]{escape(chr(10).join(mismatches))}[/]")
    recent = history[-8:]
    grid.add_row("history", "  ".join(f"#{h.number} {styled(h.status)}" for h in recent))
    console.print(Panel(grid, title=escape(f"{title} · #{it.number}"), title_align="left", expand=False))
    console.print("[dim]watching for saves; Ctrl-C stops[/]")


def _resources_line(resources: list) -> str:
    from flashcore_cli.builder.ptxas import kernel_base_name

    return "; ".join(f"{kernel_base_name(k.kernel)} {k.registers} regs, {k.spills} B spills" for k in resources) or "no kernels"


def run_watch(registry_path, name: str, shape_values: list[str] | None, causal: bool, bench: bool, dtype_text: str,
              arch_text: str | None, interval: float, timeout: float, reps: int, family=None) -> int:  # fmt: skip
    from flashcore_cli.check.correctness import new_seed
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.loop.watch import BENCH_MODE, Watcher, worker_steps
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.registry.shapes import MISSION_SHAPE, parse_dtype, parse_shapes
    from flashcore_cli.registry.variants import load_registry, require_runnable

    shapes = parse_shapes(shape_values) or parse_shapes([MISSION_SHAPE])
    dtype = parse_dtype(dtype_text)
    check_positive(interval, "--interval")
    check_timeout(timeout)
    if bench:
        check_reps(reps)
    variant = load_registry(registry_path).get(name)  # an unknown name fails here, before anything runs
    variant_name = variant.name
    arch = target_arch(arch_text)
    require_runnable([variant], shapes, causal=causal, dtype=dtype, family=family)  # the arguments first, then the GPU
    require_gpu("watch")
    seed = new_seed()
    steps = worker_steps(registry_path, variant_name, shapes, causal=causal, dtype=dtype, arch=arch, timeout=timeout,
                         seed=seed, bench=bench, reps=reps, family=family)  # fmt: skip
    what = f"{', '.join(map(str, shapes))}{' causal' if causal else ''}{family.label(causal) if family else ''} {dtype}"
    title = f"flashcore watch {variant_name} · {what} · {arch}" + (f" · bench {BENCH_MODE}" if bench else "")
    console.print(f"watching {variant_name} ({what}, {arch}); seed {seed}; Ctrl-C stops")
    watcher = Watcher(steps, lambda it, hist: render_iteration(console, it, hist, title=title, clear=console.is_terminal),
                      interval=interval)  # fmt: skip
    code = watcher.run()
    if code == EXIT_INTERRUPTED:
        console.print("[yellow]stopped[/] (Ctrl-C)")
    return code


def _change(it) -> str:
    """This build against the previous one, by the rule `compare` uses: "same (within noise)" when the medians
    differ by less than either row's half p10-p90 spread; the factor faster or slower otherwise."""
    from flashcore_cli.measure.timing import timing_verdict

    rows = (it.previous_timing, it.timing)
    if all(r.get(k) is not None for r in rows for k in ("median_us", "p10_us", "p90_us")):
        verdict = timing_verdict(*rows, threshold=math.inf)
        return "same (within noise)" if verdict.word == "same" else verdict.text()
    change = it.previous_us / it.median_us
    return f"{change:.2f}x {'faster' if change >= 1 else 'slower'}"

