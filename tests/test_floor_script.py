"""scripts/floor_v11.py: bad input is a clear error (exit 2, no traceback), before any GPU work."""

import subprocess
import sys

import pytest

from conftest import REPO, cuda_available


def run(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "floor_v11.py"), *args], capture_output=True, text=True)


@pytest.mark.parametrize("args", [["--runs", "0"], ["--reps", "5"]])
def test_bad_counts_exit_2(args):
    r = run(*args)
    assert r.returncode == 2
    assert "error: --runs must be >= 1 and --reps >= 10" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(cuda_available(), reason="on a GPU machine this would run the floor kernels")
def test_no_sm90_gpu_exits_2():
    r = run("--runs", "1")
    assert r.returncode == 2
    assert "need an sm_90 GPU" in r.stderr
    assert "Traceback" not in r.stderr
