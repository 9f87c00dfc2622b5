"""bench --pair: a variant's samples and a reference row's taken in turn in one worker (modes.time_pair), so the two
rows see one clock and power state. The turn-taking with fakes, the CLI's refusals, the rows and the record from
faked workers, and on the lent GPU one real paired run."""

import json

import pytest
from typer.testing import CliRunner

from flashcore_cli.cli import app
from flashcore_cli.core.isolate import WorkerOutcome
from flashcore_cli.measure.bench import BenchRow, bench_variant, paired_name
from flashcore_cli.measure.timing import MAX_TIMEOUTS, TimingError, alternate
from flashcore_cli.registry.shapes import Case, parse_shape

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def test_samples_alternate_and_neither_call_is_always_first():
    order = []

    def sample(fn):
        order.append(fn)
        return 10.0 if fn == "a" else 20.0

    a, b, discarded = alternate(sample, "a", "b", 4)
    assert a == [10.0] * 4 and b == [20.0] * 4 and discarded == 0
    assert "".join(order) == "abbaabba"


def test_a_discarded_sample_is_taken_again_and_counted():
    answers = {"a": iter([5.0, None, 6.0]), "b": iter([None, 8.0, 9.0])}
    order = []

    def sample(fn):
        order.append(fn)
        return next(answers[fn])

    a, b, discarded = alternate(sample, "a", "b", 2)
    assert (a, b, discarded) == ([5.0, 6.0], [8.0, 9.0], 2)
    assert "".join(order) == "abbaab"  # a call already at reps takes no more samples


def test_a_pair_that_always_times_out_is_untimeable_not_a_hang():
    calls = []

    def late(fn):
        calls.append(fn)
        return None

    with pytest.raises(TimingError, match="timed out"):
        alternate(late, "a", "b", 100)
    assert len(calls) == MAX_TIMEOUTS + 1


def test_pairs_are_cold_mode_only():
    from flashcore_cli.measure.modes import time_pair

    with pytest.raises(TimingError, match="cold mode only"):
        time_pair(lambda: None, lambda: None, mode="graph", reps=100, warmup=1)


@pytest.mark.parametrize("args, message", [
    (["--pair", "cudnn"], "--pair 'cudnn': expected a reference row, one of sdpa, sdpa-flash, sdpa-efficient, sdpa-cudnn"),
    (["--pair", "sdpa-cudnn", "--mode", "graph"], "--pair: paired samples are taken in cold mode only (not --mode graph)"),
])  # fmt: skip
def test_a_bad_pair_is_exit_2_in_one_line(args, message):
    result = runner.invoke(app, ["bench", "baseline", *args], env=WIDE)
    assert result.exit_code == 2
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert message in error and "Traceback" not in result.output


def _timing(event, median, **extra):
    return {"event": event, "mode": "cold", "median_us": median, "p10_us": median, "p90_us": median, "calls_per_sample": 1,
            "timed_out_samples": 0, "samples_us": [median] * 100, **extra}  # fmt: skip


def _bench_baseline(monkeypatch, events, pair="sdpa-cudnn"):
    from flashcore_cli.measure import bench
    from flashcore_cli.registry.variants import load_registry

    seen = {}
    monkeypatch.setattr(bench, "run_worker", lambda request, **kw: seen.update(pair=request.pair) or WorkerOutcome("done", events))
    reg = load_registry(None)
    rows = bench_variant(reg, reg.get("baseline"), Case(parse_shape("1,2,64,64"), False, 1), arch="sm_90", reps=100,
                         warmup=1, timeout=60, pair=pair)  # fmt: skip
    return seen, rows["cold"]


def test_a_paired_worker_gives_the_variant_row_and_the_reference_s(monkeypatch):
    events = [{"event": "built", "key": "abc"}, {"event": "case", "status": "OK"}, _timing("timing", 300.0, name="baseline"),
              _timing("pair-timing", 330.0, name="sdpa-cudnn", paired_with="baseline"), {"event": "done"}]  # fmt: skip
    seen, row = _bench_baseline(monkeypatch, events)
    assert seen == {"pair": "sdpa-cudnn"}  # the request names the reference
    assert row.status == "OK" and row.median == 300.0
    paired = row.paired
    assert paired.name == paired_name("sdpa-cudnn", "baseline") == "sdpa-cudnn~baseline"
    assert paired.kind == "reference" and paired.status == "OK" and paired.median == 330.0
    assert paired.paired_with == "baseline" and len(paired.timing["samples_us"]) == 100
    assert paired.as_dict(1e9, 330.0)["paired_with"] == "baseline"


def test_a_reference_that_cannot_run_is_a_skip_row_and_a_failed_variant_none(monkeypatch):
    events = [{"event": "built", "key": "abc"}, {"event": "case", "status": "OK"},
              {"event": "pair-skipped", "name": "sdpa-flash", "reason": "RuntimeError: no kernel for this shape"},
              _timing("timing", 300.0, name="baseline"), {"event": "done"}]  # fmt: skip
    _, row = _bench_baseline(monkeypatch, events, pair="sdpa-flash")
    assert row.status == "OK" and row.paired.status == "SKIP" and "no kernel for this shape" in row.paired.detail
    failed = [{"event": "built", "key": "abc"},
              {"event": "case", "status": "MISMATCH", "max_error": 1.0, "tolerance": 0.01, "detail": "wrong"},
              {"event": "done"}]  # fmt: skip
    _, row = _bench_baseline(monkeypatch, failed)
    assert row.status == "MISMATCH" and row.paired is None  # never timed, so neither was its pair
    _, unpaired = _bench_baseline(monkeypatch, events[:2] + events[3:], pair="")
    assert unpaired.paired is None


def test_bench_records_the_pair_beside_the_variant(monkeypatch, tmp_path, fake_bench_workers):
    def row(name, kind, median, **extra):
        timing = {"median_us": median, "p10_us": median, "p90_us": median, "samples_us": [median] * 100}
        return BenchRow(name, kind, "OK", timing, **extra)

    def fake_references(case, *, reps, warmup, timeout, modes=("cold",), on_event=None, passes="fwd"):
        return {"cold": [row("sdpa", "reference", 400.0)]}, {"gpu": "NVIDIA H200"}

    def fake_variant(registry, variant, case, *, arch, reps, warmup, timeout, modes=("cold",), on_event=None, defines=None,
                     passes="fwd", pair=""):  # fmt: skip
        mine = row(variant.name, "variant", 300.0)
        mine.paired = row(paired_name(pair, variant.name), "reference", 330.0, paired_with=variant.name)
        return {"cold": mine}

    fake_bench_workers(references=fake_references, variant=fake_variant)
    out = tmp_path / "pair.json"
    result = runner.invoke(app, ["bench", "baseline", "--pair", "sdpa-cudnn", "--json", str(out), "--arch", "sm_90"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["sdpa", "baseline", "sdpa-cudnn~baseline"]
    assert rows[2]["paired_with"] == "baseline" and "paired_with" not in rows[1]
    assert rows[2]["speedup_vs_sdpa"] == pytest.approx(400.0 / 330.0)
    assert "1.10x" in result.output  # the pair's ratio, 330 / 300


def test_the_worker_enters_a_one_shot_backend_pin_once(monkeypatch, tmp_path):
    """The reference's first call and every paired sample run inside one entry of its backend pin (sdpa_kernel's
    context manager is one-shot: entered twice, it raises)."""
    import contextlib
    from types import SimpleNamespace

    from flashcore_cli import worker
    from flashcore_cli.measure import timed
    from flashcore_cli.core.protocol import WorkRequest
    from flashcore_cli.measure.timing import Timing

    entered, calls = [], []

    @contextlib.contextmanager
    def pin():
        entered.append("pin")
        yield

    def fake_pair(mine, theirs, **kw):
        theirs()
        return Timing([1.0] * 100, "cold"), Timing([2.0] * 100, "cold")

    monkeypatch.setattr("flashcore_cli.measure.references.reference_functions",
                        lambda q, k, v, causal, passes, family=None: [("sdpa-cudnn", lambda: calls.append("ref"), pin(), "")])
    monkeypatch.setattr("flashcore_cli.check.case.make_inputs", lambda case: (None, None, None))
    monkeypatch.setattr("flashcore_cli.measure.modes.time_pair", fake_pair)
    attn = SimpleNamespace(name="v12", build=SimpleNamespace(key="k"), forward_note=lambda: None)
    case = Case(parse_shape("1,2,64,64"), False, 1)
    request = WorkRequest("bench", case=case.as_dict(), reps=100, warmup=1, modes=["cold"], passes="bwd", pair="sdpa-cudnn")
    events = worker.Events(str(tmp_path / "events.jsonl"))
    monkeypatch.setattr(timed, "variant_call", lambda attn, case, passes: lambda: None)
    timed.time_variant(attn, case, request, events.emit)
    said = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert entered == ["pin"] and calls == ["ref", "ref"]  # its first call, then the samples
    assert [(e["event"], e["name"], e["median_us"]) for e in said] == [("timing", "v12", 1.0), ("pair-timing", "sdpa-cudnn", 2.0)]
    assert said[1]["paired_with"] == "v12"


@pytest.mark.gpu
def test_a_paired_run_on_the_gpu_times_both_calls(tmp_path, monkeypatch):
    """sdpa-math: a pinned backend, whose context manager is one-shot."""
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))
    out = tmp_path / "pair.json"
    result = runner.invoke(app, ["bench", "baseline", "--shape", "1,2,128,64", "--reps", "100", "--pair", "sdpa-math",
                                 "--json", str(out)], env=WIDE)  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["baseline"]["status"] == "OK", rows["baseline"]["detail"]
    paired = rows["sdpa-math~baseline"]
    assert paired["status"] == "OK" and paired["paired_with"] == "baseline"
    assert len(paired["samples_us"]) == len(rows["baseline"]["samples_us"]) == 100
    assert all(s > 0 for s in paired["samples_us"])
