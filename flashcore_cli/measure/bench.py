"""`flashcore bench`: time variants beside PyTorch's own attention, in one run.

The references (SDPA default and each backend, the Triton forward) run in one worker; each variant in a
worker of its own that builds it, checks it at the bench shape and times it only if the check passed.
Each worker times in every mode the run asks for (modes.py: cold, graph, host), so a run has one set of
rows per mode; a row's speedup is SDPA default's median over the row's median, both measured in this run
and in the same mode.

The record keeps a one-mode run in the format compare and older tools read, plus its "mode":
    {"kind": "flashcore-bench", "mode": "cold", "shape", "causal", ..., "rows": [...]}
A run of several modes (--mode cold,graph,host) adds "runs", one {"mode", "rows"} section per mode in the
order asked; the top-level "mode" and "rows" are the first section's, so a reader of one-mode records sees
the first mode. Read every mode with `record.get("runs") or [record]`.

--pair REF (cold mode) times each variant with reference row REF in the variant's own worker, their samples
taken in turn (modes.time_pair): the row "REF~VARIANT" (kind "reference", "paired_with": VARIANT) and the
variant's row then ran under one clock and power state, which rows timed one after the other need not have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flashcore_cli.check.correctness import CaseOutcome
from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.events import Event
from flashcore_cli.core.gpu import clocks
from flashcore_cli.core.isolate import run_worker
from flashcore_cli.core.passes import DEFAULT_PASS
from flashcore_cli.core.protocol import LAST_WORDS, WorkerOutcome, WorkRequest, classify, in_mode, timing_fields
from flashcore_cli.core.statuses import BUILD_FAIL, OK, SKIP
from flashcore_cli.measure.modes import DEFAULT_MODE
from flashcore_cli.measure.references import FLEX, SDPA_DEFAULT
from flashcore_cli.registry.family import DENSE, Family
from flashcore_cli.registry.variants import Registry, Variant
from flashcore_cli.measure.roofline import Peaks, roofline
from flashcore_cli.registry.shapes import Case, Shape, pass_bytes, pass_flops

@dataclass
class BenchRow:
    name: str
    kind: str  # "variant" or "reference"
    status: str  # OK, MISMATCH, TIMEOUT, CRASH, BUILD-FAIL, SKIP
    timing: dict = field(default_factory=dict)
    key: str = ""
    detail: str = ""
    paired: BenchRow | None = None  # --pair: the reference's row timed in turn with this variant's (its own row)
    paired_with: str = ""  # a paired reference row: the variant it was timed with
    plain: BenchRow | None = None  # a family case: the variant's same call without the family (its own row)
    flops: float | None = None  # a plain row's own FLOPs and bytes (the run's otherwise)
    bytes_moved: float | None = None

    @property
    def median(self) -> float | None:
        return self.timing.get("median_us")

    def as_dict(self, flops: float, sdpa_median: float | None, bytes_moved: float = 0.0,
                peaks: Peaks | None = None, baseline: str = SDPA_DEFAULT) -> dict:  # fmt: skip
        flops = self.flops or flops
        bytes_moved = self.bytes_moved or bytes_moved
        d = {"name": self.name, "kind": self.kind, "status": self.status, "key": self.key, "detail": self.detail}
        if self.paired_with:
            d["paired_with"] = self.paired_with
        if self.median:
            d["tflops"] = flops / (self.median * 1e-6) / 1e12
            d["speedup_vs_sdpa" if baseline == SDPA_DEFAULT else f"speedup_vs_{baseline}"] = (
                sdpa_median / self.median if sdpa_median else None)  # fmt: skip
            if bytes_moved:
                d["roofline"] = roofline(flops, bytes_moved, self.median, peaks).as_dict()
        d.update(self.timing)
        return d


def sdpa_median(rows: list[BenchRow]) -> float | None:
    return baseline_median(rows, SDPA_DEFAULT)


def baseline_median(rows: list[BenchRow], name: str) -> float | None:
    """The median of the (unpaired) row a run's speedups are against."""
    return next((r.median for r in rows if r.name == name and r.median), None)


def baseline_for(family: Family, causal: bool) -> str:
    """SDPA default where it expresses the case (dense or causal), else FlexAttention's row."""
    return SDPA_DEFAULT if family.is_dense(causal) else FLEX


@dataclass
class BenchRun:
    shape: Shape
    causal: bool
    seed: int
    modes: list[str] = field(default_factory=lambda: [DEFAULT_MODE])
    dtype: str = DEFAULT_DTYPE  # of q, k, v for every row, references included
    passes: str = DEFAULT_PASS  # what a timed call does: fwd, bwd or fwd+bwd (shapes.PASSES)
    family: Family = DENSE  # window, softcap, sinks (registry/family.py)
    rows: dict[str, list[BenchRow]] = field(default_factory=dict)  # mode -> its rows, in run order
    environment: dict = field(default_factory=dict)
    clocks_after: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @property
    def flops(self) -> float:
        return pass_flops(self.shape, self.causal, self.passes, self.family)

    @property
    def bytes_moved(self) -> float:
        return pass_bytes(self.shape, self.passes, self.causal, self.family)

    @property
    def baseline(self) -> str:
        """The row speedups are against: SDPA default, or FlexAttention where SDPA cannot express the case."""
        return baseline_for(self.family, self.causal)

    @property
    def peaks(self) -> Peaks | None:
        return Peaks.from_dict(self.environment.get("peaks"))

    def add(self, rows_by_mode: dict[str, list[BenchRow]]) -> None:
        for mode in self.modes:
            self.rows.setdefault(mode, []).extend(rows_by_mode.get(mode, []))

    def section(self, mode: str) -> dict:
        rows = self.rows.get(mode, [])
        base = baseline_median(rows, self.baseline)
        # every row names the family it ran (a plain row, the variant without it, has its own FLOPs and none)
        return {"mode": mode, "rows": [{**r.as_dict(self.flops, base, self.bytes_moved, self.peaks, self.baseline),
                                        **({} if r.flops else self.family.as_dict())} for r in rows]}  # fmt: skip

    def record(self) -> dict:
        sections = [self.section(m) for m in self.modes]
        record = {
            "kind": "flashcore-bench",
            "mode": sections[0]["mode"],
            "started": self.started,
            "shape": str(self.shape),
            "causal": self.causal,
            **self.family.as_dict(),
            "baseline": self.baseline,
            "dtype": self.dtype,
            "pass": self.passes,
            "seed": self.seed,
            "flops": self.flops,
            "bytes": self.bytes_moved,
            "environment": self.environment,
            "clocks_after": self.clocks_after,
            "rows": sections[0]["rows"],
        }
        if len(sections) > 1:
            record["runs"] = sections
        return record


def bench_references(case: Case, *, reps: int, warmup: int, timeout: float, modes=(DEFAULT_MODE,), on_event=None,
                     passes: str = DEFAULT_PASS) -> tuple[dict[str, list[BenchRow]], dict]:  # fmt: skip
    """The reference rows of every mode ({mode: rows}) and the run's environment, from one worker."""
    request = WorkRequest("references", case=case.as_dict(), reps=reps, warmup=warmup, modes=list(modes), passes=passes)
    worker = run_worker(request, run_timeout=timeout, on_event=on_event)
    verdict = classify(worker, wording=LAST_WORDS)  # the rows timed before a crash or a timeout stand beside it
    rows: dict[str, list[BenchRow]] = {}
    for mode in modes:
        rows[mode] = [BenchRow(e["name"], "reference", OK, timing_fields(e), detail=e.get("detail", ""))
                      for e in worker.timings(mode)]  # fmt: skip
        rows[mode] += [BenchRow(e["name"], "reference", SKIP, detail=e["reason"]) for e in worker.reference_skips(mode)]
        if verdict.status != OK:
            rows[mode].append(BenchRow("references", "reference", verdict.status, detail=verdict.detail))
    return rows, worker.environment


def bench_variant(
    registry: Registry,
    variant: Variant,
    case: Case,
    *,
    arch: str,
    reps: int,
    warmup: int,
    timeout: float,
    modes=(DEFAULT_MODE,),
    on_event=None,
    defines: dict[str, str] | None = None,
    passes: str = DEFAULT_PASS,
    pair: str = "",
) -> dict[str, BenchRow]:
    """The variant's row in every mode ({mode: row}); one worker builds, checks and times it in each. pair: a
    reference row timed in turn with it (the variant row's `paired`, None where the variant was not timed)."""
    reason = variant.unsupported_reason(case.shape.head_dim, case.causal, arch, case.dtype, **case.needs())
    if reason:
        return {m: BenchRow(variant.name, "variant", SKIP, detail=reason) for m in modes}
    request = WorkRequest("bench", str(registry.path), variant.name, arch, defines=defines or {}, case=case.as_dict(), reps=reps,
                          warmup=warmup, modes=list(modes), passes=passes, pair=pair)  # fmt: skip
    worker = run_worker(request, run_timeout=timeout, on_event=on_event)
    rows = {m: _variant_row(variant, case, worker, m, timeout) for m in modes}
    for mode, row in rows.items():
        row.paired = _paired_row(pair, variant.name, worker, mode) if pair else None
        row.plain = _plain_row(variant.name, case, worker, mode, passes)
    return rows


def plain_name(variant: str) -> str:
    return f"{variant} (plain)"


def _plain_row(variant: str, case: Case, worker: WorkerOutcome, mode: str, passes: str) -> BenchRow | None:
    """A family case's companion row: the variant's same call without the window, softcap and sinks, with its own
    FLOPs and bytes (the dense or causal count); None where it was not timed."""
    import dataclasses

    timing = [e for e in worker.find(Event.PLAIN_TIMING) if in_mode(e, mode)]
    if not timing:
        return None
    plain = dataclasses.replace(case, family=DENSE)
    return BenchRow(plain_name(variant), "variant", OK, timing_fields(timing[0]), key=worker.built.get("key", "") if worker.built else "",
                    detail=f"{variant} without{case.family.label(case.causal)}, same worker",
                    flops=pass_flops(plain.shape, plain.causal, passes), bytes_moved=pass_bytes(plain.shape, passes))  # fmt: skip


def paired_name(reference: str, variant: str) -> str:
    return f"{reference}~{variant}"


def _paired_row(reference: str, variant: str, worker: WorkerOutcome, mode: str) -> BenchRow | None:
    """The reference's row from a paired worker: its samples, or SKIP with the reason it could not run; None
    where the variant was not timed (so neither was the reference)."""
    name = paired_name(reference, variant)
    if timing := [e for e in worker.find(Event.PAIR_TIMING) if in_mode(e, mode)]:
        return BenchRow(name, "reference", OK, timing_fields(timing[0]), detail=f"samples in turn with {variant}'s",
                        paired_with=variant)  # fmt: skip
    if skipped := worker.find(Event.PAIR_SKIPPED):
        return BenchRow(name, "reference", SKIP, detail=skipped[0]["reason"], paired_with=variant)
    return None


def _variant_row(variant: Variant, case: Case, worker: WorkerOutcome, mode: str, timeout: float) -> BenchRow:
    key = (worker.built or {}).get("key", "")
    checked = worker.case_results()[:1]  # the bench shape's check
    failed = checked[0] if checked and checked[0]["status"] != OK else None
    verdict = classify(worker, timeout=timeout, answered=failed is not None)  # answered: a failed check is its answer
    if verdict.status == BUILD_FAIL:
        return BenchRow(variant.name, "variant", BUILD_FAIL, key=key, detail=verdict.detail)
    # a mode timed (or found untimeable) before a later mode crashed or timed out keeps its result
    if timing := worker.timings(mode):  # detail: a kernel run in place of the preferred one (forward_note)
        return BenchRow(variant.name, "variant", OK, timing_fields(timing[0]), key=key, detail=timing[0].get("detail", ""))
    if skipped := worker.timing_skips(mode):
        return BenchRow(variant.name, "variant", SKIP, key=key, detail=f"{mode} mode: {skipped[0]['reason']}")
    if verdict.status != OK:  # TIMEOUT, CRASH
        return BenchRow(variant.name, "variant", verdict.status, key=key, detail=verdict.detail)
    e = failed  # the check failed: the row says how, never timed
    outcome = CaseOutcome(case, e["status"], e["max_error"], e["tolerance"], e.get("detail", ""), e.get("mismatches", []))
    return BenchRow(variant.name, "variant", outcome.status, key=key, detail=f"not timed: {outcome.detail} "
                    f"(max error {outcome.max_error:.3g} > tolerance {outcome.tolerance:.3g})")  # fmt: skip


def finish(run: BenchRun) -> None:
    run.clocks_after = clocks()
