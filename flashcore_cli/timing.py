"""Timing one callable on the GPU: CUDA events around each call, L2 flushed before each call.

The flush writes a buffer twice the size of the device's L2, so every timed call starts from DRAM the
way a real layer's attention does. After the flush the GPU spins for HOST_HEADSTART_US, so the host has
enqueued the call before the start event fires: the events then measure the device's time for the call,
not host-side dispatch (Python, a backend context manager, Triton's launcher). Without it, rows whose host
overhead outlasted the flush were charged for an idle GPU (seen: SDPA's flash backend 35 us vs 15 us).
Samples are per call; the summary is the median with p10/p90.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Timing:
    samples_us: list[float] = field(default_factory=list)

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
            "median_us": self.median,
            "p10_us": self.percentile(0.1),
            "p90_us": self.percentile(0.9),
            "samples_us": self.samples_us,
        }


HOST_HEADSTART_US = 50.0


class L2Flusher:
    def __init__(self, device=None):
        import torch

        props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
        clock_hz = (getattr(props, "clock_rate", 0) or 2_000_000) * 1e3  # kHz in the properties
        self.spin_cycles = int(HOST_HEADSTART_US * 1e-6 * clock_hz)

    def flush(self) -> None:
        import torch

        self.buffer.zero_()
        torch.cuda._sleep(self.spin_cycles)


def time_callable(fn, *, reps: int = 200, warmup: int = 20, flusher: L2Flusher | None = None) -> Timing:
    import torch

    flusher = flusher or L2Flusher()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flusher.flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return Timing([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])
