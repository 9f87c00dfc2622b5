"""scripts/stress.py's argument and environment paths, run as a user runs it (a subprocess): one line and
exit 2 for an unknown variant, --launches 0 or a machine that cannot run kernels; never a traceback."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, cuda_available

SCRIPT = REPO / "scripts" / "stress.py"


def stress(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(tmp_path / "cache")}
    env.pop("FLASHCORE_REGISTRY", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def one_error(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_an_unknown_variant_is_one_line(tmp_path):
    proc = stress("v99", "--launches", "3", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unknown variant 'v99'" in one_error(proc)


@pytest.mark.parametrize("launches", ["0", "-5"])
def test_no_launches_is_refused(tmp_path, launches):
    proc = stress("v8", "--launches", launches, tmp_path=tmp_path)
    assert proc.returncode == 2 and f"--launches {launches}: give at least 1 launch" in one_error(proc)


def test_a_bad_timeout_is_refused(tmp_path):
    proc = stress("v8", "--timeout", "0", tmp_path=tmp_path)
    assert proc.returncode == 2 and "--timeout 0" in one_error(proc)


@pytest.mark.skipif(cuda_available(), reason="checks the message of a machine that cannot run kernels")
def test_a_machine_without_cuda_names_the_real_cause_not_cuda_home(tmp_path):
    """nvcc is on PATH here; the worker used to fail every launch with torch's "CUDA_HOME environment variable
    is not set" when the cause is a CPU build of torch (or no GPU)."""
    proc = stress("v8", "--launches", "3", tmp_path=tmp_path)
    line = one_error(proc)
    assert proc.returncode == 2 and "CUDA_HOME" not in line
    assert "CPU build" in line or "needs a CUDA GPU" in line
