"""What each core command does: orchestration and rich rendering. cli.py only parses and calls these."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed

from rich.markup import escape
from rich.table import Table

from flashcore_cli.builder.toolchain import require_cuda_torch
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.modes import DEFAULT_MODE
from flashcore_cli.registry.archs import parse_arch, parse_archs
from flashcore_cli.registry.variants import load_registry
from flashcore_cli.core.console import (
    console,
    dtype_label,
    err_console,
    progress,
    require_gpu,
    short_kernel,
    styled,
    timing_note,
)


def cmd_list(registry_path, check: bool = True) -> int:
    """The registry as a table. With check, first each variant's head dims, dtypes and features are checked
    against what its kernel declares, through the ptxas probe for the default arch (cached probes answer at
    once, the rest compile in parallel, a progress line on stderr): a disagreement is one error line (exit 2);
    a kernel that cannot be probed here (no nvcc, a failed compile) leaves one note under the table."""
    from flashcore_cli.builder.ptxas import DeclarationProbes
    from flashcore_cli.registry.archs import default_arch

    reg = load_registry(registry_path)
    unchecked = None
    if check:
        probes = DeclarationProbes(reg.variants, default_arch())
        if probes.todo and err_console.is_terminal:
            with progress(err_console) as bar:
                task = bar.add_task(f"checking declarations: probing {len(probes.todo)} kernel(s) with nvcc", total=len(probes.todo))
                probes.compile(on_done=lambda: bar.advance(task))
        elif probes.todo:  # no terminal to draw on (a pipe, a file): stderr stays clean for the reader
            probes.compile(on_done=lambda: None)
        problem = probes.disagreement()
        if problem:
            raise problem
        unchecked = probes.unchecked_note()
    show_archs = any(v.archs for v in reg.variants)  # a column only when some variant runs on some GPUs only
    table = Table(title=f"flashcore variants ({reg.path})")
    for col in ("name", "aliases", "head dims", "causal", "dtypes", "features", *(["archs"] if show_archs else []), "sources",
                "summary"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for v in reg.variants:
        table.add_row(
            v.name,
            ", ".join(v.aliases),
            ", ".join(map(str, v.head_dims)),
            "yes" if v.causal else "no",
            ", ".join(v.dtypes),
            ", ".join(v.features) + (f"{', ' if v.features else ''}S <= {v.max_seq_len}" if v.max_seq_len else "") or "-",
            *([", ".join(v.archs) or "any"] if show_archs else []),
            "\n".join(str(p.relative_to(reg.root)) for p in v.sources),
            v.summary,
        )
    console.print(table)
    if unchecked:
        err_console.print(f"[yellow]note:[/] {escape(unchecked)}", highlight=False, soft_wrap=True)
    return 0


# ---------------------------------------------------------------- build
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
    arch = parse_arch(arch) if arch else parse_archs(None)[0]
    usable_cache()
    require_cuda_torch()
    results = {}
    for v in variants:  # not with a tuned winner stored: which applies depends on the GPU's name (torch's)
        hit = None if force or has_tuned(v.name) else find_cached(v, arch)
        if hit is not None:
            results[v.name] = WorkerOutcome(status="done", events=[{"event": "built", **hit}])
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
                    bar.advance(task)
                    bar.console.print(f"  {v.name}: {_build_word(outcome)}")
    failed = 0
    table = Table(title=f"builds ({arch})")
    for col in ("variant", "status", "key", "time", "kernels (ptxas)"):
        table.add_column(col, overflow="fold")
    for v in variants:
        outcome = results[v.name]
        b = outcome.built
        if b:
            table.add_row(v.name, styled("OK"), b["key"], _build_word(outcome), escape("\n".join(b["resources"])))  # "[sm_90]" is no markup
            if verbose:
                console.print(f"[dim]{v.name}: {b['directory']}/build.log[/]")
        else:
            failed += 1
            detail = classify(outcome, answered=False, wording=LAST_WORDS).detail  # its answer is the build
            table.add_row(v.name, styled("BUILD-FAIL"), "", "", escape(detail))
    console.print(table)
    return 1 if failed else 0


def _usable_paths(json_path, results: bool = False) -> None:
    """The cache the builds write, the results folder and the --json file, checked before any work (one line,
    exit 2)."""
    from flashcore_cli.core.records import RESULTS_ENV, output_file, results_dir, usable_cache, usable_folder

    usable_cache()
    if results:
        usable_folder(results_dir(), RESULTS_ENV, "results")
    if json_path:
        output_file(json_path, "--json")


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


# ---------------------------------------------------------------- ptxas
def cmd_ptxas(registry_path, names, all_, arch_text, json_path, fail_on_spill) -> int:
    import json

    from flashcore_cli.builder.ptxas import TRIVIAL_REGISTERS, report_all
    from flashcore_cli.core.records import output_file, write_output

    reg = load_registry(registry_path)
    variants = reg.select(names, all_)
    archs = parse_archs(arch_text)
    if json_path:
        output_file(json_path, "--json")  # a folder or an unwritable path: refused before the compiles
    with progress() as bar:
        task = bar.add_task(f"nvcc -Xptxas -v: {len(variants)} variant(s) x {', '.join(archs)}", total=len(variants) * len(archs))
        reports = report_all(variants, archs, on_done=lambda r: bar.advance(task))
    table = Table(title="ptxas resources (per __global__ kernel)")
    for col, just in (("variant", "left"), ("kernel", "left"), ("arch", "left"), ("regs", "right"), ("static smem", "right"),
                      ("dyn smem", "right"), ("spill st/ld", "right"), ("stack", "right"), ("threads", "right"),
                      ("CTAs/SM", "right")):  # fmt: skip
        table.add_column(col, justify=just, overflow="fold")
    errors = spills = 0
    for r in reports:
        if r.not_built:
            table.add_row(r.variant, f"[dim]not built for {r.arch} ({r.not_built})[/]", r.arch, *[""] * 7)
            continue
        if r.error:
            errors += 1
            table.add_row(r.variant, f"[red]compile failed[/]\n{r.error}", r.arch, *[""] * 7)
            continue
        for k in r.kernels:
            spill = f"{k.spill_stores}/{k.spill_loads}"
            if k.spills:
                spills += 1
                spill = f"[bold red]{spill}[/]"
            occ = "-" if k.ctas_per_sm is None else f"{k.ctas_per_sm} ({k.limiter})"
            regs = f"[bold yellow]{k.registers}[/]" if r.warnings and k.registers <= TRIVIAL_REGISTERS and not k.static_smem else str(k.registers)
            table.add_row(
                r.variant, short_kernel(k.kernel), r.arch, regs, _kb(k.static_smem),
                "-" if k.dynamic_smem is None else _kb(k.dynamic_smem), spill, f"{k.stack_frame} B",
                "-" if k.threads is None else str(k.threads), occ,
            )  # fmt: skip
    console.print(table)
    for r in reports:
        for warning in r.warnings:
            err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if json_path:
        write_output(json_path, json.dumps({"kind": "flashcore-ptxas", "reports": [r.as_dict() for r in reports]}, indent=1, default=str), "--json")
        console.print(f"wrote {json_path}")
    if errors:
        err_console.print(f"[red]{errors} compile(s) failed[/]")
        return 1
    if fail_on_spill and spills:
        err_console.print(f"[red]{spills} kernel(s) spill registers[/]")
        return 1
    return 0


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n else "0"


# ---------------------------------------------------------------- test
def cmd_test(registry_path, names, all_, shapes_text, timeout, json_path, seed, arch) -> int:
    from flashcore_cli.check.correctness import new_seed, plan_cases, run_variant, write_json
    from flashcore_cli.registry.shapes import parse_shapes

    reg = load_registry(registry_path)
    variants = reg.select(names, all_)
    shapes = parse_shapes(shapes_text)
    if timeout <= 0:
        raise FlashcoreError("--timeout must be positive (seconds)")
    _usable_paths(json_path)
    require_gpu("test")
    arch = parse_arch(arch) if arch else parse_archs(None)[0]
    seed = seed if seed is not None else new_seed()
    console.print(f"seed {seed} (case i uses seed {seed}+i); timeout {timeout:.0f} s per variant after its build; arch {arch}")
    outcomes = []
    with progress() as bar:
        for v in variants:
            cases = plan_cases(v, shapes, seed)
            task = bar.add_task(f"{v.name}: building", total=len(cases))

            def on_event(e, task=task, name=v.name):
                kind = e.get("event")
                if kind == "built":
                    bar.update(task, description=f"{name}: checking")
                elif kind == "case":
                    bar.advance(task)
                elif kind == "case-start":
                    c = e["case"]
                    bar.update(task, description=f"{name}: {c['shape']}{' causal' if c['causal'] else ''} {c.get('dtype', 'fp16')}")

            outcome = run_variant(reg, v, cases, arch=arch, timeout=timeout, on_event=on_event)
            bar.update(task, completed=len(cases))
            bar.console.print(f"  {v.name}: {styled(outcome.status)} ({outcome.seconds:.1f} s)")
            outcomes.append(outcome)
    _render_test(outcomes)
    if json_path:
        write_json(json_path, {"kind": "flashcore-test", "seed": seed, "arch": arch, "variants": [o.as_dict() for o in outcomes]})
        console.print(f"wrote {json_path}")
    return 1 if any(o.failed for o in outcomes) else 0


def _render_test(outcomes) -> None:
    table = Table(title="correctness: max|out - ref| <= max(1 ulp at 1.0, 2 x SDPA's error in the same dtype), fp32 reference")
    for col, just in (("variant", "left"), ("status", "left"), ("dtypes", "left"), ("OK", "right"), ("MISMATCH", "right"),
                      ("TIMEOUT/CRASH/BUILD", "right"), ("SKIP/NOT-RUN", "right"), ("worst err/tol", "right"),
                      ("time", "right")):  # fmt: skip
        table.add_column(col, justify=just)
    for o in outcomes:
        count = lambda *s: str(sum(c.status in s for c in o.cases))  # noqa: E731
        ratio = o.worst_ratio()
        table.add_row(
            o.variant, styled(o.status), ", ".join(dict.fromkeys(c.case.dtype for c in o.cases)), count("OK"), count("MISMATCH"), count("TIMEOUT", "CRASH", "BUILD-FAIL"),
            count("SKIP", "NOT-RUN"), "-" if ratio is None else f"{ratio:.2f}", f"{o.seconds:.1f} s",
        )  # fmt: skip
    console.print(table)
    for o in outcomes:
        shown = 0
        for c in o.cases:
            if c.status in ("OK", "NOT-RUN") or (c.status == "SKIP" and shown):
                continue
            if c.status == "SKIP":
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
            if c.status in ("BUILD-FAIL", "CRASH", "TIMEOUT") and c.detail:
                break  # the same detail for the rest of the variant's cases


# ---------------------------------------------------------------- bench
def cmd_bench(registry_path, names, all_, shape_text, causal, reps, warmup, json_path, timeout, seed, arch, mode=DEFAULT_MODE,
              dtype_text="fp16", pass_text="fwd", pair=None) -> int:  # fmt: skip
    from flashcore_cli.measure.bench import MIN_REPS, BenchRun, bench_references, bench_variant, finish
    from flashcore_cli.measure.references import REFERENCE_ROWS
    from flashcore_cli.check.correctness import new_seed, write_json
    from flashcore_cli.registry.shapes import MISSION_SHAPE, Case, parse_dtype, parse_pass, parse_shape
    from flashcore_cli.measure.modes import MODES, parse_modes

    modes = parse_modes(mode)
    dtype = parse_dtype(dtype_text)
    passes = parse_pass(pass_text)
    reg = load_registry(registry_path)
    variants = reg.select(names, True) if not names else reg.select(names, all_)
    shape = parse_shape(shape_text or MISSION_SHAPE)
    if reps < MIN_REPS:
        raise FlashcoreError(f"--reps {reps}: at least {MIN_REPS} timed calls are needed for a median and p10/p90")
    if warmup < 1:
        raise FlashcoreError("--warmup must be at least 1")
    if timeout <= 0:
        raise FlashcoreError("--timeout must be positive (seconds)")
    if pair is not None and pair not in REFERENCE_ROWS:
        raise FlashcoreError(f"--pair {pair!r}: expected a reference row, one of {', '.join(REFERENCE_ROWS)}")
    if pair is not None and modes != ["cold"]:
        raise FlashcoreError(f"--pair: paired samples are taken in cold mode only (not --mode {','.join(modes)})")
    _usable_paths(json_path, results=True)
    require_gpu("bench")
    arch = parse_arch(arch) if arch else parse_archs(None)[0]
    seed = seed if seed is not None else new_seed()
    case = Case(shape, causal, seed, dtype=dtype, grads=passes != "fwd")
    run = BenchRun(shape, causal, seed, modes, dtype=dtype, passes=passes)
    console.print(f"bench {shape}{' causal' if causal else ''}{dtype_label(dtype)}{pass_label(passes)}: {reps} samples per "
                  f"row and mode; seed {seed}")  # fmt: skip
    for m in modes:
        console.print(f"  {MODES[m].title}")
    with progress() as bar:
        task = bar.add_task("references (SDPA backends, Triton)", total=len(variants) + 1)
        refs, run.environment = bench_references(case, reps=reps, warmup=warmup, timeout=timeout, modes=modes,
                                                 passes=passes)  # fmt: skip
        run.add(refs)
        bar.advance(task)
        for v in variants:
            bar.update(task, description=f"{v.name}: build, check, time")
            rows = bench_variant(reg, v, case, arch=arch, reps=reps, warmup=warmup, timeout=timeout, modes=modes,
                                 passes=passes, pair=pair or "")  # fmt: skip
            run.add({m: [row, *([row.paired] if row.paired else [])] for m, row in rows.items()})
            bar.advance(task)
    finish(run)
    render_bench(run)
    from flashcore_cli.core.records import save_record

    record = run.record()
    saved = save_record(record, "bench", f"{shape}{'-causal' if causal else ''}{'' if dtype == 'fp16' else '-' + dtype}"
                                         f"{'' if passes == 'fwd' else '-' + passes}")  # fmt: skip
    console.print(f"record: {saved}")
    if json_path:
        write_json(json_path, record)
        console.print(f"wrote {json_path}")
    return 0


BYTES_COUNTED = {"fwd": "Q, K, V read, O written", "bwd": "Q, K, V, O, dO read, dQ, dK, dV written",
                 "fwd+bwd": "the forward's and the backward's"}  # fmt: skip


def pass_label(passes: str) -> str:
    return "" if passes == "fwd" else f" ({passes})"


def render_bench(run) -> None:
    """One table per mode, its title naming the mode; speedups against SDPA in the same mode; each row's place
    against the GPU's tensor and memory peaks (roofline.py)."""
    from flashcore_cli.measure.bench import sdpa_median
    from flashcore_cli.measure.roofline import roofline

    env = run.environment
    peaks = run.peaks
    for mode in run.modes:
        title = (
            f"{run.shape}{' causal' if run.causal else ''}{dtype_label(run.dtype)}{pass_label(run.passes)} on "
            f"{env.get('gpu', '?')}, {mode} mode (torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
            f"driver {env.get('driver', '?')})"
        )
        table = Table(title=title)
        for col, just in (("name", "left"), ("status", "left"), ("median us", "right"), ("p10 us", "right"),
                          ("p90 us", "right"), ("TFLOP/s", "right"), ("% tensor", "right"), ("GB/s", "right"),
                          ("% memory", "right"), ("bound", "left"), ("vs SDPA", "right"), ("note", "left")):  # fmt: skip
            table.add_column(col, justify=just, overflow="fold")
        rows = run.rows.get(mode, [])
        sdpa = sdpa_median(rows)
        for r in rows:
            if r.median:
                tflops = run.flops / (r.median * 1e-6) / 1e12
                roof = roofline(run.flops, run.bytes_moved, r.median, peaks)
                pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
                speed = f"{sdpa / r.median:.2f}x" if sdpa else "-"
                table.add_row(
                    r.name, styled(r.status), f"{r.median:.1f}", f"{r.timing['p10_us']:.1f}", f"{r.timing['p90_us']:.1f}",
                    f"{tflops:.1f}", pct(roof.tensor_fraction), f"{roof.gbps:.0f}", pct(roof.memory_fraction), roof.bound,
                    speed, timing_note(r.kind, r.timing) + (f", {r.detail}" if r.detail else ""),
                )  # fmt: skip
            else:
                table.add_row(r.name, styled(r.status), *["-"] * 9,
                              (r.detail or "").splitlines()[0][:120] if r.detail else "")  # fmt: skip
        console.print(table)
        for r in rows:  # --pair: the two rows of each pair, timed in turn
            mine = next((x for x in rows if x.name == r.paired_with and x.kind == "variant"), None)
            if r.paired_with and r.median and mine is not None and mine.median:
                console.print(f"{mine.name} vs {r.name}, samples taken in turn (one clock and power state): "
                              f"{r.median / mine.median:.2f}x ({r.name}'s median / {mine.name}'s)")  # fmt: skip
    if peaks is not None and peaks.tensor_tflops:
        console.print(f"peaks ({env.get('gpu', '?')}): tensor {peaks.tensor_tflops:.0f} TFLOP/s dense 16-bit "
                      f"({peaks.sm_count} SMs x {peaks.sm_clock_mhz} MHz x {peaks.tensor_flops_per_sm_clock} FLOP/clock), "
                      f"memory {peaks.memory_gbps:.0f} GB/s (2 x {peaks.memory_clock_mhz} MHz x {peaks.bus_width_bits} bit / 8); "
                      f"bytes: {run.bytes_moved / 1e6:.1f} MB per call ({BYTES_COUNTED[run.passes]})")  # fmt: skip
    console.print("vs SDPA: SDPA default's median / this row's median, in the same mode (above 1: faster than SDPA)")
