"""A reference row that says what it ran (Triton's autotuned tile) keeps that in the bench's rows and record:
the worker is faked (no GPU), bench_references and the command's record are real."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from flashcore_cli.cli import app
from flashcore_cli.core.protocol import WorkerOutcome
from flashcore_cli.measure import bench
from flashcore_cli.registry.shapes import Case, Shape

runner = CliRunner()
TIMING = {"median_us": 9.9, "p10_us": 9.8, "p90_us": 10.2, "mode": "cold"}


def fake_run_worker(request, run_timeout, on_event=None):
    assert request.task == "references"
    return WorkerOutcome("done", [
        {"event": "environment", "gpu": "fake"},
        {"event": "timing", "name": "sdpa", "detail": "", **TIMING},
        {"event": "timing", "name": "triton", "detail": "tile 64x64, 4 warps, 3 stages", **TIMING},
    ])  # fmt: skip


def test_reference_rows_carry_the_workers_detail(monkeypatch):
    monkeypatch.setattr(bench, "run_worker", fake_run_worker)
    rows, env = bench.bench_references(Case(Shape(1, 8, 512, 64), False, 0), reps=100, warmup=1, timeout=10)
    got = {r.name: (r.status, r.detail, r.timing["median_us"]) for r in rows["cold"]}
    assert got == {"sdpa": ("OK", "", 9.9), "triton": ("OK", "tile 64x64, 4 warps, 3 stages", 9.9)}
    assert env == {"gpu": "fake"}


def test_the_bench_record_keeps_the_reference_detail(monkeypatch, tmp_path, fake_bench_workers):
    monkeypatch.setattr(bench, "run_worker", fake_run_worker)
    fake_bench_workers(variant=lambda *a, modes=("cold",), **k: {})
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--json", str(out), "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["triton"]["detail"] == "tile 64x64, 4 warps, 3 stages"
    assert rows["triton"]["median_us"] == 9.9 and rows["sdpa"]["detail"] == ""


def test_a_substituted_kernel_is_named_in_the_variant_row_that_timed_it(monkeypatch, tmp_path):
    """A variant's timing event with a detail (the launcher's forward_note: v11's cp.async kernel run in place of
    its TMA kernel) is the row's note and its record's detail; without one the row says nothing more."""
    from flashcore_cli.registry.variants import load_registry

    note = "v11_fwd<64, 32, 32, 16, 3, 4, 1> ran in place of v11_fwd_tma<64, 32, 64, 16, 3, 2, 1>: the driver could not make the K/V tensor maps"

    def fake_variant_worker(request, run_timeout, on_event=None):
        assert request.task == "bench"
        extra = {"detail": note} if request.variant == "v11" else {}
        return WorkerOutcome("done", [
            {"event": "built", "key": "k"},
            {"event": "case", "case": {}, "status": "OK", "max_error": 0.0, "tolerance": 1.0},
            {"event": "timing", "name": request.variant, "key": "k", **TIMING, **extra},
            {"event": "done"},
        ])  # fmt: skip

    monkeypatch.setattr(bench, "run_worker", fake_variant_worker)
    reg = load_registry(None)
    case = Case(Shape(1, 8, 512, 64), False, 0)
    for name, detail in (("v11", note), ("v12", "")):
        row = bench.bench_variant(reg, reg.get(name), case, arch="sm_90", reps=100, warmup=1, timeout=10)["cold"]
        assert (row.status, row.detail, row.median) == ("OK", detail, 9.9)
        assert row.as_dict(1e9, 10.0)["detail"] == detail
