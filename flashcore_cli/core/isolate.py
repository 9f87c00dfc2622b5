"""Run GPU work in a child process of its own process group, under a wall-clock timeout.

A kernel can hang (the seeds' v9 deadlocked) or fault (v10's "unspecified launch failure" poisons the
CUDA context for the whole process). So each variant's work runs in `python -m flashcore_cli.worker`,
which reports progress as JSON lines in an events file (protocol.py: the request it reads, the events it
writes). The parent follows the events, kills the whole group when the deadline passes, and hands back a
WorkerOutcome (protocol.classify says what happened); the run goes on to the next variant.

Deadlines: `build_timeout` until the worker says it has built the variant, then `run_timeout` for the rest.

Ctrl-C. A terminal sends SIGINT to its foreground process group; every child flashcore starts (a worker, a
compiler through run_tool) has a session of its own, so the signal reaches flashcore alone, never a compiler
half-way (whose "ptxas died due to signal 2" would read as a compile failure). flashcore's main thread gets
the KeyboardInterrupt; a command that runs children from a thread pool waits for them inside
stop_on_interrupt(pool), which drops the queued work and kills every running child's whole session
(cancel_all: ninja puts its compilers in process groups of their own, so the session is what holds them all),
and the command exits 130 at once. A tool that died of SIGINT anyway is an interruption (KeyboardInterrupt),
never a failed row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import re
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from flashcore_cli.core.events import Event
from flashcore_cli.core.protocol import WorkerOutcome, WorkRequest

DEFAULT_BUILD_TIMEOUT = 900.0

# Set by cancel_all while a command stops on Ctrl-C: no new child starts, running ones are killed.
_cancelled = threading.Event()
_live: dict[int, subprocess.Popen] = {}  # pid (= its session id) -> every child running now
_live_lock = threading.Lock()
# nvcc's words for a compiler stage (cicc, ptxas, the host compiler) that a SIGINT killed
_DIED_OF_SIGINT = re.compile(r"died due to signal 2\b")


def run_worker(
    request: WorkRequest,
    *,
    run_timeout: float,
    build_timeout: float = DEFAULT_BUILD_TIMEOUT,
    on_event=None,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> WorkerOutcome:
    """Run `request` in a worker (protocol.py: what it says and what it answers). `env` adds variables (e.g.
    CUDA_VISIBLE_DEVICES to pin a GPU); `prefix` wraps the command (e.g. a compute-sanitizer or ncu invocation)."""
    with tempfile.TemporaryDirectory(prefix="flashcore-worker-") as tmp:
        tmpdir = Path(tmp)
        events_path = tmpdir / "events.jsonl"
        log_path = tmpdir / "worker.log"
        spec_path = tmpdir / "spec.json"
        events_path.touch()
        spec_path.write_text(json.dumps({**request.to_json(), "events": str(events_path)}))
        scratch = tmpdir / "tmp"  # the worker's and its compilers' temporary files (nvcc's tmpxft_*): gone with tmpdir
        scratch.mkdir()
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch), **(env or {})}
        start = time.monotonic()
        if _cancelled.is_set():
            raise KeyboardInterrupt
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*(prefix or []), sys.executable, "-m", "flashcore_cli.worker", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own session: a timeout or Ctrl-C kills everything it started
                env=child_env,
            )
        outcome = WorkerOutcome(status="done")
        deadline = start + build_timeout
        reader = _EventReader(events_path)
        _register(proc)
        try:
            while True:
                if _cancelled.is_set():
                    raise KeyboardInterrupt
                for event in reader.read():
                    outcome.events.append(event)
                    if event.get("event") == Event.BUILT:
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
        finally:
            _unregister(proc)
        for event in reader.read():
            outcome.events.append(event)
            if on_event:
                on_event(event)
        outcome.returncode = proc.returncode
        outcome.seconds = time.monotonic() - start
        if outcome.status != "timeout" and not outcome.find(Event.DONE):
            outcome.status = "crash"
        outcome.log_tail = _tail(log_path)
        return outcome


def run_tool(cmd: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) for a compiler or another tool, in a session of its
    own (see the module's docstring): Ctrl-C, cancel_all() or a timeout kill it and everything it started.
    Raises KeyboardInterrupt when it was interrupted (cancelled, or it or one of its stages died of SIGINT)."""
    if _cancelled.is_set():
        raise KeyboardInterrupt
    # TMPDIR: nvcc's intermediate files (tmpxft_*, 8-12 MB a compile) go to a folder of ours, removed whatever
    # happens, instead of /tmp, where a killed compile leaves them
    with tempfile.TemporaryDirectory(prefix="flashcore-tool-") as scratch:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**(os.environ if env is None else env), "TMPDIR": scratch}, start_new_session=True)  # fmt: skip
        _register(proc)
        try:
            if _cancelled.is_set():  # cancel_all ran between the check above and _register
                raise KeyboardInterrupt
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # Ctrl-C in this (the main) thread, a timeout
            _kill_group(proc)
            raise
        finally:
            _unregister(proc)
    if _cancelled.is_set() or proc.returncode == -signal.SIGINT or _DIED_OF_SIGINT.search(err or "") or _DIED_OF_SIGINT.search(out or ""):
        raise KeyboardInterrupt
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def cancel_all() -> None:
    """Stop every child now: no new one starts (run_tool and run_worker raise KeyboardInterrupt), and each
    running one's session is killed. stop_on_interrupt calls it, and clears it once the threads are done."""
    _cancelled.set()
    with _live_lock:
        running = list(_live.values())
    for proc in running:
        _kill_session(proc.pid)


@contextmanager
def stop_on_interrupt(pool):
    """Around the wait for a ThreadPoolExecutor's futures: on Ctrl-C (or any error that ends the command) drop
    the queued work, kill the running children, wait for the threads (they return at once) and re-raise."""
    try:
        yield
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        cancel_all()
        try:
            pool.shutdown(wait=True)
        finally:
            _cancelled.clear()
        raise


def _register(proc: subprocess.Popen) -> None:
    with _live_lock:
        _live[proc.pid] = proc


def _unregister(proc: subprocess.Popen) -> None:
    with _live_lock:
        _live.pop(proc.pid, None)


def _kill_group(proc: subprocess.Popen) -> None:
    _kill_session(proc.pid)
    proc.wait()


def _kill_session(sid: int) -> None:
    """SIGKILL the process group `sid` leads, then every process left in its session (ninja and make start
    their compilers in process groups of their own; a session holds them all)."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(10):
        members = _session_members(sid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc; [] where there is no /proc."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) > 3 and fields[0] != b"Z" and int(fields[3]) == sid:
            members.append(int(entry))
    return members


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
