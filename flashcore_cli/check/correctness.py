"""`flashcore test`: every variant in its own worker process, every case classified.

Statuses: OK, MISMATCH, TIMEOUT, CRASH, BUILD-FAIL, SKIP (a shape the variant does not support, or a GPU it
does not run on, with the reason), NOT-RUN (cases after a TIMEOUT or CRASH, whose process is gone).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from flashcore_cli.core.isolate import run_worker
from flashcore_cli.core.protocol import WorkerOutcome, WorkRequest, Wording, classify
from flashcore_cli.core.statuses import BUILD_FAIL, CRASH, FAILURES, MISMATCH, NOT_RUN, OK, SKIP, TIMEOUT
from flashcore_cli.registry.variants import Registry, Variant
from flashcore_cli.registry.family import FAMILY_FEATURES, Family
from flashcore_cli.registry.shapes import Case, Shape, default_cases, expand_cases, family_cases

# Worst first: a variant's status is the worst of its cases'.
SEVERITY = [BUILD_FAIL, CRASH, TIMEOUT, MISMATCH, NOT_RUN, OK, SKIP]


@dataclass
class CaseOutcome:
    case: Case
    status: str
    max_error: float | None = None
    tolerance: float | None = None
    detail: str = ""
    mismatches: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            **self.case.as_dict(),
            "status": self.status,
            "max_error": self.max_error,
            "tolerance": self.tolerance,
            "detail": self.detail,
            "mismatches": self.mismatches,
        }


@dataclass
class VariantOutcome:
    variant: str
    cases: list[CaseOutcome]
    seconds: float = 0.0
    build: dict = field(default_factory=dict)
    detail: str = ""

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.cases} or {SKIP}
        return min(statuses, key=SEVERITY.index)

    @property
    def failed(self) -> bool:
        return any(c.status in FAILURES for c in self.cases)

    def worst_ratio(self) -> float | None:
        ratios = [c.max_error / c.tolerance for c in self.cases if c.status in (OK, MISMATCH) and c.max_error is not None and c.tolerance]
        return max(ratios) if ratios else None

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "build": self.build,
            "detail": self.detail,
            "cases": [c.as_dict() for c in self.cases],
        }


def plan_cases(variant: Variant, shapes: list[Shape] | None, seed: int, causal_modes=(False, True),
               dtypes: tuple[str, ...] | None = None, family: Family | None = None) -> list[Case]:  # fmt: skip
    """The cases of every dtype the variant declares (or of `dtypes`), fp16's first: its seeds are as before. A
    variant with a backward has its gradients checked in every case. With `family` (--window, --softcap, --sinks)
    every case runs under it; without, a variant that declares any of the family's features also gets the family's
    odd cases (shapes.FAMILY_CASES) after the standard set."""
    import dataclasses

    cases: list[Case] = []
    for dtype in dtypes or variant.dtypes:
        base = seed + len(cases)
        if shapes:
            cases += expand_cases(shapes, base, causal_modes, dtype)
        else:
            cases += [c for c in default_cases(variant.head_dims, base, dtype) if c.causal in causal_modes]
            if family is None and any(variant.supports(f) for f in FAMILY_FEATURES):
                cases += [c for c in family_cases(variant.head_dims, seed + len(cases), dtype) if c.causal in causal_modes]
    if family is not None:
        cases = [dataclasses.replace(c, family=family) for c in cases]
    if variant.supports("backward"):
        cases = [dataclasses.replace(c, grads=True) for c in cases]
    return cases


def run_variant(
    registry: Registry,
    variant: Variant,
    cases: list[Case],
    *,
    arch: str,
    timeout: float,
    on_event=None,
    defines: dict[str, str] | None = None,
) -> VariantOutcome:
    runnable, outcomes = [], {}
    for case in cases:
        reason = variant.unsupported_reason(case.shape.head_dim, case.causal, arch, case.dtype, **case.needs())
        if reason:
            outcomes[case] = CaseOutcome(case, SKIP, detail=reason)
        else:
            runnable.append(case)
    result = VariantOutcome(variant.name, [])
    if runnable:
        request = WorkRequest("test", str(registry.path), variant.name, arch, defines=defines or {},
                              cases=[c.as_dict() for c in runnable])  # fmt: skip
        worker = run_worker(request, run_timeout=timeout, on_event=on_event)
        result.seconds = worker.seconds
        result.build = worker.built or {}
        checked, result.detail = read_cases(worker, runnable, timeout)
        outcomes.update(checked)
    result.cases = [outcomes[c] for c in cases]
    return result


# how a test words a timeout and a worker that died: of the case it was checking, or of the build before any case
CASE_WORDS = Wording(timeout="no result after {timeout:.0f} s; process group killed", died="worker died (exit {returncode})\n{log_tail}")
BUILD_WORDS = Wording(timeout="the build did not finish in time")


def read_cases(worker: WorkerOutcome, runnable: list[Case], timeout: float) -> tuple[dict[Case, CaseOutcome], str]:
    """Each case's outcome from a test worker's events: its result where it was checked; else the worker's
    failure (classify) for the case it was checking, or for every case when it failed before checking any
    (then that is also the variant's detail, returned second); NOT-RUN for the cases after it."""
    started = [_key(c) for c in worker.started_cases()]
    verdict = classify(worker, timeout=timeout, wording=CASE_WORDS if started else BUILD_WORDS)
    if verdict.status == BUILD_FAIL:
        return {case: CaseOutcome(case, BUILD_FAIL, detail=verdict.detail) for case in runnable}, ""
    if (verdict.status == TIMEOUT and worker.phase == "build") or (verdict.status == CRASH and not started):
        return {case: CaseOutcome(case, verdict.status, detail=verdict.detail) for case in runnable}, verdict.detail
    by_case = {_key(e["case"]): e for e in worker.case_results()}
    outcomes = {}
    for case in runnable:
        key = _key(case.as_dict())
        if key in by_case:
            e = by_case[key]
            outcomes[case] = CaseOutcome(case, e["status"], e["max_error"], e["tolerance"], e.get("detail", ""), e.get("mismatches", []))
        elif started and key == started[-1] and verdict.status in (TIMEOUT, CRASH):
            outcomes[case] = CaseOutcome(case, verdict.status, detail=verdict.detail)
        else:
            outcomes[case] = CaseOutcome(case, NOT_RUN, detail="an earlier case of this variant timed out or crashed")
    return outcomes, ""


def _key(case: dict) -> str:
    return json.dumps(case, sort_keys=True)


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1000)


def write_json(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
