"""Run records: every bench, sweep and tune writes its JSON record into a results folder, so runs can be
compared later (`flashcore compare A.json B.json`).

Every record says how it was timed in a top-level "mode": "cold", "graph" or "host" (timing.py); a record
without one is from before the modes, and was timed cold. A bench of several modes keeps its first mode's
"mode" and "rows" at the top and adds "runs", one {"mode", "rows"} section per mode (bench.py)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path


def results_dir() -> Path:
    return Path(os.environ.get("FLASHCORE_RESULTS", "results"))


def save_record(record: dict, kind: str, label: str = "") -> Path:
    """results/<kind>-<YYYYmmdd-HHMMSS>[-label].json; never overwrites an earlier record."""
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
    base = f"{kind}-{stamp}" + (f"-{slug}" if slug else "")
    path = folder / f"{base}.json"
    n = 1
    while path.exists():
        path = folder / f"{base}-{n}.json"
        n += 1
    path.write_text(json.dumps(record, indent=1, default=str))
    return path


# The cache (builds, tuned parameters, harness extensions, crash logs): $FLASHCORE_CACHE or ~/.cache/flashcore.
def cache_root() -> Path:
    env = os.environ.get("FLASHCORE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flashcore"


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
