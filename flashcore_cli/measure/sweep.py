"""`flashcore sweep`: time variants and the references along the sequence-length axis.

Each point (one sequence length) is what `flashcore bench` does at one shape: the references in one worker,
each variant in a worker of its own that checks it before timing it (bench.bench_references and
bench.bench_variant), in the one timing mode of the run (--mode: cold, graph or host; modes.py). The points
are spread over every visible GPU, one lane process per GPU (gpus.py); every row says which GPU measured it,
and a point whose lane died is a CRASH row saying so. The run leaves a JSON record in the results folder (its
"mode", the GPUs, lanes and wall time, every sample of every row) and, with --plot, a chart.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.modes import DEFAULT_MODE, OLD_RECORD_MODE
from flashcore_cli.measure.series import series

DEFAULT_SEQ_LENS = "512,1024,2048,4096,8192,16384"


@dataclass(frozen=True)
class PointJob:
    registry: str
    variant: str | None  # None: the references
    case: dict
    arch: str
    reps: int
    warmup: int
    timeout: float
    mode: str = DEFAULT_MODE
    passes: str = "fwd"  # what a timed call does (bench --pass)


def parse_seq_lens(text: str) -> list[int]:
    tokens = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not tokens or not all(re.fullmatch(r"\d+", t) and int(t) > 0 for t in tokens):
        raise FlashcoreError(f"bad --seq '{text}': expected positive integers separated by commas, e.g. {DEFAULT_SEQ_LENS}")
    return sorted({int(t) for t in tokens})


def run_point(job: PointJob) -> dict:
    """One point, in a GPU lane: the references, or one variant (built, checked, then timed); "gpu_name" is the
    GPU its worker ran on, when the worker got that far."""
    from flashcore_cli.measure.bench import bench_references, bench_variant
    from flashcore_cli.registry.variants import load_registry
    from flashcore_cli.registry.shapes import Case

    case = Case.from_dict(job.case)
    modes = (job.mode,)
    if job.variant is None:
        rows, env = bench_references(case, reps=job.reps, warmup=job.warmup, timeout=job.timeout, modes=modes,
                                     passes=job.passes)  # fmt: skip
        return {"rows": rows[job.mode], "environment": env, "gpu_name": env.get("gpu", "")}
    reg = load_registry(job.registry)
    device = {}

    def on_event(event: dict) -> None:
        if event.get("event") == "device":
            device["gpu"] = event["gpu"]

    rows = bench_variant(reg, reg.get(job.variant), case, arch=job.arch, reps=job.reps, warmup=job.warmup, timeout=job.timeout,
                         modes=modes, on_event=on_event, passes=job.passes)  # fmt: skip
    return {"rows": [rows[job.mode]], "environment": {}, "gpu_name": device.get("gpu", "")}


def lost_point(job: PointJob, lost) -> dict:
    """A point whose lane died under it (gpus.LaneLost): one CRASH row with the reason, as a crashed worker gives."""
    from flashcore_cli.measure.bench import BenchRow

    name, kind = (job.variant, "variant") if job.variant else ("references", "reference")
    return {"rows": [BenchRow(name, kind, "CRASH", detail=lost.reason)], "environment": {}, "gpu_name": ""}


def point_rows(job: PointJob, rows: list, sdpa_median: float | None, gpu: str, gpu_name: str = "") -> list[dict]:
    """A point's rows as the record stores them: bench's row fields plus where on the axis and which GPU (the
    visible GPU's index or UUID, as CUDA_VISIBLE_DEVICES names it, and its model)."""
    from flashcore_cli.registry.shapes import Case, pass_flops

    case = Case.from_dict(job.case)
    flops = pass_flops(case.shape, case.causal, job.passes)
    extra = {"seq_len": case.shape.seq_len, "shape": str(case.shape), "causal": case.causal, "gpu": gpu, "gpu_name": gpu_name}
    return [{**row.as_dict(flops, sdpa_median), **extra} for row in rows]


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise FlashcoreError("--plot draws with matplotlib, which is not installed: `pip install matplotlib` (flashcore's "
                             "`plot` extra), or leave out --plot") from None  # fmt: skip


def run_sweep(registry_path, names, seq_text, batch, heads, dim, causal, plot, reps, warmup, timeout, json_path, arch_text,
              mode_text=DEFAULT_MODE, dtype_text="fp16", pass_text="fwd") -> int:  # fmt: skip
    """Parse and check the options, plan the points, measure them over the GPUs, then record, show and chart."""
    from flashcore_cli.registry.archs import parse_arch, parse_archs
    from flashcore_cli.core.console import console, require_gpu
    from flashcore_cli.check.correctness import new_seed
    from flashcore_cli.measure.gpus import visible_gpus
    from flashcore_cli.core.records import clocks
    from flashcore_cli.registry.variants import load_registry
    from flashcore_cli.registry.shapes import parse_dtype, parse_pass, parse_shape
    from flashcore_cli.measure.modes import MODES, parse_modes

    (mode,) = parse_modes(mode_text, several=False)
    dtype = parse_dtype(dtype_text)
    passes = parse_pass(pass_text)
    reg = load_registry(registry_path)
    variants = reg.select(names, True) if not names else reg.select(names, False)
    seq_lens = parse_seq_lens(seq_text or DEFAULT_SEQ_LENS)
    shapes = [parse_shape(f"{batch},{heads},{s},{dim}") for s in seq_lens]
    check_counts(reps, warmup, timeout)
    if plot:
        require_matplotlib()
    require_gpu("sweep")
    gpus = visible_gpus() or ["0"]
    arch = parse_arch(arch_text) if arch_text else parse_archs(None)[0]
    seed = new_seed()
    template = PointJob(str(reg.path), None, {}, arch, reps, warmup, timeout, mode, passes)
    jobs = plan_points(template, [v.name for v in variants], shapes, causal, seed, dtype)
    console.print(
        f"sweep {batch},{heads},S,{dim}{' causal' if causal else ''} over S = {', '.join(map(str, seq_lens))}: "
        f"{len(variants)} variant(s) + references, {reps} samples per row, on {len(gpus)} GPU(s) ({', '.join(gpus)}); seed {seed}; "
        f"{MODES[mode].title}"
    )
    results, lane_of, wall_s = measure_points(jobs, gpus)
    record = {
        "kind": "flashcore-sweep",
        "mode": mode,
        "batch": batch,
        "heads": heads,
        "head_dim": dim,
        "causal": causal,
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


def check_counts(reps: int, warmup: int, timeout: float) -> None:
    """--reps, --warmup and --timeout, before anything runs (exit 2)."""
    from flashcore_cli.measure.modes import MIN_REPS

    if reps < MIN_REPS:
        raise FlashcoreError(f"--reps {reps}: at least {MIN_REPS} timed calls are needed for a median and p10/p90")
    if warmup < 1 or timeout <= 0:
        raise FlashcoreError("--warmup must be at least 1 and --timeout positive (seconds)")


def plan_points(template: PointJob, variants: list[str], shapes, causal: bool, seed: int, dtype: str) -> list[PointJob]:
    """The template's point at every shape, for the references and then each variant; shape i's case has seed + i."""
    import dataclasses

    from flashcore_cli.registry.shapes import Case

    jobs = []
    for i, shape in enumerate(shapes):
        case = Case(shape, causal, seed + i, dtype=dtype, grads=template.passes != "fwd").as_dict()
        for name in [None, *variants]:
            jobs.append(dataclasses.replace(template, variant=name, case=case))
    return jobs


def measure_points(jobs: list[PointJob], gpus: list[str]) -> tuple[list[dict], dict[int, str], float]:
    """Every point on the GPUs' lanes, with a progress bar and one line per point; a point whose lane died is a
    CRASH row. Returns each point's result, the GPU each ran on (by index) and the wall time."""
    from flashcore_cli.core.console import progress
    from flashcore_cli.measure.gpus import LaneLost, map_on_gpus
    from flashcore_cli.registry.shapes import Case

    lane_of: dict[int, str] = {}
    with progress() as bar:
        task = bar.add_task(f"{len(jobs)} points", total=len(jobs))

        def on_done(index, result, gpu):
            job = jobs[index]
            if isinstance(result, LaneLost):
                result = lost_point(job, result)
            lane_of[index] = gpu
            bar.advance(task)
            statuses = ", ".join(f"{r.name} {r.status}" for r in result["rows"] if r.status != "OK") or "OK"
            bar.console.print(f"  S={Case.from_dict(job.case).shape.seq_len} {job.variant or 'references'} (gpu {gpu}): {statuses}")

        started = time.monotonic()
        results = map_on_gpus(run_point, jobs, gpus, on_done=on_done)
        wall_s = time.monotonic() - started
    results = [lost_point(job, r) if isinstance(r, LaneLost) else r for job, r in zip(jobs, results)]
    return results, lane_of, wall_s


def sweep_rows(jobs: list[PointJob], results: list[dict], lane_of: dict[int, str]) -> list[dict]:
    """Every point's rows as the record stores them, each with its speedup against SDPA default at its shape and
    the GPU (lane and model) that measured it."""
    from flashcore_cli.measure.references import SDPA_DEFAULT

    name_of = {lane_of[i]: r["gpu_name"] for i, r in enumerate(results) if r.get("gpu_name")}
    sdpa_at = {
        job.case["shape"]: next((r.median for r in result["rows"] if r.name == SDPA_DEFAULT and r.median), None)
        for job, result in zip(jobs, results)
        if job.variant is None
    }
    return [
        row
        for i, (job, result) in enumerate(zip(jobs, results))
        for row in point_rows(job, result["rows"], sdpa_at.get(job.case["shape"]), lane_of[i], name_of.get(lane_of[i], ""))
    ]


def keep_sweep(record: dict, json_path, plot) -> None:
    """Show the record's table, save it in the results folder, and write the --json copy and the --plot chart."""
    from flashcore_cli.check.correctness import write_json
    from flashcore_cli.core.console import console
    from flashcore_cli.core.records import save_record

    render_sweep(record)
    batch, heads, dim, causal, dtype = (record[k] for k in ("batch", "heads", "head_dim", "causal", "dtype"))
    saved = save_record(record, "sweep", f"{batch},{heads},S,{dim}{'-causal' if causal else ''}{'' if dtype == 'fp16' else '-' + dtype}")
    console.print(f"record: {saved}")
    if json_path:
        write_json(json_path, record)
        console.print(f"wrote {json_path}")
    if plot:
        from flashcore_cli.measure.plot import plot_sweep

        plot_sweep(record, plot)
        console.print(f"chart: {plot}")


def render_sweep(record: dict) -> None:
    from rich.table import Table

    from flashcore_cli.core.console import console, dtype_label, styled

    env = record.get("environment", {})
    title = (
        f"sweep {record['batch']},{record['heads']},S,{record['head_dim']}{' causal' if record['causal'] else ''}"
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
