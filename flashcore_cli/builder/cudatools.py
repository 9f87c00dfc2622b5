"""Finding NVIDIA's command-line tools (cuobjdump, nvdisasm, ncu, compute-sanitizer) and saying how to get
the ones that are missing.

Each tool is looked for on PATH, in the CUDA toolkit (CUDA_HOME/bin and /usr/local/cuda*/bin), in the pip
wheels that carry some of them (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm install under
site-packages/nvidia/<pkg>/bin; Triton bundles both in triton/backends/nvidia/bin), and, for ncu, where
Nsight Compute installs itself (/opt/nvidia/nsight-compute/<version>/).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.builder.toolchain import cuda_home

HOW_TO_GET = {
    "cuobjdump": "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (cuobjdump 13 needs nvdisasm too), "
    "or put the CUDA toolkit's bin/ on PATH",
    "nvdisasm": "`pip install nvidia-cuda-nvdisasm`, or put the CUDA toolkit's bin/ on PATH",
    "ncu": "install NVIDIA Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH",
    "compute-sanitizer": "it ships with the CUDA toolkit: put CUDA_HOME/bin on PATH (or set CUDA_HOME)",
}


def _package_dirs(name: str) -> list[Path]:
    """Where an installed (namespace) package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])]


def candidates(tool: str) -> list[Path]:
    """Every place `tool` may be, in the order they are tried."""
    places: list[Path] = []
    if which := shutil.which(tool):
        places.append(Path(which))
    homes = [h for h in (cuda_home(),) if h] + [Path(p) for p in sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    for home in homes:
        places.append(home / "bin" / tool)
        if tool == "compute-sanitizer":
            places.append(home / "compute-sanitizer" / "compute-sanitizer")
        if tool == "ncu":
            places += [Path(p) for p in sorted(glob.glob(str(home / "nsight-compute*" / "ncu")), reverse=True)]
    for root in _package_dirs("nvidia"):
        places += [Path(p) for p in sorted(glob.glob(str(root / "*" / "bin" / tool)))]
    for root in _package_dirs("triton"):
        places.append(root / "backends" / "nvidia" / "bin" / tool)
    if tool == "ncu":
        places += [Path(p) for p in sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)]
    return list(dict.fromkeys(places))


def locate(tool: str) -> Path | None:
    for path in candidates(tool):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def require(tool: str, purpose: str) -> Path:
    path = locate(tool)
    if path is None:
        raise FlashcoreError(f"{tool} not found ({purpose} needs it): {HOW_TO_GET[tool]}; `flashcore doctor` checks every tool")
    return path


def env_with_nvdisasm(cuobjdump: Path) -> dict[str, str]:
    """cuobjdump >= 13 runs nvdisasm, which it looks for beside itself and on PATH: put the one we found there."""
    env = dict(os.environ)
    extra = [str(cuobjdump.parent)]
    if nvdisasm := locate("nvdisasm"):
        extra.insert(0, str(nvdisasm.parent))
    env["PATH"] = os.pathsep.join([*dict.fromkeys(extra), env.get("PATH", "")])
    return env
