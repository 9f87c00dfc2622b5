"""Content-addressed cache keys.

A key covers every source of a variant and every header it includes (followed through #include "..."),
its flags and defines, the target arch and the compiler — plus, for torch builds, torch's and CUDA's
versions and the Python ABI. Any edit among these gives a new key (a rebuild); no edit, the same key
(a cache hit). Nobody deletes ~/.cache/torch_extensions by hand again.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from flashcore_cli.registry.variants import Variant
from flashcore_cli.build.toolchain import BASE_NVCC_FLAGS, nvcc_version

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
    sources = list(variant.sources) + ([binding_source(variant)] if for_build else [])
    files = source_closure(sources, [variant.kernels_dir])
    defines = {**variant.defines, **(extra_defines or {})}
    parts = {
        "files": {str(f.relative_to(variant.root)) if f.is_relative_to(variant.root) else str(f): _sha256(f) for f in files},
        "flags": BASE_NVCC_FLAGS + list(variant.flags),
        "defines": dict(sorted(defines.items())),
        "arch": arch,
        "nvcc": nvcc_version(),
    }
    if for_build:
        import sysconfig

        import torch

        parts.update(
            torch=torch.__version__,
            cuda=torch.version.cuda,
            abi=sysconfig.get_config_var("EXT_SUFFIX"),
        )
    return parts


def cache_key(variant: Variant, arch: str, *, for_build: bool, extra_defines: dict[str, str] | None = None) -> str:
    parts = key_parts(variant, arch, for_build=for_build, extra_defines=extra_defines)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
