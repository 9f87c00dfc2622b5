"""The edit loop on a GPU: the shared binding compiled once, an edit recompiling only the variant's .cu, a
revert hitting the cache, two processes building at once, and `watch`'s real steps (gpu-marked: skipped
without CUDA). Each test works on copies of kernels/ in tmp_path, with a cache of its own."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

pytestmark = pytest.mark.gpu

ENTRY = "variants:\n  - name: v8\n    sources: [kernels/ladder/v8.cu]\n    summary: s\n    head_dims: [64, 128]\n    causal: true\n"


@pytest.fixture
def project(tmp_path):
    """A project holding v8 and what it and the binding include (every header in kernels/)."""
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for f in (REPO / "kernels").rglob("*"):
        if f.suffix in (".h", ".cuh") or f.name in ("binding.cpp", "v8.cu"):
            (kernels / f.relative_to(REPO / "kernels")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, kernels / f.relative_to(REPO / "kernels"))
    (tmp_path / "variants.yaml").write_text(ENTRY)
    return tmp_path


def gpu_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def variant(project):
    from flashcore_cli.registry.variants import load_registry

    return load_registry(project / "variants.yaml").get("v8")


def check_against_sdpa(module) -> None:
    import torch

    q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = module.forward(q, k, v, False, None, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out.float() - ref.float()).abs().max().item() < 1e-2


def test_an_edit_recompiles_only_the_variant_and_a_revert_is_a_cache_hit(project, fresh_cache):
    from flashcore_cli.builder.jit import BINDING_OBJECT, binding_dir, build_variant

    arch = gpu_arch()
    first = build_variant(variant(project), arch)
    assert not first.cached and not first.binding["cached"]
    obj = binding_dir(first.binding["key"]) / BINDING_OBJECT
    stamp = obj.stat().st_mtime_ns
    check_against_sdpa(first.module)

    source = project / "kernels" / "ladder" / "v8.cu"
    original = source.read_text()
    source.write_text(original + "// a one-line edit\n")
    edited = build_variant(variant(project), arch)
    assert not edited.cached and edited.key != first.key
    assert edited.binding == {"key": first.binding["key"], "cached": True, "build_seconds": 0.0}
    assert obj.stat().st_mtime_ns == stamp  # the binding object was not rebuilt
    log = (edited.directory / "build.log").read_text()
    assert "binding.cpp" not in log and "v8.cu" in log  # ninja compiled the .cu (and the entry point), not the binding
    assert len(list((fresh_cache / "binding").glob("*/binding.json"))) == 1
    check_against_sdpa(edited.module)

    source.write_text(original)
    reverted = build_variant(variant(project), arch)
    assert reverted.cached and reverted.key == first.key


def test_an_edited_variant_passes_flashcore_test(project, fresh_cache):
    from typer.testing import CliRunner

    from flashcore_cli.cli import app

    source = project / "kernels" / "ladder" / "v8.cu"
    source.write_text(source.read_text() + "// a one-line edit\n")
    result = CliRunner().invoke(app, ["--registry", str(project / "variants.yaml"), "test", "v8", "--shapes", "1,8,512,64"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["--registry", str(project / "variants.yaml"), "build", "v8"])
    assert result.exit_code == 0 and "cached" in result.output, result.output  # answered without a worker


BUILD_AND_CALL = textwrap.dedent(
    """
    import sys, torch
    from flashcore_cli.builder.jit import build_variant
    from flashcore_cli.registry.variants import load_registry
    v = load_registry(sys.argv[1]).get("v8")
    major, minor = torch.cuda.get_device_capability()
    r = build_variant(v, f"sm_{major}{minor}")
    q, k, w = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    err = (r.module.forward(q, k, w, False, None, None).float() - torch.nn.functional.scaled_dot_product_attention(q, k, w).float()).abs().max().item()
    print("RESULT", r.key, r.cached, r.binding["cached"], err)
    sys.exit(0 if err < 1e-2 else 1)
    """
)


def test_two_processes_building_the_same_variant_both_succeed(project, fresh_cache):
    env = {**os.environ, "FLASHCORE_CACHE": str(fresh_cache), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen([sys.executable, "-c", BUILD_AND_CALL, str(project / "variants.yaml")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)  # fmt: skip
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    results = [next(line for line in out.splitlines() if line.startswith("RESULT")).split() for out in outputs]
    assert results[0][1] == results[1][1]  # the same key
    assert sorted(r[2] for r in results) == ["False", "True"]  # one built it, the other waited and loaded it
    assert sorted(r[3] for r in results) == ["False", "True"]  # likewise the binding
    assert len(list((fresh_cache / "build").glob("v8-*/build.json"))) == 1
    marker = json.loads(next((fresh_cache / "binding").glob("*/binding.json")).read_text())
    assert marker["object"] == "binding.o"


def test_watch_steps_show_a_compile_error_then_the_fix(project, fresh_cache):
    from flashcore_cli.loop.watch import Watcher, worker_steps
    from flashcore_cli.registry.shapes import parse_shapes

    steps = worker_steps(str(project / "variants.yaml"), "v8", parse_shapes(["1,8,512,64"]), causal=False, dtype="fp16",
                         arch=gpu_arch(), timeout=120, seed=1, bench=True)  # fmt: skip
    watcher = Watcher(steps, lambda it, h: None)
    first = watcher.iterate(["(start)"])
    watcher.history.append(first)
    assert first.status == "OK" and first.median_us and first.sdpa_us and first.resources
    source = project / "kernels" / "ladder" / "v8.cu"
    original = source.read_text()
    source.write_text(original + "\nint broken = ;\n")
    broken = watcher.iterate(["kernels/ladder/v8.cu"])
    watcher.history.append(broken)
    assert broken.status == "BUILD-FAIL" and "error" in broken.errors
    source.write_text(original + "// fixed\n")
    fixed = watcher.iterate(["kernels/ladder/v8.cu"])
    assert fixed.status == "OK" and fixed.previous_us == first.median_us and fixed.deltas == []
