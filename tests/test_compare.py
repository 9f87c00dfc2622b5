"""`flashcore compare`: the noise-aware verdict rule, row matching, warnings and the exit code that gates CI."""

import json

import pytest
from typer.testing import CliRunner

from conftest import cells
from flashcore_cli.cli import app
from flashcore_cli.report.compare import compare, row_verdict, timing_verdict

runner = CliRunner()


def timed(median, half_spread, name="v8", **extra):
    return {"name": name, "status": "OK", "median_us": median, "p10_us": median - half_spread, "p90_us": median + half_spread, **extra}


@pytest.mark.parametrize(
    "a, b, word, regression",
    [
        (timed(30.0, 0.5), timed(30.4, 0.5), "same", False),  # inside the spread
        (timed(30.0, 0.1), timed(30.4, 2.0), "same", False),  # inside the noisier run's spread
        (timed(30.0, 0.5), timed(27.0, 0.5), "faster", False),
        (timed(30.0, 0.2), timed(31.0, 0.2), "slower", False),  # beyond the spread, but only 3.3%
        (timed(30.0, 0.2), timed(33.0, 0.2), "slower", True),  # 10% slower, beyond the spread
        (timed(30.0, 2.0), timed(33.0, 4.0), "same", False),  # 10% slower, but inside B's spread
    ],
)
def test_verdict_rule(a, b, word, regression):
    v = timing_verdict(a, b, threshold=0.05)
    assert (v.word, v.regression) == (word, regression)


def test_verdict_ratio_and_threshold():
    v = timing_verdict(timed(30.0, 0.2), timed(33.0, 0.2), threshold=0.15)
    assert v.word == "slower" and not v.regression and v.text() == "1.10x slower"
    assert timing_verdict(timed(30.0, 0.2), timed(20.0, 0.2)).text() == "1.50x faster"


def test_failures_are_verdicts_too():
    assert row_verdict(timed(30.0, 0.5), {"name": "v8", "status": "MISMATCH"}).regression
    assert row_verdict({"name": "v8", "status": "CRASH"}, timed(30.0, 0.5)).word == "fixed"
    assert row_verdict({"name": "v8", "status": "SKIP"}, {"name": "v8", "status": "SKIP"}).word == "not timed"


def test_sweep_rows_match_by_shape_and_causal():
    a = {"rows": [timed(10, 0.1, shape="1,8,512,64", causal=False), timed(50, 0.5, shape="1,8,1024,64", causal=False)]}
    b = {"rows": [timed(10, 0.1, shape="1,8,512,64", causal=False), timed(40, 0.5, shape="1,8,1024,64", causal=True)]}
    results = {key: verdict for key, _, _, verdict in compare(a, b)}
    assert results[("v8", "1,8,512,64", False)].word == "same"
    assert results[("v8", "1,8,1024,64", False)] is None and results[("v8", "1,8,1024,64", True)] is None


def bench_record(path, rows, gpu="NVIDIA H100 80GB HBM3", shape="1,8,512,64"):
    path.write_text(json.dumps({"kind": "flashcore-bench", "shape": shape, "causal": False, "environment": {"gpu": gpu}, "rows": rows}))
    return str(path)


def test_cli_exit_codes(tmp_path, table_rows):
    a = bench_record(tmp_path / "a.json", [timed(12.4, 0.3, "sdpa"), timed(30.0, 0.2)])
    same = bench_record(tmp_path / "same.json", [timed(12.5, 0.3, "sdpa"), timed(30.1, 0.2)])
    slower = bench_record(tmp_path / "slower.json", [timed(12.5, 0.3, "sdpa"), timed(33.0, 0.2)])
    result = runner.invoke(app, ["compare", a, same])
    assert result.exit_code == 0, result.output
    assert "no regression" in result.output
    result = runner.invoke(app, ["compare", a, slower])
    assert result.exit_code == 1
    assert {"1.10x slower (REGRESSION)", "+10.0%"} <= set(cells(table_rows))
    assert runner.invoke(app, ["compare", a, slower, "--threshold", "0.2"]).exit_code == 0


def test_cli_warns_about_unlike_runs_and_refuses_nothing_in_common(tmp_path):
    a = bench_record(tmp_path / "a.json", [timed(30.0, 0.2)])
    other_gpu = bench_record(tmp_path / "b.json", [timed(30.0, 0.2)], gpu="NVIDIA H200")
    result = runner.invoke(app, ["compare", a, other_gpu])
    assert result.exit_code == 0 and "different GPUs" in result.output
    other_shape = bench_record(tmp_path / "c.json", [timed(30.0, 0.2)], shape="2,16,4096,64")
    result = runner.invoke(app, ["compare", a, other_shape])
    assert result.exit_code == 2 and "no row in common" in result.output


@pytest.mark.parametrize("content, needle", [("{not json", "not a JSON record"), ('{"kind": "x"}', "no 'rows'")])
def test_cli_bad_records_are_exit_2(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = runner.invoke(app, ["compare", str(bad), str(bad)])
    assert result.exit_code == 2 and needle in result.output
    assert runner.invoke(app, ["compare", str(tmp_path / "missing.json"), str(bad)]).exit_code == 2
    assert runner.invoke(app, ["compare", str(bad), str(bad), "--threshold", "5"]).exit_code == 2
