"""Target architectures: parsing, per-arch occupancy limits, and the default (the GPU present, else sm_90).

A GPU has an arch (sm_89, sm_90). A compile targets an arch or an arch-specific target: sm_90a adds Hopper's
wgmma and setmaxnreg, and its code runs on sm_90 GPUs only. A variant that needs them lists `archs: [sm_90a]`
in the registry (registry.Variant.target_arch picks what to compile for).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.gpu import first_gpu


@dataclass(frozen=True)
class ArchLimits:
    max_threads_per_sm: int
    max_ctas_per_sm: int
    regs_per_sm: int
    smem_per_sm: int  # bytes usable by CTAs on one SM
    smem_per_block_optin: int  # the most one block may ask for (after cudaFuncSetAttribute)
    reserved_smem_per_cta: int = 1024  # the runtime keeps 1 KB per CTA on sm_80+
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of 256
    label: str = ""


# CUDA C Programming Guide, "Compute capabilities" table.
ARCHS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(2048, 32, 65536, 167936, 166912, label="A100"),
    "sm_86": ArchLimits(1536, 16, 65536, 102400, 101376, label="RTX 30xx / A10"),
    "sm_89": ArchLimits(1536, 24, 65536, 102400, 101376, label="L4 / RTX 40xx"),
    "sm_90": ArchLimits(2048, 32, 65536, 233472, 232448, label="H100 / H200"),
}
DEFAULT_ARCH = "sm_90"
# Arch-specific targets -> the GPU arch their code runs on (and nowhere else).
ARCH_SPECIFIC = {"sm_90a": "sm_90"}
TARGETS = [*ARCHS, *ARCH_SPECIFIC]


def gpu_arch(target: str) -> str:
    """'sm_90a' -> 'sm_90' (the GPUs that run it); an arch is its own."""
    return ARCH_SPECIFIC.get(target, target)


def limits(target: str) -> ArchLimits:
    return ARCHS[gpu_arch(target)]


def parse_arch(text: str) -> str:
    arch = text.strip().lower()
    if re.fullmatch(r"\d+a?", arch):
        arch = f"sm_{arch}"
    if arch not in TARGETS:
        raise FlashcoreError(f"unknown arch '{text}' (known: {', '.join(TARGETS)})")
    return arch


def parse_archs(text: str | None) -> list[str]:
    if not text:
        return [default_arch()]
    archs = [parse_arch(a) for a in text.split(",") if a.strip()]
    if not archs:
        raise FlashcoreError(f"no arch in '{text}'")
    return list(dict.fromkeys(archs))


def target_arch(text: str | None) -> str:
    """--arch of a command that targets one arch: the arch given, else the GPU's (default_arch)."""
    return parse_arch(text) if text else default_arch()


def default_arch() -> str:
    """The arch of GPU 0 when there is one (core/gpu.py: no torch, no CUDA context), else sm_90."""
    try:
        major, minor = first_gpu("compute_cap").get("compute_cap", "").split(".")
    except ValueError:
        return DEFAULT_ARCH
    arch = f"sm_{major}{minor}"
    return arch if arch in ARCHS else DEFAULT_ARCH


def arch_number(arch: str) -> str:
    """'sm_90' -> '90', 'sm_90a' -> '90a'."""
    return arch.split("_", 1)[1]
