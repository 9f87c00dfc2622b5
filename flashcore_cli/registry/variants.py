"""The variant registry: variants.yaml, validated on load.

Every problem is reported as one FlashcoreError naming the file, the variant and the key, so a broken
registry never surfaces as a traceback. Paths are relative to the registry file and must stay inside the
project (the nearest ancestor holding pyproject.toml).

Which registry, resolved as git finds its repository (resolve_registry): --registry, else
$FLASHCORE_REGISTRY, else a variants.yaml in the current directory or one of its parents, else the
installed project's.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashcore_cli.registry.archs import ARCH_SPECIFIC, TARGETS, gpu_arch
from flashcore_cli.core.dtypes import DEFAULT_DTYPE, DTYPES
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.paths import INSTALL_ROOT, INSTALLED_KERNELS, INSTALLED_REGISTRY, REGISTRY_FILE

DEFAULT_REGISTRY = INSTALLED_REGISTRY
REGISTRY_ENV = "FLASHCORE_REGISTRY"
# A source written `flashcore:kernels/...` names a file of the installed parts (core/paths.py), so a kernel
# author's own registry, in a folder of theirs, builds its copy of a rung against the translation units it shares.
INSTALLED_PREFIX = "flashcore:"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SOURCE_SUFFIXES = {".cu", ".cuh", ".cpp", ".h"}
_REQUIRED = {"name", "sources", "summary", "head_dims", "causal"}
_OPTIONAL = {"aliases", "flags", "defines", "notes", "tune", "archs", "dtypes", "features", "max_seq_len"}
# The element types a variant may declare (`dtypes:`): core/dtypes.py's DTYPES; fp16 is the default.
DEFAULT_DTYPES = (DEFAULT_DTYPE,)
# What a variant may support beyond forward [B, H, S, D] attention (`features:`), by name, with the bit of
# flashcore_features() each one is: declared once, by kernels/flashcore.h's FlashcoreFeature (each enumerator's
# comment opens with the name), and read from there at first use. The kernel declares the same; the probe checks.
_FEATURE_ENUMERATOR = re.compile(r'^\s*kFlashcore\w+\s*=\s*1\s*<<\s*(\d+)\s*,\s*//\s*"(\w+)"', re.MULTILINE)


class _FeatureBits(Mapping):
    """name -> bit, in flashcore.h's order, parsed from its `enum FlashcoreFeature` the first time it is read."""

    def __init__(self, header: Path):
        self._header = header
        self._bits: dict[str, int] | None = None

    def _table(self) -> dict[str, int]:
        if self._bits is None:
            text = self._header.read_text()
            enum = re.search(r"enum FlashcoreFeature\b[^{]*\{(.*?)\};", text, re.DOTALL)
            bits = {name: 1 << int(shift) for shift, name in _FEATURE_ENUMERATOR.findall(enum.group(1) if enum else "")}
            if not bits:
                raise RuntimeError(f"{self._header}: no feature bits found in enum FlashcoreFeature")
            self._bits = bits
        return self._bits

    def __getitem__(self, name: str) -> int:
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


FEATURES: Mapping[str, int] = _FeatureBits(INSTALLED_KERNELS / "flashcore.h")
FEATURE_HELP = {
    "gqa": "grouped-query attention (fewer key/value heads than query heads)",
    "seqlen_kv": "a key sequence of another length than the queries'",
    "lse": "the row log-sum-exp",
    "backward": "a backward (it is forward-only)",
    "window": "a sliding window (window_size other than causal's or none)",
    "softcap": "a logit softcap",
    "sinks": "attention sinks",
}


@dataclass(frozen=True)
class TuneSpace:
    """-D parameters the tuner may vary, each with its candidate values, and restrictions over them."""

    params: dict[str, list[int]] = field(default_factory=dict)
    constraints: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Variant:
    name: str
    aliases: tuple[str, ...]
    sources: tuple[Path, ...]
    flags: tuple[str, ...]
    defines: dict[str, str]
    summary: str
    head_dims: tuple[int, ...]
    causal: bool
    notes: str
    tune: TuneSpace
    root: Path  # the project root: its kernels/ holds the variant's own files
    archs: tuple[str, ...] = ()  # the targets it can be built and run for; empty: any
    dtypes: tuple[str, ...] = DEFAULT_DTYPES  # the element types its launcher takes (DTYPES)
    features: tuple[str, ...] = ()  # FEATURES it supports
    max_seq_len: int | None = None  # the most query rows it takes (a decode rung); None: any

    @property
    def kernels_dir(self) -> Path:
        """The kernels/ holding the contract (flashcore.h), the binding and the shared headers: the project's
        own where it has them (a checkout), else the installed parts (a kernel author's own folder)."""
        own = self.root / "kernels"
        return own if (own / "flashcore.h").is_file() else INSTALLED_KERNELS

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        """Where its sources' #include "..." are found: the project's kernels/, then the installed parts."""
        own = self.root / "kernels"
        return (own,) if own == self.kernels_dir else (own, self.kernels_dir)

    def target_arch(self, arch: str) -> str | None:
        """What to compile for when the GPU (or --arch) is `arch`: `arch` itself, or the arch-specific target
        the variant lists for it (sm_90 -> sm_90a); None when the variant does not run there."""
        if not self.archs or arch in self.archs:
            return arch
        for listed in self.archs:
            if gpu_arch(listed) == gpu_arch(arch):
                return listed if listed in ARCH_SPECIFIC else arch
        return None

    def runs_on(self) -> str:
        return " and ".join(self.archs) if self.archs else "any arch"

    def build_target(self, arch: str) -> str:
        """target_arch, or one clear error where the variant cannot be built for `arch`."""
        target = self.target_arch(arch)
        if target is None:
            raise FlashcoreError(f"{self.name} runs on {self.runs_on()} only; it is not built for {arch}")
        return target

    def supports(self, feature: str) -> bool:
        return feature in self.features

    def feature_mask(self) -> int:
        return sum(FEATURES[f] for f in self.features)

    def unsupported_reason(self, head_dim: int, causal: bool, arch: str | None = None, dtype: str = DEFAULT_DTYPE, *,
                           gqa: bool = False, seqlen_kv: bool = False, backward: bool = False,
                           seq_len: int | None = None, window: bool = False, softcap: bool = False,
                           sinks: bool = False) -> str | None:  # fmt: skip
        """Why this variant cannot run a case (on a GPU of `arch`, when given; in `dtype`; with fewer key/value
        heads than query heads, keys of another length, a backward, the family's window, softcap or sinks), or
        None when it can."""
        if arch is not None and self.target_arch(arch) is None:
            return f"{self.name} runs on {self.runs_on()} only; this GPU is {arch}"
        if dtype not in self.dtypes:
            return f"dtype {dtype} is not supported by {self.name} (it takes {', '.join(self.dtypes)})"
        if head_dim not in self.head_dims:
            dims = ", ".join(str(d) for d in self.head_dims)
            return f"head dim {head_dim} is not supported by {self.name} (it supports {dims})"
        if causal and not self.causal:
            return f"causal masking is not supported by {self.name}"
        if seq_len is not None and self.max_seq_len is not None and seq_len > self.max_seq_len:
            return f"{seq_len} query rows: {self.name} takes at most {self.max_seq_len} (a decode kernel)"
        wanted_features = (("gqa", gqa), ("seqlen_kv", seqlen_kv), ("backward", backward), ("window", window),
                           ("softcap", softcap), ("sinks", sinks))  # fmt: skip
        for feature, wanted in wanted_features:
            if wanted and not self.supports(feature):
                return f"{FEATURE_HELP[feature]} is not supported by {self.name}" if feature != "backward" else (
                    f"{self.name} is forward-only: it has no backward")  # fmt: skip
        return None


def require_runnable(variants, shapes, *, causal: bool | None, dtype: str = DEFAULT_DTYPE, backward: bool = False,
                     family=None) -> None:  # fmt: skip
    """One FlashcoreError when none of `variants` runs any of `shapes` (causal None: either way): a shape or
    head dim that nothing asked for can run is a bad value, said before anything asks for a GPU."""
    reasons = []
    for shape in shapes:
        for v in variants:
            found = [v.unsupported_reason(shape.head_dim, c, dtype=dtype, gqa=shape.gqa, seqlen_kv=shape.other_kv_len,
                                          backward=backward, seq_len=shape.seq_len,
                                          **(family.normalized(c, shape.seq_len, shape.seq_len_kv).needs(c)
                                             if family is not None else {}))
                     for c in ((False, True) if causal is None else (causal,))]  # fmt: skip
            if None in found:
                return
            reasons.append(found[-1] if causal is None else found[0])
    if reasons:
        shown = f"{shapes[0]}" + (f" (and {len(shapes) - 1} more shape(s))" if len(shapes) > 1 else "")
        others = f"; nor does any of the other {len(variants) - 1} variant(s)" if len(variants) > 1 else ""
        raise FlashcoreError(f"nothing to run at {shown}: {reasons[0]}{others}")


@dataclass(frozen=True)
class Registry:
    path: Path
    root: Path
    variants: tuple[Variant, ...]

    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    def get(self, name: str) -> Variant:
        if not isinstance(name, str):  # load_variant(None) from the Python API
            raise FlashcoreError(f"a variant's name is a string, e.g. 'v11' (got {name!r}); `flashcore list` shows the registry")
        for v in self.variants:
            if name == v.name or name in v.aliases:
                return v
        known = [v.name for v in self.variants] + [a for v in self.variants for a in v.aliases]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise FlashcoreError(f"unknown variant '{name}'{hint}; `flashcore list` shows the registry")

    def select(self, names: list[str] | None, all_: bool) -> list[Variant]:
        """The variants a command was asked for: NAME... or --all, never both, never neither."""
        if all_ and names:
            raise FlashcoreError("give variant names or --all, not both")
        if all_:
            return list(self.variants)
        if not names:
            raise FlashcoreError("name at least one variant, or pass --all")
        chosen: list[Variant] = []
        for n in names:
            v = self.get(n)
            if v not in chosen:
                chosen.append(v)
        return chosen


@dataclass(frozen=True)
class RegistryChoice:
    """The registry a command uses, and how it was found (for the one line that says so)."""

    path: Path
    source: str  # "--registry", "FLASHCORE_REGISTRY", "the current directory", "installed"

    @property
    def is_installed(self) -> bool:
        return _same_file(self.path, DEFAULT_REGISTRY)


def resolve_registry(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> RegistryChoice:
    """--registry (a file, or a folder holding variants.yaml), else $FLASHCORE_REGISTRY, else a variants.yaml
    in the current directory or one of its parents, else the installed project's."""
    if explicit is not None:
        if not str(explicit).strip():
            raise FlashcoreError("--registry is empty: give a registry file (variants.yaml) or the folder holding one")
        return RegistryChoice(_registry_file(explicit), "--registry")
    env = os.environ.get(REGISTRY_ENV, "").strip()
    if env:
        return RegistryChoice(_registry_file(env), REGISTRY_ENV)
    try:
        start = (cwd or Path.cwd()).resolve()
    except OSError:  # the current directory was removed
        start = None
    for folder in [start, *start.parents] if start else []:
        if (folder / REGISTRY_FILE).is_file():
            return RegistryChoice(folder / REGISTRY_FILE, "the current directory")
    return RegistryChoice(DEFAULT_REGISTRY, "installed")


def registry_path(explicit: str | os.PathLike | None = None) -> Path:
    return resolve_registry(explicit).path


def _registry_file(given: str | os.PathLike) -> Path:
    path = Path(given).expanduser()
    return path / REGISTRY_FILE if path.is_dir() else path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return False


def _resolved(path: Path, what: str) -> Path:
    """path.resolve(), or one FlashcoreError for a path that cannot be resolved (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # Python < 3.13 raises RuntimeError for a loop, later ones OSError
        import errno

        loop = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
        raise FlashcoreError(f"{path}: {what} is a symlink loop" if loop else f"{path}: {what}: {exc}") from None


def project_root(start: Path) -> Path:
    for d in [start, *start.parents]:
        if (d / "pyproject.toml").is_file():
            return d
    return start


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    import yaml  # deferred: keeps `flashcore --help` fast

    path = _resolved(registry_path(path), "the registry")
    if not path.is_file():
        raise FlashcoreError(f"{path}: registry file not found")
    try:
        # libyaml's loader where PyYAML has it (~10x faster than the pure-Python one: every command reads this)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except UnicodeDecodeError as exc:
        raise FlashcoreError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); save the registry as UTF-8") from None
    except OSError as exc:
        raise FlashcoreError(f"{path}: cannot read the registry ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise FlashcoreError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    root = project_root(path.parent)
    if not isinstance(data, dict) or set(data) != {"variants"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FlashcoreError(f"{path}: the registry must be a mapping with one key, 'variants' (found {keys})")
    entries = data["variants"]
    if not isinstance(entries, list) or not entries:
        raise FlashcoreError(f"{path}: 'variants' must be a non-empty list")

    variants: list[Variant] = []
    seen: dict[str, str] = {}
    for index, entry in enumerate(entries):
        v = _parse_variant(path, root, index, entry)
        for label in (v.name, *v.aliases):
            if label in seen:
                raise FlashcoreError(
                    f"{path}: variant '{v.name}': name or alias '{label}' is already used by variant '{seen[label]}'"
                )
            seen[label] = v.name
        variants.append(v)
    return Registry(path=path, root=root, variants=tuple(variants))


def _parse_variant(path: Path, root: Path, index: int, entry: Any) -> Variant:
    """One registry entry, validated key by key in a fixed order (the first problem is the one reported)."""
    name = _entry_name(path, index, entry)
    where = f"{path}: variant '{name}'"

    def fail(key: str, problem: str) -> FlashcoreError:
        return FlashcoreError(f"{where}: key '{key}': {problem}")

    _check_keys(entry, fail)
    aliases = _parse_aliases(entry.get("aliases", []), fail)
    sources = _parse_sources(entry["sources"], fail, path, root, name)
    flags = _parse_flags(entry.get("flags", []), fail)
    defines = _parse_defines(entry.get("defines", {}), fail)
    summary = _parse_summary(entry["summary"], fail)
    head_dims = _parse_head_dims(entry["head_dims"], fail)
    causal = entry["causal"]
    if not isinstance(causal, bool):
        raise fail("causal", "must be true or false")
    notes = entry.get("notes", "")
    if not isinstance(notes, str):
        raise fail("notes", "must be a string")
    archs = _parse_archs(entry.get("archs"), fail)
    dtypes = _parse_dtypes(entry.get("dtypes"), fail)
    features = _parse_features(entry.get("features"), fail)
    max_seq_len = _parse_max_seq_len(entry.get("max_seq_len"), fail)
    tune = _parse_tune(entry.get("tune"), fail)
    return Variant(
        name=name,
        aliases=aliases,
        sources=sources,
        flags=flags,
        defines=defines,
        summary=summary,
        head_dims=head_dims,
        causal=causal,
        notes=notes.strip(),
        tune=tune,
        root=root,
        archs=archs,
        dtypes=dtypes,
        features=features,
        max_seq_len=max_seq_len,
    )


def _entry_name(path: Path, index: int, entry: Any) -> str:
    """The entry's name, once the entry is known to be a mapping (errors name it by its place in the list)."""
    where = f"{path}: variant #{index + 1}"
    if not isinstance(entry, dict):
        raise FlashcoreError(f"{where}: must be a mapping of keys, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise FlashcoreError(f"{where}: key 'name': must be a string of letters, digits, '_', '.', '-' (got {name!r})")
    return name


def _check_keys(entry: dict, fail) -> None:
    """No key outside _REQUIRED and _OPTIONAL, and every required one."""
    unknown = sorted(set(entry) - _REQUIRED - _OPTIONAL)
    if unknown:
        allowed = ", ".join(sorted(_REQUIRED | _OPTIONAL))
        raise fail(unknown[0], f"unknown key (allowed: {allowed})")
    missing = sorted(_REQUIRED - set(entry))
    if missing:
        raise fail(missing[0], "missing")


def _parse_aliases(raw: Any, fail) -> tuple[str, ...]:
    if not _is_list_of(raw, str) or not all(_NAME.match(a) for a in raw):
        raise fail("aliases", "must be a list of names")
    return tuple(raw)


def _parse_sources(raw: Any, fail, path: Path, root: Path, name: str) -> tuple[Path, ...]:
    """The source files, resolved against the registry's folder (or, written flashcore:PATH, against the
    installed parts): inside the project (or the installed parts), CUDA/C++, existing."""
    if not _is_list_of(raw, str) or not raw:
        raise fail("sources", "must be a non-empty list of file paths")
    sources = []
    for s in raw:
        installed = s.startswith(INSTALLED_PREFIX)
        base, inside = (INSTALL_ROOT, INSTALL_ROOT.resolve()) if installed else (path.parent, root)
        p = _resolved(base / s.removeprefix(INSTALLED_PREFIX), f"variant '{name}': source '{s}'")
        if not p.is_relative_to(inside):
            raise fail("sources", f"'{s}' is outside {'the installed parts' if installed else 'the project'} ({inside})")
        if p.suffix not in _SOURCE_SUFFIXES:
            raise fail("sources", f"'{s}' is not a CUDA/C++ source ({', '.join(sorted(_SOURCE_SUFFIXES))})")
        if not p.is_file():
            raise fail("sources", f"file '{s}' does not exist")
        sources.append(p)
    return tuple(sources)


def _parse_flags(raw: Any, fail) -> tuple[str, ...]:
    if not _is_list_of(raw, str):
        raise fail("flags", "must be a list of strings (nvcc flags)")
    for f in raw:
        if f.startswith("-D"):
            raise fail("flags", f"'{f}': put macros under 'defines', so the cache key and the tuner see them")
    return tuple(raw)


def _parse_defines(raw: Any, fail) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise fail("defines", "must be a mapping NAME: value")
    defines: dict[str, str] = {}
    for k, val in raw.items():
        if not isinstance(k, str) or not _IDENT.match(k):
            raise fail("defines", f"'{k}' is not a C identifier")
        if isinstance(val, bool) or not isinstance(val, (int, float, str)):
            raise fail("defines", f"'{k}' must be a number or a string")
        defines[k] = str(val)
    return defines


def _parse_summary(raw: Any, fail) -> str:
    if not isinstance(raw, str) or not raw.strip() or "\n" in raw.strip():
        raise fail("summary", "must be a one-line string")
    return raw.strip()


def _parse_head_dims(raw: Any, fail) -> tuple[int, ...]:
    if not _is_list_of(raw, int) or not raw or any(isinstance(d, bool) or d <= 0 for d in raw):
        raise fail("head_dims", "must be a non-empty list of positive integers")
    if len(set(raw)) != len(raw):
        raise fail("head_dims", "lists a head dim twice")
    return tuple(raw)


def _parse_max_seq_len(raw: Any, fail) -> int | None:
    if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
        raise fail("max_seq_len", f"must be a positive integer (the most query rows the kernel takes), got {raw!r}")
    return raw


def _parse_archs(raw: Any, fail) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not _is_list_of(raw, str) or not raw:
        raise fail("archs", f"must be a non-empty list of archs, e.g. [sm_90a] (got {raw!r})")
    for arch in raw:
        if arch not in TARGETS:
            close = difflib.get_close_matches(arch, TARGETS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise fail("archs", f"unknown arch '{arch}' ({hint}known: {', '.join(TARGETS)})")
    if len(set(raw)) != len(raw):
        raise fail("archs", "lists an arch twice")
    return tuple(raw)


def _parse_names(raw: Any, fail, key: str, known, what: str, example: str) -> tuple[str, ...]:
    """A list of names out of `known`, each once (a registry key such as dtypes or features)."""
    if not _is_list_of(raw, str):
        raise fail(key, f"must be a list of {what}s, e.g. {example} (known: {', '.join(known)}; got {raw!r})")
    for name in raw:
        if name not in known:
            raise fail(key, f"unknown {what} '{name}' (known: {', '.join(known)})")
    if len(set(raw)) != len(raw):
        raise fail(key, f"lists a {what} twice")
    return tuple(raw)


def _parse_dtypes(raw: Any, fail) -> tuple[str, ...]:
    if raw is None:
        return DEFAULT_DTYPES
    if not _is_list_of(raw, str) or not raw:
        raise fail("dtypes", f"must be a non-empty list of element types, e.g. [fp16, bf16] (got {raw!r})")
    return _parse_names(raw, fail, "dtypes", DTYPES, "dtype", "[fp16, bf16]")


def _parse_features(raw: Any, fail) -> tuple[str, ...]:
    if raw is None:
        return ()
    features = _parse_names(raw, fail, "features", tuple(FEATURES), "feature", "[gqa, backward]")
    if "backward" in features and "lse" not in features:
        raise fail("features", "'backward' needs 'lse' too (the backward reads the forward's log-sum-exp)")
    return tuple(f for f in FEATURES if f in features)


def _parse_tune(raw: Any, fail) -> TuneSpace:
    if raw is None:
        return TuneSpace()
    if not isinstance(raw, dict) or not set(raw) <= {"params", "constraints"}:
        raise fail("tune", "must be a mapping with 'params' (NAME: [values]) and optional 'constraints' ([expr])")
    params_raw = raw.get("params", {})
    if not isinstance(params_raw, dict) or not params_raw:
        raise fail("tune", "'params' must be a non-empty mapping NAME: [integer values]")
    params: dict[str, list[int]] = {}
    for k, vals in params_raw.items():
        if not isinstance(k, str) or not _IDENT.match(k):
            raise fail("tune", f"parameter '{k}' is not a C identifier")
        if not _is_list_of(vals, int) or not vals or any(isinstance(x, bool) for x in vals):
            raise fail("tune", f"parameter '{k}' must list integer values")
        params[k] = list(vals)
    constraints = raw.get("constraints", [])
    if not _is_list_of(constraints, str):
        raise fail("tune", "'constraints' must be a list of expressions over the parameters")
    return TuneSpace(params=params, constraints=list(constraints))


def _is_list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(x, kind) for x in value)
