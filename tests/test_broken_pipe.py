"""A reader that goes away (`flashcore list | head -1`) ends flashcore at once and quietly, as it does cat and
git: killed by SIGPIPE (a shell's 141), no traceback, no error text (docs/usage.md, "Exit codes")."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="POSIX pipes")


def into_a_closed_pipe(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
    """`flashcore ARGS` with its stdout a pipe whose reader has already gone: every write breaks it."""
    read, write = os.pipe()
    os.close(read)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), **env_vars}
        return subprocess.run([sys.executable, "-m", "flashcore_cli", *args], cwd=REPO, env=env, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [["--help"], ["list"], ["ptxas", "--help"]])
def test_a_broken_pipe_ends_quietly_with_sigpipe(args):
    proc = into_a_closed_pipe(*args)
    assert proc.returncode == -signal.SIGPIPE, (proc.returncode, proc.stderr)
    assert proc.stderr == ""


def test_a_shell_sees_141_and_head_its_line():
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m flashcore_cli --help | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip() in ("0", "141"), proc  # 0 when head read before flashcore was done writing
    assert proc.stderr == ""


def test_exit_141_is_documented():
    usage = (REPO / "docs" / "usage.md").read_text()
    section = usage.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert "| 141 |" in section and "SIGPIPE" in section
