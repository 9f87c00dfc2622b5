"""A variant's .cu files compiled to objects by nvcc, one cached object per source.

    <cache>/objects/<variant>/<stem>-<key>.o     the object (written whole: compiled to a temporary name, renamed)
    <cache>/objects/<variant>/<stem>-<key>.log   what nvcc printed (ptxas -v: every kernel's registers, spills)

A kernel source includes CUDA headers and kernels/ headers only (the contract: flashcore.h), so it needs none of
torch's flags: nvcc compiles it here, without torch, while the process that links the module imports torch. Each
object has a key of its own (object_key: that source and the headers it reaches, the flags, defines, arch and
nvcc), so an edit of kernels/v11.cu recompiles v11.cu alone, not v11_bwd.cu; the sources of one build compile
in parallel. The module is then linked through torch.utils.cpp_extension.load (jit.py) from these objects, the
binding's object and a generated entry point.

The compilers run in this process's session (not sessions of their own, unlike isolate.run_tool): a worker whose
session is killed on a timeout or Ctrl-C takes its compilers with it.
"""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.builder.cache import object_key
from flashcore_cli.builder.toolchain import find_nvcc
from flashcore_cli.core.records import cache_root
from flashcore_cli.registry.variants import Variant

# Compiled into every object so it can be linked into a shared library.
OBJECT_FLAGS = ["-Xcompiler", "-fPIC"]


@dataclass
class ObjectBuild:
    source: Path
    object: Path
    log: str  # nvcc's output (ptxas -v lines; errors when it failed)
    cached: bool
    seconds: float
    returncode: int = 0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.object.is_file()


def objects_dir(variant: Variant) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in variant.name)
    return cache_root() / "objects" / safe


def compile_objects(variant: Variant, arch_flags: list[str], cuda_flags: list[str], *, force: bool = False) -> list[ObjectBuild]:
    """Every source of the variant as an object (cached ones at once, the others compiled in parallel).
    arch_flags name the target (-gencode ...), cuda_flags the rest; both are part of each object's key."""
    nvcc = find_nvcc()
    flags = [*cuda_flags, *arch_flags, *OBJECT_FLAGS]
    directory = objects_dir(variant)
    directory.mkdir(parents=True, exist_ok=True)
    jobs = []
    for source in variant.sources:  # the include folder is not in the key: the closure's contents are
        key = object_key(variant, source, flags)
        jobs.append((source, directory / f"{source.stem}-{key}.o"))
    flags = [*flags, f"-I{variant.kernels_dir}"]
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return list(pool.map(lambda job: _object(nvcc, flags, *job, force=force), jobs))


def _object(nvcc: str, flags: list[str], source: Path, obj: Path, *, force: bool) -> ObjectBuild:
    log_path = obj.with_suffix(".log")
    if not force and obj.is_file() and log_path.is_file():
        return ObjectBuild(source, obj, log_path.read_text(errors="replace"), True, 0.0)
    tmp = obj.with_name(f".{obj.stem}.{os.getpid()}.{id(obj)}.tmp.o")
    cmd = [nvcc, *flags, "-c", str(source), "-o", str(tmp)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    log = f"$ {' '.join(cmd)}\n{proc.stdout}"
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return ObjectBuild(source, obj, log, False, seconds, proc.returncode)
    tmp_log = tmp.with_suffix(".log")
    tmp_log.write_text(log)
    tmp_log.replace(log_path)  # the log first: an object is used only with its log beside it
    tmp.replace(obj)
    return ObjectBuild(source, obj, log, False, seconds)
