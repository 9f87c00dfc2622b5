"""The child process that owns the GPU for one piece of isolated work (see isolate.py).

    python -m flashcore_cli.worker SPEC.json

SPEC.json is a WorkRequest (core/protocol.py: the request, and every event this process writes) plus the path
of its events file. Tasks: "build" (build one variant), "test" (build, then check cases), "bench" (build,
check the bench shape, then time it), "references" (time PyTorch SDPA's backends and the Triton reference),
"launch" (call a variant a few times for compute-sanitizer or ncu to watch), "trial" (one tuning combination:
check, then time). Timing tasks time in each mode of request.modes (measure/modes.py; none: the default mode)
and emit one "timing" event per mode, or "timing-skipped" with the reason where the call cannot be timed in a
mode. Progress goes to the events file as JSON lines; the last line of a clean run is {"event": "done"}.
This module only dispatches: building and checking are the builder's and check's, timing is measure/timed.py's.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from flashcore_cli.core.errors import EXIT_INTERNAL_ERROR
from flashcore_cli.core.events import Event
from flashcore_cli.core.protocol import WorkRequest, crash_fields
from flashcore_cli.core.statuses import OK
from flashcore_cli.measure.timed import time_references, time_variant
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
        events.emit(Event.BUILD_FAILED, errors=exc.errors, log=str(exc.log))
        return None
    events.emit(Event.BUILT, **result.as_dict())
    return variant, result


def _crash(events: Events, exc: BaseException, where: str) -> None:
    events.emit(Event.CRASH, **crash_fields(exc, where))


def task_build(request: WorkRequest, events: Events) -> None:
    _build_only(request, events)


def _check(attn, case: Case, events: Events):
    """Check one case and report it; None when it crashed (the crash is reported; the context is gone)."""
    from flashcore_cli.check.case import check_case

    events.emit(Event.CASE_START, case=case.as_dict())
    try:
        result = check_case(attn, case)
    except Exception as exc:  # a fault poisons the context: report it and stop this variant
        _crash(events, exc, case.label())
        return None
    events.emit(Event.CASE, **result.__dict__)
    return result


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
    events.emit(Event.DEVICE, gpu=torch.cuda.get_device_name())  # which GPU measured the row (sweep's lanes)
    case = Case.from_dict(request.case)
    result = _check(attn, case, events)
    if result is None or result.status != OK:
        return  # never time a variant that failed correctness
    time_variant(attn, case, request, events.emit)


def task_references(request: WorkRequest, events: Events) -> None:
    time_references(request, events.emit)


def task_launch(request: WorkRequest, events: Events) -> None:
    """Call the variant `calls` times on one case and nothing else: the process compute-sanitizer or ncu
    watches (sanitize/profile build the variant beforehand, so this only loads it from the cache). A variant
    with a backward runs it too (from the forward's o and lse, into NaN-poisoned gradients), so the tools see
    both passes."""
    import torch

    from flashcore_cli.check.case import grad_output, make_inputs, make_sinks

    attn = _build(request, events)
    if attn is None:
        return
    case = Case.from_dict(request.case)
    q, k, v = make_inputs(case)
    sinks = make_sinks(case)
    kwargs = {"causal": case.causal, **case.family.kwargs(case.causal), "sinks": sinks}
    backward = attn.variant.supports("backward")
    out = torch.full_like(q, float("nan"))
    events.emit(Event.CASE_START, case=case.as_dict())
    try:
        for _ in range(request.calls):
            if backward:
                out, lse, residual = attn.forward_train(q, k, v, **kwargs)
                grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                dsinks = torch.full_like(sinks, float("nan")) if sinks is not None else None
                attn.backward(grad_output(case), q, k, v, out, lse, **kwargs, out_residual=residual, into=grads,
                              dsinks=dsinks)  # fmt: skip
            else:
                attn(q, k, v, **kwargs, out=out)
        torch.cuda.synchronize()
    except Exception as exc:
        _crash(events, exc, case.label())
        return
    events.emit(Event.LAUNCHED, calls=request.calls, kernels=[p[0] for p in attn.plan(case.shape.head_dim)])


def task_trial(request: WorkRequest, events: Events) -> None:
    """One tuning trial: build with exactly request.defines (request.ignore_tuned keeps the stored winner
    out), check every case, and time request.case only if all passed."""
    import torch

    from flashcore_cli.core.records import environment

    attn = _build(request, events)
    if attn is None:
        return
    events.emit(Event.DEVICE, gpu=torch.cuda.get_device_name())
    events.emit(Event.ENVIRONMENT, **environment())
    for raw in request.cases:
        result = _check(attn, Case.from_dict(raw), events)
        if result is None or result.status != OK:
            return  # never time a configuration that failed correctness
    time_variant(attn, Case.from_dict(request.case), request, events.emit)


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
        return EXIT_INTERNAL_ERROR
    events.emit(Event.DONE)
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
