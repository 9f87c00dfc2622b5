"""`flashcore new NAME --from v8`: a new rung that builds and passes `flashcore test` at once.

The source variant's kernel file is copied to kernels/NAME.cu under a fresh header (the rung's story, to be
written: idea, change from the previous rung, ptxas, measured), with its __global__ kernels renamed
(v8_fwd -> NAME_fwd, everywhere in the file, so flashcore_plan's kernel name strings follow), so that the
copy's kernels are told apart from the original's in ptxas, sass and ncu output. A variant of several
translation units (v11: its bf16 half, D=128 kernels and backward beside v11.cu) has only the one that defines
flashcore_plan copied; the copy's entry lists the others after it, shared as they are, so it links. A registry
entry is appended to variants.yaml as text, so the file's comments and layout stay as they are.

The entry carries every key of the source's entry that defines what the variant is and how it is built
(flags, defines, head_dims, causal, archs, dtypes, features, tune, and any key added later), copied from
the registry file itself; only what names or describes it is new (name, sources, summary, notes; aliases are
not copied, they belong to the original). A copy of v12 without its `archs: [sm_90a]` would build for plain
sm_90 with its body compiled out, and every command would still exit 0: after writing, the new entry is
loaded back and compared with the source's, key by key, and a difference undoes the scaffold.

The copy goes beside the original's file and its entry into the registry the command resolved (--registry,
$FLASHCORE_REGISTRY, a variants.yaml in the current folder or a parent): run in a copy of the project, `new`
writes into the copy. Where none is found (a kernel author's own folder, flashcore installed from a wheel),
`new` never writes into the installed parts: it starts ./variants.yaml with the one entry and ./kernels/NAME.cu,
and the files the copy shares are named flashcore:PATH, the installed parts' own. The "next:" hint it prints
names --registry when the registry would not be found from here.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.errors import FlashcoreError

_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
MAX_NAME = 64  # a variant's name becomes a file name (kernels/NAME.cu) and the prefix of its kernels' names
# The keys of an entry that name or describe a variant; every other key defines it, and is carried by `new`.
_NOT_CARRIED = {"name", "aliases", "sources", "summary", "notes"}
_SKIPPED_BEFORE_NAME = {"void", "static", "inline", "__forceinline__", "__noinline__", "extern"}

HEADER = """\
// {name}.cu — (one line: what this rung is).
//
// Idea: (two or three sentences: what this rung does, and why it should beat {src}).
//
// Change from the previous rung ({src}): (what changed, with the number that motivated it).
//
// Run:  flashcore test {name} && flashcore bench {name} --shape 1,8,512,64
//
// ptxas: (from `flashcore ptxas {name} --arch sm_89,sm_90`)
// Measured: (from `flashcore bench {name}`, losses included)
//
// Scaffolded by `flashcore new {name} --from {src}`: until the lines above are written, this is {src}
// {renames}.
"""


_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)


def code_only(source: str) -> str:
    """The source with comments and string literals blanked (same length), so prose is never read as code."""
    return _COMMENT_OR_STRING.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), source)


def global_kernel_names(source: str) -> list[str]:
    """Names of the __global__ functions defined or declared in a CUDA source, in order of appearance."""
    source = code_only(source)
    names: list[str] = []
    for m in re.finditer(r"\b__global__\b", source):
        pos = m.end()
        while True:
            ws = re.match(r"\s+", source[pos:])
            pos += ws.end() if ws else 0
            if source.startswith("__launch_bounds__", pos):
                pos = _skip_parens(source, source.index("(", pos))
                continue
            word = re.match(r"[A-Za-z_]\w*", source[pos:])
            if not word:
                break
            pos += word.end()
            if word.group() in _SKIPPED_BEFORE_NAME:
                continue
            if re.match(r"\s*\(", source[pos:]) and word.group() not in names:
                names.append(word.group())
            break
    return names


def _skip_parens(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise FlashcoreError("unbalanced parentheses after __launch_bounds__")


def renamed(kernel: str, old: str, new: str) -> str:
    """v8_fwd -> mine_fwd when the kernel carries the old variant's name first; else mine_<kernel>."""
    if kernel == old or kernel.startswith(old + "_"):
        return new + kernel[len(old) :]
    return f"{new}_{kernel}"


def strip_header(source: str) -> str:
    """The source without its leading comment block (the old rung's story)."""
    lines = source.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].lstrip().startswith("//") or not lines[i].strip()):
        i += 1
    return "".join(lines[i:])


def scaffold_source(source: str, new: str, old: str) -> tuple[str, dict[str, str]]:
    """The copy with a fresh header and the kernels the source defines renamed. A rung composed of parts (its
    kernels defined in the kernels/*.cuh it includes, as v12's) is copied as it is: its plan names the parts'
    kernels, and a copy that wants kernels of its own copies the part it changes."""
    kernels = global_kernel_names(source)
    renames = {k: renamed(k, _identifier(old), new) for k in kernels}
    body = strip_header(source)
    for k, n in renames.items():
        body = re.sub(rf"\b{re.escape(k)}\b", n, body)
    said = (f"with its kernels renamed ({', '.join(f'{k} -> {n}' for k, n in renames.items())})" if renames else
            "as it is: its kernels are defined in the parts it includes (kernels/*.cuh)")  # fmt: skip
    header = HEADER.format(name=new, src=old, renames=said)
    return header + body, renames


def registry_entry(text: str, name: str, sources: list[str], variant, raw: dict | None = None) -> str:
    """The YAML of the new entry, indented like the file's first entry: its sources (the copy, then the files it
    shares with `variant`), then the source entry's defining keys (`raw`, as the registry file has them; else
    rebuilt from `variant`), in its order, in flow style."""
    import json

    m = re.search(r"^([ \t]*)-[ \t]+name:", text, re.MULTILINE)
    dash = m.group(1) if m else "  "
    key = dash + "  "
    carried = {k: v for k, v in (raw if raw is not None else _entry_of(variant)).items() if k not in _NOT_CARRIED}
    lines = [
        f"{dash}- name: {name}",
        f"{key}sources: [{', '.join(sources)}]",
        f'{key}summary: "Copy of {variant.name}, scaffolded by flashcore new: replace with the idea in one line"',
    ]
    for k, value in carried.items():
        if k == "tune" and isinstance(value, dict):  # a block, one constraint a line, as the registry writes it
            lines.append(f"{key}tune:")
            for part, content in value.items():
                if part == "constraints" and isinstance(content, list):
                    lines += [f"{key}  constraints:", *(f"{key}    - {json.dumps(c)}" for c in content)]
                else:
                    lines.append(f"{key}  {part}: {_flow(content)}")
        else:
            lines.append(f"{key}{k}: {_flow(value)}")
    lines.append(f'{key}notes: "Scaffolded from {variant.name} by `flashcore new {name} --from {variant.name}`."')
    return "\n".join(lines) + "\n"


def _flow(value) -> str:
    """One YAML value on one line: [sm_90a], {NAME: 1}; a scalar as JSON (true, 64, "text"), which YAML reads
    back the same."""
    import json

    import yaml

    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf"), sort_keys=False).strip()
    return json.dumps(value)


def _entry_of(variant) -> dict:
    """A variant's defining keys as the registry spells them (for a variant with no raw entry at hand)."""
    entry: dict = {"head_dims": list(variant.head_dims), "causal": variant.causal}
    if variant.flags:
        entry["flags"] = list(variant.flags)
    if variant.defines:
        entry["defines"] = dict(variant.defines)
    if variant.archs:
        entry["archs"] = list(variant.archs)
    if tuple(variant.dtypes) != (DEFAULT_DTYPE,):
        entry["dtypes"] = list(variant.dtypes)
    if variant.features:
        entry["features"] = list(variant.features)
    if variant.tune.params:
        entry["tune"] = {"params": variant.tune.params, **({"constraints": variant.tune.constraints} if variant.tune.constraints else {})}
    return entry


def raw_entry(registry_text: str, name: str) -> dict | None:
    """The source variant's entry as the registry file writes it (its keys, in order)."""
    import yaml

    data = yaml.safe_load(registry_text)
    for entry in (data or {}).get("variants", []):
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def differences(copy, original) -> list[str]:
    """The defining fields of two variants that differ (every dataclass field but the naming ones)."""
    from dataclasses import fields

    naming = {"name", "aliases", "sources", "summary", "notes", "root"}
    names = [f.name for f in fields(original) if f.name not in naming]
    return [n for n in names if getattr(copy, n) != getattr(original, n)]


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name)


def plan_source(variant) -> Path:
    """The .cu of the variant that implements the kernel contract (defines flashcore_plan)."""
    for s in variant.sources:
        if s.suffix == ".cu" and "flashcore_plan" in s.read_text(errors="replace"):
            return s
    raise FlashcoreError(f"{variant.name}: none of its .cu sources defines flashcore_plan; nothing to copy")


def read_source(path: Path) -> str:
    """A kernel source as UTF-8 text, or one FlashcoreError naming the file and the byte."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FlashcoreError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); save it as UTF-8 to copy it") from None
    except OSError as exc:
        raise FlashcoreError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def scaffold(registry_path, name: str, source_name: str) -> tuple[Path, Path, list[Path], dict[str, str]]:
    from flashcore_cli.registry.variants import load_registry, resolve_registry

    choice = resolve_registry(registry_path)
    reg = load_registry(choice.path)
    if len(name) > MAX_NAME:
        raise FlashcoreError(f"a variant's name is at most {MAX_NAME} characters ('{name[:20]}...' has {len(name)}): "
                             "it names kernels/NAME.cu and its kernels")  # fmt: skip
    if not _IDENTIFIER.match(name):
        raise FlashcoreError(f"'{name}' cannot name a variant's kernels: use letters, digits and '_', starting with a letter")
    taken = {label for v in reg.variants for label in (v.name, *v.aliases)}
    if name in taken:
        raise FlashcoreError(f"a variant named '{name}' is already registered in {reg.path}")
    src = reg.get(source_name)
    original = plan_source(src)
    text, renames = scaffold_source(read_source(original), name, src.name)
    shared = shared_sources(src, original)
    source_text = reg.path.read_text(encoding="utf-8")
    raw = raw_entry(source_text, src.name)
    if choice.source == "installed":  # nothing found from here: a registry of the author's own, in this folder
        target, registry, registry_text = _own_folder(name)
        sources = [f"kernels/{name}.cu", *(_installed_source(p) for p in shared)]
    else:  # the copy goes beside the original, its entry into the same registry
        target, registry, registry_text = original.with_name(f"{name}.cu"), reg.path, source_text
        sources = [Path(os.path.relpath(path, reg.path.parent)).as_posix() for path in (target, *shared)]
    if target.exists():
        raise FlashcoreError(f"{target} already exists; pick another name or remove it")
    entry = registry_entry(source_text, name, sources, src, raw)
    _write_and_check(target, text, registry, registry_text, entry, name, src)
    return target, registry, shared, renames


OWN_REGISTRY_HEADER = """\
# A kernel author's own flashcore registry (written by `flashcore new`): its variants build against the
# installed flashcore's parts. A source written flashcore:PATH is a file of the installed parts
# (`flashcore list` in the flashcore checkout shows the shipped variants); every other path is relative to
# this file. The keys are those of the shipped registry: see its header.
variants:
"""


def _own_folder(name: str) -> tuple[Path, Path, str]:
    """The copy's file and a new registry in the current folder, for `new` run where no registry is found."""
    from flashcore_cli.registry.variants import REGISTRY_FILE

    here = Path.cwd()
    return here / "kernels" / f"{name}.cu", here / REGISTRY_FILE, ""


def shared_label(path: Path, registry: Path) -> str:
    """How the registry names a shared source: relative to it, or flashcore:PATH for one of the installed parts."""
    return os.path.relpath(path, registry.parent) if path.is_relative_to(registry.parent) else _installed_source(path)


def _installed_source(path: Path) -> str:
    from flashcore_cli.core.paths import INSTALL_ROOT
    from flashcore_cli.registry.variants import INSTALLED_PREFIX

    return INSTALLED_PREFIX + path.resolve().relative_to(INSTALL_ROOT.resolve()).as_posix()


def _write_and_check(target: Path, text: str, registry: Path, registry_text: str, entry: str, name: str, src) -> None:
    """Writes the copy and the registry with its new entry, loads the entry back and compares it with the
    source's, key by key; any failure leaves the folder as it was."""
    from flashcore_cli.registry.variants import load_registry

    made = [d for d in (target.parent,) if not d.exists()]
    new_text = (registry_text.rstrip("\n") + "\n\n" + entry) if registry_text else OWN_REGISTRY_HEADER + entry
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise FlashcoreError(f"cannot write {target} ({exc.strerror or exc})") from None

    def undo() -> None:
        if registry_text:
            registry.write_text(registry_text, encoding="utf-8")
        else:
            registry.unlink(missing_ok=True)
        target.unlink(missing_ok=True)
        for d in made:
            d.rmdir()

    try:
        registry.write_text(new_text, encoding="utf-8")
    except OSError as exc:
        undo()
        raise FlashcoreError(f"cannot write {registry} ({exc.strerror or exc}); nothing was changed") from None
    try:
        lost = differences(load_registry(registry).get(name), src)
        if lost:
            raise FlashcoreError(f"the copy's {', '.join(lost)} would differ from {src.name}'s")
    except FlashcoreError as exc:  # leave the folder as it was
        undo()
        raise FlashcoreError(f"the new entry did not validate, nothing was changed: {exc}") from None


def shared_sources(variant, copied: Path) -> list[Path]:
    """The variant's other sources, which the copy lists after its own file and shares as they are: the
    translation units that define what the copied one calls (v11.cu's bf16 half, D=128 kernels and backward)."""
    return [s for s in variant.sources if s.resolve() != copied.resolve()]


def registry_flag(registry: Path, cwd: Path | None = None) -> str:
    """'' when a command run from `cwd` finds `registry` by itself; else the --registry option that names it
    (relative to cwd when inside it), so a printed command works as printed."""
    from flashcore_cli.registry.variants import resolve_registry

    cwd = (cwd or Path.cwd()).resolve()
    registry = registry.resolve()
    if resolve_registry(None, cwd=cwd).path.resolve() == registry:
        return ""
    shown = os.path.relpath(registry, cwd) if registry.is_relative_to(cwd) else str(registry)
    return f"--registry {shlex.quote(shown)} "
