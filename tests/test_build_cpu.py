"""The real torch build path (cpp_extension.load, the shared binding object, a variant's generated entry point)
on a machine with nvcc and a CPU build of torch, which cannot build a CUDA extension by itself: its wheel lacks
a few CUDA headers (c10/cuda's cmake macros, cuSPARSE/cuBLAS/cuSOLVER) and libc10_cuda / libtorch_cuda. The
test supplies stand-ins — declarations only, and libraries whose c10::cuda symbols are never called (CPU
tensors fail the binding's checks before any CUDA call) — in a child process, so nothing leaks into the suite.

It compiles binding.cpp (about a minute on two cores), so it runs only when asked:
    FLASHCORE_CPU_BUILD_TEST=1 python -m pytest -q tests/test_build_cpu.py
On a GPU machine tests/test_loop_gpu.py covers the same with the real libraries, and more.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(
    os.environ.get("FLASHCORE_CPU_BUILD_TEST") != "1", reason="compiles the torch binding (~1 min): FLASHCORE_CPU_BUILD_TEST=1"
)

HEADERS = {
    "c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n",
    "cusparse.h": "#pragma once\ntypedef struct cusparseContext* cusparseHandle_t;\ntypedef int cusparseStatus_t;\n",
    "cublas_v2.h": "#pragma once\ntypedef struct cublasContext* cublasHandle_t;\ntypedef int cublasStatus_t;\n",
    "cublasLt.h": "#pragma once\ntypedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolver_common.h": "#pragma once\ntypedef int cusolverStatus_t;\n",
    "cusolverDn.h": '#pragma once\n#include "cusolver_common.h"\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n',
}
# The c10::cuda symbols binding.cpp references (nm -u binding.o), defined as plain data: resolved, never called.
C10_CUDA_SYMBOLS = """
_ZN3c104cuda12device_countEv _ZN3c104cuda14ExchangeDeviceEa _ZN3c104cuda14MaybeSetDeviceEa
_ZN3c104cuda17getStreamFromPoolEba _ZN3c104cuda17getStreamFromPoolEia _ZN3c104cuda20CUDACachingAllocator9allocatorE
_ZN3c104cuda20getCurrentCUDAStreamEa _ZN3c104cuda20getDefaultCUDAStreamEa _ZN3c104cuda20setCurrentCUDAStreamENS0_10CUDAStreamE
_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb _ZN3c104cuda9GetDeviceEPa _ZN3c104cuda9SetDeviceEab
_ZNK3c104cuda10CUDAStream11synchronizeEv _ZNK3c104cuda10CUDAStream5queryEv _ZNK3c104cuda10CUDAStream6streamEv
""".split()

DRIVER = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from pathlib import Path
    for name in ("libc10_cuda.so", "libtorch_cuda.so"):
        ctypes.CDLL(str(Path(os.environ["LIBRARY_PATH"]) / name), mode=ctypes.RTLD_GLOBAL)
    import torch
    from torch.utils import cpp_extension
    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # a CPU torch looks for none
    from flashcore_cli.builder.jit import BINDING_OBJECT, binding_dir, build_variant
    from flashcore_cli.registry.variants import load_registry

    registry, source = sys.argv[1], Path(sys.argv[2])
    def build():
        return build_variant(load_registry(registry).get("v8"), "sm_90")

    out = {}
    first = build()
    m = first.module
    obj = binding_dir(first.binding["key"]) / BINDING_OBJECT
    out["first"] = dict(cached=first.cached, binding=first.binding, key=first.key, plan=m.plan(64), dtypes=m.dtypes(),
                        features=m.features(), doc=m.forward.__doc__, stamp=obj.stat().st_mtime_ns)
    try:
        q = torch.zeros(1, 1, 8, 64, dtype=torch.half)
        m.forward(q, q, q)
        out["first"]["error"] = None
    except ValueError as exc:
        out["first"]["error"] = str(exc)
    original = source.read_text()
    source.write_text(original + "// a one-line edit\\n")
    edited = build()
    out["edited"] = dict(cached=edited.cached, binding=edited.binding, key=edited.key, stamp=obj.stat().st_mtime_ns,
                         log=(edited.directory / "build.log").read_text(), plan=edited.module.plan(64))
    source.write_text(original)
    reverted = build()
    out["reverted"] = dict(cached=reverted.cached, key=reverted.key)
    print("RESULT " + json.dumps(out))
    """
)


def stand_ins(root):
    include, lib = root / "include", root / "lib"
    for name, text in HEADERS.items():
        (include / name).parent.mkdir(parents=True, exist_ok=True)
        (include / name).write_text(text)
    lib.mkdir()
    (lib / "c10_cuda.c").write_text("".join(f"char {s}[64];\n" for s in C10_CUDA_SYMBOLS))
    (lib / "empty.c").write_text("")
    for name, src in (("libc10_cuda.so", "c10_cuda.c"), ("libtorch_cuda.so", "empty.c")):
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(lib / name), str(lib / src)], check=True)
    return include, lib


def test_the_binding_is_built_once_and_an_edit_recompiles_only_the_variant(tmp_path, nvcc):
    from flashcore_cli.builder.toolchain import cuda_home

    project = tmp_path / "project"
    kernels = project / "kernels"
    kernels.mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    for f in (REPO / "kernels").rglob("*"):
        if f.suffix in (".h", ".cuh") or f.name in ("binding.cpp", "v8.cu"):
            (kernels / f.relative_to(REPO / "kernels")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, kernels / f.relative_to(REPO / "kernels"))
    (project / "variants.yaml").write_text(
        "variants:\n  - name: v8\n    sources: [kernels/ladder/v8.cu]\n    summary: s\n    head_dims: [64, 128]\n    causal: true\n"
    )
    include, lib = stand_ins(tmp_path / "stand-ins")
    home = cuda_home()
    if not (home / "include" / "cuda_runtime.h").is_file():
        home = next((p for p in (home, home / "cuda") if (p / "include" / "cuda_runtime.h").is_file()), None) or pytest.skip("no CUDA headers")
    env = {**os.environ, "CPLUS_INCLUDE_PATH": str(include), "LIBRARY_PATH": str(lib), "CUDA_HOME": str(home),
           "FLASHCORE_CACHE": str(tmp_path / "cache"), "MAX_JOBS": "2",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(project / "variants.yaml"), str(kernels / "ladder" / "v8.cu")], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    first, edited, reverted = out["first"], out["edited"], out["reverted"]
    assert not first["cached"] and not first["binding"]["cached"]
    assert [p[0] for p in first["plan"]] == ["v8_fwd<64>"]  # v8's launcher, through the binding's plan()
    assert (first["dtypes"], first["features"]) == (1, 0)
    assert first["error"] and "must be a CUDA tensor" in first["error"]  # the binding's own check, as a ValueError
    assert "causal: bool = False" in first["doc"] and "out:" in first["doc"]  # the signature and defaults kept
    assert not edited["cached"] and edited["key"] != first["key"]
    assert edited["binding"]["cached"] and edited["binding"]["key"] == first["binding"]["key"]
    assert edited["stamp"] == first["stamp"]  # binding.o untouched
    assert "binding.cpp" not in edited["log"] and "v8.cu" in edited["log"] and edited["plan"] == first["plan"]
    assert reverted["cached"] and reverted["key"] == first["key"]
