"""`flashcore doctor`: what this machine has for flashcore, and for each missing piece what to do.

Python packages are probed in a subprocess (a broken torch install cannot take the report down with it);
the GPU and driver come from nvidia-smi (core/gpu.py), the tools from cudatools' search.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.core.gpu import query

PACKAGES_PROBE = r"""
import json, importlib
out = {}
for name in ("torch", "triton", "matplotlib", "ninja"):
    try:
        m = importlib.import_module(name)
        out[name] = {"version": getattr(m, "__version__", "?")}
        if name == "torch":
            out[name].update(cuda=m.version.cuda, gpu=m.cuda.is_available())
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
print(json.dumps(out))
"""


@dataclass
class Check:
    name: str
    ok: bool
    found: str
    advice: str = ""  # what to do when it is missing
    needed_for: str = ""


def _run(cmd: list[str], timeout: float = 60) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _tool_version(path: Path) -> str:
    out = _run([str(path), "--version"], timeout=30) or ""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    version = next((ln for ln in lines if "release" in ln.lower() or "version" in ln.lower()), lines[-1] if lines else "")
    return f"{path} ({version})" if version else str(path)


def gpu_check() -> Check:
    smi = shutil.which("nvidia-smi")
    gpus = [", ".join(row.values()) for row in query("name,driver_version,compute_cap")]
    if not gpus:
        return Check("GPU + driver", False, "no NVIDIA GPU visible (nvidia-smi " + ("found nothing)" if smi else "is not installed)"),
                     "test, bench, sanitize, profile, sweep and tune need one; list, ptxas, sass, compare and new work without")
    return Check("GPU + driver", True, "; ".join(f"GPU {i}: {g}" for i, g in enumerate(gpus)))


def nvcc_check() -> Check:
    from flashcore_cli.core.errors import FlashcoreError
    from flashcore_cli.builder.toolchain import find_nvcc, nvcc_version

    try:
        nvcc = find_nvcc()
    except FlashcoreError as exc:
        return Check("CUDA / nvcc", False, "not found", str(exc).split(": ", 1)[-1], "build, ptxas, sass")
    return Check("CUDA / nvcc", True, f"{nvcc} ({nvcc_version(nvcc)})")


def package_checks() -> list[Check]:
    out = _run([sys.executable, "-c", PACKAGES_PROBE], timeout=120)
    found = json.loads(out) if out else {}
    checks = []
    torch = found.get("torch", {"error": "the probe could not run"})
    if "error" in torch:
        checks.append(Check("torch", False, torch["error"], "`pip install torch` (a CUDA build)", "build, test, bench"))
    elif not torch.get("cuda"):
        checks.append(Check("torch", False, f"{torch['version']} (a CPU build)", "install a CUDA build of torch to build and run kernels",
                            "build, test, bench"))  # fmt: skip
    else:
        gpu = "a GPU is visible" if torch.get("gpu") else "no GPU visible to torch"
        checks.append(Check("torch", True, f"{torch['version']}, CUDA {torch['cuda']}, {gpu}"))
    advice = {
        "triton": ("`pip install triton`", "the Triton reference row in bench/sweep"),
        "ninja": ("`pip install ninja`", "build (torch's extension builder runs ninja)"),
        "matplotlib": ("`pip install matplotlib` (flashcore's `plot` extra)", "sweep --plot"),
    }
    for name, (how, why) in advice.items():
        info = found.get(name, {"error": "the probe could not run"})
        ok = "error" not in info
        if name == "ninja" and not ok and shutil.which("ninja"):
            ok, info = True, {"version": shutil.which("ninja")}
        checks.append(Check(name, ok, info.get("version") if ok else info["error"], "" if ok else how, "" if ok else why))
    return checks


def tool_checks() -> list[Check]:
    from flashcore_cli.builder.cudatools import HOW_TO_GET, locate

    needed = {"ncu": "profile", "compute-sanitizer": "sanitize", "cuobjdump": "sass", "nvdisasm": "sass (cuobjdump 13 runs it)"}
    checks = []
    for tool, purpose in needed.items():
        path = locate(tool)
        checks.append(Check(tool, path is not None, _tool_version(path) if path else "not found",
                            "" if path else HOW_TO_GET[tool], "" if path else purpose))  # fmt: skip
    return checks


def folder_size(path: Path) -> tuple[int, int]:
    total = files = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                total += (Path(root) / n).stat().st_size
                files += 1
            except OSError:
                pass
    return total, files


def storage_checks() -> list[Check]:
    """The cache and the results folder: where they are, what they hold, and whether flashcore can write there
    (a real write, so a read-only mount shows even to root; nothing is created)."""
    from flashcore_cli.core.records import CACHE_ENV, RESULTS_ENV, cache_root, folder_problem, results_dir

    checks = []
    for label, path, how, needed in (("cache", cache_root(), CACHE_ENV, "build, ptxas, test, bench, sweep, tune"),
                                     ("results", results_dir(), RESULTS_ENV, "bench, sweep, tune, sanitize, profile")):  # fmt: skip
        shown = Path(os.path.abspath(path))
        problem = folder_problem(path)
        if problem:
            checks.append(Check(label, False, f"{shown}: not writable: {problem}", f"set {how} to a folder flashcore can write", needed))
        elif path.is_dir():
            size, files = folder_size(path)
            builds = len(list((path / "build").glob("*/build.json"))) if label == "cache" else None
            extra = f", {builds} build(s)" if builds is not None else ""
            checks.append(Check(label, True, f"{shown}: {size / 2**20:.1f} MiB in {files} file(s){extra} (set {how} to move it)"))
        else:
            checks.append(Check(label, True, f"{shown} (empty so far; set {how} to move it)"))
    return checks


def registry_check(registry_path) -> Check:
    from flashcore_cli.core.errors import FlashcoreError
    from flashcore_cli.registry.variants import load_registry

    try:
        reg = load_registry(registry_path)
    except FlashcoreError as exc:
        return Check("registry", False, str(exc), "fix the entry named above (`flashcore list` shows the same error)")
    return Check("registry", True, f"{reg.path}: {len(reg.variants)} variant(s)")


def all_checks(registry_path) -> list[Check]:
    """Every piece doctor looks at, in the order its table lists them."""
    return [gpu_check(), nvcc_check(), *package_checks(), *tool_checks(), registry_check(registry_path), *storage_checks()]
