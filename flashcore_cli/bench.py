"""`flashcore bench`: time variants beside PyTorch's own attention, in one run.

The references (SDPA default and each backend, the Triton forward) run in one worker; each variant in a
worker of its own that builds it, checks it at the bench shape and times it only if the check passed.
Speedup is SDPA default's median over the row's median, both measured in this run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flashcore_cli.correctness import CaseOutcome
from flashcore_cli.isolate import run_worker
from flashcore_cli.references import SDPA_DEFAULT, clocks
from flashcore_cli.registry import Registry, Variant
from flashcore_cli.shapes import Case, Shape, attention_flops

MIN_REPS = 100


@dataclass
class BenchRow:
    name: str
    kind: str  # "variant" or "reference"
    status: str  # OK, MISMATCH, TIMEOUT, CRASH, BUILD-FAIL, SKIP
    timing: dict = field(default_factory=dict)
    key: str = ""
    detail: str = ""

    @property
    def median(self) -> float | None:
        return self.timing.get("median_us")

    def as_dict(self, flops: float, sdpa_median: float | None) -> dict:
        d = {"name": self.name, "kind": self.kind, "status": self.status, "key": self.key, "detail": self.detail}
        if self.median:
            d["tflops"] = flops / (self.median * 1e-6) / 1e12
            d["speedup_vs_sdpa"] = sdpa_median / self.median if sdpa_median else None
        d.update(self.timing)
        return d


@dataclass
class BenchRun:
    shape: Shape
    causal: bool
    seed: int
    rows: list[BenchRow] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    clocks_after: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @property
    def flops(self) -> float:
        return attention_flops(self.shape, self.causal)

    @property
    def sdpa_median(self) -> float | None:
        for r in self.rows:
            if r.name == SDPA_DEFAULT and r.median:
                return r.median
        return None

    def record(self) -> dict:
        sdpa = self.sdpa_median
        return {
            "kind": "flashcore-bench",
            "started": self.started,
            "shape": str(self.shape),
            "causal": self.causal,
            "seed": self.seed,
            "flops": self.flops,
            "environment": self.environment,
            "clocks_after": self.clocks_after,
            "rows": [r.as_dict(self.flops, sdpa) for r in self.rows],
        }


def bench_references(case: Case, *, reps: int, warmup: int, timeout: float, on_event=None) -> tuple[list[BenchRow], dict]:
    spec = {"task": "references", "case": case.as_dict(), "reps": reps, "warmup": warmup}
    worker = run_worker(spec, run_timeout=timeout, on_event=on_event)
    env = (worker.find("environment") or [{}])[0]
    env = {k: v for k, v in env.items() if k != "event"}
    rows = [BenchRow(e["name"], "reference", "OK", _timing(e)) for e in worker.find("timing")]
    rows += [BenchRow(e["name"], "reference", "SKIP", detail=e["reason"]) for e in worker.find("reference-skipped")]
    if worker.status != "done" or worker.find("crash"):
        crash = worker.find("crash")
        rows.append(
            BenchRow("references", "reference", "CRASH" if worker.status != "timeout" else "TIMEOUT",
                     detail=crash[0]["error"] if crash else worker.log_tail)
        )  # fmt: skip
    return rows, env


def bench_variant(
    registry: Registry,
    variant: Variant,
    case: Case,
    *,
    arch: str,
    reps: int,
    warmup: int,
    timeout: float,
    on_event=None,
    defines: dict[str, str] | None = None,
) -> BenchRow:
    reason = variant.unsupported_reason(case.shape.head_dim, case.causal, arch)
    if reason:
        return BenchRow(variant.name, "variant", "SKIP", detail=reason)
    spec = {
        "task": "bench",
        "registry": str(registry.path),
        "variant": variant.name,
        "arch": arch,
        "defines": defines or {},
        "case": case.as_dict(),
        "reps": reps,
        "warmup": warmup,
    }
    worker = run_worker(spec, run_timeout=timeout, on_event=on_event)
    built = worker.find("built")
    key = built[0].get("key", "") if built else ""
    if worker.find("build-failed"):
        return BenchRow(variant.name, "variant", "BUILD-FAIL", key=key, detail=worker.find("build-failed")[0]["errors"])
    if worker.status == "timeout":
        return BenchRow(variant.name, "variant", "TIMEOUT", key=key, detail=f"killed after {timeout:.0f} s ({worker.phase})")
    crash = worker.find("crash")
    if crash or worker.status == "crash":
        return BenchRow(variant.name, "variant", "CRASH", key=key, detail=crash[0]["error"] if crash else worker.log_tail)
    checked = worker.find("case")
    if checked and checked[0]["status"] != "OK":
        e = checked[0]
        outcome = CaseOutcome(case, e["status"], e["max_error"], e["tolerance"], e.get("detail", ""), e.get("mismatches", []))
        return BenchRow(variant.name, "variant", outcome.status, key=key, detail=f"not timed: {outcome.detail} "
                        f"(max error {outcome.max_error:.3g} > tolerance {outcome.tolerance:.3g})")  # fmt: skip
    timing = worker.find("timing")
    if not timing:
        return BenchRow(variant.name, "variant", "CRASH", key=key, detail=worker.log_tail)
    return BenchRow(variant.name, "variant", "OK", _timing(timing[0]), key=key)


def finish(run: BenchRun) -> None:
    run.clocks_after = clocks()


def _timing(event: dict) -> dict:
    return {k: event[k] for k in ("median_us", "p10_us", "p90_us", "samples_us") if k in event}
