"""`flashcore sweep`: the axis, the rows of a record, the chart, the GPU lanes, and a real sweep on the lent GPU."""

import json
import sys

import pytest
from typer.testing import CliRunner

from flashcore_cli.measure.bench import BenchRow
from flashcore_cli.cli import app
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.gpus import map_on_gpus, visible_gpus
from flashcore_cli.registry.shapes import Case, parse_shape
from flashcore_cli.commands.sweep import render_sweep
from flashcore_cli.measure.sweep import PointJob, parse_seq_lens, point_rows

runner = CliRunner()


def test_seq_lens():
    assert parse_seq_lens("1024, 512,512 2048") == [512, 1024, 2048]
    for bad in ("", "512,x", "0,512", "-4"):
        with pytest.raises(FlashcoreError, match="bad --seq"):
            parse_seq_lens(bad)


def test_point_rows_carry_the_axis_tflops_and_speedup():
    job = PointJob("r.yaml", "v8", Case(parse_shape("1,8,1024,64"), True, 7).as_dict(), "sm_90", 100, 10, 60.0)
    rows = point_rows(job, [BenchRow("v8", "variant", "OK", {"median_us": 100.0, "p10_us": 99.0, "p90_us": 101.0})], 50.0, "1")
    (row,) = rows
    assert (row["seq_len"], row["shape"], row["causal"], row["gpu"]) == (1024, "1,8,1024,64", True, "1")
    assert row["tflops"] == pytest.approx(4 * 8 * 1024**2 * 64 / 2 / 100e-6 / 1e12)  # causal: half the FLOPs
    assert row["speedup_vs_sdpa"] == pytest.approx(0.5)


def sample_record():
    rows = []
    for s, (sdpa, mine) in {512: (12.0, 40.0), 1024: (30.0, 150.0), 2048: (90.0, None)}.items():
        flops = 4 * 8 * s * s * 64
        rows.append({"name": "sdpa", "kind": "reference", "status": "OK", "seq_len": s, "median_us": sdpa, "tflops": flops / sdpa / 1e6})
        if mine:
            rows.append({"name": "v8", "kind": "variant", "status": "OK", "seq_len": s, "median_us": mine, "tflops": flops / mine / 1e6})
        else:
            rows.append({"name": "v8", "kind": "variant", "status": "TIMEOUT", "seq_len": s})
    return {"batch": 1, "heads": 8, "head_dim": 64, "causal": False, "seq_lens": [512, 1024, 2048],
            "environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11"}, "rows": rows}  # fmt: skip


def test_render_shows_time_tflops_and_failures(capsys):
    render_sweep(sample_record())
    out = capsys.readouterr().out
    assert "S=2048" in out and "150.0 us" in out and "TIMEOUT" in out


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from flashcore_cli.measure.plot import plot_sweep

    path = plot_sweep(sample_record(), tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = runner.invoke(app, ["sweep", "baseline", "--seq", "512", "--plot", "x.png"])
    assert result.exit_code == 2
    assert "pip install matplotlib" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, needle", [(["--seq", "512,abc"], "bad --seq"), (["--reps", "5"], "at least 100"), (["--dim", "0"], "bad shape"),
                                          (["--mode", "warm"], "bad --mode 'warm'"), (["--mode", "cold,host"], "one mode at a time")])
def test_bad_input_is_exit_2(args, needle):
    result = runner.invoke(app, ["sweep", "baseline", *args])
    assert result.exit_code == 2 and needle in result.output


@pytest.mark.parametrize("env, expected", [("2,3", ["2", "3"]), ("", []), ("0,-1,1", ["0"]), ("GPU-7f3a,GPU-19bc", ["GPU-7f3a", "GPU-19bc"])])
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, env, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert visible_gpus() == expected


def test_jobs_run_in_lanes_pinned_to_their_gpu():
    import os

    seen = []
    results = map_on_gpus(os.getenv, ["CUDA_VISIBLE_DEVICES"] * 6, ["7", "9"], on_done=lambda i, r, gpu: seen.append((r, gpu)))
    assert set(results) <= {"7", "9"} and len(results) == 6
    assert all(result == gpu for result, gpu in seen)  # each job saw the GPU of the lane that ran it


@pytest.mark.gpu
def test_sweep_two_lengths_with_a_chart(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    png = tmp_path / "sweep.png"
    result = runner.invoke(app, ["sweep", "baseline", "--seq", "256,512", "--heads", "4", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    (record,) = tmp_path.glob("sweep-*.json")
    assert json.loads(record.read_text())["mode"] == "cold"  # the default
    rows = json.loads(record.read_text())["rows"]
    for s in (256, 512):
        mine = next(r for r in rows if r["name"] == "baseline" and r["seq_len"] == s)
        sdpa = next(r for r in rows if r["name"] == "sdpa" and r["seq_len"] == s)
        assert mine["status"] == "OK" and mine["tflops"] > 0 and len(mine["samples_us"]) >= 100
        assert sdpa["median_us"] > 0 and mine["speedup_vs_sdpa"] > 0


def in_process(fn, jobs, gpus, on_done=None):
    """map_on_gpus without lane processes, so that a test's fakes are seen by the jobs."""
    results = []
    for i, job in enumerate(jobs):
        results.append(fn(job))
        if on_done:
            on_done(i, results[-1], gpus[i % len(gpus)])
    return results


def test_the_command_end_to_end_with_fake_timings(monkeypatch, tmp_path):
    """No GPU: bench's variant and reference timings are faked; the jobs, the record, the table and the chart are real."""

    from flashcore_cli.measure import bench
    from flashcore_cli.measure import gpus
    asked_modes, asked_passes = set(), set()

    def fake_references(case, *, reps, warmup, timeout, modes=("cold",), on_event=None, passes="fwd"):
        asked_modes.update(modes)
        asked_passes.add(passes)
        s = case.shape.seq_len
        rows = [BenchRow("sdpa", "reference", "OK", {"median_us": s / 50, "p10_us": s / 51, "p90_us": s / 49, "samples_us": [s / 50] * reps})]
        rows += [BenchRow("triton", "reference", "SKIP", detail="no triton")]
        return {m: rows for m in modes}, {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11"}

    def fake_variant(registry, variant, case, *, arch, reps, warmup, timeout, modes=("cold",), on_event=None, defines=None, passes="fwd"):
        asked_modes.update(modes)
        asked_passes.add(passes)
        s = case.shape.seq_len
        if s > 512:
            return {m: BenchRow(variant.name, "variant", "TIMEOUT", detail="killed after 300 s (run)") for m in modes}
        timing = {"median_us": s / 10, "p10_us": s / 11, "p90_us": s / 9, "samples_us": [s / 10] * reps}
        return {m: BenchRow(variant.name, "variant", "OK", timing) for m in modes}

    monkeypatch.setattr(bench, "bench_references", fake_references)
    monkeypatch.setattr(bench, "bench_variant", fake_variant)
    monkeypatch.setattr(gpus, "map_on_gpus", in_process)
    monkeypatch.setattr(gpus, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    plot = ["--plot", str(tmp_path / "s.png")] if __import__("importlib").util.find_spec("matplotlib") else []
    result = runner.invoke(app, ["sweep", "baseline", "--seq", "1024,512", "--causal", "--mode", "graph", *plot])
    assert result.exit_code == 0, result.output
    (saved,) = tmp_path.glob("sweep-*-1_8_S_64-causal.json")
    record = json.loads(saved.read_text())
    assert record["mode"] == "graph" and asked_modes == {"graph"}  # every row of the run in the one mode
    assert record["pass"] == "fwd" and asked_passes == {"fwd"}
    assert record["seq_lens"] == [512, 1024] and record["gpus"] == ["0", "1"] and record["causal"] is True
    mine = {r["seq_len"]: r for r in record["rows"] if r["name"] == "baseline"}
    assert mine[512]["status"] == "OK" and mine[1024]["status"] == "TIMEOUT"
    assert mine[512]["speedup_vs_sdpa"] == pytest.approx((512 / 50) / (512 / 10))
    assert mine[512]["tflops"] == pytest.approx(4 * 8 * 512**2 * 64 / 2 / (512 / 10 * 1e-6) / 1e12)
    assert {r["gpu"] for r in record["rows"]} == {"0", "1"}
    out = " ".join(result.output.split())
    assert "51.2 us" in out and "TIMEOUT" in out and "record:" in out
