"""What the parent and a worker say to each other (isolate.py runs the worker; worker.py is the worker).

    parent: run_worker(WorkRequest)  --- SPEC.json --->  python -m flashcore_cli.worker SPEC.json
    parent: WorkerOutcome            <-- events file ---  one JSON line per event, {"event": "done"} last

The request. One WorkRequest names the task and everything it needs; SPEC.json is its to_json() plus "events",
the path of the events file, and the worker reads it back with WorkRequest.from_json. The keys are the
field names, but for `passes`, which is "pass" (a Python keyword). Cases travel as Case.as_dict() records.

The events, each {"event": KIND, ...} on a line of its own: core/events.py declares the kinds (Event) and what
each carries; the list below this paragraph is made from that declaration when the module loads:
{events}

The outcome. WorkerOutcome holds the events, how the process ended and the tail of its log; its accessors read
the events for the callers. classify() is the one rule that turns an outcome into a status (BUILD-FAIL,
TIMEOUT, CRASH or OK) and its detail; each caller only words the two failures that leave no words of the
worker's own (a timeout, and a worker that ended without its answer) through a Wording.

No torch here, nor anything of the registry: the CLI imports this module at start-up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from flashcore_cli.core.events import Event, describe
from flashcore_cli.core.passes import DEFAULT_PASS
from flashcore_cli.core.statuses import BUILD_FAIL, CRASH, OK, TIMEOUT

__doc__ = __doc__.replace("{events}", describe())
# a timing event's fields that a row keeps (Timing.as_dict() less the mode)
TIMING_KEYS = ("median_us", "p10_us", "p90_us", "calls_per_sample", "timed_out_samples", "samples_us")


@dataclass(frozen=True)
class WorkRequest:
    """One piece of isolated work: the task and what it reads (the tasks are worker.py's TASKS)."""

    task: str  # build, test, bench, references, launch, trial
    registry: str = ""  # the registry file (every task but references)
    variant: str = ""  # the variant's name in it
    arch: str = ""  # the target, e.g. sm_90
    force: bool = False  # build: compile even when the cache has it
    defines: dict[str, str] = field(default_factory=dict)  # -D NAME=VALUE, over the GPU's stored tuned winner
    ignore_tuned: bool = False  # trial: build with `defines` alone, never the stored winner
    cases: list[dict] = field(default_factory=list)  # test, trial: the cases to check (Case.as_dict())
    case: dict | None = None  # bench, references, launch, trial: the case to time or launch (Case.as_dict())
    reps: int = 0  # timed samples per row and mode
    warmup: int = 0  # untimed calls first
    modes: list[str] = field(default_factory=list)  # the timing modes, in order (empty: the default mode)
    passes: str = DEFAULT_PASS  # what a timed call does: fwd, bwd or fwd+bwd ("pass" in the JSON)
    calls: int = 1  # launch: how many calls
    pair: str = ""  # bench: a reference row (measure/references.py) whose samples alternate with the variant's

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["pass"] = data.pop("passes")
        return data

    @classmethod
    def from_json(cls, data: dict) -> WorkRequest:
        """The request in a spec (its other keys, such as "events", are not the request's)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {("passes" if key == "pass" else key): value for key, value in data.items()}
        return cls(**{key: value for key, value in values.items() if key in names})


def crash_fields(exc: BaseException, where: str) -> dict:
    """A "crash" event's fields: where it happened, and the exception's type and message."""
    return {"where": where, "error": f"{type(exc).__name__}: {exc}".strip()[:2000]}


def in_mode(event: dict, mode: str) -> bool:
    """An event without a mode (a row skipped before any timing) belongs to every mode."""
    return event.get("mode", mode) == mode


def timing_fields(event: dict) -> dict:
    """What a row keeps of a timing event."""
    return {k: event[k] for k in TIMING_KEYS if k in event}


@dataclass
class WorkerOutcome:
    """How one worker ended, and everything it said."""

    status: str  # "done", "timeout", "crash" (it ended without saying "done")
    events: list[dict] = field(default_factory=list)
    returncode: int | None = None
    seconds: float = 0.0
    log_tail: str = ""
    phase: str = "build"  # "build" or "run": where a timeout struck

    def find(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def _first(self, kind: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == kind), None)

    @property
    def built(self) -> dict | None:
        """The "built" event (with its "event" key, as records keep it); None when nothing was built."""
        return self._first(Event.BUILT)

    @property
    def build_errors(self) -> str | None:
        """The compiler's first errors when the build failed, else None."""
        failed = self._first(Event.BUILD_FAILED)
        return failed["errors"] if failed else None

    @property
    def crash_errors(self) -> list[str]:
        return [e["error"] for e in self.find(Event.CRASH)]

    @property
    def crash_error(self) -> str | None:
        """The error of the first exception the worker reported, else None."""
        return next(iter(self.crash_errors), None)

    @property
    def device(self) -> str:
        """The name of the GPU the worker ran on ("" when it did not get that far)."""
        device = self._first(Event.DEVICE)
        return device["gpu"] if device else ""

    @property
    def environment(self) -> dict:
        """The run's environment ({} when the worker did not report one)."""
        return {k: v for k, v in (self._first(Event.ENVIRONMENT) or {}).items() if k != "event"}

    def started_cases(self) -> list[dict]:
        """The cases whose check began, in order."""
        return [e["case"] for e in self.find(Event.CASE_START)]

    def case_results(self) -> list[dict]:
        """The checked cases' results, in order."""
        return self.find(Event.CASE)

    def timings(self, mode: str) -> list[dict]:
        return [e for e in self.find(Event.TIMING) if in_mode(e, mode)]

    def timing_skips(self, mode: str) -> list[dict]:
        """A variant's "timing-skipped" events in the mode: it cannot be timed that way."""
        return [e for e in self.find(Event.TIMING_SKIPPED) if in_mode(e, mode)]

    def reference_skips(self, mode: str) -> list[dict]:
        return [e for e in self.find(Event.REFERENCE_SKIPPED) if in_mode(e, mode)]


@dataclass(frozen=True)
class Verdict:
    status: str  # OK, BUILD-FAIL, TIMEOUT, CRASH
    detail: str = ""


@dataclass(frozen=True)
class Wording:
    """How a caller words the two failures that leave no words of the worker's own. str.format templates, with
    timeout (seconds), phase (build or run), status, returncode, log_tail, and last_words (the error of the
    worker's crash event if it reported one, else log_tail)."""

    timeout: str = "killed after {timeout:.0f} s ({phase})"  # the deadline passed: the process group was killed
    died: str = "{log_tail}"  # it ended without its answer: died without "done", or "done" without the answer


LAST_WORDS = Wording(timeout="{last_words}")  # a timeout said as whatever the worker said last


def classify(outcome: WorkerOutcome, *, timeout: float = 0.0, answered: bool = True, wording: Wording = Wording()) -> Verdict:
    """The worker's verdict, the first that holds:
        BUILD-FAIL  the build failed (detail: the compiler's first errors)
        TIMEOUT     its deadline passed and its process group was killed (detail: wording.timeout)
        CRASH       it reported an exception (detail: its error); or it ended without its answer (wording.died):
                    it died without saying "done", or said "done" without what the caller asked (answered=False)
        OK          it ended cleanly, with its answer
    `timeout` is the run deadline the caller gave (seconds), for the wording. A result the worker gave before it
    failed (a case checked, a mode timed) is the caller's to keep: it reads the result first where it keeps it."""
    if outcome.build_errors is not None:
        return Verdict(BUILD_FAIL, outcome.build_errors)
    error = outcome.crash_error
    words = {"timeout": timeout, "phase": outcome.phase, "status": outcome.status, "returncode": outcome.returncode,
             "log_tail": outcome.log_tail, "last_words": outcome.log_tail if error is None else error}  # fmt: skip
    if outcome.status == "timeout":
        return Verdict(TIMEOUT, wording.timeout.format(**words))
    if error is not None:
        return Verdict(CRASH, error)
    if outcome.status == "crash" or not answered:
        return Verdict(CRASH, wording.died.format(**words))
    return Verdict(OK)
