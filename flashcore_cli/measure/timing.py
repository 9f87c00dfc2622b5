"""Timing one callable on the GPU, in one of three modes: the one core that bench, sweep and tune use.

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

A cold or graph sample whose spin gave up (the host did not release it within SPIN_TIMEOUT_MS) is discarded
and counted, never used; after MAX_TIMEOUTS of them the call is reported untimeable in that mode.
Samples are per call; the summary is the median with p10/p90.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from flashcore_cli.core.errors import FlashcoreError

MODES = ("cold", "graph", "host")
MODE_TITLES = {
    "cold": "cold mode: L2 flushed, blocking start, events around one call",
    "graph": "graph mode: CUDA graph replays, warm L2, device time per call",
    "host": "host mode: back-to-back wall time per call, dispatch included",
}

# Event timestamps resolve ~0.5 us: a 200 us replay puts that at 0.25% of a sample.
GRAPH_SAMPLE_US = 200.0
# A host batch ends with one synchronize (the last call's GPU tail plus the wake-up, ~10-20 us, is charged once
# per batch): a 2 ms batch keeps that under 1% of the per-call figure.
HOST_SAMPLE_US = 2000.0
HOST_PROBE_CALLS = 10
MAX_CALLS_PER_SAMPLE = 1000
MAX_TIMEOUTS = 3  # timed-out samples tolerated per row before the call is declared untimeable in the mode


class TimingError(Exception):
    """A call that cannot be timed in the mode asked for (the reason is the message)."""


def parse_modes(text: str | None, *, several: bool = True) -> list[str]:
    """'cold', 'graph', 'host', or (several=True) a comma list of them, in the order given."""
    tokens = [t.strip().lower() for t in (text or "").split(",")]
    allowed = f"{', '.join(MODES[:-1])} or {MODES[-1]}"
    if not tokens or not all(t in MODES for t in tokens) or len(set(tokens)) != len(tokens):
        hint = f" (or several, comma-separated: {','.join(MODES)})" if several else ""
        raise FlashcoreError(f"bad --mode '{text}': expected {allowed}{hint}")
    if not several and len(tokens) > 1:
        raise FlashcoreError(f"--mode '{text}': this command times one mode at a time ({allowed})")
    return tokens


@dataclass
class Timing:
    samples_us: list[float] = field(default_factory=list)
    mode: str = "cold"
    calls_per_sample: int = 1
    timed_out_samples: int = 0  # cold/graph: samples discarded because their blocking start gave up

    @property
    def median(self) -> float:
        return statistics.median(self.samples_us)

    def percentile(self, q: float) -> float:
        s = sorted(self.samples_us)
        pos = (len(s) - 1) * q
        lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "median_us": self.median,
            "p10_us": self.percentile(0.1),
            "p90_us": self.percentile(0.9),
            "calls_per_sample": self.calls_per_sample,
            "timed_out_samples": self.timed_out_samples,
            "samples_us": self.samples_us,
        }


def calls_per_sample(one_call_us: float, target_us: float) -> int:
    """How many calls make a sample at least target_us long (1 to MAX_CALLS_PER_SAMPLE)."""
    if not one_call_us > 0:
        return MAX_CALLS_PER_SAMPLE
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(target_us / one_call_us)))


def per_call(sample_us: float | None, calls: int) -> float | None:
    return None if sample_us is None else sample_us / calls


def collect(sample, reps: int, *, max_timeouts: int = MAX_TIMEOUTS) -> tuple[list[float], int]:
    """reps samples from sample(), which returns microseconds, or None for a sample to discard (its blocking
    start timed out). Returns (samples, discarded); raises TimingError past max_timeouts discards."""
    samples: list[float] = []
    discarded = 0
    while len(samples) < reps:
        us = sample()
        if us is None:
            discarded += 1
            if discarded > max_timeouts:
                raise TimingError(
                    f"{discarded} samples' blocking start timed out: the GPU waited over the spin's limit for the host "
                    "to queue the call (does the call wait for the GPU itself, e.g. a synchronize?); --mode host can time it"
                )
            continue
        samples.append(us)
    return samples, discarded


class L2Flusher:
    """Writes a buffer twice the size of the device's L2, so the next call starts from DRAM."""

    def __init__(self, device=None):
        import torch

        props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")

    def flush(self) -> None:
        self.buffer.zero_()


def gated_us(gate, queue) -> float | None:
    """Device time of what queue() enqueues on the current stream, from a blocking start; None when the start's
    spin gave up (the sample must be discarded)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gate.hold()
    try:
        start.record()
        queue()
        end.record()
    finally:
        gate.release()  # also when queue() raised: the spin must not wait out its limit
    end.synchronize()
    if gate.timed_out():
        return None
    return start.elapsed_time(end) * 1000.0


def time_cold(fn, *, reps: int, warmup: int, flusher: L2Flusher, gate) -> Timing:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    gated_us(gate, fn)  # the gate's own first launch (module load) outside the samples

    def sample():
        flusher.flush()
        return gated_us(gate, fn)

    samples, discarded = collect(sample, reps)
    return Timing(samples, "cold", 1, discarded)


def time_graph(fn, *, reps: int, warmup: int, gate) -> Timing:
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


def time_host(fn, *, reps: int, warmup: int, sync=None, clock=time.perf_counter) -> Timing:
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


def time_callable(fn, *, mode: str = "cold", reps: int = 200, warmup: int = 20, flusher: L2Flusher | None = None,
                  gate=None) -> Timing:  # fmt: skip
    """Time fn() in one mode. fn is called warmup times first; a Timing of reps samples comes back. Raises
    TimingError when fn cannot be timed in the mode (report it as the row's reason, not a crash)."""
    if mode not in MODES:
        raise ValueError(f"unknown timing mode {mode!r}; expected one of {MODES}")
    if mode == "host":
        return time_host(fn, reps=reps, warmup=warmup)
    if gate is None:
        from flashcore_cli.measure.blocking_start import shared

        gate = shared()
    if mode == "graph":
        return time_graph(fn, reps=reps, warmup=warmup, gate=gate)
    return time_cold(fn, reps=reps, warmup=warmup, flusher=flusher or L2Flusher(), gate=gate)


# ---- the noise-aware rule `compare` and `tune` judge two timed rows by ----

DEFAULT_THRESHOLD = 0.05


@dataclass
class Verdict:
    word: str  # "same", "faster", "slower", "broken", "fixed", "not timed"
    ratio: float | None = None  # median_A / median_B: above 1 means B is faster
    regression: bool = False

    def text(self) -> str:
        if self.word in ("faster", "slower") and self.ratio:
            factor = self.ratio if self.word == "faster" else 1 / self.ratio
            return f"{factor:.2f}x {self.word}" + (" (REGRESSION)" if self.regression else "")
        return self.word + (" (REGRESSION)" if self.regression else "")


def half_spread(row: dict) -> float:
    return (row["p90_us"] - row["p10_us"]) / 2


def timing_verdict(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """The rule on two timed rows (median_us, p10_us, p90_us)."""
    ma, mb = a["median_us"], b["median_us"]
    ratio = ma / mb
    if abs(mb - ma) <= max(half_spread(a), half_spread(b)):
        return Verdict("same", ratio)
    if mb < ma:
        return Verdict("faster", ratio)
    return Verdict("slower", ratio, regression=mb / ma - 1 > threshold)
