"""What the GPUs here are, asked in one place. The CLI asks nvidia-smi (query: no torch, no CUDA context, so it
answers before any worker starts): the name, driver, compute capability, clocks or index of each GPU. Whether
torch would see a GPU at all is gpu_visible (read without importing torch); a command that runs kernels refuses
early through require_gpu; torch_metadata says which torch and CUDA are installed. The one fact nvidia-smi does not report, the memory bus width a roofline needs, is
read with the maximum clocks through NVML (nvml_limits, inside a worker)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreError


def query(fields: str, index: str | None = None, timeout: float = 20) -> list[dict[str, str]]:
    """nvidia-smi --query-gpu=FIELDS (comma-separated, values without units): one {field: value} per GPU, or for
    GPU `index` only; [] when nvidia-smi is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    command = [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", *(["-i", index] if index is not None else [])]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    names = fields.split(",")
    rows = [[value.strip() for value in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    return [dict(zip(names, values)) for values in rows if len(values) == len(names)]


def first_gpu(fields: str) -> dict[str, str]:
    """query() of GPU 0, or {}."""
    rows = query(fields, "0", timeout=10)
    return rows[0] if rows else {}


def clocks() -> dict[str, str]:
    """GPU 0's clocks, temperature and power now (a record keeps them: what the GPU ran at)."""
    return first_gpu("clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw")


def torch_metadata() -> dict[str, str | None]:
    """torch's version and the CUDA version it was built for ({"torch", "cuda"}; cuda None for a CPU build;
    {} without torch): torch's own values once it is imported, else read from torch/version.py without
    importing it (the same values as torch.__version__ and torch.version.cuda, a second or more sooner)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return {"torch": str(torch.__version__), "cuda": torch.version.cuda}
    return _torch_version_file()


@functools.lru_cache(maxsize=None)
def _torch_version_file() -> dict[str, str | None]:
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {}
    values: dict[str, str | None] = {}
    try:
        tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text())
        for node in tree.body:  # __version__ = '...'; cuda: Optional[str] = '13.0'
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and isinstance(value, ast.Constant):
                values["torch" if target.id == "__version__" else "cuda"] = value.value
    except (OSError, SyntaxError, IndexError):
        values = {}
    if "torch" not in values:  # an unusual install: ask torch itself
        import torch

        return {"torch": str(torch.__version__), "cuda": torch.version.cuda}
    values.setdefault("cuda", None)
    return values



def gpu_visible() -> bool:
    """Whether torch would see a CUDA GPU here, answered without importing torch or initialising CUDA: a CUDA
    build of torch, CUDA_VISIBLE_DEVICES not hiding every device, and an NVIDIA device node (or, without
    /dev/nvidia*, a GPU that nvidia-smi lists). A driver too old for torch's CUDA passes here and fails in the
    worker, with torch's error on the row."""
    if torch_metadata().get("cuda") is None:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-")):
        return False
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    return bool(query("index", timeout=30))


def require_gpu(command: str) -> None:
    """Refuses a command that runs kernels where no GPU is visible; asks no torch (each worker imports it)."""
    if not gpu_visible():
        raise FlashcoreError(
            f"`flashcore {command}` runs kernels and needs a CUDA GPU; none is visible here "
            "(`flashcore ptxas` and `flashcore list` work without one)"
        )


def nvml_limits(cuda_device: int = 0) -> dict[str, int] | None:
    """The maximum SM and memory clocks (MHz) and the memory bus width (bits) of a CUDA device, through NVML;
    None without NVML or when it refuses (a container without the library)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(cuda_device))
            return {
                "sm_clock_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "memory_clock_mhz": int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                "bus_width_bits": int(pynvml.nvmlDeviceGetMemoryBusWidth(handle)),
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def nvml_index(device: int) -> int:
    """NVML numbers GPUs by PCI order; CUDA_VISIBLE_DEVICES renumbers them for CUDA: map the first visible one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    try:
        return int(visible[device]) if visible and visible[0].strip() else device
    except (ValueError, IndexError):
        return device
