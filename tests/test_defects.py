"""Defects a new user hit (issue 46), each as it was met: every bad input is one line and exit 2, never an
internal error (3), never "no GPU" for a bad value, never a framed box; a killed run leaves no compiler and no
temporary file behind; a refused run leaves no folder behind."""

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, REPO, processes_mentioning
from flashcore_cli.cli import app
from flashcore_cli.core.errors import FlashcoreError

runner = CliRunner()
RECORD = FIXTURES / "records" / "bench-short-three-modes.json"


def one_error_line(result) -> str:
    """The single 'error: ...' line a refused command printed (and nothing that looks like a traceback)."""
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# ---------------------------------------------------------------- report: exit 2, not 3
def test_report_merge_into_an_existing_folder_is_bad_input(tmp_path):
    (tmp_path / "out").mkdir()
    result = runner.invoke(app, ["report", "merge", str(RECORD), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "is a folder" in one_error_line(result)


def test_report_readme_check_of_a_file_that_is_not_utf8_is_bad_input(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_bytes(b"\xff\xfe<!-- results:1,8,512,64 -->\n<!-- /results -->\n")
    result = runner.invoke(app, ["report", "readme", str(RECORD), "--readme", str(readme), "--check"])
    assert result.exit_code == 2
    assert "not UTF-8" in one_error_line(result)


# ---------------------------------------------------------------- numbers: nan and inf are no durations
@pytest.mark.parametrize(
    "args",
    [
        ["test", "v11", "--timeout", "nan"],
        ["test", "v11", "--timeout", "inf"],
        ["bench", "v11", "--timeout", "nan"],
        ["sanitize", "v11", "--timeout", "nan"],
        ["profile", "v11", "--timeout", "nan"],
        ["sweep", "--timeout", "nan"],
        ["tune", "v11", "--timeout", "nan"],
        ["watch", "v11", "--timeout", "nan"],
        ["watch", "v11", "--interval", "nan"],
        ["watch", "v11", "--interval", "inf"],
        ["compare", str(RECORD), str(RECORD), "--threshold", "nan"],
    ],
)
def test_a_number_option_given_nan_or_inf_is_one_line_exit_2(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    option, value = args[-2:]
    assert one_error_line(result) == f"error: {option} {value}: give a finite number"


# ---------------------------------------------------------------- a bad value is named as one, GPU or not
NO_GPU = "needs a CUDA GPU"


@pytest.mark.parametrize(
    "args, said",
    [
        (["test", "v11", "--arch", "banana"], "unknown arch 'banana'"),
        (["test", "v11", "--shapes", "1,8,512,65"], "head dim 65 is not supported by v11"),
        (["bench", "v11", "--arch", "banana"], "unknown arch 'banana'"),
        (["bench", "v11", "--shape", "1,8,512,65"], "head dim 65 is not supported by v11"),
        (["sweep", "--dim", "65"], "head dim 65 is not supported by"),
        (["sweep", "v11", "--arch", "banana"], "unknown arch 'banana'"),
        (["sanitize", "v11", "--show", "-1"], "--show -1"),
        (["sanitize", "v11", "--arch", "banana"], "unknown arch 'banana'"),
        (["profile", "v11", "--arch", "banana"], "unknown arch 'banana'"),
        (["watch", "v11", "--shape", "1,8,512,65"], "head dim 65 is not supported by v11"),
        (["watch", "v11", "--arch", "banana"], "unknown arch 'banana'"),
    ],
)
def test_a_bad_value_is_reported_as_itself_before_asking_for_a_gpu(monkeypatch, args, said):
    monkeypatch.setattr("flashcore_cli.core.gpu.gpu_visible", lambda: False)  # as on a machine with none
    monkeypatch.setattr("flashcore_cli.builder.cudatools.require", lambda tool, why: tool)  # ncu, compute-sanitizer
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert said in line and NO_GPU not in line


def test_bench_without_a_gpu_creates_no_results_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLASHCORE_RESULTS", raising=False)
    monkeypatch.setenv("FLASHCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("flashcore_cli.core.gpu.gpu_visible", lambda: False)
    result = runner.invoke(app, ["bench", "v11", "--json", str(tmp_path / "out" / "run.json")])
    assert result.exit_code == 2 and NO_GPU in one_error_line(result)
    assert sorted(os.listdir(tmp_path)) == []  # no results/, no out/, no cache/


def test_bench_refuses_a_json_path_that_is_a_folder_before_asking_for_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr("flashcore_cli.core.gpu.gpu_visible", lambda: False)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))
    result = runner.invoke(app, ["bench", "v11", "--json", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder" in one_error_line(result)
    assert not (tmp_path / "results").exists()


# ---------------------------------------------------------------- compare names the modes
def test_compare_with_an_unknown_mode_names_the_valid_ones():
    result = runner.invoke(app, ["compare", str(RECORD), str(RECORD), "--mode", "warm"])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "'warm'" in line and all(mode in line for mode in ("cold", "graph", "host"))


# ---------------------------------------------------------------- the Python API
def test_load_variant_of_none_is_one_clear_flashcore_error():
    from flashcore_cli.api import load_variant

    with pytest.raises(FlashcoreError, match=r"a variant's name is a string.*got None"):
        load_variant(None)


# ---------------------------------------------------------------- the parser's own errors: one line, exit 2
@pytest.mark.parametrize(
    "args, said",
    [
        (["--foo"], "No such option: --foo"),
        (["bench", "--reps", "x"], "Invalid value for '--reps'"),
        (["sass"], "Missing argument"),
        (["list", "--nocheck"], "No such option: --nocheck"),
        (["--registry"], "requires an argument"),
    ],
)
def test_a_parse_error_is_one_line_exit_2(capsys, args, said):
    from flashcore_cli.entry import run_cli

    assert run_cli(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], err
    assert "╭" not in err and "Usage:" not in err


def test_a_parse_error_from_the_installed_entry_point_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "flashcore_cli", "ptxas", "--arhc", "sm_90"], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: No such option: --arhc"), proc.stderr


# ---------------------------------------------------------------- a killed run leaves nothing behind
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGTERM to flashcore (timeout, kill)", "SIGINT to its group (Ctrl-C)"])
def test_a_killed_ptxas_all_stops_its_compilers_and_leaves_no_temporary_file(tmp_path, nvcc, how):
    scratch = tmp_path / "tmp"  # TMPDIR: where flashcore's and nvcc's temporary files would go
    scratch.mkdir()
    env = {**os.environ, "FLASHCORE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(scratch), "PYTHONPATH": str(REPO)}
    env.pop("FLASHCORE_REGISTRY", None)
    proc = subprocess.Popen([sys.executable, "-m", "flashcore_cli", "ptxas", "--all", "--arch", "sm_89,sm_90"], cwd=REPO,
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not processes_mentioning(str(scratch)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and processes_mentioning(str(scratch)), "no compiler started"
        time.sleep(1.0)  # inside the compiles: nvcc has written its intermediate files by now
        if how.startswith("SIGTERM"):
            os.kill(proc.pid, signal.SIGTERM)  # what `timeout` and `kill` send: to flashcore alone
        else:
            os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output
    assert "interrupted" in output and "compile failed" not in output
    time.sleep(0.2)
    assert processes_mentioning(str(scratch)) == []
    assert sorted(p.name for p in scratch.iterdir()) == []  # no flashcore-ptxas-*, no tmpxft_*
