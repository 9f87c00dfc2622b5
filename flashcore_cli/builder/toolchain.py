"""The CUDA toolchain on this machine: nvcc, its version, the flags every compile shares, demangling; and what
torch is installed, read without importing it (a cached `flashcore build` never imports torch): torch_metadata
and gpu_visible live in core/gpu.py (its require_gpu asks gpu_visible) and are named here too."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreEnvironmentError, FlashcoreError
from flashcore_cli.core.gpu import gpu_visible, torch_metadata  # noqa: F401  (core's; named here for the builder)

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
