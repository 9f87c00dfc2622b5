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
from flashcore_cli.core.events import Event
from flashcore_cli.core.passes import DEFAULT_PASS
from flashcore_cli.core.statuses import CRASH
from flashcore_cli.measure.modes import DEFAULT_MODE

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
    passes: str = DEFAULT_PASS  # what a timed call does (bench --pass)


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
        if event.get("event") == Event.DEVICE:
            device["gpu"] = event["gpu"]

    rows = bench_variant(reg, reg.get(job.variant), case, arch=job.arch, reps=job.reps, warmup=job.warmup, timeout=job.timeout,
                         modes=modes, on_event=on_event, passes=job.passes)  # fmt: skip
    return {"rows": [rows[job.mode]], "environment": {}, "gpu_name": device.get("gpu", "")}


def lost_point(job: PointJob, lost) -> dict:
    """A point whose lane died under it (gpus.LaneLost): one CRASH row with the reason, as a crashed worker gives."""
    from flashcore_cli.measure.bench import BenchRow

    name, kind = (job.variant, "variant") if job.variant else ("references", "reference")
    return {"rows": [BenchRow(name, kind, CRASH, detail=lost.reason)], "environment": {}, "gpu_name": ""}


def point_rows(job: PointJob, rows: list, sdpa_median: float | None, gpu: str, gpu_name: str = "") -> list[dict]:
    """A point's rows as the record stores them: bench's row fields plus where on the axis and which GPU (the
    visible GPU's index or UUID, as CUDA_VISIBLE_DEVICES names it, and its model). sdpa_median: the point's
    baseline row's (SDPA default, or FlexAttention where SDPA cannot express the case: bench.baseline_for)."""
    from flashcore_cli.measure.bench import baseline_for
    from flashcore_cli.registry.shapes import Case, pass_flops

    case = Case.from_dict(job.case)
    flops = pass_flops(case.shape, case.causal, job.passes, case.family)
    extra = {"seq_len": case.shape.seq_len, "shape": str(case.shape), "causal": case.causal, **case.family.as_dict(),
             "gpu": gpu, "gpu_name": gpu_name}  # fmt: skip
    baseline = baseline_for(case.family, case.causal)
    return [{**row.as_dict(flops, sdpa_median, baseline=baseline), **extra} for row in rows]


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise FlashcoreError("--plot draws with matplotlib, which is not installed: `pip install matplotlib` (flashcore's "
                             "`plot` extra), or leave out --plot") from None  # fmt: skip


def plan_points(template: PointJob, variants: list[str], shapes, causal: bool, seed: int, dtype: str,
                family=None) -> list[PointJob]:  # fmt: skip
    """The template's point at every shape, for the references and then each variant; shape i's case has seed + i."""
    import dataclasses

    from flashcore_cli.registry.shapes import Case

    jobs = []
    for i, shape in enumerate(shapes):
        case = Case(shape, causal, seed + i, dtype=dtype, grads=template.passes != DEFAULT_PASS,
                    **({"family": family} if family is not None else {})).as_dict()  # fmt: skip
        for name in [None, *variants]:
            jobs.append(dataclasses.replace(template, variant=name, case=case))
    return jobs


def measure_points(jobs: list[PointJob], gpus: list[str], on_point=None) -> tuple[list[dict], dict[int, str], float]:
    """Every point on the GPUs' lanes, on_point(job, result, gpu) as each ends; a point whose lane died is a CRASH
    row. Returns each point's result, the GPU each ran on (by index) and the wall time."""
    from flashcore_cli.measure.gpus import LaneLost, map_on_gpus

    lane_of: dict[int, str] = {}

    def on_done(index, result, gpu):
        job = jobs[index]
        if isinstance(result, LaneLost):
            result = lost_point(job, result)
        lane_of[index] = gpu
        if on_point is not None:
            on_point(job, result, gpu)

    started = time.monotonic()
    results = map_on_gpus(run_point, jobs, gpus, on_done=on_done)
    wall_s = time.monotonic() - started
    results = [lost_point(job, r) if isinstance(r, LaneLost) else r for job, r in zip(jobs, results)]
    return results, lane_of, wall_s


def sweep_rows(jobs: list[PointJob], results: list[dict], lane_of: dict[int, str]) -> list[dict]:
    """Every point's rows as the record stores them, each with its speedup against SDPA default at its shape and
    the GPU (lane and model) that measured it."""
    from flashcore_cli.measure.bench import baseline_for
    from flashcore_cli.registry.shapes import Case

    name_of = {lane_of[i]: r["gpu_name"] for i, r in enumerate(results) if r.get("gpu_name")}
    sdpa_at = {}
    for job, result in zip(jobs, results):
        if job.variant is None:
            case = Case.from_dict(job.case)
            base = baseline_for(case.family, case.causal)
            sdpa_at[job.case["shape"]] = next((r.median for r in result["rows"] if r.name == base and r.median), None)
    return [
        row
        for i, (job, result) in enumerate(zip(jobs, results))
        for row in point_rows(job, result["rows"], sdpa_at.get(job.case["shape"]), lane_of[i], name_of.get(lane_of[i], ""))
    ]


