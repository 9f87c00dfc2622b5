"""`flashcore sweep`: time variants and the references along the sequence length, over every visible GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from flashcore_cli.commands.options import (DEFAULT_REPS, DEFAULT_WARMUP, Arch, Causal, Dtype, JsonOut, Mode, Pass, Reps, Warmup,
                                            Sinks, Softcap, Window, family_options,
                                            check_counts)
from flashcore_cli.core.console import console, dtype_label, progress, styled
from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.passes import DEFAULT_PASS
from flashcore_cli.core.statuses import OK
from flashcore_cli.measure.modes import DEFAULT_MODE
from flashcore_cli.registry.family import Family


def sweep(
    ctx: typer.Context,
    names: Annotated[Optional[list[str]], typer.Argument(help="variants (default: all)", show_default=False)] = None,
    *,
    seq: Annotated[Optional[str], typer.Option("--seq", help="sequence lengths, e.g. 512,1024,2048 (default: 512 ... 16384)")] = None,
    batch: Annotated[int, typer.Option("--batch", help="B")] = 1,
    heads: Annotated[int, typer.Option("--heads", help="H")] = 8,
    dim: Annotated[int, typer.Option("--dim", help="head dim D")] = 64,
    causal: Causal = False,
    plot: Annotated[Optional[str], typer.Option("--plot", help="draw the chart to this PNG (needs matplotlib)")] = None,
    reps: Reps = DEFAULT_REPS,
    warmup: Warmup = DEFAULT_WARMUP,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant and point (after its build)")] = 300.0,
    json_path: JsonOut = None,
    arch: Arch = None,
    mode: Mode = DEFAULT_MODE,
    dtype: Dtype = DEFAULT_DTYPE,
    passes: Pass = DEFAULT_PASS,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """Time variants and the references along the sequence length, over every visible GPU; record and chart."""
    return run_sweep(ctx.obj["registry"], names, seq, batch, heads, dim, causal, plot, reps, warmup, timeout, json_path, arch, mode,
                     dtype, passes, family_options(window, softcap, sinks))  # fmt: skip


def run_sweep(registry_path, names, seq_text, batch, heads, dim, causal, plot, reps, warmup, timeout, json_path, arch_text,
              mode_text=DEFAULT_MODE, dtype_text=DEFAULT_DTYPE, pass_text=DEFAULT_PASS, family=None) -> int:  # fmt: skip
    """Parse and check the options, plan the points, measure them over the GPUs, then record, show and chart."""
    from flashcore_cli.check.correctness import new_seed
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.measure.sweep import DEFAULT_SEQ_LENS, PointJob, parse_seq_lens, plan_points, require_matplotlib, sweep_rows
    from flashcore_cli.registry.archs import target_arch
    from flashcore_cli.measure.gpus import visible_gpus
    from flashcore_cli.core.gpu import clocks
    from flashcore_cli.registry.variants import load_registry, require_runnable
    from flashcore_cli.registry.shapes import parse_dtype, parse_pass, parse_shape
    from flashcore_cli.measure.modes import MODES, parse_modes
    from flashcore_cli.registry.family import DENSE

    family = family or DENSE
    (mode,) = parse_modes(mode_text, several=False)
    dtype = parse_dtype(dtype_text)
    passes = parse_pass(pass_text)
    reg = load_registry(registry_path)
    variants = reg.select(names, True) if not names else reg.select(names, False)
    seq_lens = parse_seq_lens(seq_text or DEFAULT_SEQ_LENS)
    shapes = [parse_shape(f"{batch},{heads},{s},{dim}") for s in seq_lens]
    check_counts(reps, warmup, timeout)
    arch = target_arch(arch_text)
    require_runnable(variants, shapes, causal=causal, dtype=dtype, backward=passes != DEFAULT_PASS,
                     family=family)  # a head dim (or family) none runs
    if plot:
        require_matplotlib()
    require_gpu("sweep")
    gpus = visible_gpus() or ["0"]
    seed = new_seed()
    template = PointJob(str(reg.path), None, {}, arch, reps, warmup, timeout, mode, passes)
    jobs = plan_points(template, [v.name for v in variants], shapes, causal, seed, dtype, family)
    console.print(
        f"sweep {batch},{heads},S,{dim}{' causal' if causal else ''}{family.label(causal)} over S = {', '.join(map(str, seq_lens))}: "
        f"{len(variants)} variant(s) + references, {reps} samples per row, on {len(gpus)} GPU(s) ({', '.join(gpus)}); seed {seed}; "
        f"{MODES[mode].title}"
    )
    results, lane_of, wall_s = measure_with_progress(jobs, gpus)
    record = {
        "kind": "flashcore-sweep",
        "mode": mode,
        "batch": batch,
        "heads": heads,
        "head_dim": dim,
        "causal": causal,
        **family.as_dict(),
        "dtype": dtype,
        "pass": passes,
        "seq_lens": seq_lens,
        "seed": seed,
        "arch": arch,
        "gpus": gpus,
        "lanes": min(len(gpus), len(jobs)),
        "wall_s": round(wall_s, 3),
        "environment": next((r["environment"] for r in results if r["environment"]), {}),
        "clocks_after": clocks(),
        "rows": sweep_rows(jobs, results, lane_of),
    }
    keep_sweep(record, json_path, plot)
    return 0


def measure_with_progress(jobs: list, gpus: list[str]) -> tuple[list[dict], dict[int, str], float]:
    """measure.sweep.measure_points under a progress bar, one line per point as it ends."""
    from flashcore_cli.measure.sweep import measure_points
    from flashcore_cli.registry.shapes import Case

    with progress() as bar:
        task = bar.add_task(f"{len(jobs)} points", total=len(jobs))

        def on_point(job, result, gpu):
            bar.advance(task)
            statuses = ", ".join(f"{r.name} {r.status}" for r in result["rows"] if r.status != OK) or OK
            bar.console.print(f"  S={Case.from_dict(job.case).shape.seq_len} {job.variant or 'references'} (gpu {gpu}): {statuses}")

        return measure_points(jobs, gpus, on_point=on_point)


def keep_sweep(record: dict, json_path, plot) -> None:
    """Show the record's table, save it in the results folder, and write the --json copy and the --plot chart."""
    from flashcore_cli.check.correctness import write_json
    from flashcore_cli.core.records import save_record

    render_sweep(record)
    batch, heads, dim, causal, dtype = (record[k] for k in ("batch", "heads", "head_dim", "causal", "dtype"))
    label = Family.from_dict(record).label(causal).replace(" ", "-")
    saved = save_record(record, "sweep", f"{batch},{heads},S,{dim}{'-causal' if causal else ''}{label}"
                                         f"{'' if dtype == 'fp16' else '-' + dtype}")  # fmt: skip
    console.print(f"record: {saved}")
    if json_path:
        write_json(json_path, record)
        console.print(f"wrote {json_path}")
    if plot:
        from flashcore_cli.measure.plot import plot_sweep

        plot_sweep(record, plot)
        console.print(f"chart: {plot}")


def render_sweep(record: dict) -> None:
    from flashcore_cli.measure.modes import OLD_RECORD_MODE
    from flashcore_cli.measure.series import series

    env = record.get("environment", {})
    title = (
        f"sweep {record['batch']},{record['heads']},S,{record['head_dim']}{' causal' if record['causal'] else ''}"
        f"{Family.from_dict(record).label(record['causal'])}"
        f"{dtype_label(record.get('dtype', 'fp16'))} "
        f"on {env.get('gpu', '?')}, {record.get('mode', OLD_RECORD_MODE)} mode: median us / TFLOP/s"
    )
    table = Table(title=title)
    table.add_column("name")
    for s in record["seq_lens"]:
        table.add_column(f"S={s}", justify="right")
    for name, points in series(record).items():
        cells = []
        for s in record["seq_lens"]:
            row = points.get(s)
            if row is None:
                cells.append("-")
            elif row.get("median_us"):
                cells.append(f"{row['median_us']:.1f} us\n{row['tflops']:.1f} TF")
            else:
                cells.append(styled(row["status"]))
        table.add_row(name, *cells)
    console.print(table)

