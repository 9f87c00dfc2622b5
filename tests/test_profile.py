"""`flashcore profile`: the ncu CSV parser, the failure diagnosis, and (on the lent GPU) a real profile."""

import json

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES
from flashcore_cli.builder import cudatools
from flashcore_cli.cli import app
from flashcore_cli.inspect.profile import METRICS, failed_metrics, function_name, kernel_regex, ncu_problem, parse_ncu_details

INSTRUMENTS = FIXTURES / "instruments"
runner = CliRunner()


def test_details_csv_gives_the_table_values():
    (k,) = parse_ncu_details((INSTRUMENTS / "ncu_details_v11.csv").read_text())
    s = k.summary()
    assert s["kernel"] == "void v11_fwd<64, 32, 16, 16, 2, 8, 1>(FlashcoreParams)" and s["grid"] == "(8, 16, 1)"
    assert s["duration_us"] == pytest.approx(8.384)  # "8,384" ns: thousands separators and base units read
    assert s["sm_throughput_pct"] == pytest.approx(34.53)
    assert s["dram_bytes_per_s"] == pytest.approx(189_893_129_770.99)
    assert s["achieved_occupancy_pct"] == pytest.approx(23.43)
    assert s["tensor_hmma_pct"] == pytest.approx(13.63) and s["tensor_gmma_pct"] is None
    assert [r for r, _ in s["top_stalls"]] == ["wait", "short_scoreboard", "not_selected"]
    assert (s["smem_bank_conflicts_ld"], s["smem_bank_conflicts_st"]) == (65536, 0)
    assert k.metrics["Duration"] == ("ns", 8384.0)  # section metrics are kept too


def test_launches_are_grouped_and_the_profiler_preamble_skipped():
    text = (
        "==PROF== Connected to process 1 (/usr/bin/python3)\n"
        '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","k1","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"\n'
        '"1","k2","Command line profiler metrics","gpu__time_duration.sum","msecond","1.5"\n'
        '"1","k2","Command line profiler metrics","dram__bytes.sum.per_second","Gbyte/second","900"\n'
    )
    k1, k2 = parse_ncu_details(text)
    assert k1.summary()["duration_us"] == pytest.approx(2.5)
    assert k2.summary()["duration_us"] == pytest.approx(1500)
    assert k2.summary()["dram_bytes_per_s"] == pytest.approx(9e11)
    assert k2.summary()["tensor_hmma_pct"] is None  # not collected: n/a, never 0


def test_ncu_failures_are_explained():
    denied = (INSTRUMENTS / "ncu_counters_denied.log").read_text()
    assert "ERR_NVGPUCTRPERM" in ncu_problem(denied)
    assert "no kernel" in ncu_problem("==WARNING== No kernels were profiled.\n")
    assert ncu_problem("==PROF== Disconnected from process 1\n") is None
    log = f"==ERROR== Failed to find metric {METRICS[3]}\n==PROF== {METRICS[0]} is fine here\n"
    assert failed_metrics(log, METRICS) == [METRICS[3]]


def test_kernel_filter():
    assert function_name("void v8_fwd<64>(FlashcoreParams)") == "v8_fwd"
    assert function_name("void fc::detail::k<(int)64>(P)") == "k"
    assert kernel_regex(["v8_fwd", "v8_fwd", "v8_split"]) == "regex:^(v8_fwd|v8_split)(<|\\(|$)"


def test_missing_ncu_says_what_to_do(monkeypatch):
    monkeypatch.setattr(cudatools, "locate", lambda tool: None)
    result = runner.invoke(app, ["profile", "baseline"])
    assert result.exit_code == 2
    assert "ncu not found" in result.output and "Nsight Compute" in result.output


@pytest.mark.gpu
def test_profile_baseline(tmp_path, monkeypatch):
    if cudatools.locate("ncu") is None:
        pytest.fail("ncu is not installed on this GPU machine (`flashcore doctor` says where to get it)")
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["profile", "baseline", "--shape", "1,8,512,64"])
    assert result.exit_code == 0, result.output
    assert "duration" in result.output and "baseline_fwd" in result.output
    (report,) = tmp_path.glob("profile-*.ncu-rep")
    (record,) = tmp_path.glob("profile-*.json")
    kernels = json.loads(record.read_text())["kernels"]
    assert kernels and kernels[0]["duration_us"] > 0 and report.stat().st_size > 0


def test_the_command_end_to_end_with_a_replayed_report(monkeypatch, tmp_path):
    """No GPU: ncu's run is replayed. The first attempt names a metric this ncu lacks, so it is dropped and the
    profile taken again; the report read back is ncu_details_v11.csv."""
    from pathlib import Path

    from flashcore_cli.core import isolate

    from flashcore_cli.inspect import profile

    from flashcore_cli.builder import ptxas
    from flashcore_cli.core.isolate import WorkerOutcome
    from flashcore_cli.inspect.profile import TENSOR_GMMA
    from flashcore_cli.builder.ptxas import KernelResources, VariantReport

    attempts = []

    def fake_run_worker(request, *, run_timeout, prefix=None, env=None, **_):
        if request.task == "build":
            return WorkerOutcome("done", [{"event": "built", "key": "k"}, {"event": "done"}])
        metrics = prefix[prefix.index("--metrics") + 1].split(",")
        attempts.append((prefix, metrics))
        log = Path(prefix[prefix.index("--log-file") + 1])
        if TENSOR_GMMA in metrics:
            log.write_text(f"==ERROR== Failed to find metric {TENSOR_GMMA}\n")
            return WorkerOutcome("crash", [], returncode=1)
        log.write_text("==PROF== Disconnected from process 1\n")
        Path(prefix[prefix.index("--export") + 1] + ".ncu-rep").write_bytes(b"report")
        return WorkerOutcome("done", [{"event": "built"}, {"event": "done"}])

    kernels = [KernelResources("m", f"void baseline_fwd<{d}>(FlashcoreParams)", "sm_90") for d in (64, 128)]
    monkeypatch.setattr(ptxas, "compile_probe", lambda variant, arch, extra_defines=None: VariantReport("baseline", arch, kernels))
    monkeypatch.setattr(isolate, "run_worker", fake_run_worker)
    monkeypatch.setattr(profile, "read_report", lambda ncu, report: parse_ncu_details((INSTRUMENTS / "ncu_details_v11.csv").read_text()))
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setattr(cudatools, "locate", lambda tool: Path("/opt/nsight-compute") / tool)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["profile", "baseline"])
    assert result.exit_code == 0, result.output
    assert len(attempts) == 2 and TENSOR_GMMA not in attempts[1][1]
    prefix = attempts[1][0]
    assert prefix[prefix.index("--clock-control") + 1] == "none"
    assert prefix[prefix.index("--kernel-name") + 1] == "regex:^(baseline_fwd)(<|\\(|$)"
    out = " ".join(result.output.split())
    assert "8.38 us" in out and "wait 1.70" in out and "65,536 / 0" in out
    (report,) = tmp_path.glob("profile-*-baseline-1_8_512_64.ncu-rep")
    assert report.read_bytes() == b"report"


def test_denied_counters_are_a_clear_exit_2(monkeypatch, tmp_path):
    from pathlib import Path

    from flashcore_cli.core import isolate

    from flashcore_cli.builder import ptxas
    from flashcore_cli.core.isolate import WorkerOutcome
    from flashcore_cli.builder.ptxas import KernelResources, VariantReport

    def fake_run_worker(request, *, run_timeout, prefix=None, env=None, **_):
        if request.task == "launch":
            Path(prefix[prefix.index("--log-file") + 1]).write_text((INSTRUMENTS / "ncu_counters_denied.log").read_text())
        return WorkerOutcome("done", [{"event": "built", "key": "k"}, {"event": "done"}])

    report = VariantReport("baseline", "sm_90", [KernelResources("m", "void baseline_fwd<64>(FlashcoreParams)", "sm_90")])
    monkeypatch.setattr(ptxas, "compile_probe", lambda variant, arch, extra_defines=None: report)
    monkeypatch.setattr(isolate, "run_worker", fake_run_worker)
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setattr(cudatools, "locate", lambda tool: Path("/opt/nsight-compute") / tool)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["profile", "baseline"])
    assert result.exit_code == 2
    assert "ERR_NVGPUCTRPERM" in result.output and "Traceback" not in result.output
