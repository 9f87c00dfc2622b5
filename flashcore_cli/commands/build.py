"""`flashcore build`: JIT-build variants into the content-addressed cache, a worker per build."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Annotated

import typer
from rich.table import Table

from flashcore_cli.builder.toolchain import require_cuda_torch
from flashcore_cli.commands.options import All, Arch, Names
from flashcore_cli.core.console import console, progress, styled
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, EXIT_OK
from flashcore_cli.core.events import Event
from flashcore_cli.core.statuses import BUILD_FAIL, OK
from flashcore_cli.registry.archs import target_arch
from flashcore_cli.registry.variants import load_registry


def build(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    arch: Arch = None,
    force: Annotated[bool, typer.Option("--force", help="rebuild even when the cache has this exact build")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="print where each build log is")] = False,
) -> int:
    """JIT-build variants (torch cpp_extension + ninja) into the content-addressed cache; print ptxas resources."""
    return cmd_build(ctx.obj["registry"], names, all_, arch, force, verbose)


def cmd_build(registry_path, names, all_, arch, force, verbose) -> int:
    """A cached build is answered here, without a worker or torch (its build.json is written only after the
    module was built and imported once); the rest build in parallel workers, one per variant (the first that
    needs the shared binding compiles it, the others wait for it)."""
    from rich.markup import escape

    from flashcore_cli.builder.jit import find_cached
    from flashcore_cli.builder.tuned import has_tuned
    from flashcore_cli.core.isolate import WorkerOutcome, run_worker, stop_on_interrupt
    from flashcore_cli.core.protocol import LAST_WORDS, WorkRequest, classify
    from flashcore_cli.core.records import usable_cache

    reg = load_registry(registry_path)
    variants = reg.select(names, all_)
    arch = target_arch(arch)
    usable_cache()
    require_cuda_torch()
    results = {}
    for v in variants:  # not with a tuned winner stored: which applies depends on the GPU's name (torch's)
        hit = None if force or has_tuned(v.name) else find_cached(v, arch)
        if hit is not None:
            results[v.name] = WorkerOutcome(status="done", events=[{"event": Event.BUILT, **hit}])
    todo = [v for v in variants if v.name not in results]
    cores = os.cpu_count() or 1
    parallel = max(1, min(len(todo), cores))  # a build is one nvcc and a small link: one worker per variant
    os.environ.setdefault("MAX_JOBS", str(max(2, cores // parallel)))  # ninja jobs per build (its entry point, its .cu)
    if todo:
        with progress() as bar:
            task = bar.add_task(f"building {len(todo)} variant(s) for {arch}", total=len(todo))

            def one(v):
                return v, run_worker(WorkRequest("build", str(reg.path), v.name, arch, force=force), run_timeout=60)

            with ThreadPoolExecutor(max_workers=parallel) as pool, stop_on_interrupt(pool):  # Ctrl-C: 130 at once
                for fut in as_completed([pool.submit(one, v) for v in todo]):
                    v, outcome = fut.result()
                    results[v.name] = outcome
                    bar.update(task, advance=1, done=v.name)
                    bar.console.print(f"  {v.name}: {_build_word(outcome)}")
    failed = 0
    table = Table(title=f"builds ({arch})")
    for col in ("variant", "status", "key", "time", "kernels (ptxas)"):
        table.add_column(col, overflow="fold")
    for v in variants:
        outcome = results[v.name]
        b = outcome.built
        if b:
            table.add_row(v.name, styled(OK), b["key"], _build_word(outcome), escape("\n".join(b["resources"])))  # "[sm_90]" is no markup
            if verbose:
                console.print(f"[dim]{v.name}: {b['directory']}/build.log[/]")
        else:
            failed += 1
            detail = classify(outcome, answered=False, wording=LAST_WORDS).detail  # its answer is the build
            table.add_row(v.name, styled(BUILD_FAIL), "", "", escape(detail))
    console.print(table)
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _build_word(outcome) -> str:
    """'cached' (found by the CLI, not loaded), 'cached, load 0.05 s' (loaded by a worker), 'built in 4.1 s'
    (+ the shared binding's compile when this build made it)."""
    b = outcome.built
    if not b:
        return "[bold yellow]BUILD-FAIL[/]"
    if b["cached"]:
        return "cached" if b.get("load_seconds") is None else f"cached, load {b['load_seconds']:.2f} s"
    binding = b.get("binding") or {}
    extra = "" if binding.get("cached", True) else f" (+ the shared binding, built in {binding['build_seconds']:.1f} s)"
    return f"built in {b['build_seconds']:.1f} s{extra}"

