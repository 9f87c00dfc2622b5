"""A variant's .cu files compiled to objects by nvcc, one cached object per source.

    <cache>/objects/<variant>/<stem>-<key>.o     the object (written whole: compiled to a temporary name, renamed)
    <cache>/objects/<variant>/<stem>-<key>.log   what nvcc printed (ptxas -v: every kernel's registers, spills)

A kernel source includes CUDA headers and kernels/ headers only (the contract: flashcore.h), so it needs none of
torch's flags: nvcc compiles it here, without torch, while the process that links the module imports torch. Each
object has a key of its own (object_key: that source and the headers it reaches, the flags, defines, arch and
nvcc), so an edit of kernels/sm80/v11.cu recompiles v11.cu alone, not v11_bwd.cu; the sources of one build compile
in parallel. The module is then linked through torch.utils.cpp_extension.load (jit.py) from these objects, the
binding's object and a generated entry point.

The compilers run in this process's session (not sessions of their own, unlike isolate.run_tool): a worker whose
session is killed on a timeout or Ctrl-C takes its compilers with it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.builder.cache import object_key
from flashcore_cli.builder.toolchain import find_nvcc
from flashcore_cli.core.errors import FlashcoreError
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


def start_objects(variant: Variant, arch_flags: list[str], cuda_flags: list[str], *, force: bool = False) -> "PendingObjects":
    """Every source of the variant as an object: the cached ones at once, nvcc started for the others (all of
    them before this returns, so a caller that imports torch next does not hold them back: an import holds the
    GIL through each library it loads). arch_flags name the target (-gencode ...), cuda_flags the rest; both
    are part of each object's key. PendingObjects.result() waits for them."""
    nvcc = find_nvcc()
    flags = [*cuda_flags, *arch_flags, *OBJECT_FLAGS]
    directory = objects_dir(variant)
    directory.mkdir(parents=True, exist_ok=True)
    jobs = []
    for source in variant.sources:  # the include folder is not in the key: the closure's contents are
        key = object_key(variant, source, flags)
        jobs.append(_Job(source, directory / f"{source.stem}-{key}.o"))
    flags = [*flags, *(f"-I{d}" for d in variant.include_dirs)]
    for job in jobs:
        job.start(nvcc, flags, force=force)
    return PendingObjects(jobs)


class PendingObjects:
    def __init__(self, jobs: list["_Job"]):
        self._jobs = jobs

    def wait(self) -> None:
        """Until every nvcc has exited and its files are in place (or removed)."""
        for job in self._jobs:
            job.join()

    def result(self) -> list[ObjectBuild]:
        """The objects in the variant's source order, once every nvcc has exited (a thread per run waits for
        it, so each one's time is its own)."""
        self.wait()
        missing = [job.source.name for job in self._jobs if job.build is None]
        if missing:  # its waiting thread died (an OSError moving files into the cache)
            raise FlashcoreError(f"nvcc's run on {missing[0]} left no result (see {self._jobs[0].object.parent})")
        return [job.build for job in self._jobs]


class _Job:
    def __init__(self, source: Path, obj: Path):
        self.source, self.object = source, obj
        self.build: ObjectBuild | None = None
        self._waiter: threading.Thread | None = None

    def start(self, nvcc: str, flags: list[str], *, force: bool) -> None:
        log_path = self.object.with_suffix(".log")
        if not force and self.object.is_file() and log_path.is_file():
            self.build = ObjectBuild(self.source, self.object, log_path.read_text(errors="replace"), True, 0.0)
            return
        tmp = self.object.with_name(f".{self.object.stem}.{os.getpid()}.{id(self)}.tmp.o")
        cmd = [nvcc, *flags, "-c", str(self.source), "-o", str(tmp)]
        # nvcc's output into a file, not a pipe: several run at once, and a long error must not block one
        out = tmp.with_suffix(".log")
        start = time.perf_counter()
        try:
            with open(out, "wb") as sink:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        except OSError as exc:  # nvcc could not be started: a failed object, as a failed compile is
            out.unlink(missing_ok=True)
            self.build = ObjectBuild(self.source, self.object, f"$ {' '.join(cmd)}\n{exc}\n", False, 0.0, 127)
            return
        self._waiter = threading.Thread(target=self._finish, args=(proc, cmd, tmp, out, log_path, start), daemon=True)
        self._waiter.start()

    def _finish(self, proc: subprocess.Popen, cmd: list[str], tmp: Path, out: Path, log_path: Path, start: float) -> None:
        returncode = proc.wait()
        seconds = time.perf_counter() - start
        log = f"$ {' '.join(cmd)}\n{out.read_text(errors='replace')}"
        if returncode != 0:
            out.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
            self.build = ObjectBuild(self.source, self.object, log, False, seconds, returncode)
            return
        out.write_text(log)
        out.replace(log_path)  # the log first: an object is used only with its log beside it
        tmp.replace(self.object)
        self.build = ObjectBuild(self.source, self.object, log, False, seconds)

    def join(self) -> None:
        if self._waiter is not None:
            self._waiter.join()
