"""Resources per kernel from `ptxas -v`, with no GPU: registers, shared memory, spills, stack, occupancy.

Each variant is compiled with plain nvcc into a small host program (the variant's .cu plus a probe main).
ptxas reports every __global__ kernel; running the program — host code only, no CUDA call — prints what
the launcher asks for at each head dim (threads, dynamic shared memory) through flashcore_plan. The two
joined give the CTAs per SM each kernel allows on the arch. The probe also prints what the kernel declares
it supports (the head dims it plans for, flashcore_dtypes, flashcore_features): check_declared refuses a
registry entry that says otherwise, and a plan entry that names no kernel ptxas compiled. `flashcore list` runs
the same probe, from the same cache, for the default arch (DeclarationProbes), and refuses the same entries.

A variant that lists its archs (archs: [sm_90a]) is compiled for the target it lists for an asked arch
(sm_90 -> sm_90a), and reported as not built for an arch it does not run on.

A kernel whose body compiled to (almost) nothing is flagged (empty_body_warnings): the usual cause is a
variant written for an arch-specific target (wgmma, setmaxnreg under #if __CUDA_ARCH_FEAT_SM90_ALL) whose
entry does not list that target, built for plain sm_90. Everything "works" then, on an empty kernel.

The compilers run through isolate.run_tool: in sessions of their own, killed at once on Ctrl-C (exit 130),
and a compiler that died of SIGINT is an interruption, never a "compile failed" row.
"""

from __future__ import annotations

import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flashcore_cli.registry.archs import ArchLimits, limits
from flashcore_cli.builder.cache import cache_key
from flashcore_cli.core.isolate import run_tool, stop_on_interrupt
from flashcore_cli.core.records import usable_cache
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.variants import Variant
from flashcore_cli.builder.toolchain import BASE_NVCC_FLAGS, define_flags, demangle, find_nvcc, gencode

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+?):?\s*$")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")

# A kernel compiled to (almost) nothing. The one cause seen so far: an arch-specific body compiled out, e.g. v12
# (FlashAttention-3: wgmma and setmaxnreg under #if __CUDA_ARCH_FEAT_SM90_ALL) built for plain sm_90 by an
# entry without `archs: [sm_90a]`: ptxas reports 4-18 registers and no static shared memory per kernel, sass
# 49-158 instructions and no MMA. Every real rung of the ladder uses 96-254 registers and 512-5356 SASS
# instructions (sm_89 and sm_90), so these thresholds sit far from both. A warning, never a failure: a toy
# kernel (tests/fixtures' hang and fault) is small on purpose.
TRIVIAL_REGISTERS = 24  # ptxas: at most this many registers, and no static shared memory
TRIVIAL_INSTRUCTIONS = 256  # sass: fewer SASS instructions than this (NOPs aside), and no HMMA/HGMMA
_ARCH_FEATURE_MACRO = re.compile(r"__CUDA_ARCH_FEAT_SM(\d+)_ALL|__CUDA_ARCH_(?:FAMILY_)?SPECIFIC__")

# Head dims the probe asks flashcore_plan about: every one a kernel could plausibly declare.
PROBE_HEAD_DIMS = range(1, 513)
PROBE_MAIN = r"""
#include "flashcore.h"
#include "flashcore_defaults.h"
#include <cstdio>
int main() {
  std::printf("dtypes\t%%d\nfeatures\t%%d\nmax-seq-len\t%%d\n", flashcore_dtypes(), flashcore_features(),
              flashcore_max_seq_len());
  FlashcoreKernelPlan plans[kFlashcoreMaxPlans + 1];
  for (int d = %(first)d; d <= %(last)d; ++d) {
    const int n = flashcore_plan(d, plans, kFlashcoreMaxPlans + 1);
    if (n > kFlashcoreMaxPlans) std::printf("too-many\t%%d\t%%d\t%%d\n", d, n, kFlashcoreMaxPlans);
    for (int j = 0; j < n && j < kFlashcoreMaxPlans; ++j)
      std::printf("plan\t%%d\t%%s\t%%d\t%%d\n", d, plans[j].kernel, plans[j].threads_per_block, plans[j].dynamic_smem_bytes);
  }
  return 0;
}
""" % {"first": PROBE_HEAD_DIMS[0], "last": PROBE_HEAD_DIMS[-1]}


@dataclass
class KernelResources:
    mangled: str
    kernel: str  # demangled
    arch: str
    registers: int = 0
    static_smem: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    # joined from flashcore_plan (None: the launcher does not use this kernel at any declared head dim)
    head_dim: int | None = None
    threads: int | None = None
    dynamic_smem: int | None = None
    ctas_per_sm: int | None = None
    limiter: str = ""

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    @property
    def smem_per_cta(self) -> int:
        return self.static_smem + (self.dynamic_smem or 0)

    def summary(self) -> str:
        dyn = f" + {self.dynamic_smem / 1024:.1f} KB dynamic" if self.dynamic_smem else ""
        occ = f", {self.ctas_per_sm} CTA/SM" if self.ctas_per_sm is not None else ""
        return (
            f"{self.kernel} [{self.arch}]: {self.registers} regs, {self.static_smem / 1024:.1f} KB static smem{dyn}, "
            f"{self.spill_stores}+{self.spill_loads} B spills, {self.stack_frame} B stack{occ}"
        )


@dataclass
class Declared:
    """What the kernel itself says it supports (read by the probe, host code only)."""

    head_dims: tuple[int, ...] = ()
    dtypes: int = 0  # mask of 1 << (0: fp16, 1: bf16)
    features: int = 0  # mask of registry.variants.FEATURES
    max_seq_len: int = 0  # the most query rows it takes (0: any)
    plans: list[tuple[int, str, int, int]] = field(default_factory=list)  # (head dim, kernel, threads, dynamic smem)
    too_many_plans: list[tuple[int, int, int]] = field(default_factory=list)  # (head dim, plans it listed, the most allowed)


@dataclass
class VariantReport:
    variant: str
    arch: str
    kernels: list[KernelResources] = field(default_factory=list)
    compile_seconds: float = 0.0
    error: str = ""
    not_built: str = ""  # why the variant is not built for this arch (its registry archs exclude it)
    declared: Declared | None = None
    warnings: list[str] = field(default_factory=list)  # e.g. kernels that look empty (empty_body_warnings)

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "arch": self.arch,
            "compile_seconds": round(self.compile_seconds, 2),
            "error": self.error,
            "not_built": self.not_built,
            "kernels": [asdict(k) | {"spills": k.spills} for k in self.kernels],
            "declared": asdict(self.declared) if self.declared else None,
            "warnings": self.warnings,
        }


def parse_ptxas(text: str) -> list[KernelResources]:
    """Kernels (entry functions) in ptxas -v output; device functions' property lines are skipped."""
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    props_for: str | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = KernelResources(mangled=m.group(1), kernel=m.group(1), arch=m.group(2))
            kernels[f"{current.mangled}@{current.arch}"] = current
            props_for = None
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif m := _FRAME.search(line):
            if current is not None and props_for == current.mangled:
                current.stack_frame, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current is not None:
            current.registers = int(m.group(1))
            if s := _SMEM.search(line):
                current.static_smem = int(s.group(1))
            if b := _BARRIERS.search(line):
                current.barriers = int(b.group(1))
            current = None
    found = list(kernels.values())
    names = demangle([k.mangled for k in found])
    for k in found:
        k.kernel = names.get(k.mangled, k.mangled)
    return found


def occupancy(k: KernelResources, limits: ArchLimits) -> tuple[int, str]:
    """CTAs per SM the kernel's registers, shared memory and threads allow, and which limit binds."""
    if not k.threads:
        return 0, "unknown threads"
    warps = -(-k.threads // 32)
    regs_per_warp = -(-max(k.registers, 1) * 32 // limits.reg_alloc_unit) * limits.reg_alloc_unit
    smem = k.smem_per_cta
    if smem > limits.smem_per_block_optin:
        return 0, f"needs {smem} B smem > {limits.smem_per_block_optin} B per block"
    bounds = {
        "threads": limits.max_threads_per_sm // k.threads,
        "registers": (limits.regs_per_sm // regs_per_warp) // warps,
        "smem": limits.smem_per_sm // (smem + limits.reserved_smem_per_cta),
        "CTA slots": limits.max_ctas_per_sm,
    }
    limiter = min(bounds, key=bounds.get)
    return bounds[limiter], limiter


def kernel_base_name(demangled: str) -> str:
    """'void v11_fwd<64, 128>(FlashcoreParams)' -> 'v11_fwd<64, 128>': the name a plan entry gives."""
    name = demangled[5:] if demangled.startswith("void ") else demangled
    depth = 0
    for i, ch in enumerate(name):  # the parameter list starts at the first '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def _join_plans(kernels: list[KernelResources], plans: list[tuple[int, str, int, int]], arch: str) -> list[str]:
    """Each kernel's threads and dynamic shared memory from the plan entry naming it; returns the plan entries
    that name no compiled kernel."""
    by_name = {kernel_base_name(k.kernel): k for k in kernels}
    unmatched = []
    for head_dim, name, threads, dyn in plans:
        k = by_name.get(name)
        if k is None:
            unmatched.append(name)
            continue
        if k.threads is None:
            k.head_dim, k.threads, k.dynamic_smem = head_dim, threads, dyn
            k.ctas_per_sm, k.limiter = occupancy(k, limits(arch))
    return unmatched


def parse_probe(text: str) -> Declared:
    declared = Declared()
    dims: list[int] = []
    for line in text.splitlines():
        kind, *fields = line.split("\t")
        if kind == "dtypes":
            declared.dtypes = int(fields[0])
        elif kind == "features":
            declared.features = int(fields[0])
        elif kind == "max-seq-len":
            declared.max_seq_len = int(fields[0])
        elif kind == "too-many":
            declared.too_many_plans.append((int(fields[0]), int(fields[1]), int(fields[2])))
        elif kind == "plan":
            d, name, threads, dyn = fields
            declared.plans.append((int(d), name, int(threads), int(dyn)))
            if int(d) not in dims:
                dims.append(int(d))
    declared.head_dims = tuple(dims)
    return declared


def _ranges(values) -> str:
    """[1, 2, 3, 64] -> '1-3, 64'."""
    runs: list[list[int]] = []
    for x in sorted(values):
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_declared(variant: Variant, report: VariantReport) -> None:
    """One FlashcoreError naming both sides where the registry entry and the kernel disagree: head dims,
    dtypes, features; or where the kernel's plan breaks the contract (too many entries, a name that is no
    compiled kernel)."""
    from flashcore_cli.registry.variants import DTYPES, FEATURES

    d = report.declared
    if d is None:
        return
    source = ", ".join(str(p.relative_to(variant.root)) if p.is_relative_to(variant.root) else str(p) for p in variant.sources)
    where = f"variant '{variant.name}' ({report.arch})"
    if d.too_many_plans:
        dim, n, most = d.too_many_plans[0]
        raise FlashcoreError(f"{where}: {source}'s flashcore_plan lists {n}+ kernels at head dim {dim}; the contract allows {most}")
    if set(d.head_dims) != set(variant.head_dims):
        raise FlashcoreError(
            f"{where}: variants.yaml declares head_dims {list(variant.head_dims)} but {source} plans kernels for "
            f"{_ranges(d.head_dims) or 'none'}: make them agree"
        )
    kernel_dtypes = [name for i, name in enumerate(DTYPES) if d.dtypes >> i & 1]
    if set(kernel_dtypes) != set(variant.dtypes):
        raise FlashcoreError(
            f"{where}: variants.yaml declares dtypes {list(variant.dtypes)} but {source}'s flashcore_dtypes() takes "
            f"{kernel_dtypes or 'none'}: make them agree"
        )
    kernel_features = [name for name, bit in FEATURES.items() if d.features & bit]
    if set(kernel_features) != set(variant.features):
        raise FlashcoreError(
            f"{where}: variants.yaml declares features {list(variant.features)} but {source}'s flashcore_features() "
            f"says {kernel_features}: make them agree"
        )
    if d.max_seq_len != (variant.max_seq_len or 0):
        raise FlashcoreError(
            f"{where}: variants.yaml declares max_seq_len {variant.max_seq_len or 'none'} but {source}'s "
            f"flashcore_max_seq_len() says {d.max_seq_len or 'none'}: make them agree"
        )
    if report.kernels:
        unmatched = _join_plans(report.kernels, d.plans, report.arch)
        if unmatched:
            raise FlashcoreError(
                f"{where}: {source}'s flashcore_plan names kernel '{unmatched[0]}', which ptxas did not compile "
                "(a plan entry must be the kernel's name as c++filt prints it, without 'void' and the parameters)"
            )


def _trivial_resources(k: KernelResources) -> bool:
    return k.registers <= TRIVIAL_REGISTERS and k.static_smem == 0


def empty_body_warnings(variant: Variant, arch: str, kernels: list, what: str, total: int | None = None) -> list[str]:
    """One warning line when most kernels of `variant` built for `arch` look empty (ptxas: few registers and
    no static shared memory; sass: few instructions and no MMA; `kernels` are those, `total` how many it has),
    naming them and the likely cause. A variant whose kernels are mostly real is left alone: a few small
    elementwise passes beside them (the backward's prep and dQ conversion, 18-24 registers) are legitimately
    small, and they must not hide a compiled-out body either (v12 built for plain sm_90: 14 of its 18 kernels)."""
    if not kernels or (total is not None and 2 * len(kernels) <= total):
        return []
    from flashcore_cli.registry.archs import ARCH_SPECIFIC

    names = [kernel_base_name(k.kernel) for k in kernels]
    shown = f"{names[0]} and {len(names) - 1} more kernel(s) look" if len(names) > 1 else f"{names[0]} looks"
    if what == "ptxas":
        regs = sorted({k.registers for k in kernels})
        size = f"{regs[0]}-{regs[-1]}" if len(regs) > 1 else f"{regs[0]}"
        looks = f"{size} registers and no static shared memory"
    else:
        counts = sorted({k.total for k in kernels})
        size = f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else f"{counts[0]}"
        looks = f"{size} SASS instructions and no tensor-core MMA"
    guard = _arch_feature_guard(variant)
    listed = f"archs: [{', '.join(variant.archs)}]" if variant.archs else "no archs"
    if guard and arch not in ARCH_SPECIFIC:
        macro, where, target = guard
        cause = (f"likely its arch-specific body compiled out: {where} tests {macro}, which only a build for {target or 'an arch-specific target'} "
                 f"defines, and variants.yaml gives {variant.name} {listed}, so it was built for plain {arch}"
                 + (f" (add `archs: [{target}]` to its entry)" if target else ""))  # fmt: skip
    else:
        cause = (f"likely an arch-specific body compiled out (an #if on __CUDA_ARCH__ or __CUDA_ARCH_FEAT_* that is false "
                 f"for {arch}; variants.yaml gives {variant.name} {listed})")  # fmt: skip
    return [f"{variant.name} ({arch}): {shown} empty ({looks}): {cause}"]


def _arch_feature_guard(variant: Variant) -> tuple[str, str, str | None] | None:
    """(the macro, the file, the target that defines it) of the first arch-specific feature test in the
    variant's sources and the headers they include, or None."""
    from flashcore_cli.builder.cache import source_closure
    from flashcore_cli.registry.archs import ARCH_SPECIFIC

    try:
        files = source_closure(list(variant.sources), list(variant.include_dirs))
    except OSError:
        return None
    for f in files:
        try:
            m = _ARCH_FEATURE_MACRO.search(f.read_text(errors="replace"))
        except OSError:
            continue
        if m:
            target = f"sm_{m.group(1)}a" if m.group(1) and f"sm_{m.group(1)}a" in ARCH_SPECIFIC else None
            where = str(f.relative_to(variant.root)) if f.is_relative_to(variant.root) else str(f)
            return m.group(0), where, target
    return None


def compile_probe(variant: Variant, arch: str, extra_defines: dict[str, str] | None = None) -> VariantReport:
    """ptxas -v and flashcore_plan for one variant on one arch, or the arch-specific target it lists for that
    arch (cached by content key), its declarations checked against the registry's (check_declared)."""
    arch = variant.build_target(arch)
    cached = probe_file(variant, arch, extra_defines)
    report = read_probe(cached, variant.name, arch) if cached.is_file() else run_probe(variant, arch, cached, extra_defines)
    if report.error:
        return report
    check_declared(variant, report)
    report.warnings = empty_body_warnings(variant, arch, [k for k in report.kernels if _trivial_resources(k)], "ptxas",
                                          len(report.kernels))  # fmt: skip
    return report


def probe_file(variant: Variant, target: str, extra_defines: dict[str, str] | None = None) -> Path:
    """Where the probe of `variant` compiled for `target` is cached: <cache>/ptxas/, by content key (the
    sources, flags, defines, target and nvcc; not the registry's declarations, which every use checks)."""
    cache = usable_cache()
    key = cache_key(variant, target, for_build=False, extra_defines=extra_defines)
    return cache / "ptxas" / f"{variant.name}-{target}-{key}.json"


def read_probe(cached: Path, name: str, target: str) -> VariantReport:
    """A cached probe's report, its declarations not checked yet."""
    data = json.loads(cached.read_text())
    report = VariantReport(name, target, compile_seconds=data["compile_seconds"])
    report.kernels = [KernelResources(**{k: v for k, v in kd.items() if k != "spills"}) for kd in data["kernels"]]
    if data.get("declared"):
        raw = data["declared"]
        report.declared = Declared(tuple(raw["head_dims"]), raw["dtypes"], raw["features"], raw["max_seq_len"],
                                   [tuple(p) for p in raw["plans"]], [tuple(t) for t in raw["too_many_plans"]])  # fmt: skip
    return report


def run_probe(variant: Variant, target: str, cached: Path, extra_defines: dict[str, str] | None = None) -> VariantReport:
    """Compile the probe for `target` and run it; a probe that compiled and ran is written to `cached`. Its
    declarations are not checked here (a report with an error has none)."""
    import time

    nvcc = find_nvcc()
    defines = {**variant.defines, **(extra_defines or {})}
    report = VariantReport(variant.name, target)
    with tempfile.TemporaryDirectory(prefix="flashcore-ptxas-") as tmp:
        main = Path(tmp) / "probe_main.cu"
        main.write_text(PROBE_MAIN)
        exe = Path(tmp) / "probe"
        cmd = [
            nvcc, *BASE_NVCC_FLAGS, gencode(target), "-Xptxas=-v", *variant.flags, *define_flags(defines),
            *(f"-I{d}" for d in variant.include_dirs), "-o", str(exe), *map(str, variant.sources), str(main),
        ]  # fmt: skip
        start = time.perf_counter()
        proc = run_tool(cmd)
        report.compile_seconds = time.perf_counter() - start
        if proc.returncode != 0:
            report.error = first_errors(proc.stdout + proc.stderr)
            return report
        report.kernels = parse_ptxas(proc.stdout + proc.stderr)
        run = run_tool([str(exe)], timeout=60)
        if run.returncode != 0:
            report.error = f"the probe (flashcore_plan) failed: {run.stderr.strip() or run.returncode}"
            return report
    report.declared = parse_probe(run.stdout)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = cached.with_suffix(f".{id(report)}.tmp")
    tmp_file.write_text(json.dumps(report.as_dict()))
    tmp_file.replace(cached)
    return report


class DeclarationProbes:
    """`flashcore list`'s check of every variant's declarations (head dims, dtypes, features, ...) against its
    kernel's, through the probe `flashcore ptxas` runs and its cache, for one arch: each variant is probed for
    the target it builds for there, or, where it does not run on that arch, for the first target it lists
    (nvcc compiles for any target without a GPU). Made, it has answered from the cache; compile() probes the
    rest (`todo`) in parallel; then disagreement() and unchecked_note() say what was found."""

    def __init__(self, variants: list[Variant], arch: str):
        self.variants = list(variants)
        self.arch = arch
        self.reports: dict[str, VariantReport] = {}
        self.unchecked: dict[str, str] = {}  # variant -> why its kernel's declarations could not be read
        self.todo: list[tuple[Variant, str, Path]] = []  # (variant, target, cache file) to compile
        for v in self.variants:
            target = v.target_arch(arch) or v.archs[0]
            try:
                cached = probe_file(v, target)
                if cached.is_file():
                    self._take(v, read_probe(cached, v.name, target))
                else:
                    self.todo.append((v, target, cached))
            except Exception as exc:  # nvcc missing, an unusable cache, an unreadable cache file
                self.unchecked[v.name] = _why(exc)

    def compile(self, on_done=None) -> None:
        """Probe every variant of `todo` in parallel (Ctrl-C: the compilers killed, exit 130)."""
        import os

        jobs, self.todo = self.todo, []
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool, stop_on_interrupt(pool):
            futures = {pool.submit(run_probe, v, target, cached): v for v, target, cached in jobs}
            for fut in as_completed(futures):
                v = futures[fut]
                try:
                    self._take(v, fut.result())
                except Exception as exc:  # a tool that could not run at all
                    self.unchecked[v.name] = _why(exc)
                if on_done:
                    on_done()

    def _take(self, v: Variant, report: VariantReport) -> None:
        if report.error:
            self.unchecked[v.name] = f"its probe did not compile or run (`flashcore ptxas {v.name} --arch {report.arch}` shows why)"
        else:
            self.reports[v.name] = report

    def disagreement(self) -> FlashcoreError | None:
        """check_declared's error for the first variant, in registry order, whose entry and kernel disagree
        (naming the others that do too), or None."""
        found: list[tuple[str, FlashcoreError]] = []
        for v in self.variants:
            if v.name in self.reports:
                try:
                    check_declared(v, self.reports[v.name])
                except FlashcoreError as exc:
                    found.append((v.name, exc))
        if not found:
            return None
        first = str(found[0][1])
        others = [name for name, _ in found[1:]]
        if others:
            first += f" ({', '.join(others)} {'disagrees with its kernel' if len(others) == 1 else 'disagree with their kernels'} too)"
        return FlashcoreError(first)

    def unchecked_note(self) -> str | None:
        """One line: which variants' declarations were not checked, and why; None when every one was."""
        if not self.unchecked:
            return None
        by_reason: dict[str, list[str]] = {}
        for v in self.variants:
            if v.name in self.unchecked:
                by_reason.setdefault(self.unchecked[v.name], []).append(v.name)
        if len(by_reason) == 1 and len(self.unchecked) == len(self.variants) > 1:
            return f"declarations not checked against the kernels: {next(iter(by_reason))}"
        return "declarations not checked against the kernels " + "; ".join(f"of {', '.join(names)}: {why}" for why, names in by_reason.items())


def _why(exc: Exception) -> str:
    """An exception as the one-line reason of a note."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, FlashcoreError) else f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# nvcc: "file(12): error: ..."; then the source line and a caret under it. gcc / clang: "file:12:5: error: ...",
# then "   12 |   code" and "      |   ^~~". A caret line is only carets, tildes, spaces and gcc's gutter.
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)
_CARET = re.compile(r"^\s*(?:\d*\s*\|)?\s*[\^~][\^~ ]*$")
_LINKER = re.compile(r"(undefined reference to .*|multiple definition of .*)$")
_CONTRACT = re.compile(r"undefined reference to .(flashcore_\w+)")


def first_errors(output: str, limit: int = 12) -> str:
    """The compiler's first errors, not the whole log: each error line with the source line and the caret
    under it, and the linker's "undefined reference" lines (a .cu that lacks a contract function); a repeated
    error once. At most `limit` lines, whole errors only (the first always)."""
    lines = output.splitlines()
    blocks: list[list[str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        block: list[str] = []
        if m := _LINKER.search(line):
            block = [m.group(1)]  # without the temporary object file's name before it
        elif _ERROR.search(line) and not _CARET.match(line):
            block = [line]
            after = lines[i + 1 : i + 3]
            if len(after) == 2 and after[0].strip() and _CARET.match(after[1]) and not _ERROR.search(after[0]):
                block += after
            elif after and _CARET.match(after[0]):
                block.append(after[0])
        if not block:
            i += 1
            continue
        i += len(block) if not _LINKER.search(line) else 1
        key = "\n".join(b.strip() for b in block)
        if key not in seen:
            seen.add(key)
            blocks.append(block)
    picked: list[str] = []
    for block in blocks:
        if picked and len(picked) + len(block) > limit:
            break
        picked += block
    missing = sorted({m.group(1) for m in _CONTRACT.finditer(output)})
    if missing:
        picked.append(f"(no definition of {', '.join(missing)}: each variant's .cu defines the contract of kernels/flashcore.h)")
    return "\n".join(picked) or "\n".join(lines[-limit:])


def report_all(variants: list[Variant], archs: list[str], on_done=None) -> list[VariantReport]:
    """Compile every (variant, arch) in parallel; results in registry order."""
    import os

    rows: list[tuple[Variant, str, bool]] = []  # (variant, what to compile for, whether it is built there)
    for v in variants:
        for a in archs:
            target = v.target_arch(a)
            if not any(r[0].name == v.name and r[1] == (target or a) for r in rows):  # sm_90,sm_90a: one sm_90a
                rows.append((v, target or a, target is not None))
    jobs = [(v, target) for v, target, built in rows if built]
    results: dict[tuple[str, str], VariantReport] = {}
    for v, arch, built in rows:
        if not built:
            results[(v.name, arch)] = VariantReport(v.name, arch, not_built=f"{v.name} runs on {v.runs_on()} only")
            if on_done:
                on_done(results[(v.name, arch)])
    if not jobs:
        return [results[(v.name, a)] for v, a, _ in rows]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool, stop_on_interrupt(pool):
        futures = {pool.submit(compile_probe, v, a): (v.name, a) for v, a in jobs}
        for fut in as_completed(futures):
            name, arch = futures[fut]
            try:
                results[(name, arch)] = fut.result()
            except FlashcoreError:
                raise
            except Exception as exc:  # a tool that could not run at all: report it on the row
                results[(name, arch)] = VariantReport(name, arch, error=f"{type(exc).__name__}: {exc}")
            if on_done:
                on_done(results[(name, arch)])
    return [results[(v.name, a)] for v, a, _ in rows]
