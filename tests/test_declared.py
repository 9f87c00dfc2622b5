"""The ptxas probe refuses a registry entry that disagrees with what its kernel declares: a head dim the
entry lists and the launcher plans no kernel for used to pass in silence."""

import shutil

from typer.testing import CliRunner

from conftest import REPO
from flashcore_cli.cli import app

runner = CliRunner()


def test_a_declared_head_dim_with_no_kernel_is_exit_2_naming_both(tmp_path, nvcc, fresh_cache):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("flashcore.h", "flashcore_defaults.h", "ladder/baseline.cu"):
        (kernels / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / "kernels" / name, kernels / name)
    registry = tmp_path / "variants.yaml"
    registry.write_text('variants:\n  - name: d96\n    sources: [kernels/ladder/baseline.cu]\n    summary: "x"\n'
                        "    head_dims: [96]\n    causal: true\n")  # fmt: skip
    result = runner.invoke(app, ["--registry", str(registry), "ptxas", "d96", "--arch", "sm_90"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    (line,) = errors
    assert "variant 'd96' (sm_90)" in line
    assert "variants.yaml declares head_dims [96]" in line  # the registry's head dims
    assert "kernels/ladder/baseline.cu plans kernels for 64, 128" in line  # the kernel's


# ---------------------------------------------------------------- `flashcore list` checks the same, for the default arch:
# from the probes cached, and with --check after compiling the missing ones
BASELINE = '  - name: {name}\n    sources: [kernels/ladder/baseline.cu]\n    summary: "x"\n    head_dims: {dims}\n    causal: true\n'


def baseline_project(tmp_path, *entries: str):
    """A project with kernels/ladder/baseline.cu (head dims 64 and 128, fp16) and a registry of `entries`."""
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir(exist_ok=True)
    for name in ("flashcore.h", "flashcore_defaults.h", "ladder/baseline.cu"):
        (kernels / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / "kernels" / name, kernels / name)
    registry = tmp_path / "variants.yaml"
    registry.write_text("variants:\n" + "".join(entries))
    return registry


def lines_of(result) -> list[str]:
    """What a command printed, less the dim 'registry: ...' line of a registry given by --registry and the
    progress lines of `list --check`'s compiles (plain lines on stderr where it is no terminal)."""
    assert "Traceback" not in result.output
    return [line for line in result.output.splitlines()
            if line.strip() and not line.startswith(("registry: ", "checking declarations: "))]  # fmt: skip


def test_list_refuses_head_dims_its_kernel_does_not_plan_in_one_line_naming_both(tmp_path, nvcc, fresh_cache, monkeypatch):
    registry = baseline_project(tmp_path, BASELINE.format(name="d96", dims="[96]"))
    monkeypatch.setattr("flashcore_cli.registry.archs.default_arch", lambda: "sm_90")
    result = runner.invoke(app, ["--registry", str(registry), "list", "--check"])
    assert result.exit_code == 2, result.output
    (line,) = lines_of(result)  # the error alone: no table
    assert line.startswith("error: variant 'd96' (sm_90): ")
    assert "variants.yaml declares head_dims [96]" in line  # the registry's head dims
    assert "kernels/ladder/baseline.cu plans kernels for 64, 128" in line  # the kernel's


def test_list_refuses_dtypes_its_kernel_does_not_take_and_names_every_variant_that_disagrees(tmp_path, nvcc, fresh_cache):
    registry = baseline_project(
        tmp_path,
        BASELINE.format(name="fine", dims="[64, 128]"),
        BASELINE.format(name="bf", dims="[64, 128]") + "    dtypes: [fp16, bf16]\n",
        BASELINE.format(name="d32", dims="[32]"),
    )
    result = runner.invoke(app, ["--registry", str(registry), "list", "--check"])
    assert result.exit_code == 2, result.output
    (line,) = lines_of(result)
    assert "variant 'bf' (" in line  # the first in registry order that disagrees
    assert "variants.yaml declares dtypes ['fp16', 'bf16']" in line and "flashcore_dtypes() takes ['fp16']" in line
    assert line.endswith("(d32 disagrees with its kernel too)")


def test_list_of_a_registry_that_agrees_with_its_kernels_is_the_table_and_cached(tmp_path, nvcc, fresh_cache, monkeypatch, table_rows):
    registry = baseline_project(tmp_path, BASELINE.format(name="ok", dims="[128, 64]") + "    archs: [sm_90a]\n")
    monkeypatch.setattr("flashcore_cli.registry.archs.default_arch", lambda: "sm_89")  # a GPU it does not run on
    result = runner.invoke(app, ["--registry", str(registry), "list", "--check"])
    assert result.exit_code == 0, result.output
    assert [row["name"] for row in table_rows] == ["ok"] and "note:" not in result.output
    assert [p.name.split("-")[:2] for p in (fresh_cache / "ptxas").glob("*.json")] == [["ok", "sm_90a"]]  # its own target

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr("flashcore_cli.builder.ptxas.run_probe", no_compile)
    registry.write_text(registry.read_text().replace("[128, 64]", "[64]"))
    result = runner.invoke(app, ["--registry", str(registry), "list"])  # the cached probe answers, checked afresh
    assert result.exit_code == 2 and "declares head_dims [64] but kernels/ladder/baseline.cu plans kernels for 64, 128" in lines_of(result)[0]
    result = runner.invoke(app, ["--registry", str(registry), "list", "--no-check"])
    assert result.exit_code == 0 and "note:" not in result.output


def test_list_without_nvcc_prints_the_table_and_one_note(tmp_path, fresh_cache, monkeypatch, table_rows):
    from flashcore_cli.core.errors import FlashcoreError

    def no_nvcc(*args):
        raise FlashcoreError("nvcc not found: install the CUDA toolkit")

    monkeypatch.setattr("flashcore_cli.builder.cache.nvcc_version", no_nvcc)
    monkeypatch.setattr("flashcore_cli.builder.ptxas.find_nvcc", no_nvcc)
    registry = baseline_project(tmp_path, BASELINE.format(name="a", dims="[96]"), BASELINE.format(name="b", dims="[64]"))
    result = runner.invoke(app, ["--registry", str(registry), "list"])
    assert result.exit_code == 0, result.output
    assert [row["name"] for row in table_rows] == ["a", "b"]
    assert lines_of(result)[-1] == "note: declarations not checked against the kernels: nvcc not found: install the CUDA toolkit"


def test_list_notes_a_kernel_whose_probe_does_not_compile(tmp_path, nvcc, fresh_cache, monkeypatch, table_rows):
    registry = baseline_project(tmp_path, BASELINE.format(name="ok", dims="[64, 128]"),
                                '  - name: broken\n    sources: [kernels/broken.cu]\n    summary: "x"\n    head_dims: [64]\n    causal: true\n')  # fmt: skip
    (tmp_path / "kernels" / "broken.cu").write_text('#include "flashcore.h"\nint x = ;\n')
    monkeypatch.setattr("flashcore_cli.registry.archs.default_arch", lambda: "sm_90")
    result = runner.invoke(app, ["--registry", str(registry), "list", "--check"])
    assert result.exit_code == 0, result.output
    assert [row["name"] for row in table_rows] == ["ok", "broken"]
    assert lines_of(result)[-1] == ("note: declarations not checked against the kernels of broken: its probe did not compile or run "
                                    "(`flashcore ptxas broken --arch sm_90` shows why)")  # fmt: skip
