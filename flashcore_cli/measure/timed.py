"""What a worker times (worker.py dispatches the tasks; this module holds their timing): a variant's call for a
pass (fwd, bwd, fwd+bwd) on a case's inputs, timed in each mode of the request, alone or with a reference row's
samples taken in turn (--pair); and the reference rows (PyTorch SDPA's backends, the Triton forward). Each
result is an event (core/protocol.py) handed to `emit(kind, **fields)`, which the worker writes to its events
file.
"""

from __future__ import annotations

import contextlib

from flashcore_cli.core.events import Event
from flashcore_cli.core.protocol import WorkRequest, crash_fields
from flashcore_cli.registry.shapes import Case


def request_modes(request: WorkRequest) -> list[str]:
    from flashcore_cli.measure.modes import DEFAULT_MODE

    return list(request.modes or [DEFAULT_MODE])


def variant_call(attn, case: Case, passes: str):
    """The zero-argument call a timing of `passes` (fwd, bwd or fwd+bwd) repeats, on the case's inputs: the
    forward into a preallocated output; the backward from a saved training forward (o, lse, out_residual) into
    preallocated gradients; fwd+bwd, the training forward and the backward."""
    import torch

    from flashcore_cli.check.case import grad_output, make_inputs, make_sinks

    q, k, v = make_inputs(case)
    sinks = make_sinks(case)
    kwargs = {"causal": case.causal, **case.family.kwargs(case.causal), "sinks": sinks}
    if passes == "fwd":
        out = torch.empty_like(q)
        return lambda: attn(q, k, v, **kwargs, out=out)
    d_o = grad_output(case)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    dsinks = torch.empty_like(sinks) if sinks is not None else None
    if passes == "bwd":
        o, lse, residual = attn.forward_train(q, k, v, **kwargs)
        return lambda: attn.backward(d_o, q, k, v, o, lse, **kwargs, out_residual=residual, into=grads, dsinks=dsinks)

    def forward_backward():
        o, lse, residual = attn.forward_train(q, k, v, **kwargs)
        return attn.backward(d_o, q, k, v, o, lse, **kwargs, out_residual=residual, into=grads, dsinks=dsinks)

    return forward_backward


def time_variant(attn, case: Case, request: WorkRequest, emit) -> None:
    """A "timing" event per mode (or "timing-skipped" with the reason); with request.pair, the reference row's
    samples taken in turn with the variant's (modes.time_pair) and a "pair-timing" event beside each. A reference
    that cannot run here ("pair-skipped" says why) leaves the variant timed alone."""
    from flashcore_cli.measure.modes import time_callable, time_pair

    call = variant_call(attn, case, request.passes)
    alone = lambda mode: (time_callable(call, mode=mode, reps=request.reps, warmup=request.warmup), None)  # noqa: E731
    if not request.pair:
        _time_modes(attn, case, request, emit, alone)
        _time_plain(attn, case, request, emit)
        return
    from flashcore_cli.check.case import make_inputs
    from flashcore_cli.measure.references import reference_functions

    q, k, v = make_inputs(case)
    rows = {name: (fn, context, why)
            for name, fn, context, why in reference_functions(q, k, v, case.causal, request.passes, case.family)}  # fmt: skip
    fn, context, why_not = rows.get(request.pair, (None, None, f"no reference row is named {request.pair!r}"))
    # entered once, around everything (a backend pin is a one-shot context manager); the variant makes no SDPA call
    with context or contextlib.nullcontext():
        if fn is not None:
            try:
                fn()
            except Exception as exc:  # a backend that cannot run this shape
                fn, why_not = None, first_line(exc)
        if fn is None:
            emit(Event.PAIR_SKIPPED, name=request.pair, reason=why_not)
            _time_modes(attn, case, request, emit, alone)
            return
        paired = lambda mode: time_pair(call, fn, mode=mode, reps=request.reps, warmup=request.warmup)  # noqa: E731
        _time_modes(attn, case, request, emit, paired, f" paired with {request.pair}")
    _time_plain(attn, case, request, emit)


def _time_plain(attn, case: Case, request: WorkRequest, emit) -> None:
    """For a case with a window, softcap or sinks: the same call without them ("plain-timing"), so that a bench run
    says what the family costs the variant against its own dense or causal call, in the same worker."""
    import dataclasses

    from flashcore_cli.measure.modes import time_callable
    from flashcore_cli.measure.timing import TimingError
    from flashcore_cli.registry.family import DENSE

    if case.family.is_dense(case.causal):
        return
    call = variant_call(attn, dataclasses.replace(case, family=DENSE), request.passes)
    for mode in request_modes(request):
        try:
            timing = time_callable(call, mode=mode, reps=request.reps, warmup=request.warmup)
        except TimingError:
            continue  # the family's own row already says why this mode cannot time it
        emit(Event.PLAIN_TIMING, name=attn.name, **timing.as_dict())


def _time_modes(attn, case: Case, request: WorkRequest, emit, measure, what: str = "") -> None:
    """measure(mode) -> (the variant's Timing, the paired reference's or None), in each mode of the request."""
    from flashcore_cli.measure.timing import TimingError

    for mode in request_modes(request):
        try:
            mine, theirs = measure(mode)
        except TimingError as exc:  # this mode cannot time the call: say why, go on with the next mode
            emit(Event.TIMING_SKIPPED, name=attn.name, key=attn.build.key, mode=mode, reason=str(exc))
            continue
        except Exception as exc:
            emit(Event.CRASH, **crash_fields(exc, f"timing {case.label()}{what} ({mode} mode)"))
            return
        # a kernel the launcher ran in place of its preferred one is named in the row that timed it (a backward
        # alone runs no forward: the note of the setup's forward is not its row's)
        note = attn.forward_note() if request.passes != "bwd" else None
        emit(Event.TIMING, name=attn.name, key=attn.build.key, **mine.as_dict(), **({"detail": note} if note else {}))
        if theirs is not None:
            emit(Event.PAIR_TIMING, name=request.pair, paired_with=attn.name, **theirs.as_dict())


def time_references(request: WorkRequest, emit) -> None:
    """The "references" task: PyTorch SDPA's backends and the Triton reference on the case, each timed in every mode
    of the request ("timing"), or "reference-skipped" with the reason (in one mode, or in all)."""
    from flashcore_cli.check.case import make_inputs
    from flashcore_cli.core.records import environment
    from flashcore_cli.measure.references import reference_functions
    from flashcore_cli.measure.modes import needs_flusher, time_callable
    from flashcore_cli.measure.timing import L2Flusher, TimingError

    from flashcore_cli.measure.roofline import device_peaks

    emit(Event.BUILT, note="references need no build")
    peaks = device_peaks()
    emit(Event.ENVIRONMENT, **environment(), peaks=peaks.as_dict() if peaks else None)
    case = Case.from_dict(request.case)
    q, k, v = make_inputs(case)
    modes = request_modes(request)
    flusher = L2Flusher() if needs_flusher(modes) else None  # one for every row, made before any is timed
    for name, fn, context, why_not in reference_functions(q, k, v, case.causal, request.passes, case.family):
        if fn is None:
            emit(Event.REFERENCE_SKIPPED, name=name, reason=why_not)  # no mode: skipped in every mode
            continue
        with context:  # entered once per row (a backend pin is a one-shot context manager)
            try:
                fn()
            except Exception as exc:  # a backend that cannot run this shape: say so and go on
                emit(Event.REFERENCE_SKIPPED, name=name, reason=first_line(exc))
                continue
            describe = getattr(fn, "describe", None)  # what the row runs, when it chose (Triton's tuned tile)
            detail = describe() if describe else ""
            for mode in modes:
                try:
                    timing = time_callable(fn, mode=mode, reps=request.reps, warmup=request.warmup, flusher=flusher)
                except Exception as exc:  # this mode cannot time it (e.g. no graph capture): the reason, per mode
                    reason = str(exc) if isinstance(exc, TimingError) else first_line(exc)
                    emit(Event.REFERENCE_SKIPPED, name=name, mode=mode, reason=reason)
                    continue
                emit(Event.TIMING, name=name, detail=detail, **timing.as_dict())


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"

