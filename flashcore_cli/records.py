"""Run records: every bench, sweep and tune writes its JSON record into a results folder, so runs can be
compared later (`flashcore compare A.json B.json`).

Every record says how it was timed in a top-level "mode": "cold", "graph" or "host" (timing.py); a record
without one is from before the modes, and was timed cold. A bench of several modes keeps its first mode's
"mode" and "rows" at the top and adds "runs", one {"mode", "rows"} section per mode (bench.py)."""

from __future__ import annotations

import json
import os
import re
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
