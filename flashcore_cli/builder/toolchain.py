"""The CUDA toolchain on this machine: nvcc, its version, the flags every compile shares, demangling; and what
torch is installed, read without importing it (a cached `flashcore build` never imports torch)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreEnvironmentError, FlashcoreError

# Every compile of a variant — the torch build and the no-GPU ptxas probe — uses these, so both see the
# same kernel. torch's extension builder defines __CUDA_NO_HALF_OPERATORS__ & co.; the -U flags undo that
# so a kernel compiles the same way in both.
BASE_NVCC_FLAGS = ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr"]
UNDO_TORCH_HALF_MACROS = [
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
]
# What a torch build adds to BASE_NVCC_FLAGS, the variant's flags and the arch (jit.py; part of its cache key).
TORCH_BUILD_NVCC_FLAGS = [*UNDO_TORCH_HALF_MACROS, "-Xptxas=-v"]


def cuda_home() -> Path | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return Path(os.environ[env])
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if default.exists() else None


def find_nvcc() -> str:
    home = cuda_home()
    candidates = [home / "bin" / "nvcc"] if home else []
    which = shutil.which("nvcc")
    if which:
        candidates.append(Path(which))
    for c in candidates:
        if c.is_file():
            return str(c)
    raise FlashcoreError(
        "nvcc not found: install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME); "
        "`flashcore doctor` checks the whole toolchain"
    )


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str | None = None) -> str:
    # Not remembered across runs: `nvcc --version` takes ~2 ms, and a (path, mtime, size) key would miss a
    # toolkit changed behind a wrapper script (this machine's /usr/local/bin/nvcc execs /usr/local/cuda-13.0's).
    nvcc = nvcc or find_nvcc()
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if "release" in ln or ln.startswith("Build")]
    return " | ".join(lines) or out.strip()


@functools.lru_cache(maxsize=None)
def host_compiler() -> str:
    """The C++ compiler torch's extension builder uses ($CXX, else c++): its path and first version line, for
    the binding's cache key."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx) or cxx
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return path
    return f"{path}: {(out.splitlines() or [''])[0].strip()}"


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
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU ") for line in out.splitlines())


def define_flags(defines: dict[str, str]) -> list[str]:
    return [f"-D{k}={v}" for k, v in sorted(defines.items())]


def gencode(arch: str) -> str:
    """'sm_90' -> -gencode=arch=compute_90,code=sm_90; an arch-specific 'sm_90a' -> compute_90a / sm_90a."""
    n = arch.split("_", 1)[1]
    return f"-gencode=arch=compute_{n},code=sm_{n}"


def cpu_torch_problem() -> str | None:
    """Why torch cannot build or run a variant here, when it is a CPU build (torch's own error for that
    names CUDA_HOME, which is not the cause); None for a CUDA build. Reads torch's version file: no import."""
    meta = torch_metadata()
    if not meta:
        return "torch is not installed: install a CUDA build of torch (`flashcore ptxas` and `flashcore sass` compile kernels without torch)"
    if meta["cuda"] is not None:
        return None
    return (
        f"this torch ({meta['torch']}) is a CPU build, and flashcore variants link against PyTorch's CUDA "
        "libraries: install a CUDA build of torch (`flashcore ptxas` and `flashcore sass` compile kernels without torch)"
    )


def demangle(names: list[str]) -> dict[str, str]:
    """Itanium-demangled names through c++filt (binutils); names stay mangled where it is missing."""
    if not names:
        return {}
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out))


def require_cuda_torch() -> None:
    problem = cpu_torch_problem()
    if problem:
        raise FlashcoreEnvironmentError(problem)
