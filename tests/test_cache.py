"""Cache keys: any edit to a source, an included header, flags, defines or arch changes the key; no edit
keeps it."""

import shutil

import pytest

from conftest import REPO
from flashcore_cli.builder.cache import cache_key, source_closure
from flashcore_cli.registry.variants import load_registry


@pytest.fixture
def project(tmp_path, nvcc):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(REPO / "kernels" / "flashcore.h", kernels)
    (kernels / "tile.cuh").write_text("constexpr int kBlockM = 64;\n")
    (kernels / "k.cu").write_text('#include "flashcore.h"\n#include "tile.cuh"\n#include <cuda_fp16.h>\n')
    (tmp_path / "variants.yaml").write_text(
        "variants:\n  - name: k\n    sources: [kernels/k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    return tmp_path


def key(project, arch="sm_90"):
    variant = load_registry(project / "variants.yaml").get("k")
    return cache_key(variant, arch, for_build=False)


def test_closure_follows_quoted_includes(project):
    variant = load_registry(project / "variants.yaml").get("k")
    names = {p.name for p in source_closure(list(variant.sources), [variant.kernels_dir])}
    assert names == {"k.cu", "flashcore.h", "tile.cuh"}


def test_no_edit_same_key(project):
    assert key(project) == key(project)


def test_editing_an_included_header_changes_the_key(project):
    before = key(project)
    (project / "kernels" / "tile.cuh").write_text("constexpr int kBlockM = 128;\n")
    assert key(project) != before


def test_editing_the_source_flags_defines_or_arch_changes_the_key(project):
    base = key(project)
    assert key(project, "sm_89") != base
    registry = project / "variants.yaml"
    text = registry.read_text()
    registry.write_text(text + "    flags: ['-Xptxas=-O2']\n")
    with_flags = key(project)
    assert with_flags != base
    registry.write_text(text + "    defines: {BLOCK: 32}\n")
    assert key(project) not in (base, with_flags)
    registry.write_text(text)
    (project / "kernels" / "k.cu").write_text((project / "kernels" / "k.cu").read_text() + "// edit\n")
    assert key(project) != base
