"""The timing modes: each one object (TimingMode) in one registry (MODES), which everything that names a mode
reads: the CLI (--mode's choices, its help and its errors), the worker (whether a run needs the L2 flusher),
time_callable (how a mode times a call), and the records (their "mode"). A new mode is one function here that
times a call, and its TimingMode in MODES.

Users run attention three ways, so there are three honest answers to "how long does a call take":

  cold (the default)  The L2 is flushed before each call (a buffer twice the device's L2 is written), then CUDA
                      events go around one call: the call starts from DRAM, as one layer's attention does in a
                      model. The start is blocking (blocking_start.py, as nvbench does it): after the flush a
                      one-thread kernel spins until the host has queued the start event, the call and the end
                      event, so the events see only device time, never host dispatch. The spin it replaces was a
                      fixed 50 us, and a row whose dispatch took longer was charged for an idle GPU (Triton's
                      launcher costs ~61 us per call: 37.7 us median where its kernel takes 6.7). An empty kernel
                      measures ~3.5 us here (the launch and the event pair): part of every cold row.
  graph               N calls captured in a CUDA graph (warmed up on a side stream first, as PyTorch requires)
                      and replayed: device time per call with a warm L2 and no launch gaps, what serving with
                      CUDA graphs sees. A sample is one replay, timed by events from a blocking start, divided by
                      N; N makes a replay at least GRAPH_SAMPLE_US long. A call that cannot be captured (it
                      synchronizes, or allocates in a way capture forbids) raises TimingError with the reason.
  host                Back-to-back wall time per call: time.perf_counter around N calls that end with one
                      torch.cuda.synchronize, divided by N (N makes a batch at least HOST_SAMPLE_US long). Python
                      dispatch and input validation are included: what an eager PyTorch program sees.

A variant's row may also be timed paired with a reference row (bench --pair: time_pair, cold mode): their samples
taken in turn in one worker, so the two rows see one clock and power state.

The pieces the modes are made of (Timing, the blocking start's samples, the L2 flusher, the discarded samples'
rule) are timing.py's. No torch at import: the CLI reads this registry at start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.timing import (L2Flusher, Timing, TimingError, alternate, calls_per_sample, collect, gated_us,
                                          per_call)

DEFAULT_MODE = "cold"  # what bench, sweep, tune and watch time in unless told
MIN_REPS = 100  # timed samples per row: the median and p10/p90 need at least this many
OLD_RECORD_MODE = "cold"  # a record without a "mode" is from before the modes: every timing then was cold

# Event timestamps resolve ~0.5 us: a 200 us replay puts that at 0.25% of a sample.
GRAPH_SAMPLE_US = 200.0
# A host batch ends with one synchronize (the last call's GPU tail plus the wake-up, ~10-20 us, is charged once
# per batch): a 2 ms batch keeps that under 1% of the per-call figure.
HOST_SAMPLE_US = 2000.0
HOST_PROBE_CALLS = 10


@dataclass(frozen=True)
class TimingMode:
    name: str
    summary: str  # a few words for --help: what the mode measures
    description: str  # one line: how it times a call
    time: Callable[..., Timing]  # time(fn, *, reps, warmup, flusher, gate) -> Timing; raises TimingError
    flushes_l2: bool = False  # time() needs an L2Flusher (one per worker serves every row timed in the mode)
    blocking_start: bool = False  # time() needs the blocking-start gate (blocking_start.py)

    @property
    def title(self) -> str:
        """The line above a run in this mode."""
        return f"{self.name} mode: {self.description}"


def _cold_sampler(fns, *, warmup: int, flusher: L2Flusher, gate):
    """Each of fns called warmup times, then the gate's own first launch (module load) outside the samples; returns
    sample(fn): the L2 flushed, then fn's device time from a blocking start (None: discard it)."""
    import torch

    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    gated_us(gate, fns[0])

    def sample(fn):
        flusher.flush()
        return gated_us(gate, fn)

    return sample


def time_cold(fn, *, reps: int, warmup: int, flusher: L2Flusher, gate) -> Timing:
    sample = _cold_sampler((fn,), warmup=warmup, flusher=flusher, gate=gate)
    samples, discarded = collect(lambda: sample(fn), reps)
    return Timing(samples, "cold", 1, discarded)


def time_pair(fn_a, fn_b, *, mode: str, reps: int, warmup: int, flusher: L2Flusher | None = None,
              gate=None) -> tuple[Timing, Timing]:  # fmt: skip
    """fn_a and fn_b timed in turn, sample by sample (timing.alternate), in cold mode: both see the same clock and
    power state, where rows timed one after the other do not (a row that keeps the tensor cores busy for
    milliseconds runs at the board's power cap, at a clock set by what ran before it). Raises TimingError in
    another mode."""
    if mode != "cold":
        raise TimingError(f"paired samples are taken in cold mode only, not {mode} mode")
    if gate is None:
        from flashcore_cli.measure.blocking_start import shared

        gate = shared()
    sample = _cold_sampler((fn_a, fn_b), warmup=warmup, flusher=flusher or L2Flusher(), gate=gate)
    a, b, discarded = alternate(sample, fn_a, fn_b, reps)
    return Timing(a, "cold", 1, discarded), Timing(b, "cold", 1, discarded)


def time_graph(fn, *, reps: int, warmup: int, gate, flusher=None) -> Timing:
    import statistics

    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    # one call's device time with a warm L2 (eager, so a little over the graph's) sizes the graph
    eager = [us for us in (gated_us(gate, fn) for _ in range(5)) if us is not None]
    calls = calls_per_sample(statistics.median(eager) if eager else 0.0, GRAPH_SAMPLE_US)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TimingError(f"cannot be captured in a CUDA graph ({type(exc).__name__}: {first})") from None
    try:
        graph.replay()
        torch.cuda.synchronize()
        samples, discarded = collect(lambda: per_call(gated_us(gate, graph.replay), calls), reps)
    finally:
        graph.reset()
    return Timing(samples, "graph", calls, discarded)


def time_host(fn, *, reps: int, warmup: int, flusher=None, gate=None, sync=None, clock=time.perf_counter) -> Timing:
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    sync()

    def batch(calls: int) -> float:
        start = clock()
        for _ in range(calls):
            fn()
        sync()
        return (clock() - start) * 1e6 / calls

    calls = calls_per_sample(batch(HOST_PROBE_CALLS), HOST_SAMPLE_US)
    return Timing([batch(calls) for _ in range(reps)], "host", calls)


MODES: dict[str, TimingMode] = {
    m.name: m
    for m in (
        TimingMode("cold", "L2 flushed, device time", "L2 flushed, blocking start, events around one call", time_cold,
                   flushes_l2=True, blocking_start=True),
        TimingMode("graph", "CUDA graph replays", "CUDA graph replays, warm L2, device time per call", time_graph,
                   blocking_start=True),
        TimingMode("host", "back-to-back wall time", "back-to-back wall time per call, dispatch included", time_host),
    )
}  # fmt: skip


def _either(words: list[str]) -> str:
    """'a, b or c'."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def mode_help() -> str:
    """--mode's help: each mode and what it measures."""
    return _either([f"{m.name} ({m.summary})" for m in MODES.values()])


def needs_flusher(modes) -> bool:
    return any(MODES[m].flushes_l2 for m in modes if m in MODES)


def parse_modes(text: str | None, *, several: bool = True) -> list[str]:
    """One mode's name, or (several=True) a comma list of them, in the order given."""
    tokens = [t.strip().lower() for t in (text or "").split(",")]
    allowed = _either(list(MODES))
    if not tokens or not all(t in MODES for t in tokens) or len(set(tokens)) != len(tokens):
        hint = f" (or several, comma-separated: {','.join(MODES)})" if several else ""
        raise FlashcoreError(f"bad --mode '{text}': expected {allowed}{hint}")
    if not several and len(tokens) > 1:
        raise FlashcoreError(f"--mode '{text}': this command times one mode at a time ({allowed})")
    return tokens


def time_callable(fn, *, mode: str = DEFAULT_MODE, reps: int = 200, warmup: int = 20, flusher: L2Flusher | None = None,
                  gate=None) -> Timing:  # fmt: skip
    """Time fn() in one mode. fn is called warmup times first; a Timing of reps samples comes back. Raises
    TimingError when fn cannot be timed in the mode (report it as the row's reason, not a crash)."""
    timing_mode = MODES.get(mode)
    if timing_mode is None:
        raise ValueError(f"unknown timing mode {mode!r}; expected one of {tuple(MODES)}")
    if timing_mode.blocking_start and gate is None:
        from flashcore_cli.measure.blocking_start import shared

        gate = shared()
    if timing_mode.flushes_l2 and flusher is None:
        flusher = L2Flusher()
    return timing_mode.time(fn, reps=reps, warmup=warmup, flusher=flusher, gate=gate)
