"""`flashcore tune`: search the -D parameters a variant declares, and keep the fastest correct one per GPU.

    1. the grid: every combination of the registry's `tune: params` values (--param NAME=v,v narrows or
       replaces one parameter's values; only declared names are accepted);
    2. the registry's constraints reject combinations before anything is compiled (constraints.py);
    3. the device's limits: each remaining combination is compiled by the no-GPU ptxas probe, and one whose
       kernels spill registers or cannot fit one CTA on an SM is skipped before any GPU time is spent;
    4. trials, spread over every visible GPU (gpus.py): each builds the combination (ignoring any stored
       winner), checks it on the tune shape and two awkward ones, and times it only if every check passed,
       in the run's one timing mode (--mode cold, graph or host: modes.py; the record carries it);
    5. the ranking, and the winner stored per GPU model (tuned.py): every later build of the variant on that
       GPU, so `flashcore build/test/bench`, uses it.
"""

from __future__ import annotations

import itertools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from flashcore_cli.core.statuses import CRASH, OK, SKIP
from flashcore_cli.registry.constraints import compile_constraint
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.protocol import WorkRequest, Wording, classify, timing_fields
from flashcore_cli.measure.modes import DEFAULT_MODE
from flashcore_cli.registry.variants import TuneSpace, Variant

CHECK_SEQ_LENS = (17, 97)  # beside the tune shape: a short and a ragged sequence, at the same head dim


@dataclass
class Candidate:
    defines: dict[str, int]
    skipped: str = ""  # why it never ran: a constraint, spills, does not fit, compile failed
    resources: str = ""  # from the ptxas probe
    status: str = ""  # the trial's: OK, MISMATCH, TIMEOUT, CRASH, BUILD-FAIL, SKIP (untimeable in the mode)
    timing: dict = field(default_factory=dict)
    gpu: str = ""  # the GPU model the trial ran on
    lane: str = ""  # which visible GPU
    key: str = ""
    detail: str = ""

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.defines.items())

    @property
    def median(self) -> float | None:
        return self.timing.get("median_us")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("defines", "skipped", "resources", "status", "timing", "gpu", "lane", "key", "detail")}


def parse_params(values: list[str] | None, space: TuneSpace, variant: str) -> dict[str, list[int]]:
    """The declared space, with --param NAME=v1,v2 replacing NAME's values."""
    if not space.params:
        raise FlashcoreError(f"{variant} declares no tuning parameters (add a `tune:` block with `params:` to its registry entry)")
    params = {k: list(v) for k, v in space.params.items()}
    given: set[str] = set()
    for text in values or []:
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*(.+)", text)
        if not m:
            raise FlashcoreError(f"--param '{text}': expected NAME=v1,v2,... e.g. BLOCK_M=32,64")
        name, raw = m.groups()
        if name not in params:
            raise FlashcoreError(f"--param {name}: {variant} does not declare it as tunable (declared: {', '.join(params)})")
        if name in given:
            raise FlashcoreError(f"--param {name} is given twice")
        tokens = [t.strip() for t in raw.split(",") if t.strip()]
        if not tokens or not all(re.fullmatch(r"-?\d+", t) for t in tokens):
            raise FlashcoreError(f"--param {name}={raw}: the values must be integers separated by commas")
        params[name] = list(dict.fromkeys(int(t) for t in tokens))
        given.add(name)
    return params


def grid(params: dict[str, list[int]], constraints: list[str]) -> list[Candidate]:
    """Every combination, in declaration order; those a constraint rejects are marked skipped."""
    checks = [compile_constraint(c, params.keys()) for c in constraints]
    names = list(params)
    out = []
    for combo in itertools.product(*(params[n] for n in names)):
        values = dict(zip(names, combo))
        failed = next((c.text for c in checks if not c.holds(values)), None)
        out.append(Candidate(values, skipped=f"constraint: {failed}" if failed else ""))
    return out


def probe_limits(variant: Variant, arch: str, head_dim: int, candidates: list[Candidate], on_done=None) -> None:
    """Compile each remaining candidate with the ptxas probe (no GPU); skip those that spill or do not fit."""
    import os

    from flashcore_cli.builder.ptxas import compile_probe

    todo = [c for c in candidates if not c.skipped]

    def one(c: Candidate):
        return c, compile_probe(variant, arch, {k: str(v) for k, v in c.defines.items()})

    from flashcore_cli.core.isolate import stop_on_interrupt

    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool, stop_on_interrupt(pool):
        for c, report in pool.map(one, todo):  # Ctrl-C: the queued probes dropped, the running compilers killed
            judge(c, report, head_dim)
            if on_done:
                on_done(c)


def judge(c: Candidate, report, head_dim: int) -> None:
    """Read one probe: note the resources of the kernels used at head_dim; mark the candidate skipped if it
    cannot run well on the arch."""
    if report.error:
        c.skipped, c.detail = f"compile failed: {report.error.strip().splitlines()[0]}", report.error
        return
    used = [k for k in report.kernels if k.threads and k.head_dim == head_dim] or [k for k in report.kernels if k.threads]
    c.resources = "; ".join(
        f"{k.registers} regs, {k.smem_per_cta / 1024:.1f} KB smem, {k.ctas_per_sm} CTA/SM" for k in used
    )
    if spilled := [k for k in report.kernels if k.spills]:
        c.skipped = f"spills ({', '.join(f'{k.spill_stores}+{k.spill_loads} B' for k in spilled)})"
    elif unfit := [k for k in used if k.ctas_per_sm == 0]:
        c.skipped = f"does not fit: {unfit[0].limiter}"


# ---------------------------------------------------------------- trials (run in a GPU lane)
@dataclass(frozen=True)
class TrialJob:
    registry: str
    variant: str
    arch: str
    defines: tuple[tuple[str, str], ...]
    cases: tuple[dict, ...]
    case: dict
    reps: int
    warmup: int
    timeout: float
    mode: str = DEFAULT_MODE


# a trial that ended without its answer says how the worker ended
TRIAL_WORDS = Wording(died="worker {status}, exit {returncode}\n{log_tail}")


def run_trial(job: TrialJob) -> dict:
    from flashcore_cli.core.isolate import run_worker

    request = WorkRequest("trial", job.registry, job.variant, job.arch, defines=dict(job.defines), ignore_tuned=True,
                          cases=list(job.cases), case=job.case, reps=job.reps, warmup=job.warmup, modes=[job.mode])  # fmt: skip
    worker = run_worker(request, run_timeout=job.timeout)
    result = {"key": (worker.built or {}).get("key", ""), "gpu": worker.device, "timing": {}, "detail": "",
              "environment": worker.environment}  # fmt: skip
    bad = [e for e in worker.case_results() if e["status"] != OK]
    timing, skipped = worker.timings(job.mode), worker.timing_skips(job.mode)
    verdict = classify(worker, timeout=job.timeout, answered=bool(bad or timing or skipped), wording=TRIAL_WORDS)
    if verdict.status != OK:
        return {**result, "status": verdict.status, "detail": verdict.detail}
    if bad:
        e = bad[0]
        return {**result, "status": e["status"], "detail": f"{e['case']['shape']}{' causal' if e['case']['causal'] else ''}: {e['detail']}"}
    if not timing:
        return {**result, "status": SKIP, "detail": f"{job.mode} mode: {skipped[0]['reason']}"}
    return {**result, "status": OK, "timing": timing_fields(timing[0])}


def check_cases(variant: Variant, shape, seed: int) -> list:
    """What a trial must pass before it is timed: the tune shape and two awkward sequence lengths, in every
    masking mode the variant supports (a tuned build serves them all). A rung that takes at most max_seq_len
    query rows (a decode rung) is checked at 1 and max_seq_len rows of the tune shape's heads against those
    lengths of keys instead."""
    from flashcore_cli.registry.shapes import Shape, expand_cases

    if variant.max_seq_len:
        awkward = [Shape(2, shape.heads, rows, shape.head_dim, shape.heads_kv, keys)
                   for rows, keys in zip((1, variant.max_seq_len), CHECK_SEQ_LENS)]  # fmt: skip
    else:
        awkward = [Shape(2, 3, s, shape.head_dim) for s in CHECK_SEQ_LENS if s != shape.seq_len]
    return expand_cases([shape, *awkward], seed, (False, True) if variant.causal else (False,))


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    timed = sorted((c for c in candidates if c.median), key=lambda c: c.median)
    return timed + [c for c in candidates if not c.median]


def lost_trial(lost) -> dict:
    """A trial whose lane died under it (gpus.LaneLost): CRASH with the reason."""
    return {"status": CRASH, "detail": lost.reason, "timing": {}, "gpu": "", "key": "", "environment": {}}


def run_trials(template: TrialJob, runnable: list[Candidate], gpus: list[str] | None = None,
               on_trial=None) -> tuple[list[dict], dict]:  # fmt: skip
    """One trial per candidate (the template with the candidate's defines), over the GPUs (default: every visible
    one); each candidate gets its status, timing, GPU and cache key, then on_trial(candidate) is called. Returns
    each trial's environment (GPU, driver, ...) and, for the record, the GPUs, the number of lanes and the wall
    time of the trials."""
    import dataclasses
    import time

    from flashcore_cli.measure.gpus import LaneLost, map_on_gpus, visible_gpus

    jobs = [dataclasses.replace(template, defines=tuple((k, str(v)) for k, v in c.defines.items())) for c in runnable]
    gpus = gpus or visible_gpus() or ["0"]

    def on_done(index, result, gpu):
        c = runnable[index]
        if isinstance(result, LaneLost):
            result = lost_trial(result)
        c.status, c.timing, c.gpu, c.key, c.detail = result["status"], result["timing"], result["gpu"], result["key"], result["detail"]
        c.lane = gpu
        if on_trial is not None:
            on_trial(c)

    started = time.monotonic()
    results = map_on_gpus(run_trial, jobs, gpus, on_done=on_done)
    wall_s = time.monotonic() - started
    environments = [{} if isinstance(r, LaneLost) else r.get("environment") or {} for r in results]
    return environments, {"gpus": gpus, "lanes": min(len(gpus), len(jobs)), "wall_s": round(wall_s, 3)}


def best_per_gpu(candidates: list[Candidate]) -> dict[str, Candidate]:
    best: dict[str, Candidate] = {}
    for c in ranked(candidates):
        if c.median and c.gpu and c.gpu not in best:
            best[c.gpu] = c
    return best


