"""Content-addressed cache keys.

A key covers every source of a variant and every header it includes (followed through #include "..."),
its flags and defines, the target arch and the compiler — plus, for torch builds, torch's and CUDA's
versions and the Python ABI. Any edit among these gives a new key (a rebuild); no edit, the same key
(a cache hit). Nobody deletes ~/.cache/torch_extensions by hand again.

A torch build has two keys. The binding's (binding_key) covers kernels/binding.cpp and the headers it
includes (flashcore.h, flashcore_defaults.h), its compiler flags, the host compiler, torch, CUDA and the Python
ABI — not any variant: one binding object serves every variant and arch. A variant's build key
(build_key) covers the variant's own sources and headers, its nvcc flags, defines and arch, and the
binding's key; so an edit of a variant's .cu changes only its build key, and an edit of binding.cpp every
build key (the modules link the new binding object). Neither imports torch (torch_metadata reads its version
file), so the CLI can find a cached build without it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from flashcore_cli.registry.variants import Variant
from flashcore_cli.builder.toolchain import (
    BASE_NVCC_FLAGS,
    TORCH_BUILD_NVCC_FLAGS,
    host_compiler,
    nvcc_version,
    torch_metadata,
)

# Bump when the way a build is made changes without any input above changing (the binding object, the
# generated module entry point): every key changes with it.
BUILD_FORMAT = 4
# The same for one kernel object (objects.py: how nvcc is invoked for it).
OBJECT_FORMAT = 1
# extra_cflags of every host (.cpp) compile of a torch build: the binding and the generated entry points.
HOST_CFLAGS = ["-O3", "-std=c++17"]

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def source_closure(sources: list[Path], include_dirs: list[Path]) -> list[Path]:
    """The sources plus every file they reach through #include "..." (system <...> headers are covered by
    the compiler's version in the key)."""
    seen: dict[Path, None] = {}
    stack = [p.resolve() for p in sources]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen[path] = None
        for name in _INCLUDE.findall(path.read_text(errors="replace")):
            for d in (path.parent, *include_dirs):
                candidate = (d / name).resolve()
                if candidate.is_file():
                    stack.append(candidate)
                    break
    return sorted(seen)


def binding_source(variant: Variant) -> Path:
    return variant.kernels_dir / "binding.cpp"


def key_parts(variant: Variant, arch: str, *, for_build: bool, extra_defines: dict[str, str] | None = None) -> dict:
    """The inputs of a variant's compile. for_build=False: the nvcc-only probe (ptxas). for_build=True: a
    torch build, which also names torch, CUDA, the Python ABI and the binding (by its key)."""
    files = source_closure(list(variant.sources), [variant.kernels_dir])
    defines = {**variant.defines, **(extra_defines or {})}
    parts = {
        "files": {str(f.relative_to(variant.root)) if f.is_relative_to(variant.root) else str(f): _sha256(f) for f in files},
        "flags": BASE_NVCC_FLAGS + list(variant.flags),
        "defines": dict(sorted(defines.items())),
        "arch": arch,
        "nvcc": nvcc_version(),
    }
    if for_build:
        parts.update(_torch_parts(), binding=binding_key(variant.kernels_dir), torch_nvcc_flags=TORCH_BUILD_NVCC_FLAGS,
                     host_cflags=HOST_CFLAGS, format=BUILD_FORMAT)  # fmt: skip
    return parts


def cache_key(variant: Variant, arch: str, *, for_build: bool, extra_defines: dict[str, str] | None = None) -> str:
    return _digest(key_parts(variant, arch, for_build=for_build, extra_defines=extra_defines))


def object_key(variant: Variant, source: Path, nvcc_flags: list[str]) -> str:
    """The key of one source's object (objects.py): that source and the headers it reaches, nvcc's whole
    command line but the file names (flags, defines, arch), and nvcc. No torch: the kernels do not include it."""
    files = source_closure([source], [variant.kernels_dir])
    kernels_dir = variant.kernels_dir.resolve()
    return _digest({
        "source": source.name,
        "files": {str(f.relative_to(kernels_dir)) if f.is_relative_to(kernels_dir) else str(f): _sha256(f) for f in files},
        "flags": list(nvcc_flags),
        "nvcc": nvcc_version(),
        "format": OBJECT_FORMAT,
    })  # fmt: skip


def build_key(variant: Variant, arch: str, extra_defines: dict[str, str] | None = None) -> str:
    """The key of a variant's torch build for `arch` (the target it compiles for)."""
    return cache_key(variant, arch, for_build=True, extra_defines=extra_defines)


def binding_closure(kernels_dir: Path) -> list[Path]:
    """binding.cpp and the headers it includes from the project (flashcore.h, flashcore_defaults.h)."""
    return source_closure([kernels_dir / "binding.cpp"], [kernels_dir])


def binding_key_parts(kernels_dir: Path) -> dict:
    """The inputs of the binding object. Files are named relative to kernels/ (the same sources in another
    checkout give the same key); the entry-point templates are in BUILD_FORMAT's care."""
    kernels_dir = kernels_dir.resolve()
    files = {}
    for f in binding_closure(kernels_dir):
        name = str(f.relative_to(kernels_dir)) if f.is_relative_to(kernels_dir) else str(f)
        files[name] = _sha256(f)
    return {
        "files": files,
        "host_cflags": HOST_CFLAGS,
        "cxx": host_compiler(),
        "nvcc": nvcc_version(),  # the toolkit whose headers (cuda_runtime.h, cuda_fp16.h) it includes
        **_torch_parts(),
        "format": BUILD_FORMAT,
    }


def binding_key(kernels_dir: Path) -> str:
    return _digest(binding_key_parts(kernels_dir))


def _torch_parts() -> dict:
    import sysconfig

    meta = torch_metadata()
    return {"torch": meta.get("torch"), "cuda": meta.get("cuda"), "abi": sysconfig.get_config_var("EXT_SUFFIX")}


def _digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
