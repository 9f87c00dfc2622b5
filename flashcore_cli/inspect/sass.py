"""`flashcore sass`: the machine code of a variant's kernels and the instruction mix that matters, no GPU needed.

Each .cu source of the variant is compiled to a cubin with the same nvcc flags as every other compile
(toolchain.BASE_NVCC_FLAGS, the registry's flags and defines), then disassembled by `cuobjdump -sass`.
Per kernel the mix counts what tells the story of an attention kernel: tensor-core math (HMMA; HGMMA on
Hopper), shared->register matrix loads (LDSM), asynchronous global->shared copies (LDGSTS; UTMALDG/UBLKCP
for TMA), global loads and stores by width (LDG/STG: 128-bit is what a tuned kernel uses), local memory
(LDL/STL: spills or dynamically indexed arrays) and barriers (BAR).

A variant that lists an arch-specific target (archs: [sm_90a]) is compiled for it: `flashcore sass v12`
with no GPU (sm_90) disassembles its sm_90a code. A kernel of fewer than ptxas.TRIVIAL_INSTRUCTIONS
instructions with no MMA is flagged with a warning naming the likely cause (an arch-specific body compiled
out: ptxas.empty_body_warnings, when most kernels of the variant do); the real rungs have 512 and more.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flashcore_cli.builder.cudatools import env_with_nvdisasm, require
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, FlashcoreError
from flashcore_cli.builder.ptxas import TRIVIAL_INSTRUCTIONS, first_errors
from flashcore_cli.core.isolate import run_tool
from flashcore_cli.registry.variants import Variant
from flashcore_cli.builder.toolchain import BASE_NVCC_FLAGS, define_flags, demangle, find_nvcc, gencode

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
# "        /*0070*/      @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x... */"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")
_WIDTH_TOKENS = {"U8": 8, "S8": 8, "8": 8, "U16": 16, "S16": 16, "16": 16, "32": 32, "64": 64, "128": 128}

# column -> the opcodes (before the first '.') it counts
MIX_COLUMNS = {
    "HMMA": ("HMMA",),
    "HGMMA": ("HGMMA",),
    "LDSM": ("LDSM",),
    "TMA": ("UTMALDG", "UBLKCP"),
    "LDL/STL": ("LDL", "STL"),
    "BAR": ("BAR",),
}
WIDTH_COLUMNS = ("LDGSTS", "LDG", "STG")


@dataclass
class KernelSass:
    mangled: str
    kernel: str
    opcodes: Counter = field(default_factory=Counter)  # full opcode with modifiers -> count

    @property
    def total(self) -> int:
        return sum(n for op, n in self.opcodes.items() if op != "NOP")

    def count(self, *bases: str) -> int:
        return sum(n for op, n in self.opcodes.items() if op.split(".", 1)[0] in bases)

    def widths(self, base: str) -> Counter:
        """Bits per access -> count, for LDG/STG/LDL/STL/LDGSTS (no width modifier: 32 bits)."""
        out: Counter = Counter()
        for op, n in self.opcodes.items():
            parts = op.split(".")
            if parts[0] == base:
                bits = [_WIDTH_TOKENS[p] for p in parts[1:] if p in _WIDTH_TOKENS]
                out[bits[-1] if bits else 32] += n
        return out

    def looks_empty(self) -> bool:
        """Too few instructions, and no tensor-core MMA, for an attention kernel (see ptxas.TRIVIAL_INSTRUCTIONS)."""
        return self.total < TRIVIAL_INSTRUCTIONS and not self.count("HMMA", "HGMMA")

    def mix(self) -> dict:
        d = {col: self.count(*ops) for col, ops in MIX_COLUMNS.items()}
        d.update({base: dict(sorted(self.widths(base).items(), reverse=True)) for base in WIDTH_COLUMNS})
        return {"kernel": self.kernel, "instructions": self.total, **d}


def parse_sass(text: str) -> list[KernelSass]:
    """Kernels in `cuobjdump -sass` output, each with its opcode counts."""
    kernels: list[KernelSass] = []
    current: KernelSass | None = None
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            current = KernelSass(m.group(1), m.group(1))
            kernels.append(current)
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.opcodes[m.group(1)] += 1
    names = demangle([k.mangled for k in kernels])
    for k in kernels:
        k.kernel = names.get(k.mangled, k.mangled)
    return kernels


def cuda_sources(variant: Variant) -> list[Path]:
    sources = [s for s in variant.sources if s.suffix == ".cu"]
    if not sources:
        raise FlashcoreError(f"{variant.name}: no .cu source to disassemble")
    return sources


def compile_cubin(variant: Variant, source: Path, arch: str, out: Path) -> None:
    cmd = [
        find_nvcc(), *BASE_NVCC_FLAGS, gencode(arch), "-cubin", *variant.flags, *define_flags(variant.defines),
        *(f"-I{d}" for d in variant.include_dirs), "-o", str(out), str(source),
    ]  # fmt: skip
    proc = run_tool(cmd)
    if proc.returncode != 0:
        raise FlashcoreError(f"{variant.name}: nvcc -cubin failed for {source.name}:\n{first_errors(proc.stdout + proc.stderr)}", exit_code=EXIT_CHECK_FAILED)


def disassemble(cuobjdump: Path, cubin: Path) -> str:
    proc = run_tool([str(cuobjdump), "-sass", str(cubin)], env=env_with_nvdisasm(cuobjdump))
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip()
        if "nvdisasm" in message:
            raise FlashcoreError(f"{cuobjdump} needs nvdisasm, which was not found: `pip install nvidia-cuda-nvdisasm` ({message})")
        raise FlashcoreError(f"cuobjdump -sass failed on {cubin.name}: {message}", exit_code=EXIT_CHECK_FAILED)
    return proc.stdout


def variant_sass(variant: Variant, arch: str) -> tuple[str, list[KernelSass]]:
    """The whole SASS listing of a variant for one arch (or the arch-specific target it lists for it), and its
    kernels' instruction counts."""
    arch = variant.build_target(arch)
    cuobjdump = require("cuobjdump", "`flashcore sass`")
    listings = []
    with tempfile.TemporaryDirectory(prefix="flashcore-sass-") as tmp:
        for source in cuda_sources(variant):
            cubin = Path(tmp) / f"{source.stem}.cubin"
            compile_cubin(variant, source, arch, cubin)
            listings.append(disassemble(cuobjdump, cubin))
    text = "\n".join(listings)
    return text, parse_sass(text)


