"""Paths flashcore cannot use are one line and exit 2, naming the path and why: the cache and results folders
(FLASHCORE_CACHE, FLASHCORE_RESULTS), the files a user asks for (--json, --out), a record that is a folder,
a registry that is a symlink loop. `flashcore doctor` says when a folder is not writable."""

import errno
import json
import tempfile

import pytest
from typer.testing import CliRunner

from conftest import REPO, said
from flashcore_cli.cli import app
from flashcore_cli.core import records

runner = CliRunner()
TUNE_DRY_RUN = ["tune", "v10", "--param", "V10_BLOCK_M=32", "--param", "V10_BLOCK_N=64", "--param", "V10_WARPS_N=2",
                "--param", "V10_STAGES=2", "--dry-run"]  # fmt: skip


def error_of(result) -> str:
    """The error line of a result (the output may hold a dim 'registry: ...' line and a progress line too)."""
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.fixture(autouse=True)
def fresh_proofs(monkeypatch):
    monkeypatch.setattr(records, "_usable", set())  # a folder proved writable in an earlier test is proved again


@pytest.fixture
def cache_under_a_file(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FLASHCORE_CACHE", str(blocker / "cache"))
    return blocker


@pytest.fixture
def read_only_everywhere(monkeypatch):
    """Every write test fails as on a read-only mount (EROFS), for root too: a chmod'ed folder would not stop
    root, and flashcore's check is an actual write."""

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)


@pytest.mark.parametrize("command", [["ptxas", "baseline", "--arch", "sm_90"], TUNE_DRY_RUN, ["build", "baseline"]])
def test_a_cache_under_a_regular_file_is_exit_2_naming_it(command, cache_under_a_file, nvcc):
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    line = error_of(result)
    assert f"FLASHCORE_CACHE={cache_under_a_file / 'cache'} is not usable" in line
    assert f"{cache_under_a_file} is a regular file" in line


def test_a_read_only_cache_is_exit_2_naming_it(tmp_path, monkeypatch, read_only_everywhere, nvcc):
    monkeypatch.setenv("FLASHCORE_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["ptxas", "baseline", "--arch", "sm_90"])
    assert result.exit_code == 2, result.output
    line = error_of(result)
    assert f"FLASHCORE_CACHE={tmp_path / 'cache'} is not usable: cannot write in it (Read-only file system)" in line


def test_folder_problem_on_a_real_read_only_folder(tmp_path):
    import os

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        problem = records.folder_problem(folder)
        if os.geteuid() == 0:  # root writes anyway: then the folder is usable, and the check says so
            assert problem is None
        else:
            assert problem == "cannot write in it (Permission denied)"
    finally:
        folder.chmod(0o755)


def test_doctor_says_when_the_cache_or_results_folder_is_not_writable(tmp_path, monkeypatch, cache_under_a_file, table_rows):
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr("flashcore_cli.inspect.doctor.package_checks", lambda: [])
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    rows = {row["piece"]: row for row in table_rows}
    assert rows["cache"][""] == "missing" and "not writable" in rows["cache"]["found"]
    assert f"{cache_under_a_file} is a regular file" in rows["cache"]["found"]
    assert "FLASHCORE_CACHE" in rows["cache"]["what to do"]
    assert rows["results"][""] == "ok"
    assert not (tmp_path / "results").exists()  # doctor creates nothing


def test_doctor_says_when_the_results_folder_is_read_only(tmp_path, monkeypatch, read_only_everywhere, table_rows):
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr("flashcore_cli.inspect.doctor.package_checks", lambda: [])
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    row = next(row for row in table_rows if row.get("piece") == "results")
    assert row[""] == "missing" and "Read-only file system" in row["found"] and "FLASHCORE_RESULTS" in row["what to do"]


def test_save_record_into_an_unusable_results_folder_is_one_error(tmp_path, monkeypatch):
    from flashcore_cli.core.errors import FlashcoreError

    (tmp_path / "f").write_text("")
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "f" / "results"))
    with pytest.raises(FlashcoreError, match="FLASHCORE_RESULTS=.* is not usable: .* is a regular file"):
        records.save_record({"rows": []}, "bench")


# ---------------------------------------------------------------- files the user names
def test_ptxas_json_into_a_folder_is_refused_before_compiling(tmp_path, fresh_cache):
    result = runner.invoke(app, ["ptxas", "v8", "--arch", "sm_90", "--json", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"--json {tmp_path} is a folder: give the path of a file to write" in error_of(result)
    assert not (fresh_cache / "ptxas").exists()  # refused before any compile


def test_ptxas_json_creates_its_folder(tmp_path, nvcc, shared_cache):
    out = tmp_path / "new" / "folder" / "ptxas.json"
    result = runner.invoke(app, ["ptxas", "baseline", "--arch", "sm_90", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["kind"] == "flashcore-ptxas"


@pytest.fixture
def cuobjdump():
    from flashcore_cli.builder import cudatools

    if cudatools.locate("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def test_sass_out_into_a_folder_is_refused(tmp_path, nvcc):
    result = runner.invoke(app, ["sass", "v8", "--arch", "sm_90", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"--out {tmp_path} is a folder" in error_of(result)


def test_sass_out_under_a_file_is_refused(tmp_path, nvcc):
    (tmp_path / "f").write_text("")
    result = runner.invoke(app, ["sass", "v8", "--arch", "sm_90", "--out", str(tmp_path / "f" / "v8.sass")])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'f'} is a file, not a folder" in error_of(result)


def test_sass_out_creates_missing_folders(tmp_path, nvcc, cuobjdump):
    out = tmp_path / "missing" / "folder" / "x.sass"
    result = runner.invoke(app, ["sass", "v8", "--arch", "sm_90", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Function : " in out.read_text()


def test_compare_a_folder_as_a_record_is_one_line(tmp_path):
    result = runner.invoke(app, ["compare", str(tmp_path), str(REPO / "docs" / "results" / "h200.json")])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path} is a folder: give a record file" in error_of(result)


def test_a_registry_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    result = runner.invoke(app, ["--registry", str(tmp_path / "a.yaml"), "list"])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'a.yaml'}: the registry is a symlink loop" in error_of(result)
