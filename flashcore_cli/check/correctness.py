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
from flashcore_cli.registry.variants import Registry, Variant
from flashcore_cli.registry.shapes import Case, Shape, default_cases, expand_cases

FAILING = {"MISMATCH", "TIMEOUT", "CRASH", "BUILD-FAIL"}
# Worst first: a variant's status is the worst of its cases'.
SEVERITY = ["BUILD-FAIL", "CRASH", "TIMEOUT", "MISMATCH", "NOT-RUN", "OK", "SKIP"]


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
        statuses = {c.status for c in self.cases} or {"SKIP"}
        return min(statuses, key=SEVERITY.index)

    @property
    def failed(self) -> bool:
        return any(c.status in FAILING for c in self.cases)

    def worst_ratio(self) -> float | None:
        ratios = [c.max_error / c.tolerance for c in self.cases if c.status in ("OK", "MISMATCH") and c.max_error is not None and c.tolerance]
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
               dtypes: tuple[str, ...] | None = None) -> list[Case]:  # fmt: skip
    """The cases of every dtype the variant declares (or of `dtypes`), fp16's first: its seeds are as before. A
    variant with a backward has its gradients checked in every case."""
    import dataclasses

    cases: list[Case] = []
    for dtype in dtypes or variant.dtypes:
        base = seed + len(cases)
        if shapes:
            cases += expand_cases(shapes, base, causal_modes, dtype)
        else:
            cases += [c for c in default_cases(variant.head_dims, base, dtype) if c.causal in causal_modes]
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
            outcomes[case] = CaseOutcome(case, "SKIP", detail=reason)
        else:
            runnable.append(case)
    result = VariantOutcome(variant.name, [])
    if runnable:
        spec = {
            "task": "test",
            "registry": str(registry.path),
            "variant": variant.name,
            "arch": arch,
            "defines": defines or {},
            "cases": [c.as_dict() for c in runnable],
        }
        worker = run_worker(spec, run_timeout=timeout, on_event=on_event)
        result.seconds = worker.seconds
        built = worker.find("built")
        result.build = built[0] if built else {}
        by_case = {json.dumps(e["case"], sort_keys=True): e for e in worker.find("case")}
        started = [json.dumps(e["case"], sort_keys=True) for e in worker.find("case-start")]
        failed_build = worker.find("build-failed")
        crash = worker.find("crash")
        for case in runnable:
            key = json.dumps(case.as_dict(), sort_keys=True)
            if failed_build:
                outcomes[case] = CaseOutcome(case, "BUILD-FAIL", detail=failed_build[0]["errors"])
            elif key in by_case:
                e = by_case[key]
                outcomes[case] = CaseOutcome(
                    case, e["status"], e["max_error"], e["tolerance"], e.get("detail", ""), e.get("mismatches", [])
                )
            elif started and key == started[-1] and worker.status == "timeout":
                outcomes[case] = CaseOutcome(case, "TIMEOUT", detail=f"no result after {timeout:.0f} s; process group killed")
            elif started and key == started[-1] and (crash or worker.status == "crash"):
                detail = crash[0]["error"] if crash else f"worker died (exit {worker.returncode})\n{worker.log_tail}"
                outcomes[case] = CaseOutcome(case, "CRASH", detail=detail)
            else:
                outcomes[case] = CaseOutcome(case, "NOT-RUN", detail="an earlier case of this variant timed out or crashed")
        if worker.status == "timeout" and worker.phase == "build":
            result.detail = "the build did not finish in time"
            for case in runnable:
                outcomes[case] = CaseOutcome(case, "TIMEOUT", detail=result.detail)
        elif not started and not failed_build and worker.status == "crash":
            detail = crash[0]["error"] if crash else worker.log_tail
            result.detail = detail
            for case in runnable:
                outcomes[case] = CaseOutcome(case, "CRASH", detail=detail)
    result.cases = [outcomes[c] for c in cases]
    return result


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1000)


def write_json(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
