"""What every timing mode is made of (the modes themselves, cold, graph and host, are modes.py's), and the
noise-aware rule `compare` and `tune` judge two timed rows by.

Samples are per call; their summary (Timing) is the median with p10/p90. A sample of device time is taken from a
blocking start (gated_us; blocking_start.py); one whose spin gave up (the host did not release it within
SPIN_TIMEOUT_MS) is discarded and counted, never used, and after MAX_TIMEOUTS of them the call is reported
untimeable in that mode (collect raises TimingError). L2Flusher writes a buffer twice the device's L2, so the next
call starts from DRAM.

No torch at import, nor statistics (imported where used): the CLI imports modes.py, and so this module, at
start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_CALLS_PER_SAMPLE = 1000
MAX_TIMEOUTS = 3  # timed-out samples tolerated per row before the call is declared untimeable in the mode


class TimingError(Exception):
    """A call that cannot be timed in the mode asked for (the reason is the message)."""


@dataclass
class Timing:
    samples_us: list[float]
    mode: str  # the name of its TimingMode (modes.py)
    calls_per_sample: int = 1
    timed_out_samples: int = 0  # samples discarded because their blocking start gave up

    @property
    def median(self) -> float:
        import statistics

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
            _check_timeouts(discarded, max_timeouts)
            continue
        samples.append(us)
    return samples, discarded


def _check_timeouts(discarded: int, max_timeouts: int) -> None:
    if discarded > max_timeouts:
        raise TimingError(
            f"{discarded} samples' blocking start timed out: the GPU waited over the spin's limit for the host "
            "to queue the call (does the call wait for the GPU itself, e.g. a synchronize?); --mode host can time it"
        )


def alternate(sample, fn_a, fn_b, reps: int, *, max_timeouts: int = MAX_TIMEOUTS) -> tuple[list[float], list[float], int]:
    """reps samples of each of two calls, taken in turn: a b, b a, a b, ... (neither always first). sample(fn)
    returns fn's microseconds, or None for a sample to discard, as in collect. Returns (a's samples, b's samples,
    discarded); raises TimingError past max_timeouts discards in all."""
    samples: tuple[list[float], list[float]] = ([], [])
    discarded = 0
    turn = 0
    while min(len(samples[0]), len(samples[1])) < reps:
        for which in (0, 1) if turn % 2 == 0 else (1, 0):
            if len(samples[which]) >= reps:
                continue
            us = sample(fn_a if which == 0 else fn_b)
            if us is None:
                discarded += 1
                _check_timeouts(discarded, max_timeouts)
                continue
            samples[which].append(us)
        turn += 1
    return samples[0], samples[1], discarded


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
