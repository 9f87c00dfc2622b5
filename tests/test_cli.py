"""The CLI through typer's CliRunner: exit codes and what a user reads."""

import json
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, REPO, cells, said
from flashcore_cli.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_list_prints_the_registry(table_rows):
    result = invoke("list")
    assert result.exit_code == 0, result.output
    assert "baseline" in [row["name"] for row in table_rows] and "head dims" in table_rows[0]


def test_unknown_variant_is_exit_2_with_a_suggestion_and_no_traceback():
    result = invoke("ptxas", "basline")
    assert result.exit_code == 2
    assert "did you mean baseline" in said(result)
    assert "Traceback" not in result.output


def test_broken_registry_is_exit_2():
    result = invoke("--registry", str(FIXTURES / "registries" / "unknown_key.yaml"), "list")
    assert result.exit_code == 2
    assert "key 'head_dim'" in said(result)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["bench", "baseline", "--shape", "1,8,512"], "bad shape"),
        (["bench", "baseline", "--reps", "10"], "at least 100"),
        (["test", "baseline", "--shapes", "1,x,3,4"], "bad shape"),
        (["test", "baseline", "--timeout", "0"], "--timeout"),
        (["ptxas", "baseline", "--arch", "sm_12"], "unknown arch"),
        (["ptxas", "baseline", "--all"], "not both"),
        (["ptxas"], "--all"),
    ],
)
def test_bad_input_is_exit_2(args, needle):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert needle in said(result)
    assert "Traceback" not in result.output


def test_help_is_fast_and_does_not_import_torch():
    code = "import sys, time; t=time.perf_counter(); import flashcore_cli.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flashcore_cli", "--help"], capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0 and "ptxas" in proc.stdout
    assert elapsed < 2.0  # the budget is 0.5 s on a quiet machine; CI runners are shared, so only gross regressions fail


def test_ptxas_json_for_baseline(tmp_path, nvcc, shared_cache, table_rows):
    out = tmp_path / "ptxas.json"
    result = invoke("ptxas", "baseline", "--arch", "sm_89,sm_90", "--json", str(out), "--fail-on-spill")
    assert result.exit_code == 0, result.output
    assert {(row["kernel"], row["arch"]) for row in table_rows} >= {("baseline_fwd<64>", "sm_89"), ("baseline_fwd<64>", "sm_90")}
    record = json.loads(out.read_text())
    kernels = [k for r in record["reports"] for k in r["kernels"]]
    assert {k["arch"] for k in kernels} == {"sm_89", "sm_90"}
    assert all(k["registers"] > 0 and k["threads"] and k["ctas_per_sm"] >= 1 for k in kernels)
    assert all(k["spills"] == 0 for k in kernels)


def test_compile_error_shows_the_compilers_first_lines(tmp_path, nvcc, fresh_cache, table_rows):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "flashcore.h").write_text((REPO / "kernels" / "flashcore.h").read_text())
    (kernels / "broken.cu").write_text('#include "flashcore.h"\nint flashcore_plan(int, FlashcoreKernelPlan*, int) { return undeclared_thing; }\n')
    (tmp_path / "variants.yaml").write_text(
        "variants:\n  - name: broken\n    sources: [kernels/broken.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    result = invoke("--registry", str(tmp_path / "variants.yaml"), "ptxas", "broken")
    assert result.exit_code == 1
    assert any("undeclared_thing" in cell and "error" in cell for cell in cells(table_rows))
    assert "Traceback" not in result.output


def test_version_prints_the_package_version():
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"flashcore {version('flashcore')}"


# ---------------------------------------------------------------- which registry (as git finds its repository)
def small_project(root, variant):
    """A project folder with a one-variant registry (the fixture kernels stay where they are: sources must be
    inside the project, so each project gets its own copy of fault.cu)."""
    (root / "pyproject.toml").write_text("")
    (root / "k.cu").write_text((FIXTURES / "kernels" / "fault.cu").read_text())
    (root / "variants.yaml").write_text(
        f"variants:\n  - name: {variant}\n    sources: [k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    return root / "variants.yaml"


@pytest.fixture
def projects(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHCORE_REGISTRY", raising=False)
    near = small_project(tmp_path / "near", "near_variant") if (tmp_path / "near").mkdir() is None else None
    (tmp_path / "near" / "deep" / "er").mkdir(parents=True)
    env = small_project((tmp_path / "env").resolve(), "env_variant") if (tmp_path / "env").mkdir() is None else None
    flag = small_project(tmp_path / "flag", "flag_variant") if (tmp_path / "flag").mkdir() is None else None
    (tmp_path / "nowhere").mkdir()
    return {"near": near, "env": env, "flag": flag, "root": tmp_path}


def listed(*args, env=None):
    result = CliRunner(env={"COLUMNS": "200", **(env or {})}).invoke(app, [*args, "list"])
    assert result.exit_code == 0, result.output
    return said(result)


def test_registry_resolution_order(projects, monkeypatch, table_rows):
    from flashcore_cli.registry.variants import DEFAULT_REGISTRY, resolve_registry

    root = projects["root"]
    monkeypatch.chdir(root / "near" / "deep" / "er")  # 3. a variants.yaml in a parent folder
    assert resolve_registry().path.resolve() == projects["near"].resolve()
    out = listed()
    assert "near_variant" in cells(table_rows) and f"registry: {projects['near'].resolve()} (found from the current directory)" in out
    monkeypatch.setenv("FLASHCORE_REGISTRY", str(projects["env"]))  # 2. beats the current folder
    out = listed()
    assert "env_variant" in cells(table_rows) and f"registry: {projects['env']} (from $FLASHCORE_REGISTRY)" in out
    out = listed("--registry", str(projects["flag"].parent))  # 1. beats everything; a folder is enough
    assert "flag_variant" in cells(table_rows) and "(given by --registry)" in out
    monkeypatch.delenv("FLASHCORE_REGISTRY")
    monkeypatch.chdir(root / "nowhere")  # 4. the installed project's, and no line about it
    assert resolve_registry().path == DEFAULT_REGISTRY
    out = listed()
    assert "baseline" in cells(table_rows) and "registry:" not in out


def test_a_missing_registry_is_one_line(projects, monkeypatch):
    monkeypatch.setenv("FLASHCORE_REGISTRY", str(projects["root"] / "gone.yaml"))
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 2 and "registry file not found" in result.output and "Traceback" not in result.output
