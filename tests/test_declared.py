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
    for name in ("flashcore.h", "flashcore_defaults.h", "baseline.cu"):
        shutil.copy(REPO / "kernels" / name, kernels / name)
    registry = tmp_path / "variants.yaml"
    registry.write_text('variants:\n  - name: d96\n    sources: [kernels/baseline.cu]\n    summary: "x"\n'
                        "    head_dims: [96]\n    causal: true\n")  # fmt: skip
    result = runner.invoke(app, ["--registry", str(registry), "ptxas", "d96", "--arch", "sm_90"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    (line,) = errors
    assert "variant 'd96' (sm_90)" in line
    assert "variants.yaml declares head_dims [96]" in line  # the registry's head dims
    assert "kernels/baseline.cu plans kernels for 64, 128" in line  # the kernel's
