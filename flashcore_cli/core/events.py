"""The events a worker writes to its events file, each {"event": KIND, ...} on a line of its own (core/protocol.py
holds the request and the outcome that carry them). Each kind is declared once, in Event, and what it carries
once, in FIELDS; the list in protocol.py's documentation is made from FIELDS, so it cannot drift from the
events sent (tests/test_protocol.py holds every emitted kind to Event)."""

from __future__ import annotations

import textwrap


class Event:
    """The kinds, as the events file spells them."""

    BUILT = "built"
    BUILD_FAILED = "build-failed"
    DEVICE = "device"
    ENVIRONMENT = "environment"
    CASE_START = "case-start"
    CASE = "case"
    TIMING = "timing"
    TIMING_SKIPPED = "timing-skipped"
    REFERENCE_SKIPPED = "reference-skipped"
    PAIR_TIMING = "pair-timing"
    PAIR_SKIPPED = "pair-skipped"
    PLAIN_TIMING = "plain-timing"
    LAUNCHED = "launched"
    CRASH = "crash"
    DONE = "done"


FIELDS: dict[str, str] = {
    Event.BUILT: "the variant is built or loaded: jit's BuildResult.as_dict() (key, cached, build_seconds, load_seconds, "
    "resources, directory, binding, ...); references: a note. It starts the run's deadline (run_timeout) in place of "
    "the build's.",
    Event.BUILD_FAILED: "errors (the compiler's first errors), log",
    Event.DEVICE: "gpu: the name of the GPU the worker runs on",
    Event.ENVIRONMENT: "the run's environment (records.environment()); references add the GPU's peaks",
    Event.CASE_START: "case: the case about to be checked",
    Event.CASE: "a checked case: check_case's result (case, status OK or MISMATCH, max_error, tolerance, ...)",
    Event.TIMING: "name, and key (a variant) or detail (a reference), and Timing.as_dict() (mode, median_us, ...); a "
    "variant's detail names a kernel its launcher ran in place of the preferred one",
    Event.TIMING_SKIPPED: "name, key, mode, reason: the variant cannot be timed in that mode",
    Event.REFERENCE_SKIPPED: "name, reason, and mode when only that mode cannot time it (without: every mode)",
    Event.PAIR_TIMING: "(--pair) name (the reference row), paired_with (the variant), and Timing.as_dict(): the "
    "reference's samples, taken in turn with the variant's",
    Event.PAIR_SKIPPED: "(--pair) name, reason: the reference cannot run here; the variant is timed alone",
    Event.PLAIN_TIMING: "(a case with a window, softcap or sinks) name (the variant), and Timing.as_dict(): the same "
    "call without them (dense or causal), timed in the same worker after the case's own timing",
    Event.LAUNCHED: "calls, kernels",
    Event.CRASH: "where, error: an exception in the worker (a fault poisons the CUDA context: the task stops)",
    Event.DONE: "the last event of a clean run",
}


def describe(indent: int = 4, width: int = 116) -> str:
    """FIELDS as a list for a docstring: each kind, then what it carries, wrapped under it."""
    column = max(map(len, FIELDS)) + 2
    lines = []
    for kind, text in FIELDS.items():
        wrapped = textwrap.wrap(text, width - indent - column)
        lines.append(" " * indent + kind.ljust(column) + wrapped[0])
        lines += [" " * (indent + column) + line for line in wrapped[1:]]
    return "\n".join(lines)
