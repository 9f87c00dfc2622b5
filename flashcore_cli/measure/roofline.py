"""How close a timed row is to the GPU's limits: its dense 16-bit tensor peak and its memory peak.

The peaks come from the GPU the run measured on (README, "Roofline"):
    memory peak  = 2 x max memory clock x bus width / 8         (NVML: nvmlDeviceGetMaxClockInfo(MEM),
                                                                 nvmlDeviceGetMemoryBusWidth; 2: double data rate)
    tensor peak  = SMs x max SM clock x dense 16-bit tensor FLOPs per SM per clock
                   (SM count from CUDA, the clock from NVML; the per-SM rate is the architecture's, below)
A row's bytes are the least a pass must move (shapes.pass_bytes: Q, K, V read and O written once for the
forward); its bound is the limit its arithmetic intensity (FLOPs / bytes) meets first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Dense fp16/bf16 tensor-core FLOPs per SM per clock with fp32 accumulation, by compute capability: the one
# number NVML cannot give. (sm_90: H100 SXM's 989 TFLOP/s = 132 SMs x 1830 MHz x 4096.)
TENSOR_FLOPS_PER_SM_CLOCK = {(7, 5): 1024, (8, 0): 2048, (8, 6): 1024, (8, 7): 1024, (8, 9): 1024, (9, 0): 4096,
                             (10, 0): 8192, (12, 0): 1024}  # fmt: skip


@dataclass
class Peaks:
    sm_count: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    bus_width_bits: int
    tensor_flops_per_sm_clock: int | None

    @property
    def tensor_tflops(self) -> float | None:
        if not self.tensor_flops_per_sm_clock:
            return None
        return self.sm_count * self.sm_clock_mhz * 1e6 * self.tensor_flops_per_sm_clock / 1e12

    @property
    def memory_gbps(self) -> float | None:
        if not (self.memory_clock_mhz and self.bus_width_bits):
            return None
        return 2 * self.memory_clock_mhz * 1e6 * self.bus_width_bits / 8 / 1e9

    def as_dict(self) -> dict:
        return asdict(self) | {"tensor_tflops": self.tensor_tflops, "memory_gbps": self.memory_gbps}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Peaks | None":
        if not d:
            return None
        return cls(d["sm_count"], d["sm_clock_mhz"], d["memory_clock_mhz"], d["bus_width_bits"], d["tensor_flops_per_sm_clock"])


def device_peaks(device: int = 0) -> Peaks | None:
    """The current GPU's peaks (None without NVML or a GPU: no roofline columns)."""
    import torch

    from flashcore_cli.core.gpu import nvml_limits

    limits = nvml_limits(device)
    if limits is None:
        return None
    props = torch.cuda.get_device_properties(device)
    rate = TENSOR_FLOPS_PER_SM_CLOCK.get((props.major, props.minor))
    return Peaks(props.multi_processor_count, limits["sm_clock_mhz"], limits["memory_clock_mhz"], limits["bus_width_bits"], rate)


@dataclass
class Roofline:
    tensor_fraction: float | None  # achieved TFLOP/s / tensor peak
    gbps: float  # bytes / time
    memory_fraction: float | None  # achieved bytes/s / memory peak
    bound: str  # "compute" or "memory": the limit the row's arithmetic intensity meets first

    def as_dict(self) -> dict:
        return asdict(self)


def roofline(flops: float, bytes_moved: float, median_us: float, peaks: Peaks | None) -> Roofline:
    seconds = median_us * 1e-6
    gbps = bytes_moved / seconds / 1e9
    if peaks is None or peaks.tensor_tflops is None or peaks.memory_gbps is None:
        return Roofline(None, gbps, None, "")
    tensor = flops / seconds / 1e12 / peaks.tensor_tflops
    memory = gbps / peaks.memory_gbps
    # ridge point: FLOPs per byte at which both limits take the same time
    ridge = peaks.tensor_tflops * 1e12 / (peaks.memory_gbps * 1e9)
    return Roofline(tensor, gbps, memory, "compute" if flops / bytes_moved >= ridge else "memory")
