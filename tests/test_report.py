"""`flashcore report`: a results file merged from bench records, and the README's tables and docs/ladder.md's
chart rewritten from it (and checked against it). The records are made-up fixtures (tests/fixtures/records)."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, REPO, said
from flashcore_cli.cli import app
from flashcore_cli.report.readme import chart_path, load_results

RECORDS = FIXTURES / "records"
SHORT, CAUSAL, BEFORE_MODES = (str(RECORDS / f) for f in ("bench-short-three-modes.json", "bench-long-causal.json", "bench-long-before-modes.json"))
CHECKED_IN = REPO / "docs" / "results" / "h200.json"
runner = CliRunner()

README = """# a project

Prose the command never touches.

<!-- results:summary -->
<!-- /results -->

<!-- results:bench 1,8,512,64 -->
a stale table
<!-- /results -->

<!-- results:bench 1,8,512,64 graph -->
<!-- /results -->

<!-- results:modes 1,8,512,64 -->
<!-- /results -->

<!-- results:bench 2,16,4096,64 causal -->
<!-- /results -->

The end.
"""
LADDER = "# The ladder\n\nText.\n\n<!-- ladder-chart -->\n(the chart goes here)\n<!-- /ladder-chart -->\n\nMore text.\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with a README, docs/ladder.md and a results file merged from the three fixture records."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "docs" / "ladder.md").write_text(LADDER)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", "merge", SHORT, CAUSAL, BEFORE_MODES, "-o", "docs/results/fake.json"])
    assert result.exit_code == 0, result.output
    return tmp_path


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in the text, as rows of {header: cell}."""
    tables, lines = [], text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|--") and not (i and lines[i - 1].startswith("|")):
            header = [c.strip() for c in line.strip("|").split("|")]
            body = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                body.append(dict(zip(header, (c.strip() for c in row.strip("|").split(" | ")))))
            tables.append(body)
    return tables


def region(text: str, marker: str) -> str:
    start = text.index(marker) + len(marker)
    return text[start : text.index("<!-- /", start)]


def test_merge_keeps_every_record_of_one_gpu(project):
    results = json.loads((project / "docs" / "results" / "fake.json").read_text())
    assert results["kind"] == "flashcore-results" and results["gpu"].startswith("FAKE GPU")
    assert [r["shape"] for r in results["records"]] == ["1,8,512,64", "2,16,4096,64", "2,16,4096,64"]
    sections = load_results(project / "docs" / "results" / "fake.json")
    assert [(s.shape, s.causal, s.mode) for s in sections] == [
        ("1,8,512,64", False, "cold"), ("1,8,512,64", False, "graph"), ("1,8,512,64", False, "host"),
        ("2,16,4096,64", True, "cold"), ("2,16,4096,64", False, "cold"),  # a record from before the modes: cold
    ]
    original = json.loads((RECORDS / "bench-short-three-modes.json").read_text())
    assert results["records"][0] == original  # merged as written, samples included


def test_readme_tables_are_the_records_figures(project):
    result = runner.invoke(app, ["report", "readme", "docs/results/fake.json"])
    assert result.exit_code == 0, result.output
    text = (project / "README.md").read_text()
    assert text.startswith("# a project\n\nProse the command never touches.\n") and text.endswith("\nThe end.\n")
    assert "a stale table" not in text

    bench = {r["name"]: r for r in markdown_tables(region(text, "<!-- results:bench 1,8,512,64 -->"))[0]}
    record = json.loads((RECORDS / "bench-short-three-modes.json").read_text())
    for row in record["runs"][0]["rows"]:  # cold
        shown = bench[row["name"]]
        assert shown["status"] == row["status"]
        if row.get("median_us"):
            assert shown["median us"] == f"{row['median_us']:.1f}" and shown["vs SDPA"] == f"{row['speedup_vs_sdpa']:.2f}x"
            assert shown["TFLOP/s"] == f"{row['tflops']:.1f}"
        else:
            assert shown["median us"] == "-" and shown["note"] == row["detail"][:100]
    assert "`flashcore bench baseline v8 v11 broken hopper_only --shape 1,8,512,64` on FAKE GPU" in region(text, "<!-- results:bench 1,8,512,64 -->")

    graph = {r["name"]: r for r in markdown_tables(region(text, "<!-- results:bench 1,8,512,64 graph -->"))[0]}
    assert graph["v11"]["median us"] == "6.0" and graph["v11"]["vs SDPA"] == "1.50x"

    modes = {r["name"]: r for r in markdown_tables(region(text, "<!-- results:modes 1,8,512,64 -->"))[0]}
    assert modes["v11"] == {"name": "v11", "cold mode": "9.0 (1.33x)", "graph mode": "6.0 (1.50x)", "host mode": "14.0 (1.43x)"}
    assert modes["broken"]["graph mode"] == "MISMATCH"

    causal = {r["name"]: r for r in markdown_tables(region(text, "<!-- results:bench 2,16,4096,64 causal -->"))[0]}
    assert causal["baseline"]["median us"] == "5000" and causal["sdpa"]["median us"] == "400.0"

    summary = markdown_tables(region(text, "<!-- results:summary -->"))[0]
    assert [(r["shape"], r["causal"], r["fastest variant"], r["vs SDPA"]) for r in summary] == [
        ("1,8,512,64", "no", "v11", "1.33x"), ("2,16,4096,64", "no", "v11", "0.68x"), ("2,16,4096,64", "yes", "v11", "0.83x"),
    ]  # short sequences first, non-causal before causal


def test_ladder_chart_and_its_table(project):
    assert runner.invoke(app, ["report", "readme", "docs/results/fake.json"]).exit_code == 0
    text = (project / "docs" / "ladder.md").read_text()
    assert text.startswith("# The ladder\n\nText.\n\n<!-- ladder-chart -->\n") and text.endswith("<!-- /ladder-chart -->\n\nMore text.\n")
    chart = region(text, "<!-- ladder-chart -->")
    assert "](results/fake-ladder.png)" in chart  # relative to docs/ladder.md
    rungs = {r["rung"]: r for r in markdown_tables(chart)[0]}
    assert list(rungs)[:5] == ["baseline", "v8", "v11", "broken", "hopper_only"]  # the record's order: the ladder's
    assert list(rungs["v11"])[1:] == ["1,8,512,64", "2,16,4096,64", "2,16,4096,64 causal"]
    assert rungs["v11"]["1,8,512,64"] == "9.0 us, 59.7 TFLOP/s (1.33x)"
    assert rungs["baseline"]["2,16,4096,64 causal"].startswith("5000 us")
    assert rungs["hopper_only"]["1,8,512,64"] == "SKIP"
    png = chart_path(project / "docs" / "results" / "fake.json")
    if __import__("importlib").util.find_spec("matplotlib"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_passes_when_up_to_date_and_fails_when_not(project):
    assert runner.invoke(app, ["report", "readme", "docs/results/fake.json", "--check"]).exit_code == 1  # stale at first
    assert (project / "README.md").read_text() == README  # --check writes nothing
    assert runner.invoke(app, ["report", "readme", "docs/results/fake.json"]).exit_code == 0
    result = runner.invoke(app, ["report", "readme", "docs/results/fake.json", "--check"])
    assert result.exit_code == 0, result.output
    before = (project / "README.md").read_text()
    assert runner.invoke(app, ["report", "readme", "docs/results/fake.json"]).exit_code == 0
    assert (project / "README.md").read_text() == before  # regenerating changes nothing

    results = project / "docs" / "results" / "fake.json"
    data = json.loads(results.read_text())
    data["records"][1]["rows"][0]["median_us"] = 401.0  # a figure changed in the record
    results.write_text(json.dumps(data))
    result = runner.invoke(app, ["report", "readme", str(results), "--check"])
    assert result.exit_code == 1 and "README.md:5 (summary)" in said(result) and "bench 2,16,4096,64 causal" in said(result)

    assert runner.invoke(app, ["report", "readme", str(results)]).exit_code == 0
    if chart_path(results).exists():
        chart_path(results).unlink()
        assert runner.invoke(app, ["report", "readme", str(results), "--check"]).exit_code == 1  # the chart is missing


def test_one_bench_record_is_a_results_file_of_one(project):
    (project / "README.md").write_text("<!-- results:bench 2,16,4096,64 causal -->\n<!-- /results -->\n")
    (project / "docs" / "ladder.md").write_text("<!-- ladder-chart -->\n<!-- /ladder-chart -->\n")
    shutil.copy(CAUSAL, project / "one.json")
    assert runner.invoke(app, ["report", "readme", "one.json"]).exit_code == 0
    rows = markdown_tables((project / "README.md").read_text())[0]
    assert [r["name"] for r in rows] == ["sdpa", "sdpa-flash", "triton", "baseline", "v8", "v11"]


def test_a_record_as_bench_writes_it_with_several_modes(tmp_path):
    from flashcore_cli.measure.bench import BenchRow, BenchRun
    from flashcore_cli.registry.shapes import parse_shape

    def timed(median):
        return {"median_us": median, "p10_us": median * 0.9, "p90_us": median * 1.1, "samples_us": [median] * 100}

    run = BenchRun(parse_shape("1,8,512,64"), False, 7, ["cold", "graph"])
    run.add({"cold": [BenchRow("sdpa", "reference", "OK", timed(12.0)), BenchRow("v11", "variant", "OK", timed(9.0))],
             "graph": [BenchRow("sdpa", "reference", "OK", timed(9.0)), BenchRow("v11", "variant", "OK", timed(6.0))]})  # fmt: skip
    run.environment = {"gpu": "FAKE GPU"}
    (tmp_path / "bench.json").write_text(json.dumps(run.record()))
    sections = load_results(tmp_path / "bench.json")
    assert [(s.mode, s.dtype, s.row("v11")["speedup_vs_sdpa"]) for s in sections] == [("cold", "fp16", 12 / 9), ("graph", "fp16", 1.5)]


def test_bf16_runs_sit_beside_fp16_ones(project):
    bf16 = json.loads((RECORDS / "bench-long-causal.json").read_text())
    bf16["dtype"] = "bf16"
    bf16["rows"][5]["median_us"] = 470.0  # v11
    (project / "bf16.json").write_text(json.dumps(bf16))
    assert runner.invoke(app, ["report", "merge", "docs/results/fake.json", "bf16.json", "-o", "docs/results/fake.json"]).exit_code == 0
    (project / "README.md").write_text("<!-- results:bench 2,16,4096,64 causal bf16 -->\n<!-- /results -->\n"
                                       "<!-- results:bench 2,16,4096,64 causal -->\n<!-- /results -->\n")  # fmt: skip
    result = runner.invoke(app, ["report", "readme", "docs/results/fake.json"])
    assert result.exit_code == 0, result.output
    text = (project / "README.md").read_text()
    bf16_table, fp16_table = ({r["name"]: r for r in t} for t in markdown_tables(text))
    assert bf16_table["v11"]["median us"] == "470.0" and fp16_table["v11"]["median us"] == "480.0"
    assert "`flashcore bench baseline v8 v11 --shape 2,16,4096,64 --causal --dtype bf16`" in text


@pytest.mark.parametrize(
    "readme, needle",
    [
        ("<!-- results:bench 4,4,4,64 -->\n<!-- /results -->\n", "README.md:1: the results file holds no 4,4,4,64 cold run"),
        ("<!-- results:bench 1,8,512,64 warm -->\n<!-- /results -->\n", "holds no 1,8,512,64 warm run"),
        ("<!-- results:chart -->\n<!-- /results -->\n", "README.md:1: <!-- results:chart --> is not one of: bench, inference, modes, summary"),
        ("<!-- results:bench -->\n<!-- /results -->\n", "names no shape"),
        ("<!-- results:summary -->\n", "README.md:1: the marker is never closed with <!-- /results -->"),
        ("x\n<!-- /results -->\n", "README.md:2: <!-- /results --> closes no marker"),
        ("no markers at all\n", "README.md has no <!-- results --> markers"),
    ],
)
def test_bad_markers_are_exit_2(project, readme, needle):
    (project / "README.md").write_text(readme)
    result = runner.invoke(app, ["report", "readme", "docs/results/fake.json"])
    assert result.exit_code == 2, result.output
    assert needle in said(result) and "Traceback" not in result.output
    assert (project / "README.md").read_text() == readme


def test_merge_refuses_a_run_twice_and_two_gpus(tmp_path):
    result = runner.invoke(app, ["report", "merge", CAUSAL, CAUSAL, "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "2,16,4096,64 causal in cold mode is in both" in said(result)
    other = json.loads((RECORDS / "bench-long-before-modes.json").read_text())
    other["environment"]["gpu"] = "ANOTHER FAKE GPU"
    (tmp_path / "other.json").write_text(json.dumps(other))
    result = runner.invoke(app, ["report", "merge", CAUSAL, str(tmp_path / "other.json"), "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "different GPUs" in said(result)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "not a JSON record"),
        ('{"kind": "flashcore-sweep", "rows": []}', "neither a bench record"),
        ('{"kind": "flashcore-results", "records": []}', "'records' must be a non-empty list"),
        ('{"kind": "flashcore-bench", "shape": "1,8,512", "causal": false, "rows": []}', "bad shape"),
        ('{"kind": "flashcore-bench", "shape": "1,8,512,64", "causal": false, "rows": [{"name": "v8", "median_us": 1}]}', "no 'p10_us'"),
    ],
)
def test_bad_records_are_exit_2(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = runner.invoke(app, ["report", "merge", str(bad), "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert needle in said(result) and "Traceback" not in result.output


@pytest.mark.skipif(not CHECKED_IN.exists(), reason="docs/results/h200.json is not checked in yet")
def test_the_checked_in_readme_matches_its_record(monkeypatch):
    monkeypatch.chdir(REPO)
    result = runner.invoke(app, ["report", "readme", "docs/results/h200.json", "--check"])
    assert result.exit_code == 0, result.output


# ---- passes and inference shapes: a forward, a fwd+bwd and a grouped-query record of one results file ----
def _variant_of(record: dict, **changes) -> dict:
    """A copy of a fixture bench record with some keys changed (its rows kept: the numbers are made up anyway)."""
    return {**json.loads(json.dumps(record)), **changes}


def test_passes_and_grouped_shapes_live_beside_the_forward(tmp_path, monkeypatch):
    short = json.loads(open(SHORT).read())
    first = _variant_of(short, runs=None, rows=(short.get("runs") or [short])[0]["rows"], mode="cold")
    first.pop("runs")
    training = _variant_of(first, **{"pass": "fwd+bwd"})
    decode = _variant_of(first, shape="8,32:8,1:8192,128")
    for name, record in (("fwd.json", first), ("train.json", training), ("decode.json", decode)):
        (tmp_path / name).write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", "merge", "fwd.json", "train.json", "decode.json", "-o", "all.json"])
    assert result.exit_code == 0, result.output  # one shape in two passes is no duplicate
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ladder.md").write_text(LADDER)
    (tmp_path / "README.md").write_text("<!-- results:summary -->\n<!-- /results -->\n\n<!-- results:inference -->\n"
                                        "<!-- /results -->\n\n<!-- results:bench 1,8,512,64 fwd+bwd -->\n<!-- /results -->\n")  # fmt: skip
    result = runner.invoke(app, ["report", "readme", "all.json"])
    assert result.exit_code == 0, result.output
    tables = markdown_tables((tmp_path / "README.md").read_text())
    summary, inference, training_table = tables
    assert [r["shape"] for r in summary] == ["1,8,512,64"]  # the forward ladder only
    assert [r["B,Hq:Hkv,Sq:Sk,D"] for r in inference] == ["8,32:8,1:8192,128"]
    assert training_table and "--pass fwd+bwd" in (tmp_path / "README.md").read_text()
    assert runner.invoke(app, ["report", "readme", "all.json", "--check"]).exit_code == 0


@pytest.mark.parametrize("command", [["report", "readme", "{folder}", "--check"], ["report", "merge", "{folder}", "-o", "{out}"]])
def test_a_folder_for_a_record_is_one_line_exit_2(tmp_path, command):
    """A folder where a record file belongs was exit 3 (IsADirectoryError) in `report readme`."""
    args = [a.format(folder=tmp_path, out=tmp_path / "r.json") for a in command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "is a folder" in said(result) and "Traceback" not in result.output
