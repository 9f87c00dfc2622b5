"""`flashcore compare` with the merged results file the README points to (docs/results/h200.json, written by
`flashcore report merge`): the section of the other record's case is compared; none is one clear line. And
docs/usage.md says "same" exactly as compare's footer does, which is what timing_verdict does."""

import json

import pytest
from typer.testing import CliRunner

from conftest import REPO, said
from flashcore_cli.cli import app
from flashcore_cli.measure.timing import timing_verdict
from flashcore_cli.report.compare import SAME_RULE

runner = CliRunner()
RESULTS = REPO / "docs" / "results" / "h200.json"


def section(shape, causal=False, dtype="fp16") -> dict:
    """A bench record of one case from the results file (cold mode)."""
    for record in json.loads(RESULTS.read_text())["records"]:
        if (record["shape"], record["causal"], record.get("dtype", "fp16")) == (shape, causal, dtype):
            return {k: v for k, v in record.items() if k != "runs"}
    raise AssertionError(f"{shape} {causal} {dtype} is not in {RESULTS}")


def slower(record: dict, factor: float) -> dict:
    rows = []
    for row in record["rows"]:
        row = dict(row)
        if row.get("median_us"):
            for key in ("median_us", "p10_us", "p90_us"):
                row[key] *= factor
        rows.append(row)
    return {**record, "rows": rows}


def write(path, record) -> str:
    path.write_text(json.dumps(record))
    return str(path)


def test_a_results_file_against_a_bench_record_compares_the_matching_section(tmp_path, table_rows):
    bench = write(tmp_path / "bench.json", section("2,16,4096,64", causal=True))
    result = runner.invoke(app, ["compare", str(RESULTS), bench])
    assert result.exit_code == 0, result.output
    cases = {row["case"] for row in table_rows}
    assert cases == {"2,16,4096,64 causal"}  # that section only, no other shape, causal or dtype
    assert {row["verdict"] for row in table_rows} == {"same"}
    assert "warning" not in result.output


def test_a_regression_against_the_results_file_gates(tmp_path, table_rows):
    bench = write(tmp_path / "bench.json", slower(section("2,16,4096,128", dtype="bf16"), 1.2))
    result = runner.invoke(app, ["compare", str(RESULTS), bench])
    assert result.exit_code == 1, result.output
    assert {row["case"] for row in table_rows} == {"2,16,4096,128"}
    assert all("slower (REGRESSION)" in row["verdict"] for row in table_rows if row["A median (p10-p90) us"][0].isdigit())


def test_the_results_file_on_the_right_and_a_mode_section(tmp_path, table_rows):
    record = json.loads(RESULTS.read_text())["records"][0]  # 1,8,512,64 in cold, graph and host
    assert [r["mode"] for r in record["runs"]] == ["cold", "graph", "host"]
    bench = write(tmp_path / "bench.json", record)
    result = runner.invoke(app, ["compare", bench, str(RESULTS), "--mode", "graph"])
    assert result.exit_code == 0, result.output
    assert "graph mode" in said(result) and {row["verdict"] for row in table_rows} == {"same"}


def test_no_matching_section_is_one_clear_line(tmp_path):
    bench = write(tmp_path / "bench.json", {**section("1,8,512,64"), "shape": "3,3,300,64"})
    result = runner.invoke(app, ["compare", bench, str(RESULTS)])
    assert result.exit_code == 2, result.output
    text = said(result)
    assert f"{RESULTS} (a results file) has no section of {bench}'s cases (3,3,300,64 cold)" in text
    assert "it holds: " in text and "2,16,4096,64 causal cold" in text and "Traceback" not in result.output


def test_two_results_files_compare_the_sections_they_share(table_rows):
    result = runner.invoke(app, ["compare", str(RESULTS), str(RESULTS), "--mode", "cold"])
    assert result.exit_code == 0, result.output
    cases = {row["case"] for row in table_rows}
    from flashcore_cli.report.readme import load_results

    cold = [sec for sec in load_results(RESULTS) if sec.mode == "cold"]
    assert len(cases) == len(cold) and {"1,8,512,64", "1,8,512,64 bf16", "2,16,4096,128 causal"} <= cases  # every cold section
    if any(sec.passes == "fwd+bwd" for sec in cold):
        assert "1,8,512,64 fwd+bwd" in cases  # another pass of a shape is a case of its own
    assert {row["verdict"] for row in table_rows} <= {"same", "not timed"}  # a row SKIP in both is not timed
    result = runner.invoke(app, ["compare", str(RESULTS), str(RESULTS)])
    assert result.exit_code == 2 and "pick one with --mode" in said(result)


def test_the_usage_doc_and_the_footer_say_what_the_verdict_does(tmp_path):
    usage = " ".join((REPO / "docs" / "usage.md").read_text().split())
    assert f'"same" when {SAME_RULE}' in usage
    a = write(tmp_path / "a.json", {"kind": "flashcore-bench", "shape": "1,8,512,64", "causal": False,
                                    "rows": [{"name": "v8", "status": "OK", "median_us": 30.0, "p10_us": 29.0, "p90_us": 31.0}]})  # fmt: skip
    result = runner.invoke(app, ["compare", a, a])
    assert f"same: {SAME_RULE};" in said(result)
    # the rule in those words: |B - A| <= half the wider p10-p90 spread (inclusive), not the full spread
    row = lambda median, spread: {"median_us": median, "p10_us": median - spread / 2, "p90_us": median + spread / 2}  # noqa: E731
    assert timing_verdict(row(30.0, 2.0), row(31.0, 0.2)).word == "same"  # exactly half of the wider spread
    assert timing_verdict(row(30.0, 2.0), row(31.5, 0.2)).word == "slower"  # inside the full spread, past half


def test_records_of_two_passes_are_refused(tmp_path):
    forward = write(tmp_path / "fwd.json", section("1,8,512,64"))
    backward = write(tmp_path / "bwd.json", {**section("1,8,512,64"), "pass": "bwd"})
    result = runner.invoke(app, ["compare", forward, backward])
    assert result.exit_code == 2, result.output
    assert "timed the fwd pass" in said(result) and "the bwd pass" in said(result)
