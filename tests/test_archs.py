"""The registry's `archs:` key: a variant that runs on some GPUs only (archs: [sm_90a] for wgmma/setmaxnreg) is
compiled for its arch-specific target, and skipped with the reason everywhere else.

The fixture kernel (tests/fixtures/kernels/hopper_only.cu) uses setmaxnreg, which ptxas accepts for sm_90a
only: a real compile that succeeds proves the -gencode the variant got."""

import json

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, cells, said
from flashcore_cli.registry import archs
from flashcore_cli.registry.archs import parse_arch
from flashcore_cli.cli import app
from flashcore_cli.check.correctness import plan_cases, run_variant
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.variants import load_registry
from flashcore_cli.builder.toolchain import gencode

REGISTRY = FIXTURES / "registries" / "archs.yaml"
runner = CliRunner(env={"COLUMNS": "200"})


def invoke(*args):
    return runner.invoke(app, ["--registry", str(REGISTRY), *args])


@pytest.fixture
def no_gpu(monkeypatch):
    """The default arch of a machine without a GPU (sm_90), whatever this machine has."""
    monkeypatch.setattr(archs, "default_arch", lambda: archs.DEFAULT_ARCH)


def test_archs_key_loads_and_picks_the_target():
    reg = load_registry(REGISTRY)
    hopper, anywhere = reg.get("hopper"), reg.get("anywhere")
    assert hopper.archs == ("sm_90a",) and anywhere.archs == ()
    assert hopper.target_arch("sm_90") == "sm_90a"  # an H100/H200 runs the sm_90a build
    assert hopper.target_arch("sm_90a") == "sm_90a"
    assert hopper.target_arch("sm_89") is None
    assert anywhere.target_arch("sm_89") == "sm_89" and anywhere.target_arch("sm_90a") == "sm_90a"
    assert gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert parse_arch("sm_90a") == parse_arch("90a") == "sm_90a"


def test_unsupported_reason_names_the_archs_and_the_gpu():
    hopper = load_registry(REGISTRY).get("hopper")
    assert hopper.unsupported_reason(64, False, "sm_89") == "hopper runs on sm_90a only; this GPU is sm_89"
    assert hopper.unsupported_reason(64, False, "sm_90") is None
    assert hopper.unsupported_reason(64, False) is None  # no GPU named: only the shape is checked
    assert "head dim 128" in hopper.unsupported_reason(128, False, "sm_90")
    with pytest.raises(FlashcoreError, match="runs on sm_90a only; it is not built for sm_89"):
        hopper.build_target("sm_89")


@pytest.mark.parametrize(
    "archs_yaml, needle",
    [
        ("[sm90a]", "unknown arch 'sm90a' (did you mean sm_90a?"),
        ("[sm_100a]", "unknown arch 'sm_100a'"),
        ("sm_90a", "must be a non-empty list of archs"),
        ("[]", "must be a non-empty list of archs"),
        ("[sm_90a, sm_90a]", "lists an arch twice"),
    ],
)
def test_bad_archs_are_one_clear_error(tmp_path, archs_yaml, needle):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "k.cu").write_text("")
    path = tmp_path / "variants.yaml"
    path.write_text(f"variants:\n  - name: a\n    sources: [k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n    archs: {archs_yaml}\n")
    with pytest.raises(FlashcoreError) as info:
        load_registry(path)
    assert f"{path}: variant 'a': key 'archs'" in str(info.value) and needle in str(info.value)
    result = runner.invoke(app, ["--registry", str(path), "list"])
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


def test_test_skips_a_variant_on_a_gpu_it_does_not_run_on():
    reg = load_registry(REGISTRY)
    hopper = reg.get("hopper")
    outcome = run_variant(reg, hopper, plan_cases(hopper, None, seed=1), arch="sm_89", timeout=1)
    assert outcome.status == "SKIP" and outcome.cases
    assert {c.detail for c in outcome.cases} == {"hopper runs on sm_90a only; this GPU is sm_89"}


def test_list_shows_the_archs_column_only_when_a_variant_restricts_them(table_rows):
    result = invoke("list")
    assert result.exit_code == 0, result.output
    assert "archs" in table_rows[0] and "sm_90a" in cells(table_rows)
    table_rows.clear()
    # --no-check: good.yaml is a fixture of the registry's syntax; its alpha declares head dim 128, which fault.cu
    # does not plan (`list` checks that; tests/test_declared.py)
    result = runner.invoke(app, ["--registry", str(FIXTURES / "registries" / "good.yaml"), "list", "--no-check"])
    assert result.exit_code == 0 and table_rows and not any("archs" in row for row in table_rows)


def test_ptxas_lists_a_hopper_only_variant_as_not_built_for_the_l4(tmp_path, nvcc, fresh_cache, table_rows):
    out = tmp_path / "ptxas.json"
    result = invoke("ptxas", "--all", "--arch", "sm_89", "--json", str(out), "--fail-on-spill")
    assert result.exit_code == 0, result.output
    assert any("not built for sm_89" in cell for cell in cells(table_rows))
    reports = {r["variant"]: r for r in json.loads(out.read_text())["reports"]}
    assert reports["hopper"]["not_built"] == "hopper runs on sm_90a only" and reports["hopper"]["kernels"] == []
    assert not reports["anywhere"]["not_built"] and reports["anywhere"]["kernels"]  # the other variant is built


def test_ptxas_with_no_gpu_compiles_it_for_sm_90a(tmp_path, nvcc, fresh_cache, no_gpu, table_rows):
    out = tmp_path / "ptxas.json"
    result = invoke("ptxas", "hopper", "--json", str(out), "--fail-on-spill")
    assert result.exit_code == 0, result.output  # setmaxnreg compiled: the gencode was sm_90a
    (report,) = json.loads(out.read_text())["reports"]
    assert report["arch"] == "sm_90a" and not report["error"]
    assert [(k["arch"], k["threads"]) for k in report["kernels"]] == [("sm_90a", 128)]
    table_rows.clear()
    result = invoke("ptxas", "hopper", "--arch", "sm_90,sm_90a")  # both name the one sm_90a build
    assert result.exit_code == 0 and [row["kernel"] for row in table_rows] == ["hopper_only_fwd"]


def test_the_fixture_really_needs_sm_90a(tmp_path, nvcc):
    """The proof above only holds if a plain sm_90 compile of the fixture fails."""
    import subprocess

    source = FIXTURES / "kernels" / "hopper_only.cu"
    kernels = FIXTURES.parent.parent / "kernels"
    cmd = [nvcc, "-std=c++17", gencode("sm_90"), f"-I{kernels}", "-c", str(source), "-o", str(tmp_path / "k.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and "setmaxnreg" in proc.stdout + proc.stderr


@pytest.fixture
def cuobjdump():
    from flashcore_cli.builder import cudatools
    if cudatools.locate("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed")


def test_sass_with_no_gpu_disassembles_the_sm_90a_build(nvcc, cuobjdump, no_gpu, table_rows):
    result = invoke("sass", "hopper")
    assert result.exit_code == 0, result.output
    assert "hopper for sm_90a" in said(result) and [row["kernel"] for row in table_rows] == ["hopper_only_fwd"]
    result = invoke("sass", "hopper", "--arch", "sm_89")
    assert result.exit_code == 2 and "runs on sm_90a only; it is not built for sm_89" in said(result)


@pytest.mark.gpu
def test_test_runs_a_hopper_only_variant_on_hopper_and_skips_it_elsewhere(table_rows):
    """On the lent H200 the fixture's sm_90a build loads and runs (its output is garbage: every case a
    MISMATCH, none a build failure, crash or SKIP); on any other GPU it is SKIP with the reason."""
    result = invoke("test", "hopper", "--shapes", "1,1,64,64", "--timeout", "60")
    if archs.default_arch() == "sm_90":
        summary = [row for row in table_rows if row.get("variant") == "hopper" and "SKIP/NOT-RUN" in row]
        assert len(summary) == 1, result.output
        row = summary[0]
        assert row["MISMATCH"] == "2" and row["OK"] == "0", result.output  # 1,1,64,64 causal and not
        assert row["TIMEOUT/CRASH/BUILD"] == "0" and row["SKIP/NOT-RUN"] == "0", result.output
    else:
        assert result.exit_code == 0 and "runs on sm_90a only" in result.output
