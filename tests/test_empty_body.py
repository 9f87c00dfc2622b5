"""A kernel whose body compiled to (almost) nothing is flagged by ptxas and sass, with the likely cause: v12's
wgmma body sits under #if __CUDA_ARCH_FEAT_SM90_ALL, so an entry without `archs: [sm_90a]` builds it for
plain sm_90 as an empty shell (4-18 registers, 49-158 SASS instructions, no HGMMA) that every command used
to accept with exit 0."""

import shutil

import pytest
from typer.testing import CliRunner

from conftest import REPO, said
from flashcore_cli.builder import cudatools
from flashcore_cli.builder.ptxas import KernelResources, TRIVIAL_INSTRUCTIONS, TRIVIAL_REGISTERS, _trivial_resources
from flashcore_cli.cli import app
from flashcore_cli.inspect.sass import KernelSass

runner = CliRunner()

REGISTRY = """\
variants:
  - name: noarch   # v12 without its archs: [sm_90a]
    sources: [kernels/sm90/v12.cu, kernels/sm90/v12_bwd.cu]
    dtypes: [fp16, bf16]
    features: [gqa, seqlen_kv, lse, backward, window, softcap, sinks]
    summary: "v12, its archs forgotten"
    head_dims: [64, 128]
    causal: true
  - name: baseline
    sources: [kernels/ladder/baseline.cu]
    summary: "a real kernel"
    head_dims: [64, 128]
    causal: true
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    shutil.copytree(REPO / "kernels", tmp_path / "kernels")
    (tmp_path / "variants.yaml").write_text(REGISTRY)
    return tmp_path / "variants.yaml"


def test_the_thresholds_sit_between_an_empty_body_and_a_real_rung():
    shell = KernelResources("m", "void v12_fwd<64>(FlashcoreParams)", "sm_90", registers=18, static_smem=0)
    assert _trivial_resources(shell)
    assert not _trivial_resources(KernelResources("m", "k", "sm_90", registers=96))  # the leanest real rung
    assert not _trivial_resources(KernelResources("m", "k", "sm_90", registers=16, static_smem=1024))
    assert TRIVIAL_REGISTERS < 96 and TRIVIAL_INSTRUCTIONS < 512
    empty = KernelSass("m", "k")
    empty.opcodes.update({"SYNCS.EXCH.64": 18, "BRA": 3, "EXIT": 1})
    assert empty.looks_empty()
    empty.opcodes["HGMMA.64x128x16.F32"] = 1
    assert not empty.looks_empty()


def test_ptxas_flags_a_compiled_out_body_and_names_the_cause(project, nvcc, shared_cache):
    result = runner.invoke(app, ["--registry", str(project), "ptxas", "noarch", "baseline", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output  # a warning, not a failure
    text = said(result)
    assert "warning: noarch (sm_90): v12_fwd<" in text and "look empty" in text
    assert "registers and no static shared memory" in text
    assert "kernels/common/hopper.cuh tests __CUDA_ARCH_FEAT_SM90_ALL" in text and "add `archs: [sm_90a]`" in text
    assert "warning: baseline" not in text


def test_sass_flags_a_compiled_out_body_and_names_the_cause(project, nvcc, tmp_path):
    if cudatools.locate("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    result = runner.invoke(app, ["--registry", str(project), "sass", "noarch", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    text = said(result)
    assert "warning: noarch (sm_90): v12_fwd<" in text and "SASS instructions and no tensor-core MMA" in text
    assert "__CUDA_ARCH_FEAT_SM90_ALL" in text
    result = runner.invoke(app, ["--registry", str(project), "sass", "baseline", "--arch", "sm_90"])
    assert result.exit_code == 0 and "warning" not in result.output


def test_small_passes_beside_a_real_kernel_are_not_flagged():
    """The backward's prep and dQ conversion are elementwise kernels of ~20 registers: a variant whose kernels
    are mostly real is not warned about; one whose kernels mostly look empty is."""
    from flashcore_cli.builder.ptxas import KernelResources, empty_body_warnings
    from flashcore_cli.registry.variants import load_registry

    variant = load_registry().get("v11")
    small = [KernelResources("a", "bwd_prep<64, __half>", "sm_90", registers=24)]
    assert empty_body_warnings(variant, "sm_90", small, "ptxas", total=5) == []
    assert empty_body_warnings(variant, "sm_90", small, "ptxas", total=1)
    assert empty_body_warnings(variant, "sm_90", small * 2, "ptxas", total=4) == []  # half: the passes of a rung
    assert empty_body_warnings(variant, "sm_90", small * 3, "ptxas", total=4)  # most: a body compiled out
