"""Every -D knob the kernels keep is declared in the registry, with the value the kernel ships: an `#ifndef NAME /
#define NAME value` in a file a variant compiles is in that variant's `defines:` with that value, or in its `tune:`
params with that value among the candidates. An experiment that lost leaves the code; one that stays is visible to
`flashcore list` (no GPU, no compile: the variants' source closures and the registry, read as text)."""

from __future__ import annotations

import re
from pathlib import Path

from flashcore_cli.builder.cache import source_closure
from flashcore_cli.registry.variants import FEATURES, load_registry

ROOT = Path(__file__).resolve().parent.parent
KNOB = re.compile(r"^#ifndef (\w+)\n#define \1 (.+)$", re.MULTILINE)


def knobs(path: Path) -> dict[str, str]:
    return {name: re.sub(r"\s*//.*", "", value).strip() for name, value in KNOB.findall(path.read_text())}


def test_every_ifndef_knob_is_declared_with_its_shipped_value():
    registry = load_registry(ROOT / "variants.yaml")
    undeclared = []
    for variant in registry.variants:
        files = source_closure(list(variant.sources), [variant.kernels_dir])
        for path in files:
            for name, value in knobs(path).items():
                where = f"{variant.name}: {path.relative_to(ROOT)}'s {name} (default {value})"
                if name in variant.defines:
                    assert variant.defines[name] == value, f"{where}: variants.yaml defines {variant.defines[name]}"
                elif name in variant.tune.params:
                    assert int(value) in variant.tune.params[name], f"{where}: not among its tune values"
                else:
                    undeclared.append(where)
    assert not undeclared, "knobs not in variants.yaml (defines or tune): " + "; ".join(undeclared)


def test_every_knob_in_kernels_belongs_to_some_variant():
    """A knob in a file no variant compiles would escape the check above."""
    registry = load_registry(ROOT / "variants.yaml")
    compiled = {p for v in registry.variants for p in source_closure(list(v.sources), [v.kernels_dir])}
    stray = [str(p.relative_to(ROOT)) for p in (ROOT / "kernels").rglob("*")
             if p.is_file() and knobs(p) and p.resolve() not in compiled]
    assert not stray


def test_feature_bits_come_from_flashcore_h():
    """FEATURES is read from kernels/flashcore.h's enum FlashcoreFeature: each name with its enumerator's bit."""
    header = (ROOT / "kernels" / "flashcore.h").read_text()
    enum = header[header.index("enum FlashcoreFeature"):]
    enum = enum[: enum.index("};")]
    declared = {name: 1 << int(shift) for shift, name in re.findall(r'= 1 << (\d+),\s*// "(\w+)"', enum)}
    assert dict(FEATURES) == declared
    assert list(FEATURES) == ["gqa", "seqlen_kv", "lse", "backward", "window", "softcap", "sinks"]
