"""scripts/v12_bwd_phases.py: the instrumented copy of v12's backward is made from today's kernels (each place it
instruments is still there), its registry names it, and a machine without a GPU gets one line, not a traceback."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, cuda_available

from flashcore_cli.registry.variants import load_registry

SCRIPT = REPO / "scripts" / "v12_bwd_phases.py"


def phases(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHCORE_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_the_copy_instruments_every_phase(tmp_path):
    proc = phases("--make-only", "--dir", str(tmp_path / "ph"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    mainloop = (tmp_path / "ph" / "kernels" / "sm90" / "mainloop_bwd_sm90.cuh").read_text()
    for phase in (0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 13):
        assert f"PACC(g, {phase});" in mainloop
    assert "prof_print<<<" in (tmp_path / "ph" / "kernels" / "sm90" / "v12_bwd.cu").read_text()
    assert (REPO / "kernels" / "sm90" / "mainloop_bwd_sm90.cuh").read_text().count("PACC") == 0  # the tree is untouched
    variant = load_registry(tmp_path / "ph" / "registry.yaml").get("v12phases")
    assert [p.name for p in variant.sources] == ["v12.cu", "v12_bwd.cu"]


def test_without_a_gpu_it_is_one_line(tmp_path):
    if cuda_available():
        pytest.skip("a GPU is present: the run would start")
    proc = phases("--dir", str(tmp_path / "ph"), "1,2,64,64", tmp_path=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith("v12_bwd_phases.py: the run failed: error: ")
