"""`flashcore new`: the scaffold on a temporary copy of a project, proved to compile through `flashcore ptxas`."""

import shutil

import pytest
from typer.testing import CliRunner

from conftest import REPO, cells, said
from flashcore_cli.cli import app
from flashcore_cli.registry.variants import load_registry
from flashcore_cli.builder.scaffold import global_kernel_names, renamed, strip_header

REGISTRY = """\
# A registry with comments that must survive the scaffold.
variants:
  - name: baseline   # rung 0
    sources: [kernels/ladder/baseline.cu]
    summary: "Scalar baseline"
    head_dims: [64, 128]
    causal: true
  - name: tunable
    sources: [kernels/ladder/baseline.cu]
    flags: ["-Xptxas=-O3"]
    defines: {UNUSED_A: 1}
    summary: "With flags, defines and a tune block"
    head_dims: [64]
    causal: false
    tune:
      params: {UNUSED_B: [1, 2]}
      constraints: ["UNUSED_B > 0"]
"""
runner = CliRunner()


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("flashcore.h", "flashcore_defaults.h", "ladder/baseline.cu", "binding.cpp"):
        (kernels / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / "kernels" / name, kernels / name)
    (tmp_path / "variants.yaml").write_text(REGISTRY)
    return tmp_path


def new(project, *args):
    return runner.invoke(app, ["--registry", str(project / "variants.yaml"), "new", *args])


def test_kernel_names_and_renames():
    source = '// a __global__ kernel (its name) in prose\n__global__ void __launch_bounds__(f(1), 2) v8_fwd(P p) {}\n'
    assert global_kernel_names(source) == ["v8_fwd"]
    assert renamed("v8_fwd", "v8", "mine") == "mine_fwd"
    assert renamed("wmma_64x64_fwd", "64x64", "mine") == "mine_wmma_64x64_fwd"
    assert strip_header("// story\n//\n\n#include <x>\n// kept\n") == "#include <x>\n// kept\n"


def test_scaffold_compiles_and_keeps_the_registry_text(project, nvcc, fresh_cache, table_rows):
    result = new(project, "mine", "--from", "baseline")
    assert result.exit_code == 0, result.output
    source = (project / "kernels" / "ladder" / "mine.cu").read_text()
    assert source.startswith("// mine.cu — ") and "Change from the previous rung (baseline)" in source
    assert "baseline_fwd" not in source.split("#include", 1)[1]  # every kernel name in the code was renamed
    assert "FC_PLAN_NAME(mine_fwd, 64)" in source  # flashcore_plan's kernel names follow (from the renamed identifier)
    registry = (project / "variants.yaml").read_text()
    assert registry.startswith(REGISTRY.rstrip("\n"))  # comments and entries untouched: appended text only
    assert load_registry(project / "variants.yaml").get("mine").sources == (project / "kernels" / "ladder" / "mine.cu",)
    result = runner.invoke(app, ["--registry", str(project / "variants.yaml"), "ptxas", "mine", "--arch", "sm_90", "--fail-on-spill"])
    assert result.exit_code == 0, result.output
    assert {"mine_fwd<64>", "mine_fwd<128>"} <= set(cells(table_rows))


def test_scaffold_carries_flags_defines_and_tune_block(project):
    assert new(project, "tuned2", "--from", "tunable").exit_code == 0
    v = load_registry(project / "variants.yaml").get("tuned2")
    assert v.flags == ("-Xptxas=-O3",) and v.defines == {"UNUSED_A": "1"}
    assert v.tune.params == {"UNUSED_B": [1, 2]} and v.tune.constraints == ["UNUSED_B > 0"]
    assert v.head_dims == (64,) and v.causal is False


@pytest.mark.parametrize(
    "args, needle",
    [
        (["baseline", "--from", "baseline"], "already registered"),
        (["9lives", "--from", "baseline"], "cannot name"),
        (["my-rung", "--from", "baseline"], "cannot name"),
        (["mine", "--from", "v99"], "unknown variant"),
    ],
)
def test_refusals_are_exit_2_and_change_nothing(project, args, needle):
    before = (project / "variants.yaml").read_text()
    result = new(project, *args)
    assert result.exit_code == 2 and needle in result.output
    assert (project / "variants.yaml").read_text() == before
    assert sorted(p.name for p in (project / "kernels").iterdir()) == ["binding.cpp", "flashcore.h", "flashcore_defaults.h", "ladder"]


def test_an_existing_kernel_file_is_refused(project):
    (project / "kernels" / "ladder" / "mine.cu").write_text("// someone's work\n")
    result = new(project, "mine", "--from", "baseline")
    assert result.exit_code == 2 and "already exists" in result.output
    assert (project / "kernels" / "ladder" / "mine.cu").read_text() == "// someone's work\n"


@pytest.mark.gpu
def test_scaffold_passes_flashcore_test_at_once(project, fresh_cache):
    assert new(project, "mine", "--from", "baseline").exit_code == 0
    result = runner.invoke(app, ["--registry", str(project / "variants.yaml"), "test", "mine", "--shapes", "1,2,97,64;2,1,128,128"])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- new in a copy of the project
def hinted_command(output: str) -> list[str]:
    """The `flashcore ptxas ...` command of new's "next:" hint, as argv."""
    import re
    import shlex

    (command,) = re.findall(r"`flashcore ([^`]*ptxas [^`]*)`", output)
    return shlex.split(command)


def test_new_in_a_copy_writes_into_the_copy_and_its_hint_works(project, monkeypatch, nvcc, fresh_cache, table_rows):
    monkeypatch.delenv("FLASHCORE_REGISTRY", raising=False)
    installed = (REPO / "variants.yaml").read_text()
    monkeypatch.chdir(project / "kernels")  # anywhere inside the copy: its variants.yaml is found from here
    result = runner.invoke(app, ["new", "mine", "--from", "baseline"])
    assert result.exit_code == 0, result.output
    assert f"registry: {project / 'variants.yaml'} (found from the current directory)" in said(result)
    assert f"wrote {project / 'kernels' / 'ladder' / 'mine.cu'}" in said(result)
    assert f"wrote {project / 'variants.yaml'} (appended the entry 'mine')" in said(result)
    assert (REPO / "variants.yaml").read_text() == installed and not (REPO / "kernels" / "ladder" / "mine.cu").exists()
    argv = hinted_command(said(result))
    assert argv == ["ptxas", "mine"]  # found from here: no --registry needed
    hinted = runner.invoke(app, [*argv, "--arch", "sm_90"])
    assert hinted.exit_code == 0, hinted.output
    assert "mine_fwd<64>" in cells(table_rows)


def test_new_from_outside_the_copy_hints_with_the_registry(project, tmp_path_factory, monkeypatch, nvcc, fresh_cache, table_rows):
    monkeypatch.delenv("FLASHCORE_REGISTRY", raising=False)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["--registry", str(project), "new", "mine", "--from", "baseline"])
    assert result.exit_code == 0, result.output
    assert (project / "kernels" / "ladder" / "mine.cu").is_file()
    argv = hinted_command(said(result))
    assert argv == ["--registry", str(project / "variants.yaml"), "ptxas", "mine"]
    hinted = runner.invoke(app, [*argv, "--arch", "sm_90"])
    assert hinted.exit_code == 0, hinted.output
    assert "mine_fwd<64>" in cells(table_rows)
