"""`flashcore sanitize`, `profile` and `sass`: a variant under compute-sanitizer, Nsight Compute, cuobjdump."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from flashcore_cli.core.console import console, err_console, short_kernel, status
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, EXIT_OK, FlashcoreError
from flashcore_cli.commands.options import Arch, Causal, Name, Sinks, Softcap, Window, check_timeout, family_options
from flashcore_cli.core.statuses import CRASH, TIMEOUT
from flashcore_cli.registry.family import DENSE


def sanitize(
    ctx: typer.Context,
    name: Name,
    *,
    tool: Annotated[str, typer.Option("--tool", help="memcheck, racecheck, synccheck or initcheck")] = "memcheck",
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D (default: 1,2,97,<first head dim>)")] = None,
    causal: Causal = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the sanitized run before it is killed")] = 600.0,
    show: Annotated[int, typer.Option("--show", help="how many reported problems to print")] = 5,
    arch: Arch = None,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """Run a variant once on a small shape under compute-sanitizer; exit 1 on any error."""
    return run_sanitize(ctx.obj["registry"], name, tool, shape, causal, timeout, show, arch, family_options(window, softcap, sinks))


def profile(
    ctx: typer.Context,
    name: Name,
    *,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D (default: the mission shape 1,8,512,64)")] = None,
    causal: Causal = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the profiled run before it is killed")] = 600.0,
    arch: Arch = None,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """Nsight Compute on a variant's kernels only (clocks not locked): a short table, the .ncu-rep kept."""
    return run_profile(ctx.obj["registry"], name, shape, causal, timeout, arch, family_options(window, softcap, sinks))


def sass(
    ctx: typer.Context,
    name: Name,
    *,
    arch: Arch = None,
    out: Annotated[Optional[str], typer.Option("--out", help="write the whole SASS listing to this file")] = None,
) -> int:
    """The SASS of a variant's kernels (cuobjdump) and its instruction mix — no GPU needed."""
    return run_sass(ctx.obj["registry"], name, arch, out)


def run_sanitize(registry_path, name: str, tool: str, shape_text: str | None, causal: bool, timeout: float, show: int, arch_text,
                 family=None) -> int:  # fmt: skip
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.core.protocol import classify
    from flashcore_cli.inspect.launch import build_first, launch_under
    from flashcore_cli.inspect.sanitize import DEFAULT_SEQ_LEN, TOOLS, parse_sanitizer, sanitizer_command
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.core.records import save_record
    from flashcore_cli.registry.variants import load_registry
    from flashcore_cli.registry.shapes import Case, parse_shape

    if tool not in TOOLS:
        raise FlashcoreError(f"unknown sanitizer tool '{tool}' (one of: {', '.join(TOOLS)})")
    check_timeout(timeout)
    if show < 0:
        raise FlashcoreError(f"--show {show}: how many problems to print, 0 or more")
    arch = target_arch(arch_text)  # every argument checked before the tools and the GPU
    reg = load_registry(registry_path)
    variant = reg.get(name)
    shape = parse_shape(shape_text or f"1,2,{DEFAULT_SEQ_LEN},{variant.head_dims[0]}")
    family = family or DENSE
    reason = variant.unsupported_reason(shape.head_dim, causal, gqa=shape.gqa, seqlen_kv=shape.other_kv_len, seq_len=shape.seq_len,
                                        **family.normalized(causal, shape.seq_len, shape.seq_len_kv).needs(causal))  # fmt: skip
    if reason:
        raise FlashcoreError(reason)
    case = Case(shape, causal, seed=1, family=family)
    with tempfile.TemporaryDirectory(prefix="flashcore-sanitize-") as tmp:
        log = Path(tmp) / "sanitizer.log"
        prefix = sanitizer_command(tool, log)
        require_gpu("sanitize")
        build_first(reg, variant, arch, "sanitize")
        outcome = launch_under(prefix, reg, variant, arch, case, timeout=timeout, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        text = log.read_text(errors="replace") if log.is_file() else ""
    title = f"compute-sanitizer {tool}: {variant.name} on {case.label()} ({arch})"
    if not text.strip():
        raise FlashcoreError(f"{title}: compute-sanitizer wrote no log (worker {outcome.status}):\n{outcome.log_tail}", exit_code=EXIT_CHECK_FAILED)
    report = parse_sanitizer(text, tool)
    worker = {"status": outcome.status, "returncode": outcome.returncode, "crash": outcome.crash_errors}
    record = {"kind": "flashcore-sanitize", "variant": variant.name, "case": case.as_dict(), "arch": arch, "worker": worker, **report.as_dict()}
    saved = save_record(record, "sanitize", f"{variant.name}-{tool}")
    saved.with_suffix(".log").write_text(text)

    render_sanitize(report, title, show)
    crashed = classify(outcome).status in (TIMEOUT, CRASH)  # the sanitized run itself failed
    _print_verdict(report, crashed, worker, f"{tool}, {variant.name}, {case.label()}")
    _print(f"full log: {saved.with_suffix('.log')}; record: {saved}")
    return EXIT_CHECK_FAILED if report.errors or crashed else EXIT_OK


def render_sanitize(report, title: str, show: int) -> None:
    shown = report.issues[: max(show, 0)]
    if not shown:
        return
    table = Table(title=f"{title}: first {len(shown)} of the reports")
    for col in ("#", "severity", "what", "kernel", "source", "thread", "detail"):
        table.add_column(col, overflow="fold")
    for i, issue in enumerate(shown, 1):
        style = "bold red" if issue.severity == "error" else "yellow"
        source = Path(issue.where).name if issue.where else "-"  # the full path is in the log and the record
        cells = [issue.what, short_kernel(issue.kernel), source, issue.thread or "-", "\n".join(issue.details[:2])]
        table.add_row(str(i), f"[{style}]{issue.severity}[/]", *map(escape, cells))
    console.print(table)


def _print_verdict(report, crashed: bool, worker: dict, where: str) -> None:
    warned = f", {report.warnings} warning(s)" if report.warnings else ""
    if report.errors:
        _print(f"[bold red]{report.errors} error(s){warned}[/] ({where})")
    else:
        _print(f"[green]clean: 0 errors{warned}[/] ({where})")
    if crashed:
        why = worker["crash"][0] if worker["crash"] else f"worker {worker['status']}, exit {worker['returncode']}"
        _print(f"[bold red]the sanitized run itself failed:[/] {escape(why)}")


def _print(text: str) -> None:
    console.print(text, highlight=False)


def run_profile(registry_path, name: str, shape_text: str | None, causal: bool, timeout: float, arch_text, family=None) -> int:
    from flashcore_cli.builder.cudatools import require
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.inspect.profile import collect, function_name, kernel_regex
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.inspect.launch import build_first, launch_under
    from flashcore_cli.builder.ptxas import compile_probe
    from flashcore_cli.core.records import save_record
    from flashcore_cli.core.gpu import first_gpu
    from flashcore_cli.registry.variants import load_registry
    from flashcore_cli.registry.shapes import MISSION_SHAPE, Case, parse_shape

    check_timeout(timeout)
    reg = load_registry(registry_path)
    variant = reg.get(name)
    shape = parse_shape(shape_text or MISSION_SHAPE)
    family = family or DENSE
    reason = variant.unsupported_reason(shape.head_dim, causal, gqa=shape.gqa, seqlen_kv=shape.other_kv_len, seq_len=shape.seq_len,
                                        **family.normalized(causal, shape.seq_len, shape.seq_len_kv).needs(causal))  # fmt: skip
    if reason:
        raise FlashcoreError(reason)
    arch = target_arch(arch_text)  # every argument checked before the tools and the GPU
    ncu = require("ncu", "`flashcore profile`")
    require_gpu("profile")
    case = Case(shape, causal, seed=1, family=family)
    with status(f"building {variant.name} for {arch}; reading its kernel names (ptxas)"):
        probe = compile_probe(variant, arch)
        if probe.error:
            raise FlashcoreError(f"{variant.name}: the compile failed, nothing to profile:\n{probe.error}", exit_code=EXIT_CHECK_FAILED)
        build_first(reg, variant, arch, "profile")
    regex = kernel_regex([function_name(k.kernel) for k in probe.kernels])

    with tempfile.TemporaryDirectory(prefix="flashcore-ncu-") as tmp:
        with status(f"ncu: {variant.name} on {case.label()} (kernels {regex[6:]})"):
            report, kernels, dropped = collect(
                ncu, regex, lambda prefix: launch_under(prefix, reg, variant, arch, case, timeout=timeout), Path(tmp)
            )
        gpu = first_gpu("name,driver_version")
        record = {
            "kind": "flashcore-profile",
            "variant": variant.name,
            "case": case.as_dict(),
            "arch": arch,
            "gpu": gpu,
            "clock_control": "none",
            "metrics_not_available": dropped,
            "kernels": [k.summary() for k in kernels],
        }
        saved = save_record(record, "profile", f"{variant.name}-{shape}{'-causal' if causal else ''}")
        kept = saved.with_suffix(".ncu-rep")
        shutil.move(str(report), kept)

    render_profile(kernels, f"ncu: {variant.name} on {case.label()} ({gpu.get('name', arch)}, clocks not locked)")
    if dropped:
        console.print(f"[yellow]not available on this GPU / ncu:[/] {', '.join(dropped)}")
    console.print(f"report: {kept} (open it in Nsight Compute, or `ncu --import {kept} --page details`); record: {saved}")
    return 0


def render_profile(kernels: list, title: str) -> None:
    def pct(v):
        return "n/a" if v is None else f"{v:.1f}%"

    def rate(p, b):
        return pct(p) + ("" if b is None else f" ({b / 1e9:.0f} GB/s)")

    table = Table(title=title)
    table.add_column("metric")
    for k in kernels:
        table.add_column(f"#{k.launch_id} {short_kernel(k.name)}", justify="right")
    summaries = [k.summary() for k in kernels]
    rows = [
        ("duration", [("n/a" if s["duration_us"] is None else f"{s['duration_us']:.2f} us") for s in summaries]),
        ("grid x block", [f"{k.grid} x {k.block}" for k in kernels]),
        ("SM throughput", [pct(s["sm_throughput_pct"]) for s in summaries]),
        ("tensor pipe (HMMA / GMMA)", [f"{pct(s['tensor_hmma_pct'])} / {pct(s['tensor_gmma_pct'])}" for s in summaries]),
        ("DRAM throughput", [rate(s["dram_pct"], s["dram_bytes_per_s"]) for s in summaries]),
        ("L2 throughput", [rate(s["l2_pct"], s["l2_bytes_per_s"]) for s in summaries]),
        ("achieved occupancy", [pct(s["achieved_occupancy_pct"]) for s in summaries]),
        ("top warp stalls (cycles/instr)", ["\n".join(f"{r} {v:.2f}" for r, v in s["top_stalls"]) or "n/a" for s in summaries]),
        ("smem bank conflicts (ld / st)", [_conflicts(s) for s in summaries]),
    ]
    for label, cells in rows:
        table.add_row(label, *cells)
    console.print(table)


def _conflicts(s: dict) -> str:
    ld, st = s["smem_bank_conflicts_ld"], s["smem_bank_conflicts_st"]
    return " / ".join("n/a" if v is None else f"{v:,.0f}" for v in (ld, st))


def run_sass(registry_path, name: str, arch_text: str | None, out: str | None) -> int:
    from flashcore_cli.builder.ptxas import empty_body_warnings
    from flashcore_cli.inspect.sass import MIX_COLUMNS, WIDTH_COLUMNS, variant_sass
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.core.records import output_file, write_output
    from flashcore_cli.registry.variants import load_registry

    variant = load_registry(registry_path).get(name)
    arch = variant.build_target(target_arch(arch_text))
    if out:
        output_file(out, "--out")  # a folder or an unwritable path: refused before the compile
    with status(f"nvcc -cubin {variant.name} for {arch}, cuobjdump -sass"):
        text, kernels = variant_sass(variant, arch)
    if not kernels:
        raise FlashcoreError(f"{variant.name}: cuobjdump found no kernels in the cubin", exit_code=EXIT_CHECK_FAILED)
    table = Table(title=f"SASS instruction mix: {variant.name} for {arch} (static counts, per kernel)")
    table.add_column("kernel")
    table.add_column("instrs", justify="right")
    for col in MIX_COLUMNS:
        table.add_column(col, justify="right")
    for col in WIDTH_COLUMNS:
        table.add_column(f"{col} bits x n", justify="right")
    for k in kernels:
        cells = []
        for col, ops in MIX_COLUMNS.items():
            n = k.count(*ops)
            cells.append(f"[bold red]{n}[/]" if col == "LDL/STL" and n else str(n))
        widths = [", ".join(f"{bits}x{n}" for bits, n in sorted(k.widths(b).items(), reverse=True)) or "0" for b in WIDTH_COLUMNS]
        total = f"[bold yellow]{k.total}[/]" if k.looks_empty() else str(k.total)
        table.add_row(short_kernel(k.kernel), total, *cells, *widths)
    console.print(table)
    console.print("HMMA/HGMMA: tensor-core MMAs; LDSM: ldmatrix; LDGSTS: cp.async; TMA: UTMALDG/UBLKCP; "
                  "LDL/STL: local memory (spills or indexed arrays); bits x n: access width x count")  # fmt: skip
    for warning in empty_body_warnings(variant, arch, [k for k in kernels if k.looks_empty()], "sass", len(kernels)):
        err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if out:
        write_output(out, text, "--out")
        console.print(f"full listing: {out}")
    else:
        console.print(f"full listing: `flashcore sass {variant.name} --arch {arch} --out {variant.name}.sass`")
    return 0

