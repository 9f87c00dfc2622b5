"""The child process that owns the GPU for one piece of isolated work (see isolate.py).

    python -m flashcore_cli.worker SPEC.json

SPEC.json is a WorkRequest (core/protocol.py: the request, and every event this process writes) plus the path
of its events file. Tasks: "build" (build one variant), "test" (build, then check cases), "bench" (build,
check the bench shape, then time it), "references" (time PyTorch SDPA's backends and the Triton reference),
"launch" (call a variant a few times for compute-sanitizer or ncu to watch), "trial" (one tuning combination:
check, then time). Timing tasks time in each mode of request.modes (measure/modes.py; none: the default mode)
and emit one "timing" event per mode, or "timing-skipped" with the reason where the call cannot be timed in a
mode. Progress goes to the events file as JSON lines; the last line of a clean run is {"event": "done"}.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

from flashcore_cli.core.protocol import WorkRequest
from flashcore_cli.registry.shapes import Case


class Events:
    def __init__(self, path: str):
        self.handle = open(path, "a", buffering=1)

    def emit(self, event: str, **fields) -> None:
        self.handle.write(json.dumps({"event": event, **fields}, default=str) + "\n")
        self.handle.flush()


def _build(request: WorkRequest, events: Events):
    """The variant built (or loaded from the cache) as an Attention, after its "built" event; None when the
    build failed ("build-failed" said why)."""
    from flashcore_cli.api import Attention

    built = _build_only(request, events)
    return None if built is None else Attention(*built)


def _build_only(request: WorkRequest, events: Events):
    """(variant, BuildResult) after the "built" event, or None. `build` stops here: an Attention registers a
    torch.library op, which a build does not need and its caller would wait for."""
    from flashcore_cli.builder.jit import BuildError, build_variant
    from flashcore_cli.registry.variants import load_registry

    from flashcore_cli.builder.tuned import tuned_defines_here

    variant = load_registry(request.registry).get(request.variant)
    explicit = request.defines
    # a tuning trial passes its own defines; everything else builds with the stored winner for this GPU
    defines = explicit if request.ignore_tuned else {**tuned_defines_here(variant.name), **explicit}
    try:
        result = build_variant(variant, request.arch, force=request.force, extra_defines=defines or None)
    except BuildError as exc:
        events.emit("build-failed", errors=exc.errors, log=str(exc.log))
        return None
    events.emit("built", **result.as_dict())
    return variant, result


def _crash(events: Events, exc: BaseException, where: str) -> None:
    events.emit("crash", where=where, error=f"{type(exc).__name__}: {exc}".strip()[:2000])


def task_build(request: WorkRequest, events: Events) -> None:
    _build_only(request, events)


def _check(attn, case: Case, events: Events):
    """Check one case and report it; None when it crashed (the crash is reported; the context is gone)."""
    from flashcore_cli.check.case import check_case

    events.emit("case-start", case=case.as_dict())
    try:
        result = check_case(attn, case)
    except Exception as exc:  # a fault poisons the context: report it and stop this variant
        _crash(events, exc, case.label())
        return None
    events.emit("case", **result.__dict__)
    return result


def _modes(request: WorkRequest) -> list[str]:
    from flashcore_cli.measure.modes import DEFAULT_MODE

    return list(request.modes or [DEFAULT_MODE])


def variant_call(attn, case: Case, passes: str):
    """The zero-argument call a timing of `passes` (fwd, bwd or fwd+bwd) repeats, on the case's inputs: the
    forward into a preallocated output; the backward from a saved training forward (o, lse, out_residual) into
    preallocated gradients; fwd+bwd, the training forward and the backward."""
    import torch

    from flashcore_cli.check.case import grad_output, make_inputs

    q, k, v = make_inputs(case)
    if passes == "fwd":
        out = torch.empty_like(q)
        return lambda: attn(q, k, v, causal=case.causal, out=out)
    d_o = grad_output(case)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    if passes == "bwd":
        o, lse, residual = attn.forward_train(q, k, v, causal=case.causal)
        return lambda: attn.backward(d_o, q, k, v, o, lse, causal=case.causal, out_residual=residual, into=grads)

    def forward_backward():
        o, lse, residual = attn.forward_train(q, k, v, causal=case.causal)
        return attn.backward(d_o, q, k, v, o, lse, causal=case.causal, out_residual=residual, into=grads)

    return forward_backward


def _time(attn, case: Case, request: WorkRequest, events: Events) -> None:
    """A "timing" event per mode (or "timing-skipped" with the reason); with request.pair, the reference row's
    samples taken in turn with the variant's (modes.time_pair) and a "pair-timing" event beside each. A reference
    that cannot run here ("pair-skipped" says why) leaves the variant timed alone."""
    from flashcore_cli.measure.modes import time_callable, time_pair

    call = variant_call(attn, case, request.passes)
    alone = lambda mode: (time_callable(call, mode=mode, reps=request.reps, warmup=request.warmup), None)  # noqa: E731
    if not request.pair:
        _time_modes(attn, case, request, events, alone)
        return
    from flashcore_cli.check.case import make_inputs
    from flashcore_cli.measure.references import reference_functions

    q, k, v = make_inputs(case)
    rows = {name: (fn, context, why) for name, fn, context, why in reference_functions(q, k, v, case.causal, request.passes)}
    fn, context, why_not = rows.get(request.pair, (None, None, f"no reference row is named {request.pair!r}"))
    # entered once, around everything (a backend pin is a one-shot context manager); the variant makes no SDPA call
    with context or contextlib.nullcontext():
        if fn is not None:
            try:
                fn()
            except Exception as exc:  # a backend that cannot run this shape
                fn, why_not = None, _first_line(exc)
        if fn is None:
            events.emit("pair-skipped", name=request.pair, reason=why_not)
            _time_modes(attn, case, request, events, alone)
            return
        paired = lambda mode: time_pair(call, fn, mode=mode, reps=request.reps, warmup=request.warmup)  # noqa: E731
        _time_modes(attn, case, request, events, paired, f" paired with {request.pair}")


def _time_modes(attn, case: Case, request: WorkRequest, events: Events, measure, what: str = "") -> None:
    """measure(mode) -> (the variant's Timing, the paired reference's or None), in each mode of the request."""
    from flashcore_cli.measure.timing import TimingError

    for mode in _modes(request):
        try:
            mine, theirs = measure(mode)
        except TimingError as exc:  # this mode cannot time the call: say why, go on with the next mode
            events.emit("timing-skipped", name=attn.name, key=attn.build.key, mode=mode, reason=str(exc))
            continue
        except Exception as exc:
            _crash(events, exc, f"timing {case.label()}{what} ({mode} mode)")
            return
        # a kernel the launcher ran in place of its preferred one is named in the row that timed it (a backward
        # alone runs no forward: the note of the setup's forward is not its row's)
        note = attn.forward_note() if request.passes != "bwd" else None
        events.emit("timing", name=attn.name, key=attn.build.key, **mine.as_dict(), **({"detail": note} if note else {}))
        if theirs is not None:
            events.emit("pair-timing", name=request.pair, paired_with=attn.name, **theirs.as_dict())


def task_test(request: WorkRequest, events: Events) -> None:
    attn = _build(request, events)
    if attn is None:
        return
    for raw in request.cases:
        if _check(attn, Case.from_dict(raw), events) is None:
            return


def task_bench(request: WorkRequest, events: Events) -> None:
    import torch

    attn = _build(request, events)
    if attn is None:
        return
    events.emit("device", gpu=torch.cuda.get_device_name())  # which GPU measured the row (sweep's lanes)
    case = Case.from_dict(request.case)
    result = _check(attn, case, events)
    if result is None or result.status != "OK":
        return  # never time a variant that failed correctness
    _time(attn, case, request, events)


def task_references(request: WorkRequest, events: Events) -> None:
    from flashcore_cli.check.case import make_inputs
    from flashcore_cli.core.records import environment
    from flashcore_cli.measure.references import reference_functions
    from flashcore_cli.measure.modes import needs_flusher, time_callable
    from flashcore_cli.measure.timing import L2Flusher, TimingError

    from flashcore_cli.measure.roofline import device_peaks

    events.emit("built", note="references need no build")
    peaks = device_peaks()
    events.emit("environment", **environment(), peaks=peaks.as_dict() if peaks else None)
    case = Case.from_dict(request.case)
    q, k, v = make_inputs(case)
    modes = _modes(request)
    flusher = L2Flusher() if needs_flusher(modes) else None  # one for every row, made before any is timed
    for name, fn, context, why_not in reference_functions(q, k, v, case.causal, request.passes):
        if fn is None:
            events.emit("reference-skipped", name=name, reason=why_not)  # no mode: skipped in every mode
            continue
        with context:  # entered once per row (a backend pin is a one-shot context manager)
            try:
                fn()
            except Exception as exc:  # a backend that cannot run this shape: say so and go on
                events.emit("reference-skipped", name=name, reason=_first_line(exc))
                continue
            describe = getattr(fn, "describe", None)  # what the row runs, when it chose (Triton's tuned tile)
            detail = describe() if describe else ""
            for mode in modes:
                try:
                    timing = time_callable(fn, mode=mode, reps=request.reps, warmup=request.warmup, flusher=flusher)
                except Exception as exc:  # this mode cannot time it (e.g. no graph capture): the reason, per mode
                    reason = str(exc) if isinstance(exc, TimingError) else _first_line(exc)
                    events.emit("reference-skipped", name=name, mode=mode, reason=reason)
                    continue
                events.emit("timing", name=name, detail=detail, **timing.as_dict())


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def task_launch(request: WorkRequest, events: Events) -> None:
    """Call the variant `calls` times on one case and nothing else: the process compute-sanitizer or ncu
    watches (sanitize/profile build the variant beforehand, so this only loads it from the cache). A variant
    with a backward runs it too (from the forward's o and lse, into NaN-poisoned gradients), so the tools see
    both passes."""
    import torch

    from flashcore_cli.check.case import grad_output, make_inputs

    attn = _build(request, events)
    if attn is None:
        return
    case = Case.from_dict(request.case)
    q, k, v = make_inputs(case)
    backward = attn.variant.supports("backward")
    out = torch.full_like(q, float("nan"))
    events.emit("case-start", case=case.as_dict())
    try:
        for _ in range(request.calls):
            if backward:
                out, lse, residual = attn.forward_train(q, k, v, causal=case.causal)
                grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                attn.backward(grad_output(case), q, k, v, out, lse, causal=case.causal, out_residual=residual, into=grads)
            else:
                attn(q, k, v, causal=case.causal, out=out)
        torch.cuda.synchronize()
    except Exception as exc:
        _crash(events, exc, case.label())
        return
    events.emit("launched", calls=request.calls, kernels=[p[0] for p in attn.plan(case.shape.head_dim)])


def task_trial(request: WorkRequest, events: Events) -> None:
    """One tuning trial: build with exactly request.defines (request.ignore_tuned keeps the stored winner
    out), check every case, and time request.case only if all passed."""
    import torch

    from flashcore_cli.core.records import environment

    attn = _build(request, events)
    if attn is None:
        return
    events.emit("device", gpu=torch.cuda.get_device_name())
    events.emit("environment", **environment())
    for raw in request.cases:
        result = _check(attn, Case.from_dict(raw), events)
        if result is None or result.status != "OK":
            return  # never time a configuration that failed correctness
    _time(attn, Case.from_dict(request.case), request, events)


TASKS = {
    "build": task_build,
    "test": task_test,
    "bench": task_bench,
    "references": task_references,
    "launch": task_launch,
    "trial": task_trial,
}


def main(argv: list[str]) -> int:
    spec = json.loads(open(argv[1]).read())
    events = Events(spec["events"])
    request = WorkRequest.from_json(spec)
    try:
        TASKS[request.task](request, events)
    except Exception as exc:
        traceback.print_exc()
        _crash(events, exc, request.task)
        return 3
    events.emit("done")
    if request.task == "build":
        _leave_now(events)
    return 0


def _leave_now(events: Events) -> None:
    """End a build worker without the interpreter's teardown of torch (0.5-0.65 s on the H200 box, which its
    caller waited for). Its answers are in the events file, closed here; a build launches no kernel and never
    runs under a sanitizer or profiler (whose reports are written at a normal exit), so nothing else is lost."""
    events.handle.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
