"""Ctrl-C: exit 130 at once, no compiler left running, and never a "compile failed" row for a compiler the
signal killed. A terminal's Ctrl-C reaches the whole foreground process group: the tests send SIGINT to the
group of a real `flashcore` process while its compilers run."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, processes_mentioning
from flashcore_cli.core import isolate
from flashcore_cli.core.protocol import WorkRequest

COMPILERS = ("nvcc", "cicc", "ptxas", "cudafe++", "fatbinary", "nvlink", "gcc", "cc1plus", "g++", "ld")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("args", [["ptxas", "v11", "--arch", "sm_90"], ["ptxas", "--all", "--arch", "sm_89,sm_90"], ["list", "--check"]])
def test_ctrl_c_during_compiles_is_130_at_once_and_leaves_no_compiler(tmp_path, nvcc, args):
    # TMPDIR: nvcc's and the probe's temporary files, so every compiler's command line names tmp_path
    env = {**os.environ, "FLASHCORE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("FLASHCORE_REGISTRY", None)
    proc = subprocess.Popen([sys.executable, "-m", "flashcore_cli", *args], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not processes_mentioning(str(tmp_path)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and processes_mentioning(str(tmp_path)), "no compiler started"
        time.sleep(1.0)  # well inside the compile (v11 takes several seconds)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        sent = time.monotonic()
        output, _ = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output
    assert took < 5, f"exit took {took:.1f} s"
    assert "interrupted" in output
    assert "compile failed" not in output and "died due to signal" not in output
    time.sleep(0.2)
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_cancel_all_stops_a_worker_and_every_process_group_of_its_session(tmp_path):
    """A build worker runs ninja, which puts each compiler in a process group of its own: killing the worker's
    group would leave them running, so the whole session is killed."""
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '60'], process_group=0)  # as ninja starts a compiler\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n"
    )
    outcome = {}

    def run():
        try:
            isolate.run_worker(WorkRequest("none"), run_timeout=60, build_timeout=60, prefix=[sys.executable, "-c", code])
        except KeyboardInterrupt:
            outcome["interrupted"] = True

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker, grandchild = map(int, pids.read_text().split())
        assert alive(worker) and alive(grandchild)
        isolate.cancel_all()
        thread.join(5)
    finally:
        isolate._cancelled.clear()
    assert not thread.is_alive() and outcome == {"interrupted": True}
    time.sleep(0.1)
    assert not alive(worker) and not alive(grandchild)


def test_a_tool_killed_by_sigint_is_an_interruption_not_a_failure():
    with pytest.raises(KeyboardInterrupt):
        isolate.run_tool(["sh", "-c", "kill -INT $$; sleep 5"])
    with pytest.raises(KeyboardInterrupt):  # nvcc's words when one of its stages died of SIGINT
        isolate.run_tool(["sh", "-c", "echo 'nvcc error   : 'ptxas' died due to signal 2' >&2; exit 255"])
    done = isolate.run_tool(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
