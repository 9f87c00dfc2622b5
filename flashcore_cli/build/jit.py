"""JIT builds through torch.utils.cpp_extension.load (ninja), in a content-addressed cache.

    <cache>/build/<variant>-<key>/   build directory: ninja files, objects, the .so, build.log, build.json

build.json is written last, so its presence means a complete build; a cached load imports the .so
directly (well under a second once torch is imported). A lock file per key serialises two processes
building the same variant: the second waits, then finds the first one's build.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flashcore_cli.build.cache import binding_source, cache_key
from flashcore_cli.core.records import cache_root
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.build.ptxas import KernelResources, first_errors, parse_ptxas
from flashcore_cli.registry.variants import Variant
from flashcore_cli.build.toolchain import BASE_NVCC_FLAGS, UNDO_TORCH_HALF_MACROS, define_flags, gencode


class BuildError(FlashcoreError):
    """The compiler rejected a variant: carries its first error lines."""

    def __init__(self, variant: str, errors: str, log: Path):
        super().__init__(f"{variant}: build failed (full log: {log})\n{errors}", exit_code=1)
        self.errors = errors
        self.log = log


@dataclass
class BuildResult:
    variant: str
    arch: str
    key: str
    directory: Path
    module_name: str
    library: Path
    cached: bool
    build_seconds: float  # the compile itself (0 on a cache hit)
    load_seconds: float
    resources: list[KernelResources] = field(default_factory=list)
    module: object = None

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "arch": self.arch,
            "key": self.key,
            "directory": str(self.directory),
            "cached": self.cached,
            "build_seconds": round(self.build_seconds, 2),
            "load_seconds": round(self.load_seconds, 3),
            "resources": [r.summary() for r in self.resources],
        }


def build_dir(variant: Variant, key: str) -> Path:
    return cache_root() / "build" / f"{variant.name}-{key}"


def module_name(variant: Variant, key: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in variant.name)
    return f"flashcore_{safe}_{key}"


def build_variant(
    variant: Variant,
    arch: str,
    *,
    force: bool = False,
    verbose: bool = False,
    extra_defines: dict[str, str] | None = None,
) -> BuildResult:
    """Build (or load from the cache) one variant for one arch and import its module. A variant that lists
    an arch-specific target (archs: [sm_90a]) is compiled for it on its GPU (sm_90 -> sm_90a)."""
    import torch  # noqa: F401  (the extension links against torch's libraries: load them first)

    from flashcore_cli.core.errors import FlashcoreEnvironmentError

    target = variant.target_arch(arch)
    if target is None:
        raise FlashcoreEnvironmentError(f"{variant.name} runs on {variant.runs_on()} only; this GPU is {arch}")
    arch = target
    key = cache_key(variant, arch, for_build=True, extra_defines=extra_defines)
    directory = build_dir(variant, key)
    name = module_name(variant, key)
    marker = directory / "build.json"
    directory.parent.mkdir(parents=True, exist_ok=True)

    if not force and marker.is_file():
        return _load_cached(variant, arch, key, directory, name, marker)
    with _locked(directory.parent / f"{directory.name}.lock"):
        if not force and marker.is_file():  # another process built it while we waited
            return _load_cached(variant, arch, key, directory, name, marker)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return _compile(variant, arch, key, directory, name, marker, verbose, extra_defines or {})


def _compile(variant, arch, key, directory, name, marker, verbose, extra_defines) -> BuildResult:
    from torch.utils import cpp_extension

    log = directory / "build.log"
    cuda_flags = [
        *BASE_NVCC_FLAGS, *UNDO_TORCH_HALF_MACROS, gencode(arch), "-Xptxas=-v", *variant.flags,
        *define_flags({**variant.defines, **extra_defines}),
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        with _capture_output(log, echo=verbose):
            module = cpp_extension.load(
                name=name,
                sources=[str(binding_source(variant)), *map(str, variant.sources)],
                extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=cuda_flags,
                extra_include_paths=[str(variant.kernels_dir)],
                build_directory=str(directory),
                verbose=True,
            )
    except Exception as exc:  # torch raises RuntimeError / subprocess errors; the log has the compiler's words
        text = log.read_text(errors="replace") if log.exists() else ""
        raise BuildError(variant.name, first_errors(text) or str(exc), log) from None
    seconds = time.perf_counter() - start
    resources = parse_ptxas(log.read_text(errors="replace"))
    library = Path(module.__file__)
    marker.write_text(
        json.dumps(
            {
                "variant": variant.name,
                "arch": arch,
                "key": key,
                "module": name,
                "library": library.name,
                "build_seconds": round(seconds, 2),
                "resources": [r.__dict__ for r in resources],
                "created": time.time(),
            },
            indent=1,
        )
    )
    return BuildResult(variant.name, arch, key, directory, name, library, False, seconds, 0.0, resources, module)


def _load_cached(variant, arch, key, directory, name, marker) -> BuildResult:
    start = time.perf_counter()
    info = json.loads(marker.read_text())
    library = directory / info["library"]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or not library.is_file():
            raise FlashcoreError(f"{variant.name}: cache entry {directory} is incomplete; rebuild with --force")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    resources = [KernelResources(**r) for r in info.get("resources", [])]
    return BuildResult(
        variant.name, arch, key, directory, name, library, True, 0.0, time.perf_counter() - start, resources, module
    )


@contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _capture_output(log: Path, echo: bool):
    """Send this process's stdout/stderr (file descriptors, so ninja's and nvcc's output too) to the log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "wb") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if echo:
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
