"""Target architectures: parsing, per-arch occupancy limits, and the default (the GPU present, else sm_90)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from flashcore_cli.errors import FlashcoreError


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


def parse_arch(text: str) -> str:
    arch = text.strip().lower()
    if re.fullmatch(r"\d+", arch):
        arch = f"sm_{arch}"
    if arch not in ARCHS:
        raise FlashcoreError(f"unknown arch '{text}' (known: {', '.join(ARCHS)})")
    return arch


def parse_archs(text: str | None) -> list[str]:
    if not text:
        return [default_arch()]
    archs = [parse_arch(a) for a in text.split(",") if a.strip()]
    if not archs:
        raise FlashcoreError(f"no arch in '{text}'")
    return list(dict.fromkeys(archs))


def default_arch() -> str:
    """The arch of GPU 0 when there is one (read through nvidia-smi: no torch, no CUDA context), else sm_90."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
            ).stdout.split()
            if out:
                major, minor = out[0].split(".")
                arch = f"sm_{major}{minor}"
                if arch in ARCHS:
                    return arch
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return DEFAULT_ARCH


def arch_number(arch: str) -> str:
    """'sm_90' -> '90'."""
    return arch.split("_", 1)[1]
