"""A variant's kernel objects (builder/objects.py): every nvcc started before start_objects returns, each
object cached by its own key, a failure reported with nvcc's words and nothing left behind, and an error
longer than a pipe's buffer not holding up the others. Needs nvcc (compiles for PTX + sm_90 host code only)."""

import shutil
import time

import pytest

from conftest import REPO
from flashcore_cli.builder.jit import kernel_nvcc_flags
from flashcore_cli.builder.objects import objects_dir, start_objects
from flashcore_cli.builder.toolchain import gencode
from flashcore_cli.registry.variants import load_registry

GOOD = '#include "flashcore.h"\n__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n'
# 90 errors (nvcc stops at 100), each naming and quoting an 800-character identifier: over 64 KB, a pipe's buffer
BAD = '#include "flashcore.h"\n' + "".join(f"int f{i}() {{ return undefined_name_{'x' * 800}_{i}; }}\n" for i in range(90))


@pytest.fixture
def project(tmp_path, nvcc, fresh_cache):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(REPO / "kernels" / "flashcore.h", kernels)
    (kernels / "good.cu").write_text(GOOD)
    (kernels / "bad.cu").write_text(BAD)
    (tmp_path / "variants.yaml").write_text(
        "variants:\n"
        "  - name: pair\n    sources: [kernels/good.cu, kernels/bad.cu]\n    summary: s\n    head_dims: [64]\n    causal: false\n"
        "  - name: solo\n    sources: [kernels/good.cu]\n    summary: s\n    head_dims: [64]\n    causal: false\n"
    )
    return tmp_path


def objects(project, name):
    variant = load_registry(project / "variants.yaml").get(name)
    started = time.perf_counter()
    pending = start_objects(variant, [gencode("sm_90")], kernel_nvcc_flags(variant, {}))
    return variant, time.perf_counter() - started, pending.result()


def test_a_failure_is_reported_whole_and_leaves_nothing_behind(project):
    variant, _, (good, bad) = objects(project, "pair")
    assert good.ok and not good.cached and good.object.is_file()
    assert "k(float" in good.log or "Compiling entry function" in good.log  # ptxas -v's report
    assert not bad.ok and bad.returncode != 0
    assert len(bad.log) > 65536 and "f89()" in bad.log  # the last error too: nothing cut off
    leftovers = sorted(p.name for p in objects_dir(variant).iterdir() if p.name.startswith("."))
    assert leftovers == []  # no temporary object or log
    assert not any(p.name.startswith("bad-") for p in objects_dir(variant).iterdir())


def test_start_returns_while_nvcc_runs_and_an_unchanged_source_is_cached(project):
    _, started_in, (first,) = objects(project, "solo")
    assert first.ok and not first.cached
    assert started_in < first.seconds  # start_objects did not wait for the compile
    _, _, (again,) = objects(project, "solo")
    assert again.ok and again.cached and again.object == first.object and again.log == first.log


def test_an_nvcc_that_cannot_start_is_a_failed_object_not_an_exception(project, monkeypatch):
    import flashcore_cli.builder.objects as objects_module

    monkeypatch.setattr(objects_module, "find_nvcc", lambda: str(project / "no-such-nvcc"))
    variant, _, (failed,) = objects(project, "solo")
    assert not failed.ok and failed.returncode == 127 and "no-such-nvcc" in failed.log
    assert [p.name for p in objects_dir(variant).iterdir()] == []  # no output file left
