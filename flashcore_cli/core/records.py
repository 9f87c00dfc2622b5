"""Run records: every bench, sweep and tune writes its JSON record into a results folder, so runs can be
compared later (`flashcore compare A.json B.json`).

Every record says how it was timed in a top-level "mode", a timing mode's name (measure/modes.py); a record
without one is from before the modes, and was timed cold. A bench of several modes keeps its first mode's
"mode" and "rows" at the top and adds "runs", one {"mode", "rows"} section per mode (bench.py).

The folders flashcore writes (the cache, the results) and the files a user names (--json, --out) are checked
before any work: one FlashcoreError (exit 2) naming the path and why it is unusable, never a failed compile
row or a traceback after a long run. The traceback of an unexpected error goes to a crash log in the cache
(write_crash_log: cli.py prints one line naming it)."""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.gpu import clocks, first_gpu

from flashcore_cli.core.paths import CACHE_ENV, cache_root  # noqa: F401  (re-exported: where the cache is)

RESULTS_ENV = "FLASHCORE_RESULTS"


def results_dir() -> Path:
    return Path(os.environ.get(RESULTS_ENV, "results"))


def save_record(record: dict, kind: str, label: str = "") -> Path:
    """results/<kind>-<YYYYmmdd-HHMMSS>[-label].json; never overwrites an earlier record."""
    folder = usable_folder(results_dir(), RESULTS_ENV, "results")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
    base = f"{kind}-{stamp}" + (f"-{slug}" if slug else "")
    path = folder / f"{base}.json"
    n = 1
    while path.exists():
        path = folder / f"{base}-{n}.json"
        n += 1
    try:
        path.write_text(json.dumps(record, indent=1, default=str))
    except OSError as exc:
        raise FlashcoreError(f"cannot write the record {path} ({exc.strerror or exc}); set {RESULTS_ENV} to a writable folder") from None
    return path


_usable: set[str] = set()  # folders already proved writable in this process


def usable_cache(*, create: bool = True) -> Path:
    """cache_root(), created if missing, or one FlashcoreError saying why it cannot be used."""
    return usable_folder(cache_root(), CACHE_ENV, "cache", create=create)


def usable_folder(path: Path, env: str, label: str, *, create: bool = True) -> Path:
    """`path`, created if missing and proved writable by a write, or one FlashcoreError naming the folder, why,
    and the variable that moves it. create=False: only checked, nothing made (folder_problem)."""
    if str(path) in _usable and path.is_dir():
        return path
    problem = folder_problem(path, create=create)
    if problem:
        given = f"{env}={path}" if os.environ.get(env) else f"the {label} folder {path}"
        raise FlashcoreError(f"{given} is not usable: {problem}; set {env} to a folder flashcore can write")
    if create:
        _usable.add(str(path))
    return path


def folder_problem(path: Path, *, create: bool = False) -> str | None:
    """Why files cannot be written in the folder `path`, or None. With create, a missing folder is made;
    without, it is judged by the nearest folder above that exists (nothing is left behind). The test is an
    actual write of a temporary file, so it holds for root too (who may write in a chmod'ed folder but not on
    a read-only mount)."""
    path = Path(os.path.abspath(path))
    for above in [path, *path.parents]:  # a regular file where a folder should be
        try:
            if above.exists() and not above.is_dir():
                return f"{above} is a file, not a folder" if above == path else f"{above} is a regular file, so no folder can be made under it"
        except OSError as exc:  # a symlink loop, a path too long
            return f"{above}: {exc.strerror or exc}"
    target = path
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create it ({exc.strerror or exc})"
    else:
        while not target.exists() and target != target.parent:
            target = target.parent
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".flashcore-write-test-"):
            pass
    except OSError as exc:
        where = "it" if target == path else f"{target}, where it would be created"
        return f"cannot write in {where} ({exc.strerror or exc})"
    return None


def output_file(text: str, option: str, *, create: bool = True) -> Path:
    """A file a user asked flashcore to write (--json FILE, --out FILE): its folder is created when missing
    (create=False: only checked); a folder, or a path no file can be written at, is one FlashcoreError naming
    the option."""
    path = Path(text).expanduser()
    try:
        if path.is_dir():
            raise FlashcoreError(f"{option} {text} is a folder: give the path of a file to write")
    except OSError as exc:
        raise FlashcoreError(f"{option} {text}: {exc.strerror or exc}") from None
    problem = folder_problem(path.parent, create=create)
    if problem:
        raise FlashcoreError(f"{option} {text}: {problem}")
    return path


def write_output(text: str, content: str, option: str) -> Path:
    """Write a file the user named (output_file's checks, then the write; an OSError is one line)."""
    path = output_file(text, option)
    try:
        path.write_text(content)
    except OSError as exc:
        raise FlashcoreError(f"{option} {text}: cannot write it ({exc.strerror or exc})") from None
    return path


def write_crash_log(exc: BaseException) -> str:
    """The full traceback of an unexpected exception, written to <cache>/logs/crash-<time>-<pid>.log (or the
    temp folder when the cache is not writable); returns where, so the one line the user reads can say."""
    import sys
    import traceback

    text = f"command: {' '.join(sys.argv)}\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        folders = [cache_root() / "logs"]
    except Exception:  # a broken $HOME is no reason to lose the traceback
        folders = []
    for folder in [*folders, tempfile.gettempdir()]:
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return "(no writable folder for the log)"


# ---- the environment a record carries ----


def environment() -> dict:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env = {
        "gpu": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "sms": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "driver": first_gpu("driver_version").get("driver_version"),
        "clocks": clocks(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env


