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

import functools
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreError

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


def usable_cache() -> Path:
    """cache_root(), created if missing, or one FlashcoreError saying why it cannot be used."""
    return usable_folder(cache_root(), CACHE_ENV, "cache")


def usable_folder(path: Path, env: str, label: str) -> Path:
    """`path`, created if missing and proved writable by a write, or one FlashcoreError naming the folder, why,
    and the variable that moves it."""
    if str(path) in _usable and path.is_dir():
        return path
    problem = folder_problem(path, create=True)
    if problem:
        given = f"{env}={path}" if os.environ.get(env) else f"the {label} folder {path}"
        raise FlashcoreError(f"{given} is not usable: {problem}; set {env} to a folder flashcore can write")
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


def output_file(text: str, option: str) -> Path:
    """A file a user asked flashcore to write (--json FILE, --out FILE): its folder is created when missing; a
    folder, or a path no file can be written at, is one FlashcoreError naming the option."""
    path = Path(text).expanduser()
    try:
        if path.is_dir():
            raise FlashcoreError(f"{option} {text} is a folder: give the path of a file to write")
    except OSError as exc:
        raise FlashcoreError(f"{option} {text}: {exc.strerror or exc}") from None
    problem = folder_problem(path.parent, create=True)
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

def nvidia_smi(fields: str) -> dict:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [x.strip() for x in out.split(",")]
    names = fields.split(",")
    return dict(zip(names, values)) if len(values) == len(names) else {}


def clocks() -> dict:
    return nvidia_smi("clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw")


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
        "driver": nvidia_smi("driver_version").get("driver_version"),
        "clocks": clocks(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env


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
