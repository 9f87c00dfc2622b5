"""Timing modes (cold, graph, host): parsing, the timing core's own logic with fakes, records that carry their
mode, and on the lent GPU the proof that a blocking start never charges host time."""

import json
import math

import pytest
from typer.testing import CliRunner

from flashcore_cli.measure.bench import BenchRow, BenchRun, bench_references, bench_variant
from flashcore_cli.cli import app
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.isolate import WorkerOutcome
from flashcore_cli.registry.shapes import Case, parse_shape
from flashcore_cli.measure.modes import parse_modes, time_host
from flashcore_cli.measure.timing import MAX_CALLS_PER_SAMPLE, MAX_TIMEOUTS, Timing, TimingError, calls_per_sample, collect, per_call

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


# ---------------------------------------------------------------- parsing --mode
@pytest.mark.parametrize("text, modes", [("cold", ["cold"]), ("graph", ["graph"]), ("HOST", ["host"]),
                                         ("cold, graph,host", ["cold", "graph", "host"]), ("host,cold", ["host", "cold"])])  # fmt: skip
def test_modes_parse(text, modes):
    assert parse_modes(text) == modes


@pytest.mark.parametrize("text", ["", "warm", "cold,cold", "cold,,graph", "cold;graph"])
def test_bad_modes_are_refused(text):
    with pytest.raises(FlashcoreError, match="bad --mode"):
        parse_modes(text)


def test_one_mode_commands_refuse_a_list():
    assert parse_modes("graph", several=False) == ["graph"]
    with pytest.raises(FlashcoreError, match="one mode at a time"):
        parse_modes("cold,graph", several=False)


@pytest.mark.parametrize("command", [["bench", "baseline"], ["sweep", "baseline"], ["tune", "baseline"]])
def test_a_bad_mode_is_exit_2_in_one_line(command):
    result = runner.invoke(app, [*command, "--mode", "warm"], env=WIDE)
    assert result.exit_code == 2
    # the error itself, whole on its line; a dim "registry: ..." line may come before it (run from another checkout)
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "bad --mode 'warm': expected cold, graph or host" in error and "Traceback" not in result.output


# ---------------------------------------------------------------- the registry of modes (modes.py)
def test_each_mode_is_one_object_of_the_registry():
    from flashcore_cli.measure.modes import DEFAULT_MODE, MODES, mode_help, needs_flusher

    assert list(MODES) == ["cold", "graph", "host"] and DEFAULT_MODE in MODES
    assert MODES["cold"].title == "cold mode: L2 flushed, blocking start, events around one call"
    assert MODES["graph"].title == "graph mode: CUDA graph replays, warm L2, device time per call"
    assert MODES["host"].title == "host mode: back-to-back wall time per call, dispatch included"
    assert mode_help() == "cold (L2 flushed, device time), graph (CUDA graph replays) or host (back-to-back wall time)"
    assert needs_flusher(["host", "cold"]) and not needs_flusher(["graph", "host"])


def test_time_callable_times_through_the_mode_s_object(monkeypatch):
    from flashcore_cli.measure import modes

    seen = {}

    def time_warm(fn, **kw):
        seen.update(kw)
        return Timing([1.0], "warm")

    monkeypatch.setitem(modes.MODES, "warm", modes.TimingMode("warm", "w", "one call", time_warm))
    assert modes.time_callable(lambda: None, mode="warm", reps=100, warmup=3).mode == "warm"
    assert seen == {"reps": 100, "warmup": 3, "flusher": None, "gate": None}  # it needs neither: none is made
    assert parse_modes("warm,cold") == ["warm", "cold"]
    with pytest.raises(ValueError, match="unknown timing mode 'lukewarm'"):
        modes.time_callable(lambda: None, mode="lukewarm")


# ---------------------------------------------------------------- the timing core's logic
def test_calls_per_sample_makes_a_sample_long_enough():
    assert calls_per_sample(6.7, 200.0) == 30  # Triton's graph-mode kernel: 30 x 6.7 = 201 us
    assert calls_per_sample(200.0, 200.0) == 1
    assert calls_per_sample(5000.0, 200.0) == 1  # a long call is one sample by itself
    assert calls_per_sample(0.01, 200.0) == MAX_CALLS_PER_SAMPLE
    assert calls_per_sample(0.0, 200.0) == MAX_CALLS_PER_SAMPLE  # nothing measurable: the most calls


def test_a_sample_is_divided_by_its_calls():
    assert per_call(200.0, 40) == 5.0
    assert per_call(None, 40) is None  # a discarded sample stays discarded


def test_timed_out_samples_are_discarded_and_counted_never_used():
    answers = iter([5.0, None, 6.0, None, 7.0])
    samples, discarded = collect(lambda: next(answers), 3)
    assert samples == [5.0, 6.0, 7.0] and discarded == 2


def test_a_call_that_always_times_out_is_untimeable_not_a_hang():
    calls = []

    def always_late():
        calls.append(1)
        return None

    with pytest.raises(TimingError, match="timed out"):
        collect(always_late, 100)
    assert len(calls) == MAX_TIMEOUTS + 1  # it gives up after a few, never loops for ever


def test_host_mode_is_wall_time_per_call_over_a_batch():
    """A fake clock: each call costs the host 16 us; the closing synchronize 10 us, paid once per batch."""
    now = [0.0]
    calls = []

    def fn():
        calls.append(1)
        now[0] += 16e-6

    def sync():
        now[0] += 10e-6

    timing = time_host(fn, reps=100, warmup=5, sync=sync, clock=lambda: now[0])
    probe = (10 * 16 + 10) / 10  # 17 us per call in the 10-call probe
    n = math.ceil(2000 / probe)
    assert timing.mode == "host" and timing.calls_per_sample == n == 118
    assert len(timing.samples_us) == 100
    assert timing.median == pytest.approx(16 + 10 / n)  # the synchronize is spread over the batch
    assert len(calls) == 5 + 10 + 100 * n


def test_a_timing_says_its_mode_and_calls_per_sample():
    d = Timing([4.0, 5.0, 6.0], "graph", 30, 1).as_dict()
    assert d["mode"] == "graph" and d["calls_per_sample"] == 30 and d["timed_out_samples"] == 1
    assert d["median_us"] == 5.0 and d["samples_us"] == [4.0, 5.0, 6.0]


# ---------------------------------------------------------------- records carry their mode
def timed(name, kind, median):
    return BenchRow(name, kind, "OK", {"median_us": median, "p10_us": median - 0.5, "p90_us": median + 0.5, "samples_us": [median] * 100})


def test_a_one_mode_record_keeps_the_old_format_plus_its_mode():
    run = BenchRun(parse_shape("1,8,512,64"), False, 7, ["graph"])
    run.add({"graph": [timed("sdpa", "reference", 9.0), timed("v11", "variant", 5.5)]})
    record = run.record()
    assert record["mode"] == "graph" and "runs" not in record
    rows = {r["name"]: r for r in record["rows"]}
    assert rows["v11"]["speedup_vs_sdpa"] == pytest.approx(9.0 / 5.5)


def test_a_record_of_several_modes_holds_each_with_its_own_sdpa():
    run = BenchRun(parse_shape("1,8,512,64"), False, 7, ["cold", "graph", "host"])
    for mode, (sdpa, triton) in {"cold": (12.0, 10.0), "graph": (9.0, 6.7), "host": (16.2, 61.0)}.items():
        run.add({mode: [timed("sdpa", "reference", sdpa), timed("triton", "reference", triton)]})
    record = run.record()
    assert record["mode"] == "cold" and [r["mode"] for r in record["runs"]] == ["cold", "graph", "host"]
    assert record["rows"] == record["runs"][0]["rows"]  # a one-mode reader sees the first mode
    speedups = {run["mode"]: {r["name"]: r["speedup_vs_sdpa"] for r in run["rows"]}["triton"] for run in record["runs"]}
    assert speedups == pytest.approx({"cold": 12.0 / 10.0, "graph": 9.0 / 6.7, "host": 16.2 / 61.0})


def test_worker_events_become_one_row_per_mode(monkeypatch):
    """A variant timed in cold and host mode and untimeable in graph mode: three rows from one worker."""
    from flashcore_cli.measure import bench
    from flashcore_cli.registry.variants import load_registry

    def timing(mode, median):
        return {"event": "timing", "name": "baseline", "mode": mode, "median_us": median, "p10_us": median, "p90_us": median,
                "calls_per_sample": 1 if mode == "cold" else 50, "timed_out_samples": 0, "samples_us": [median] * 100}  # fmt: skip

    events = [{"event": "built", "key": "abc"}, {"event": "case", "status": "OK"}, timing("cold", 300.0),
              {"event": "timing-skipped", "mode": "graph", "reason": "cannot be captured in a CUDA graph (RuntimeError: x)"},
              timing("host", 310.0), {"event": "done"}]  # fmt: skip
    seen = {}
    monkeypatch.setattr(bench, "run_worker", lambda request, **kw: seen.update(modes=request.modes) or WorkerOutcome("done", events))
    reg = load_registry(None)
    rows = bench_variant(reg, reg.get("baseline"), Case(parse_shape("1,2,64,64"), False, 1), arch="sm_90", reps=100, warmup=1,
                         timeout=60, modes=("cold", "graph", "host"))  # fmt: skip
    assert seen["modes"] == ["cold", "graph", "host"]
    assert {m: r.status for m, r in rows.items()} == {"cold": "OK", "graph": "SKIP", "host": "OK"}
    assert rows["host"].median == 310.0 and rows["host"].timing["calls_per_sample"] == 50 and rows["cold"].key == "abc"
    assert "cannot be captured" in rows["graph"].detail


def test_reference_rows_are_split_by_mode(monkeypatch):
    from flashcore_cli.measure import bench
    events = [{"event": "environment", "gpu": "NVIDIA H200"},
              {"event": "timing", "name": "sdpa", "mode": "cold", "median_us": 12.0, "p10_us": 11.0, "p90_us": 13.0, "samples_us": [12.0]},
              {"event": "timing", "name": "sdpa", "mode": "graph", "median_us": 9.0, "p10_us": 8.9, "p90_us": 9.1, "samples_us": [9.0]},
              {"event": "reference-skipped", "name": "sdpa-flash", "reason": "not on this GPU"},  # before timing: every mode
              {"event": "reference-skipped", "name": "triton", "mode": "graph", "reason": "cannot be captured"},
              {"event": "timing", "name": "triton", "mode": "cold", "median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "samples_us": [10.0]},
              {"event": "done"}]  # fmt: skip
    monkeypatch.setattr(bench, "run_worker", lambda request, **kw: WorkerOutcome("done", events))
    rows, env = bench_references(Case(parse_shape("1,8,512,64"), False, 1), reps=100, warmup=1, timeout=60, modes=("cold", "graph"))
    assert env == {"gpu": "NVIDIA H200"}
    status = {m: {r.name: r.status for r in rs} for m, rs in rows.items()}
    assert status == {"cold": {"sdpa": "OK", "triton": "OK", "sdpa-flash": "SKIP"},
                      "graph": {"sdpa": "OK", "triton": "SKIP", "sdpa-flash": "SKIP"}}  # fmt: skip


def test_bench_writes_one_record_with_every_mode(monkeypatch, tmp_path, fake_bench_workers):
    """No GPU: the workers are faked; the command, the per-mode tables and the record are real."""
    medians = {"cold": (12.0, 20.0), "graph": (9.0, 15.0), "host": (16.2, 25.0)}
    asked = []

    def fake_references(case, *, reps, warmup, timeout, modes=("cold",), on_event=None, passes="fwd"):
        asked.append(tuple(modes))
        return {m: [timed("sdpa", "reference", medians[m][0])] for m in modes}, {"gpu": "NVIDIA H200", "torch": "2.11"}

    def fake_variant(registry, variant, case, *, arch, reps, warmup, timeout, modes=("cold",), on_event=None, defines=None, passes="fwd",
                     pair=""):
        asked.append(tuple(modes))
        return {m: timed(variant.name, "variant", medians[m][1]) for m in modes}

    fake_bench_workers(references=fake_references, variant=fake_variant)
    out = tmp_path / "all.json"
    result = runner.invoke(app, ["bench", "baseline", "--mode", "cold,graph,host", "--json", str(out), "--arch", "sm_90"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert asked == [("cold", "graph", "host")] * 2  # one worker each for the references and the variant, all modes
    record = json.loads(out.read_text())
    assert record["mode"] == "cold" and [r["mode"] for r in record["runs"]] == ["cold", "graph", "host"]
    for run in record["runs"]:
        rows = {r["name"]: r for r in run["rows"]}
        sdpa, mine = medians[run["mode"]]
        assert rows["baseline"]["speedup_vs_sdpa"] == pytest.approx(sdpa / mine)
    for title in ("cold mode: L2 flushed", "graph mode: CUDA graph replays", "host mode: back-to-back wall time"):
        assert title in result.output  # what each mode measures, once
    for mode in ("cold", "graph", "host"):
        assert f"1,8,512,64 on NVIDIA H200, {mode} mode" in result.output  # each table's title

    single = tmp_path / "graph.json"
    result = runner.invoke(app, ["bench", "baseline", "--mode", "graph", "--json", str(single), "--arch", "sm_90"], env=WIDE)
    assert result.exit_code == 0, result.output
    record = json.loads(single.read_text())
    assert record["mode"] == "graph" and "runs" not in record and record["rows"][0]["median_us"] == 9.0


# ---------------------------------------------------------------- on the lent GPU
@pytest.fixture
def tiny():
    import torch

    return torch.zeros(1024, device="cuda")


@pytest.mark.gpu
def test_a_blocking_start_never_charges_host_time(tiny):
    """A call that sleeps 200 us on the host before its one tiny kernel: cold mode sees the kernel, not the sleep."""
    import time

    import torch

    from flashcore_cli.measure.modes import time_callable

    def slow_host():
        time.sleep(200e-6)
        tiny.add_(1)

    cold = time_callable(slow_host, mode="cold", reps=100, warmup=5)
    assert cold.median < 30, cold.as_dict()  # the cold floor is ~3.5 us; the sleep is >= 200
    assert cold.timed_out_samples == 0

    # without the blocking start, events around the same call do see the sleep: the test can fail
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    naive = []
    for _ in range(20):
        start.record()
        slow_host()
        end.record()
        end.synchronize()
        naive.append(start.elapsed_time(end) * 1000)
    assert sorted(naive)[10] > 150

    host = time_callable(slow_host, mode="host", reps=100, warmup=5)
    assert host.median > 190  # host mode is the one that counts the host


@pytest.mark.gpu
def test_a_call_that_waits_for_the_gpu_is_reported_not_timed(tiny):
    import torch

    from flashcore_cli.measure.blocking_start import BlockingStart
    from flashcore_cli.measure.modes import time_callable

    gate = BlockingStart(timeout_ms=5)

    def waits():
        tiny.add_(1)
        torch.cuda.synchronize()  # waits for the spin, which waits for the host: only the timeout ends it

    with pytest.raises(TimingError, match="timed out"):
        time_callable(waits, mode="cold", reps=100, warmup=2, gate=gate)
    after = time_callable(lambda: tiny.add_(1), mode="cold", reps=100, warmup=2, gate=gate)  # the gate recovers
    assert after.timed_out_samples == 0 and 0 < after.median < 30


@pytest.mark.gpu
def test_graph_mode_times_per_call_and_reports_what_cannot_be_captured(tiny):
    from flashcore_cli.measure.modes import time_callable

    with pytest.raises(TimingError, match="cannot be captured in a CUDA graph"):
        time_callable(lambda: tiny.add_(1).sum().item(), mode="graph", reps=100, warmup=2)
    graph = time_callable(lambda: tiny.add_(1), mode="graph", reps=100, warmup=2)
    assert graph.mode == "graph" and graph.calls_per_sample > 1
    assert 0 < graph.median < 10  # one tiny kernel per call, no launch gaps
    assert len(graph.samples_us) == 100


@pytest.mark.gpu
def test_bench_in_every_mode_on_a_small_shape(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "flashcore_cli", "bench", "baseline", "--shape", "1,2,128,64", "--reps", "100",
         "--mode", "cold,graph,host", "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "FLASHCORE_RESULTS": str(tmp_path / "results")}, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["mode"] == "cold" and [r["mode"] for r in record["runs"]] == ["cold", "graph", "host"]
    for run in record["runs"]:
        rows = {r["name"]: r for r in run["rows"]}
        for name in ("sdpa", "baseline"):
            row = rows[name]
            assert row["status"] == "OK", (run["mode"], row)
            assert len(row["samples_us"]) == 100 and min(row["samples_us"]) > 0
            assert row["speedup_vs_sdpa"] > 0
        assert rows["baseline"]["key"]


def test_math_reference_skipped_where_its_scores_would_not_fit():
    from flashcore_cli.measure.references import MATH_SCORE_LIMIT_BYTES, math_skip_reason

    assert math_skip_reason((2, 16, 4096, 64)) == ""  # 2 GiB of scores: timed
    assert MATH_SCORE_LIMIT_BYTES == 4 << 30
    reason = math_skip_reason((1, 16, 16384, 64))
    assert "16.0 GiB" in reason and "limit 4 GiB" in reason
    # exactly the limit (4 GiB of scores) is still timed, twice that is not
    assert math_skip_reason((1, 1, 32768, 64)) == ""
    assert math_skip_reason((1, 2, 32768, 64)) != ""
