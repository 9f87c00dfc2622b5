"""Run GPU work in a child process of its own process group, under a wall-clock timeout.

A kernel can hang (the seeds' v9 deadlocked) or fault (v10's "unspecified launch failure" poisons the
CUDA context for the whole process). So each variant's work runs in `python -m flashcore_cli.worker`,
which reports progress as JSON lines in an events file. The parent follows the events, kills the whole
group when the deadline passes, and classifies what happened; the run goes on to the next variant.

Deadlines: `build_timeout` until the worker says it has built the variant, then `run_timeout` for the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_BUILD_TIMEOUT = 900.0


@dataclass
class WorkerOutcome:
    status: str  # "done", "timeout", "crash"
    events: list[dict] = field(default_factory=list)
    returncode: int | None = None
    seconds: float = 0.0
    log_tail: str = ""
    phase: str = "build"  # "build" or "run": where a timeout struck

    def find(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]


def run_worker(
    spec: dict,
    *,
    run_timeout: float,
    build_timeout: float = DEFAULT_BUILD_TIMEOUT,
    on_event=None,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> WorkerOutcome:
    """`env` adds variables (e.g. CUDA_VISIBLE_DEVICES to pin a GPU); `prefix` wraps the command (e.g. a
    compute-sanitizer or ncu invocation)."""
    with tempfile.TemporaryDirectory(prefix="flashcore-worker-") as tmp:
        tmpdir = Path(tmp)
        events_path = tmpdir / "events.jsonl"
        log_path = tmpdir / "worker.log"
        spec_path = tmpdir / "spec.json"
        events_path.touch()
        spec_path.write_text(json.dumps({**spec, "events": str(events_path)}))
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        start = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*(prefix or []), sys.executable, "-m", "flashcore_cli.worker", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a timeout kills everything it started
                env=child_env,
            )
        outcome = WorkerOutcome(status="done")
        deadline = start + build_timeout
        reader = _EventReader(events_path)
        try:
            while True:
                for event in reader.read():
                    outcome.events.append(event)
                    if event.get("event") == "built":
                        outcome.phase = "run"
                        deadline = time.monotonic() + run_timeout
                    if on_event:
                        on_event(event)
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    outcome.status = "timeout"
                    break
                time.sleep(0.05)
        except BaseException:
            _kill_group(proc)
            raise
        for event in reader.read():
            outcome.events.append(event)
            if on_event:
                on_event(event)
        outcome.returncode = proc.returncode
        outcome.seconds = time.monotonic() - start
        if outcome.status != "timeout" and not outcome.find("done"):
            outcome.status = "crash"
        outcome.log_tail = _tail(log_path)
        return outcome


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _EventReader:
    """Reads complete JSON lines appended to a file since the last read."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        events = []
        for line in lines:
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return events
