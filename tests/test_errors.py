"""Malformed input and unexpected failures: one line each, with its own documented exit code (errors.py,
docs/usage.md, "Exit codes"), never a traceback and never exit 1 (1 means a check failed or a regression)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES
from flashcore_cli.cli import app
from flashcore_cli.core.errors import EXIT_BAD_INPUT, EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, FlashcoreEnvironmentError

runner = CliRunner(env={"COLUMNS": "200"})


def one_line(result) -> str:
    """The message a failed command printed: its one line, whole (errors print with soft wrap). The dim
    "registry: ... (found from the current directory)" line a command adds when its registry is not the
    installed project's (a run from another checkout) is no part of it."""
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("registry: ")]
    assert len(lines) == 1, result.output
    return lines[0]


def timed(name="v8", median=30.0, **extra):
    return {"name": name, "status": "OK", "median_us": median, "p10_us": median - 0.5, "p90_us": median + 0.5, **extra}


def record(path: Path, rows, **top) -> str:
    path.write_text(json.dumps({"kind": "flashcore-bench", "shape": "1,8,512,64", "causal": False, "rows": rows, **top}))
    return str(path)


# ---------------------------------------------------------------- compare on hand-made records
@pytest.mark.parametrize(
    "row, needle",
    [
        ({"name": "v8", "status": "OK", "median_us": 16.0}, "row 2 ('v8') has 'median_us' but no 'p10_us'"),
        ({"name": "v8", "status": "OK", "median_us": 16.0, "p10_us": 15.0}, "row 2 ('v8') has 'median_us' but no 'p90_us'"),
        ({"status": "OK", "median_us": 16.0, "p10_us": 15.0, "p90_us": 17.0}, "row 2 has no 'name'"),
        ("v8 16.0", "row 2 is a string (\"v8 16.0\"), not an object"),
        ({**timed(), "median_us": "16"}, "row 2 ('v8'): 'median_us' must be a non-negative number of microseconds, got a string (\"16\")"),
        (timed(p10_us=None), "'p10_us' must be a non-negative number"),
        ({**timed(), "name": 8}, "row 2: 'name' must be a string, got a number (8)"),
        ({**timed(), "status": 0}, "'status' must be a string"),
        ({**timed(), "causal": "yes"}, "'causal' must be true or false"),
    ],
)
def test_compare_names_the_file_and_row_of_a_malformed_record(tmp_path, row, needle):
    good = record(tmp_path / "good.json", [timed("sdpa"), timed()])
    bad = record(tmp_path / "bad.json", [timed("sdpa"), row])
    for args in ([good, bad], [bad, good]):
        result = runner.invoke(app, ["compare", *args])
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        line = one_line(result)
        assert bad in line and needle in line


def test_compare_refuses_records_of_other_shapes_of_json(tmp_path):
    for content, needle in [("[1, 2]", "no 'rows'"), ('{"rows": [], "environment": "H200"}', "'environment' must be an object"),
                            ('{"rows": [], "mode": 3}', "'mode' must be a string")]:  # fmt: skip
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        result = runner.invoke(app, ["compare", str(bad), str(bad)])
        assert result.exit_code == EXIT_BAD_INPUT and needle in one_line(result)
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"rows": [], "note": "caf\u00e9"}'.encode("latin-1"))
    result = runner.invoke(app, ["compare", str(latin1), str(latin1)])
    assert result.exit_code == EXIT_BAD_INPUT and "not a JSON record" in one_line(result)


def test_compare_refuses_two_modes_and_old_records_are_cold(tmp_path):
    old = record(tmp_path / "old.json", [timed()])  # no "mode": written before modes, so cold
    cold = record(tmp_path / "cold.json", [timed()], mode="cold")
    graph = record(tmp_path / "graph.json", [timed()], mode="graph")
    assert runner.invoke(app, ["compare", old, cold]).exit_code == 0
    result = runner.invoke(app, ["compare", cold, graph])
    assert result.exit_code == EXIT_BAD_INPUT
    line = one_line(result)
    assert f"{cold} was timed in cold mode and {graph} in graph mode" in line


def test_compare_picks_one_mode_of_a_record_of_several(tmp_path):
    runs = [{"mode": "cold", "rows": [timed(median=30.0)]}, {"mode": "graph", "rows": [timed(median=10.0)]}]
    both = record(tmp_path / "both.json", runs[0]["rows"], mode="cold", runs=runs)
    graph = record(tmp_path / "graph.json", [timed(median=10.1)], mode="graph")
    result = runner.invoke(app, ["compare", both, graph])
    assert result.exit_code == EXIT_BAD_INPUT and "holds several modes (cold, graph): pick one with --mode" in one_line(result)
    result = runner.invoke(app, ["compare", both, graph, "--mode", "graph"])
    assert result.exit_code == 0, result.output
    assert "graph mode" in result.output and "same" in result.output
    result = runner.invoke(app, ["compare", both, graph, "--mode", "host"])
    assert result.exit_code == EXIT_BAD_INPUT and "has no host-mode rows (its modes: cold, graph)" in one_line(result)
    result = runner.invoke(app, ["compare", both, graph, "--mode", "cold"])
    assert result.exit_code == EXIT_BAD_INPUT and "was timed in graph mode only" in one_line(result)


# ---------------------------------------------------------------- registry, API, options
def test_a_registry_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_bytes("variants:\n  - name: caf\u00e9\n".encode("latin-1"))
    result = runner.invoke(app, ["--registry", str(path), "list"])
    assert result.exit_code == EXIT_BAD_INPUT
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].startswith("registry:") and len(lines) == 2 and "Traceback" not in result.output
    assert str(path) in lines[1] and "not a UTF-8 text file" in lines[1]


def test_load_variant_with_a_cpu_torch_names_the_cpu_torch(monkeypatch, tmp_path):
    import torch

    from flashcore_cli import load_variant

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setenv("FLASHCORE_CACHE", str(tmp_path))
    with pytest.raises(FlashcoreEnvironmentError) as info:
        load_variant("v8")
    message = str(info.value)
    assert "CPU build" in message and "CUDA_HOME" not in message
    assert isinstance(info.value, RuntimeError)  # what callers that catch torch's build errors expect
    assert not (tmp_path / "build").exists()  # refused before any build was started


@pytest.mark.parametrize(
    "args, option",
    [
        (["bench", "v8", "--shape", ""], "--shape"),
        (["bench", "v8", "--shape", "  "], "--shape"),
        (["test", "v8", "--shapes", ""], "--shapes"),
        (["sanitize", "v8", "--shape", ""], "--shape"),
        (["profile", "v8", "--shape", ""], "--shape"),
        (["tune", "v8", "--shape", "", "--dry-run"], "--shape"),
        (["ptxas", "v8", "--arch", ""], "--arch"),
        (["ptxas", "v8", "--json", ""], "--json"),
    ],
)
def test_an_empty_option_is_bad_input_not_the_default(args, option):
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert one_line(result) == f"error: {option} is empty: give it a value, or leave the option out for its default"


def test_an_empty_registry_option_is_bad_input():
    result = runner.invoke(app, ["--registry", "", "list"])
    assert result.exit_code == EXIT_BAD_INPUT and "--registry is empty" in one_line(result)


# ---------------------------------------------------------------- the unexpected
def test_an_unexpected_exception_is_one_line_a_log_and_exit_3(monkeypatch, tmp_path):
    from flashcore_cli.commands import list as commands

    def broken(registry_path, **options):
        return {}["missing"]

    monkeypatch.setattr(commands, "cmd_list", broken)
    monkeypatch.setenv("FLASHCORE_CACHE", str(tmp_path))
    result = runner.invoke(app, ["list"])
    assert result.exit_code == EXIT_INTERNAL_ERROR
    line = one_line(result)
    assert line.startswith("internal error: KeyError: 'missing' (a bug in flashcore; the traceback is in ")
    (log,) = (tmp_path / "logs").glob("crash-*.log")
    assert str(log) in line
    text = log.read_text()
    assert "Traceback" in text and "in broken" in text and "KeyError: 'missing'" in text


def test_ctrl_c_is_exit_130(monkeypatch):
    from flashcore_cli.commands import list as commands

    def interrupted(registry_path, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "cmd_list", interrupted)
    result = runner.invoke(app, ["list"])
    assert result.exit_code == EXIT_INTERRUPTED and one_line(result) == "interrupted"


def test_the_exit_codes_are_documented():
    usage = (FIXTURES.parent.parent / "docs" / "usage.md").read_text()
    section = usage.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ("0", "1", "2", "3", "130"):
        assert f"| {code} |" in section
