"""Spreading independent GPU jobs over every visible GPU of the host: one lane process per GPU.

Each lane is a long-lived Python process pinned to one GPU through CUDA_VISIBLE_DEVICES; it runs the jobs it
takes from a shared queue one at a time, and each job still runs its GPU work in an isolated worker of its
own (isolate.run_worker), which inherits the lane's CUDA_VISIBLE_DEVICES. A lane never touches CUDA itself.
Jobs must be picklable and `fn` a module-level function (lanes are started with 'spawn').

Every job runs exactly once: a lane takes the next job from the queue only when it is free, so a fast GPU takes
more jobs than a slow one. A lane that dies (killed, out of memory) costs only the job it was running: that job's
result is a LaneLost saying so, the lane is not restarted, and the other lanes take the rest of the queue.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from flashcore_cli.core.gpu import query


def visible_gpus() -> list[str]:
    """The GPUs a job may be pinned to: CUDA_VISIBLE_DEVICES' entries when it is set, else nvidia-smi's indices
    (core/gpu.py)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        ids = [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",")]
        visible = []
        for g in ids:  # CUDA stops at the first entry that is not a device
            if not g or g.startswith("-"):
                break
            visible.append(g)
        return visible
    return [row["index"] for row in query("index") if row["index"].isdigit()]


def _pin(gpu: str) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu


@dataclass(frozen=True)
class LaneLost:
    """The result of a job that no lane finished: its lane died under it, or every lane had died before it ran."""

    gpu: str
    reason: str


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Kill a lane's process now (a job in it is abandoned): ProcessPoolExecutor.terminate_workers from Python 3.14,
    its worker processes by hand before that."""
    if hasattr(pool, "terminate_workers"):
        pool.terminate_workers()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def _wait_all(events: list[threading.Event], timeout: float) -> None:
    """Wait for every lane to have wound down, at most `timeout` seconds in all. A lane is done only after its pool
    has shut down, so no concurrent.futures manager thread is still closing its wake-up pipe when the interpreter's
    exit hook writes to it (a race in Python <= 3.11 that prints 'OSError: Bad file descriptor' at exit). Events, not
    Thread.join: a join interrupted by Ctrl-C marks its thread stopped in Python 3.11, and a second join returns at once."""
    deadline = time.monotonic() + timeout
    for event in events:
        event.wait(max(0.0, deadline - time.monotonic()))


def map_on_gpus(fn, jobs: list, gpus: list[str], on_done=None) -> list:
    """fn(job) for every job, each in the lane of some GPU; results in job order, a LaneLost for a job whose lane
    died. on_done(index, result, gpu) is called (from a lane's thread, under a lock) as each job finishes or is
    lost. An exception raised by fn itself (a bug) stops every lane and is raised here."""
    if not gpus:
        raise ValueError("no GPU to run on")
    if not jobs:
        return []
    context = multiprocessing.get_context("spawn")
    results: list = [None] * len(jobs)
    pending = list(range(len(jobs)))
    lock = threading.Lock()
    failures: list[BaseException] = []
    pools: list[ProcessPoolExecutor] = []
    interrupted = False

    def finish(index: int, result, gpu: str) -> None:  # under the lock
        results[index] = result
        if on_done:
            on_done(index, result, gpu)

    def lane(gpu: str, done: threading.Event) -> None:
        try:
            run_lane(gpu)
        finally:  # set only once the pool has shut down (its manager and queue threads joined)
            done.set()

    def run_lane(gpu: str) -> None:
        with ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_pin, initargs=(gpu,)) as pool:
            with lock:
                pools.append(pool)
            while True:
                with lock:
                    if not pending or failures or interrupted:
                        return
                    index = pending.pop(0)
                try:
                    future = pool.submit(fn, jobs[index])
                except BrokenProcessPool:  # the lane died between jobs: this one never started, another lane takes it
                    with lock:
                        pending.insert(0, index)
                    return
                try:
                    result = future.result()
                except BrokenProcessPool:
                    with lock:
                        if not interrupted:  # not a lane we stopped ourselves
                            finish(index, LaneLost(gpu, f"the lane process of GPU {gpu} died while running it (killed, or out of memory?)"), gpu)
                    return
                except BaseException as exc:  # a bug in fn: stop handing out jobs, re-raise below
                    with lock:
                        failures.append(exc)
                    return
                with lock:
                    finish(index, result, gpu)

    lanes_done = [threading.Event() for _ in gpus[: len(jobs)]]
    for gpu, done in zip(gpus, lanes_done):
        threading.Thread(target=lane, args=(gpu, done), daemon=True).start()
    try:
        for done in lanes_done:
            done.wait()
    except BaseException:  # Ctrl-C (or any signal raised here): stop every lane now, and wait for each to wind down
        with lock:
            interrupted = True
            stopping = list(pools)
        for pool in stopping:
            _terminate(pool)
        _wait_all(lanes_done, timeout=10)
        raise
    if failures:
        raise failures[0]
    for index in pending:  # every lane died before these ran
        finish(index, LaneLost("", "not run: every GPU's lane process had died"), "")
    return results
