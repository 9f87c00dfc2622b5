"""`flashcore new` carries every key that defines the variant it copies (archs, dtypes, features, flags,
defines, head dims, causal, tune, ...), and refuses what it cannot write in one line (exit 2)."""

import shutil

import pytest
from typer.testing import CliRunner

from conftest import REPO, said
from flashcore_cli.builder.scaffold import differences
from flashcore_cli.cli import app
from flashcore_cli.registry.variants import load_registry

runner = CliRunner()

REGISTRY = """\
variants:
  - name: hopper   # an sm_90a-only rung in the shape of v12
    aliases: [h]
    sources: [kernels/sm90/v12.cu, kernels/sm90/v12_bwd.cu]
    archs: [sm_90a]
    dtypes: [fp16, bf16]
    features: [gqa, seqlen_kv, lse, backward, window, softcap, sinks]
    summary: "v12"
    head_dims: [64, 128]
    causal: true
    notes: "the original's notes"
  - name: everything
    sources: [kernels/ladder/baseline.cu]
    flags: ["-Xptxas=-O3"]
    defines: {UNUSED_A: 1, UNUSED_S: "a b"}
    summary: "every defining key"
    head_dims: [64]
    causal: false
    archs: [sm_89, sm_90a]
    dtypes: [fp16, bf16]
    features: [gqa, lse, backward]
    tune:
      params: {UNUSED_B: [1, 2]}
      constraints: ["UNUSED_B > 0"]
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", kernels)
    (tmp_path / "variants.yaml").write_text(REGISTRY)
    return tmp_path


def new(project, *args):
    return runner.invoke(app, ["--registry", str(project / "variants.yaml"), "new", *args])


@pytest.mark.parametrize("source", ["hopper", "everything"])
def test_new_carries_every_defining_key(project, source):
    result = new(project, "mine", "--from", source)
    assert result.exit_code == 0, result.output
    registry = load_registry(project / "variants.yaml")
    copy, original = registry.get("mine"), registry.get(source)
    assert differences(copy, original) == []
    assert (copy.archs, copy.dtypes, copy.features, copy.flags, copy.defines, copy.tune, copy.head_dims, copy.causal) == (
        original.archs, original.dtypes, original.features, original.flags, original.defines, original.tune,
        original.head_dims, original.causal)  # fmt: skip
    shared = tuple(s for s in original.sources if s.name not in ("v12.cu", "baseline.cu"))  # the hopper's backward
    beside = original.sources[0].parent  # the copy goes beside the file it copies
    assert copy.aliases == () and copy.sources == (beside / "mine.cu", *shared)
    assert copy.notes != original.notes and copy.summary != original.summary


def test_a_copy_of_v12_builds_for_sm_90a_with_its_hgmma(project, nvcc, fresh_cache, table_rows):
    """The issue's case: the copy of the sm_90a-only rung keeps archs and dtypes, so ptxas builds it for
    sm_90a (its wgmma body in: 128+ registers) and warns of nothing."""
    assert new(project, "my12", "--from", "hopper").exit_code == 0
    result = runner.invoke(app, ["--registry", str(project / "variants.yaml"), "ptxas", "my12", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    rows = [r for r in table_rows if r.get("variant") == "my12"]
    wgmma = [r for r in rows if r["kernel"].startswith(("v12_fwd", "v12_bwd"))]  # beside them: the small passes
    assert wgmma and all(r["arch"] == "sm_90a" for r in rows) and all(int(r["regs"]) >= 96 for r in wgmma), rows
    assert "warning" not in result.output


def test_a_name_too_long_for_a_file_is_one_line(project):
    before = (project / "variants.yaml").read_text()
    result = new(project, "a" * 300, "--from", "everything")
    assert result.exit_code == 2, result.output
    assert "at most 64 characters" in said(result) and "Traceback" not in result.output
    assert (project / "variants.yaml").read_text() == before


def test_a_source_that_is_not_utf8_is_one_line(project):
    source = project / "kernels" / "latin.cu"
    source.write_bytes((REPO / "kernels" / "ladder" / "baseline.cu").read_bytes() + "// caf\u00e9\n".encode("latin-1"))
    with open(project / "variants.yaml", "a") as f:
        f.write('  - name: latin\n    sources: [kernels/latin.cu]\n    summary: "x"\n    head_dims: [64, 128]\n    causal: true\n')
    before = (project / "variants.yaml").read_text()
    result = new(project, "mine", "--from", "latin")
    assert result.exit_code == 2, result.output
    assert f"{source}: not a UTF-8 text file" in said(result) and "Traceback" not in result.output
    assert (project / "variants.yaml").read_text() == before and not any((project / "kernels").rglob("mine.cu"))


def test_a_copy_of_a_rung_of_several_files_shares_the_others_and_links(tmp_path, nvcc, fresh_cache, table_rows):
    """v11 is four translation units (v11.cu calls its bf16 half, its D=128 kernels and its backward in the
    others): the copy of v11.cu lists them after itself, so it links and ptxas reports its kernels."""
    (tmp_path / "pyproject.toml").write_text("")
    shutil.copytree(REPO / "kernels", tmp_path / "kernels")
    shutil.copy(REPO / "variants.yaml", tmp_path / "variants.yaml")
    result = new(tmp_path, "my11", "--from", "v11")
    assert result.exit_code == 0, result.output
    registry = load_registry(tmp_path / "variants.yaml")
    copy, original = registry.get("my11"), registry.get("v11")
    others = tuple(s for s in original.sources if s.name != "v11.cu")
    assert len(others) >= 1 and copy.sources == (tmp_path / "kernels" / "sm80" / "my11.cu", *others)
    assert all(s.name in said(result) for s in others)  # the user is told which files are shared
    result = runner.invoke(app, ["--registry", str(tmp_path / "variants.yaml"), "ptxas", "my11", "--arch", "sm_89"])
    assert result.exit_code == 0, result.output
    rows = [r for r in table_rows if r.get("variant") == "my11"]
    assert rows and not any("compile failed" in r.get("kernel", "") for r in rows), rows
    assert any("bwd" in r.get("kernel", "") for r in rows)  # the shared backward's kernels are in the copy
