"""The two keys of a torch build (cache.py): the shared binding's and a variant's; the generated entry point;
finding a cached build, and `flashcore build` answering one, without torch."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, cells
from flashcore_cli.builder import cache, jit
from flashcore_cli.builder.cache import binding_key, build_key
from flashcore_cli.registry.variants import load_registry


@pytest.fixture
def project(tmp_path, nvcc):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("flashcore.h", "flashcore_defaults.h", "binding.cpp"):
        shutil.copy(REPO / "kernels" / name, kernels)
    (kernels / "tile.cuh").write_text("constexpr int kBlockM = 64;\n")
    (kernels / "k.cu").write_text('#include "flashcore.h"\n#include "tile.cuh"\n')
    (kernels / "other.cu").write_text('#include "flashcore.h"\n')
    (kernels / "unrelated.cuh").write_text("// nobody includes me\n")
    (tmp_path / "variants.yaml").write_text(
        "variants:\n"
        "  - name: k\n    sources: [kernels/k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
        "  - name: other\n    sources: [kernels/other.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    return tmp_path


def variant(project, name="k"):
    return load_registry(project / "variants.yaml").get(name)


def keys(project):
    return binding_key(project / "kernels"), build_key(variant(project), "sm_90"), build_key(variant(project, "other"), "sm_90")


def edit(path, text="// edit\n"):
    original = path.read_text()
    path.write_text(original + text)
    return original


def test_a_variant_edit_changes_its_build_key_only(project):
    b, k, other = keys(project)
    original = edit(project / "kernels" / "k.cu")
    b2, k2, other2 = keys(project)
    assert b2 == b and other2 == other and k2 != k
    (project / "kernels" / "k.cu").write_text(original)  # the revert: the earlier key, a cache hit
    assert keys(project) == (b, k, other)


def test_a_header_the_variant_includes_changes_its_key_an_unrelated_file_does_not(project):
    b, k, other = keys(project)
    edit(project / "kernels" / "unrelated.cuh")
    assert keys(project) == (b, k, other)
    edit(project / "kernels" / "tile.cuh")
    b2, k2, other2 = keys(project)
    assert (b2, other2) == (b, other) and k2 != k


@pytest.mark.parametrize("name", ["binding.cpp", "flashcore_defaults.h"])
def test_a_binding_edit_changes_the_binding_key_and_every_build_key(project, name):
    b, k, other = keys(project)
    edit(project / "kernels" / name)
    b2, k2, other2 = keys(project)
    assert b2 != b and k2 != k and other2 != other


def test_flashcore_h_is_in_both_keys(project):
    b, k, other = keys(project)
    edit(project / "kernels" / "flashcore.h")
    assert all(new != old for new, old in zip(keys(project), (b, k, other)))


def test_torch_cuda_and_the_host_compiler_change_the_binding_key(project, monkeypatch):
    b = binding_key(project / "kernels")
    # versions no real install has (the lent GPU machines run 2.11.0+cu130 itself, which made b_torch == b there)
    monkeypatch.setattr(cache, "torch_metadata", lambda: {"torch": "0.0.1+cu991", "cuda": "99.1"})
    b_torch = binding_key(project / "kernels")
    monkeypatch.setattr(cache, "torch_metadata", lambda: {"torch": "0.0.1+cu991", "cuda": "99.2"})
    b_cuda = binding_key(project / "kernels")
    monkeypatch.setattr(cache, "host_compiler", lambda: "/usr/bin/c++: another version")
    b_cxx = binding_key(project / "kernels")
    assert len({b, b_torch, b_cuda, b_cxx}) == 4


def test_the_binding_key_names_files_by_content_not_by_checkout(project, tmp_path_factory, nvcc):
    elsewhere = tmp_path_factory.mktemp("another-checkout")
    shutil.copytree(project / "kernels", elsewhere / "kernels")
    assert binding_key(elsewhere / "kernels") == binding_key(project / "kernels")


def test_the_arch_and_defines_change_the_build_key_not_the_binding_key(project):
    v = variant(project)
    assert build_key(v, "sm_89") != build_key(v, "sm_90") != build_key(v, "sm_90", {"X": "1"})
    parts = cache.key_parts(v, "sm_90", for_build=True)
    assert parts["binding"] == binding_key(project / "kernels") and "binding.cpp" not in json.dumps(parts["files"])


def test_the_entry_point_is_generated_deterministically():
    text = jit.module_stub_source("flashcore_v8_0123456789abcdef")
    assert text == jit.module_stub_source("flashcore_v8_0123456789abcdef")
    assert 'PyObject* PyInit_flashcore_v8_0123456789abcdef() { return flashcore_binding_init("flashcore_v8_0123456789abcdef"); }' in text
    assert "#include" not in text  # neither torch nor Python.h: its compile is on every build's path
    assert jit.module_stub_source("flashcore_v9_x") != text
    for bad in ("has space", 'quote"', "9starts_with_digit", ""):
        with pytest.raises(ValueError):
            jit.module_stub_source(bad)
    probe = jit.binding_probe_source("flashcore_binding_abc")
    assert "flashcore_plan" in probe and "PyInit_flashcore_binding_abc" in probe


def test_the_binding_exports_the_entry_the_stub_calls():
    source = (REPO / "kernels" / "binding.cpp").read_text()
    assert 'extern "C" PyObject* flashcore_binding_init(const char* module_name)' in source
    assert "PYBIND11_MODULE" not in source.replace("not PYBIND11_MODULE", "")


def fake_build(project, fresh_cache, name="k", library=True):
    v = variant(project, name)
    key = build_key(v, "sm_90")
    directory = jit.build_dir(v, key)
    directory.mkdir(parents=True)
    lib = directory / f"{jit.module_name(v, key)}.so"
    if library:
        lib.write_bytes(b"")
    resources = [{"mangled": "_Z1kv", "kernel": "void k_fwd<64>(FlashcoreParams)", "arch": "sm_90", "registers": 96}]
    (directory / "build.json").write_text(json.dumps({"library": lib.name, "resources": resources, "binding_key": "b1"}))
    return v, key


def test_find_cached(project, fresh_cache):
    v = variant(project)
    assert jit.find_cached(v, "sm_90") is None
    _, key = fake_build(project, fresh_cache)
    hit = jit.find_cached(v, "sm_90")
    assert hit["key"] == key and hit["cached"] and hit["load_seconds"] is None
    assert "96 regs" in hit["resources"][0] and hit["binding"]["key"] == "b1"
    assert jit.find_cached(v, "sm_89") is None  # another arch, another key


def test_find_cached_wants_the_library(project, fresh_cache):
    fake_build(project, fresh_cache, library=False)
    assert jit.find_cached(variant(project), "sm_90") is None


def test_build_answers_a_cached_variant_without_a_worker(project, fresh_cache, monkeypatch, table_rows):
    from typer.testing import CliRunner

    from flashcore_cli.commands import build as commands
    from flashcore_cli.cli import app

    fake_build(project, fresh_cache)
    monkeypatch.setattr(commands, "require_cuda_torch", lambda: None)
    spawned = []
    monkeypatch.setattr("flashcore_cli.core.isolate.run_worker", lambda request, **kw: spawned.append(request))
    result = CliRunner().invoke(app, ["--registry", str(project / "variants.yaml"), "build", "k", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    assert spawned == []
    assert "cached" in cells(table_rows) and "k_fwd<64>(FlashcoreParams) [sm_90]: 96 regs" in " ".join(cells(table_rows))  # [sm_90] is not taken for markup


def test_build_with_force_or_a_tuned_winner_goes_to_a_worker(project, fresh_cache, monkeypatch):
    from typer.testing import CliRunner

    from flashcore_cli.commands import build as commands
    from flashcore_cli.builder.tuned import store_tuned
    from flashcore_cli.cli import app
    from flashcore_cli.core.isolate import WorkerOutcome

    fake_build(project, fresh_cache)
    monkeypatch.setattr(commands, "require_cuda_torch", lambda: None)
    spawned = []

    def run_worker(request, **kw):
        spawned.append(request)
        return WorkerOutcome("done", events=[{"event": "built", "key": "x", "cached": False, "build_seconds": 1.0,
                                              "load_seconds": 0.0, "resources": [], "directory": "d",
                                              "binding": {"key": "b", "cached": False, "build_seconds": 20.0}}])  # fmt: skip

    monkeypatch.setattr("flashcore_cli.core.isolate.run_worker", run_worker)
    args = ["--registry", str(project / "variants.yaml"), "build", "k", "--arch", "sm_90"]
    result = CliRunner().invoke(app, [*args, "--force"])
    assert result.exit_code == 0 and len(spawned) == 1 and spawned[0].force
    assert "built in 1.0 s (+ the shared binding, built in 20.0 s)" in " ".join(result.output.split())
    store_tuned("k", "NVIDIA H200", {"X": "1"}, {})
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and len(spawned) == 2


def test_build_all_runs_one_worker_per_variant(project, fresh_cache, monkeypatch):
    from typer.testing import CliRunner

    from flashcore_cli.commands import build as commands
    from flashcore_cli.cli import app
    from flashcore_cli.core.isolate import WorkerOutcome

    monkeypatch.setattr(commands, "require_cuda_torch", lambda: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    seen = []

    def run_worker(request, **kw):
        seen.append((request.variant, os.environ.get("MAX_JOBS")))
        return WorkerOutcome("done", events=[{"event": "built", "key": "x", "cached": False, "build_seconds": 1.0,
                                              "load_seconds": 0.0, "resources": [], "directory": "d", "binding": {}}])  # fmt: skip

    monkeypatch.setattr("flashcore_cli.core.isolate.run_worker", run_worker)
    result = CliRunner().invoke(app, ["--registry", str(project / "variants.yaml"), "build", "--all", "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    assert sorted(seen) == [("k", "8"), ("other", "8")]  # two workers on 16 cores: 8 ninja jobs each


NO_TORCH = """
import sys
from flashcore_cli.builder.toolchain import cpu_torch_problem, gpu_visible, torch_metadata
meta = torch_metadata(); cpu_torch_problem(); gpu_visible()
from flashcore_cli.builder.jit import find_cached
from flashcore_cli.registry.variants import load_registry
find_cached(load_registry(sys.argv[1]).get("k"), "sm_90")
assert "torch" not in sys.modules, "torch was imported"
import torch
assert meta == {"torch": str(torch.__version__), "cuda": torch.version.cuda}, (meta, torch.__version__)
print("ok")
"""


def test_keys_and_checks_import_no_torch_and_read_torch_s_own_values(project, fresh_cache):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(project / "variants.yaml")], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gpu_visible_honours_cuda_visible_devices(monkeypatch):
    from flashcore_cli.builder import toolchain
    from flashcore_cli.core import gpu

    assert toolchain.gpu_visible is gpu.gpu_visible  # core's, named in the toolchain module too
    monkeypatch.setattr(gpu, "torch_metadata", lambda: {"torch": "2.11.0+cu130", "cuda": "13.0"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not gpu.gpu_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert not gpu.gpu_visible()
    monkeypatch.setattr(gpu, "torch_metadata", lambda: {"torch": "2.13.0+cpu", "cuda": None})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert not gpu.gpu_visible()  # a CPU torch sees no GPU, whatever the machine has
