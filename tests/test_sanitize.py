"""`flashcore sanitize`: the compute-sanitizer log parser on logs in the tool's own format, the command's
errors without a GPU, and (on the lent GPU) a clean baseline and the faulting fixture caught."""

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, cells
from flashcore_cli.builder import cudatools
from flashcore_cli.cli import app
from flashcore_cli.inspect.sanitize import TOOLS, parse_location, parse_sanitizer

INSTRUMENTS = FIXTURES / "instruments"
runner = CliRunner()


def read(name: str) -> str:
    return (INSTRUMENTS / name).read_text()


def test_memcheck_on_the_fault_fixture():
    # captured on the lent H200: `flashcore --registry tests/fixtures/faults.yaml sanitize fault --shape 1,2,64,64`
    report = parse_sanitizer(read("memcheck_fault.txt"), "memcheck")
    assert report.errors == 36  # the summary line's count, not the number of blocks shown
    first = report.issues[0]
    assert first.what == "Invalid __global__ write of size 4 bytes"
    assert first.kernel == "fault_fwd(FlashcoreParams)"
    assert first.where == "fault.cu:9"
    assert first.thread == "thread (0,0,0) in block (0,0,0)"
    assert first.details[0] == "Access to 0xdead0000 is out of bounds"  # backtraces are left out
    assert report.issues[-1].what == "process didn't terminate successfully"


def test_clean_log_has_no_errors():
    report = parse_sanitizer(read("memcheck_clean.txt"))
    assert report.errors == 0 and report.issues == []


def test_racecheck_counts_errors_and_warnings_apart():
    # captured on the lent H200: v9's pair merge before it moved from bar.arrive to bar.sync
    report = parse_sanitizer(read("racecheck_hazards.txt"), "racecheck")
    assert (report.errors, report.warnings) == (17, 0)
    assert {i.severity for i in report.issues} == {"error"}
    last = report.issues[-1]
    assert last.what == "Race reported between Read access"
    assert last.kernel.startswith("void consume_kv<(int)64, (int)2>(const FlashcoreParams &") and last.where == "v9.cu:540"
    assert last.details[0].startswith("and Write access at") and last.details[0].endswith("in v9.cu:532 [2048 hazards]")


def test_synccheck_and_initcheck():
    sync = parse_sanitizer(read("synccheck_divergent.txt"), "synccheck")
    assert sync.errors == 128 and len(sync.issues) == 2
    assert sync.issues[0].what == "Barrier error detected. Divergent thread(s) in block"
    assert sync.issues[0].where.endswith("divergent.cu:88")
    init = parse_sanitizer(read("initcheck_uninitialized.txt"), "initcheck")
    assert init.errors == 1
    (issue,) = init.issues
    assert issue.kernel == "void uninit_fwd<(int)64>(FlashcoreParams)" and issue.where.endswith("uninit.cu:53")
    assert issue.details == ["Address 0x7f3a1e000a40"]


def test_a_log_cut_short_counts_its_error_blocks():
    text = "\n".join(read("memcheck_fault.txt").splitlines()[:17])  # the run died before the summary
    assert parse_sanitizer(text).errors == 3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("fault_fwd(FlashcoreParams)+0x70 in /k/fault.cu:9", ("fault_fwd(FlashcoreParams)", "/k/fault.cu:9")),
        ("col_kernel(const unsigned int *, int)+0x490", ("col_kernel(const unsigned int *, int)", "")),
        ("0xa0a50 in /usr/include/cub/thread_load.cuh:272:ThreadLoad<LOAD_CG>", ("ThreadLoad<LOAD_CG>", "/usr/include/cub/thread_load.cuh:272")),
        ("0x3b0 in void k<int=2048>(unsigned long*)", ("void k<int=2048>(unsigned long*)", "")),
        ("v<(int)64>(P)+0xd790 in delta.cuh:324 [16 hazards]", ("v<(int)64>(P)", "delta.cuh:324")),
    ],
)
def test_location_forms(text, expected):
    assert parse_location(text) == expected


def test_unknown_tool_is_exit_2():
    result = runner.invoke(app, ["sanitize", "baseline", "--tool", "leakcheck"])
    assert result.exit_code == 2 and "one of: memcheck" in result.output


def test_missing_compute_sanitizer_says_what_to_do(monkeypatch):
    monkeypatch.setattr(cudatools, "locate", lambda tool: None)
    result = runner.invoke(app, ["sanitize", "baseline"])
    assert result.exit_code == 2
    assert "compute-sanitizer not found" in result.output and "CUDA toolkit" in result.output


@pytest.mark.gpu
@pytest.mark.parametrize("tool", TOOLS)
def test_baseline_is_clean(tool, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["sanitize", "baseline", "--tool", tool])
    assert result.exit_code == 0, result.output
    assert "clean: 0 errors" in result.output
    assert list(tmp_path.glob(f"sanitize-*-baseline-{tool}.log"))


@pytest.mark.gpu
def test_fault_fixture_is_caught_with_its_source_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["--registry", str(FIXTURES / "faults.yaml"), "sanitize", "fault", "--shape", "1,2,64,64"])
    assert result.exit_code == 1, result.output
    assert "Invalid __global__ write" in result.output
    assert "fault.cu:" in result.output and "fault_fwd" in result.output


def test_the_command_end_to_end_with_a_replayed_sanitizer_log(monkeypatch, tmp_path, table_rows):
    """No GPU: the workers are replaced by a fake that writes memcheck_fault.txt where compute-sanitizer would."""
    from pathlib import Path

    from flashcore_cli.core import isolate
    from flashcore_cli.core.isolate import WorkerOutcome

    calls = []

    def fake_run_worker(request, *, run_timeout, prefix=None, env=None, **_):
        calls.append((request.task, prefix, env))
        if request.task == "build":
            return WorkerOutcome("done", [{"event": "built", "key": "k"}, {"event": "done"}])
        Path(prefix[prefix.index("--log-file") + 1]).write_text(read("memcheck_fault.txt"))
        crash = {"event": "crash", "error": "RuntimeError: CUDA error: unspecified launch failure"}
        return WorkerOutcome("crash", [{"event": "built"}, crash], returncode=3)

    monkeypatch.setattr(isolate, "run_worker", fake_run_worker)
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setattr(cudatools, "locate", lambda tool: Path("/opt/cuda/bin") / tool)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["--registry", str(FIXTURES / "faults.yaml"), "sanitize", "fault", "--shape", "1,2,64,64", "--show", "2"])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "36 error(s)" in out and "first 2 of the reports" in out
    assert "unspecified launch failure" in out
    assert {row["kernel"] for row in table_rows} == {"fault_fwd"} and "fault.cu:9" in cells(table_rows)
    (task, prefix, env), = [c for c in calls if c[0] == "launch"]
    assert prefix[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck"]
    assert env == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # out-of-bounds past a tensor is not hidden in a pooled block
    assert calls[0][0] == "build" and calls[0][1] is None  # the compile never runs under the sanitizer
    (log,) = tmp_path.glob("sanitize-*-fault-memcheck.log")
    assert log.read_text() == read("memcheck_fault.txt")
