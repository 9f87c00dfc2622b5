"""`flashcore report`: the README's tables and docs/ladder.md's chart, generated from a checked-in run record.

A results file holds one GPU's bench records (docs/results/h200.json):
    {"kind": "flashcore-results", "gpu": "NVIDIA H200", "records": [<a `flashcore bench --json` record>, ...]}
`flashcore report merge A.json B.json ... -o FILE` writes it from several bench records (several shapes,
causal and not, each of one or several modes); a bench record on its own is read as a results file of one.

`flashcore report readme FILE` rewrites what lies between markers, and nothing else:
    README.md         <!-- results:bench 1,8,512,64 [causal] [MODE] [DTYPE] [PASS] -->  that run's table, as bench prints it
                      <!-- results:modes 1,8,512,64 [causal] [DTYPE] [PASS] -->         every row's median in each mode
                      <!-- results:summary [MODE] [DTYPE] [PASS] -->                    per shape: SDPA default, the fastest variant
                      ...
                      <!-- /results -->
    docs/ladder.md    <!-- ladder-chart [MODE] [DTYPE] --> ... <!-- /ladder-chart -->
                      the chart (a PNG beside the results file, drawn with matplotlib) and the same figures as a table
MODE defaults to cold, DTYPE to fp16 and PASS (fwd, bwd, fwd+bwd) to fwd, the bench's defaults. `--check` writes nothing and exits 1 when a region differs from
what the results file gives (or the chart's PNG is missing), so CI can hold the README to its record.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.core.dtypes import DEFAULT_DTYPE, DTYPES
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.passes import DEFAULT_PASS, PASSES
from flashcore_cli.core.records import output_file, write_output
from flashcore_cli.core.statuses import OK
from flashcore_cli.report.compare import (  # the records' kinds and defaults, and reading a record's sections
    BENCH_KIND,
    DEFAULT_MODE,
    RESULTS_KIND,
    Section,
    read_json_record,
    sections_of,
)

SDPA_DEFAULT = "sdpa"
OPEN = re.compile(r"^<!-- results:(?P<spec>.*?) -->$")
CLOSE = "<!-- /results -->"
LADDER_OPEN = re.compile(r"^<!-- ladder-chart(?P<spec>.*?) -->$")
LADDER_CLOSE = "<!-- /ladder-chart -->"


# ---------------------------------------------------------------- reading and merging
def bench_records(path: Path) -> list[dict]:
    """The bench records a file holds: a results file's, or the file itself when it is one bench record."""
    data = read_json_record(path)  # one line for a missing file, a folder, an unreadable file, not JSON
    if isinstance(data, dict) and data.get("kind") == RESULTS_KIND:
        records = data.get("records")
        if not isinstance(records, list) or not records:
            raise FlashcoreError(f"{path}: 'records' must be a non-empty list of bench records")
    elif isinstance(data, dict) and data.get("kind") == BENCH_KIND:
        records = [data]
    else:
        raise FlashcoreError(
            f"{path}: neither a bench record (`flashcore bench --json`) nor a results file (`flashcore report merge`)"
        )
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or record.get("kind") != BENCH_KIND:
            raise FlashcoreError(f"{path}: record {number} is not a bench record (kind {BENCH_KIND!r})")
    return records


def load_results(path: str | Path) -> list[Section]:
    path = Path(path)
    sections: list[Section] = []
    for number, record in enumerate(bench_records(path), 1):
        sections += sections_of(record, f"{path}: record {number}")
    seen: set[tuple] = set()
    for s in sections:
        if s.key in seen:
            raise FlashcoreError(f"{path} holds {s.case} in {s.mode} mode twice: keep one run of each")
        seen.add(s.key)
    return sections


def merge(paths: list[str], out: str) -> dict:
    """One results file from bench records (or other results files): one GPU, each case and mode once."""
    if not paths:
        raise FlashcoreError("give the bench records to merge (files written by `flashcore bench --json`)")
    output_file(out, "--out")  # a folder or an unwritable path: refused before the records are read
    records: list[dict] = []
    origin: dict[tuple, str] = {}
    gpus: dict[str, str] = {}
    for text in paths:
        path = Path(text)
        for number, record in enumerate(bench_records(path), 1):
            where = f"{path}: record {number}"
            for s in sections_of(record, where):
                if s.key in origin:
                    raise FlashcoreError(f"{s.case} in {s.mode} mode is in both {origin[s.key]} and {path}: merge one run of each")
                origin[s.key] = str(path)
            gpu = (record.get("environment") or {}).get("gpu") or "an unnamed GPU"
            gpus.setdefault(gpu, str(path))
            records.append(record)
    if len(gpus) > 1:
        named = "; ".join(f"{gpu} ({path})" for gpu, path in gpus.items())
        raise FlashcoreError(f"the records come from different GPUs: {named}; a results file holds one GPU's runs")
    results = {"kind": RESULTS_KIND, "gpu": next(iter(gpus)), "records": records}
    write_output(out, dump(results), "--out")
    return results


def dump(results: dict) -> str:
    """Indented JSON with each list of numbers (a row's samples) on one line, so the file diffs by row."""
    text = json.dumps(results, indent=1, default=str)
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    return re.sub(rf"\[\s*({number}(?:,\s*{number})*)\s*\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text) + "\n"


# ---------------------------------------------------------------- the tables
def us(value: float) -> str:
    return f"{value:.0f}" if value >= 1000 else f"{value:.1f}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(map(cell, r)) + " |" for r in rows]


def environment_line(env: dict) -> str:
    return f"{env.get('gpu', 'GPU ?')} (torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, driver {env.get('driver', '?')})"


def command(s: Section) -> str:
    mode = "" if s.mode == DEFAULT_MODE else f" --mode {s.mode}"
    dtype = "" if s.dtype == DEFAULT_DTYPE else f" --dtype {s.dtype}"
    passes = "" if s.passes == DEFAULT_PASS else f" --pass {s.passes}"
    variants = [r.get("name") for r in s.rows if r.get("kind") == "variant"]
    which = " ".join(variants) if 0 < len(variants) < 6 else "--all"  # a run of a few variants names them
    return f"flashcore bench {which} --shape {s.shape}{' --causal' if s.causal else ''}{mode}{dtype}{passes}"


def how(s: Section) -> str:
    """How the section was timed: its mode, its dtype when not fp16, its pass when not the forward."""
    return (f"{s.mode} mode" + ("" if s.dtype == DEFAULT_DTYPE else f", {s.dtype}")
            + ("" if s.passes == DEFAULT_PASS else f", {s.passes}"))  # fmt: skip


def speedup(row: dict) -> str:
    return f"{row['speedup_vs_sdpa']:.2f}x" if row.get("speedup_vs_sdpa") else "-"


def bench_table(s: Section, source: str) -> list[str]:
    rows = []
    for r in s.rows:
        if r.get("median_us"):
            rows.append([r["name"], r.get("status", OK), us(r["median_us"]), f"{us(r['p10_us'])}-{us(r['p90_us'])}",
                         f"{r.get('tflops', 0):.1f}", speedup(r), r.get("kind", "")])  # fmt: skip
        else:
            rows.append([r["name"], r.get("status", "?"), "-", "-", "-", "-", (r.get("detail") or "").strip().split("\n")[0][:100]])
    return [
        f"`{command(s)}` on {environment_line(s.environment)}, {how(s)} (from `{source}`):",
        "",
        *table(["name", "status", "median us", "p10-p90 us", "TFLOP/s", "vs SDPA", "note"], rows, right={2, 3, 4, 5}),
        "",
        "vs SDPA: SDPA default's median / this row's median in the same run and mode (above 1: faster than SDPA).",
    ]


def modes_table(sections: list[Section], source: str) -> list[str]:
    names = list(dict.fromkeys(r["name"] for s in sections for r in s.rows))
    rows = []
    for name in names:
        cells = [name]
        for s in sections:
            r = s.row(name) or {}
            cells.append(f"{us(r['median_us'])} ({speedup(r)})" if r.get("median_us") else r.get("status", "-"))
        rows.append(cells)
    head = sections[0]
    return [
        f"{head.case} on {environment_line(head.environment)}, median us (vs SDPA default in the same mode), from `{source}`:",
        "",
        *table(["name", *(f"{s.mode} mode" for s in sections)], rows, right=set(range(1, len(sections) + 1))),
    ]


def fastest(s: Section, kind: str) -> dict | None:
    timed = [r for r in s.rows if r.get("kind") == kind and r.get("median_us")]
    return min(timed, key=lambda r: r["median_us"]) if timed else None


def summary_table(sections: list[Section], source: str) -> list[str]:
    rows = []
    for s in sections:
        sdpa, best = s.row(SDPA_DEFAULT) or {}, fastest(s, "variant")
        rows.append([
            s.shape, "yes" if s.causal else "no",
            f"{us(sdpa['median_us'])} us, {sdpa['tflops']:.1f} TFLOP/s" if sdpa.get("median_us") else sdpa.get("status", "-"),
            best["name"] if best else "-",
            f"{us(best['median_us'])} us, {best['tflops']:.1f} TFLOP/s" if best else "-",
            speedup(best) if best else "-",
        ])  # fmt: skip
    env = sections[0].environment
    return [
        f"`flashcore bench --all` on {environment_line(env)}, {how(sections[0])}, one run per shape (from `{source}`):",
        "",
        *table(["shape", "causal", "SDPA default", "fastest variant", "its time", "vs SDPA"], rows, right={5}),
    ]


def inference_table(sections: list[Section], source: str) -> list[str]:
    """Grouped-query and uneven shapes: SDPA's backends and the fastest variant, time and K/V-bound GB/s."""
    rows = []
    for s in sections:
        cudnn, flash, best = s.row("sdpa-cudnn") or {}, s.row("sdpa-flash") or {}, fastest(s, "variant")
        gbps = lambda r: f", {r['roofline']['gbps']:.0f} GB/s" if r.get("roofline") else ""  # noqa: E731
        time = lambda r: f"{us(r['median_us'])} us{gbps(r)}" if r.get("median_us") else r.get("status", "-")  # noqa: E731
        vs = f"{cudnn['median_us'] / best['median_us']:.2f}x" if best and cudnn.get("median_us") else "-"
        rows.append([s.shape, "yes" if s.causal else "no", time(cudnn), time(flash), best["name"] if best else "-",
                     time(best) if best else "-", vs])  # fmt: skip
    if not sections:
        return ["(the results file holds no grouped-query or uneven shape)"]
    env = sections[0].environment
    return [
        f"`flashcore bench` on {environment_line(env)}, {how(sections[0])}, one run per shape; GB/s: Q, K, V read and O "
        f"written once, per second (from `{source}`):",
        "",
        *table(["B,Hq:Hkv,Sq:Sk,D", "causal", "SDPA cuDNN", "SDPA flash (FA2)", "fastest variant", "its time", "vs cuDNN"],
               rows, right={6}),  # fmt: skip
    ]


def ladder_table(sections: list[Section]) -> list[str]:
    names = list(dict.fromkeys(r["name"] for s in sections for r in s.rows if r.get("kind") == "variant"))
    refs = list(dict.fromkeys(r["name"] for s in sections for r in s.rows if r.get("kind") == "reference"))
    rows = []
    for name in [*names, *refs]:
        cells = [name if name in names else f"{name} (reference)"]
        for s in sections:
            r = s.row(name) or {}
            cells.append(f"{us(r['median_us'])} us, {r['tflops']:.1f} TFLOP/s ({speedup(r)})" if r.get("median_us") else r.get("status", "-"))
        rows.append(cells)
    return table(["rung", *(s.case for s in sections)], rows, right=set(range(1, len(sections) + 1)))


# ---------------------------------------------------------------- markers
@dataclass
class Region:
    file: Path
    line: int  # 1-based line of the opening marker
    spec: str
    start: int  # index of the first line inside the region
    end: int  # index of the closing marker


def regions(path: Path, lines: list[str], opener: re.Pattern, closer: str) -> list[Region]:
    found, open_at = [], None
    for i, line in enumerate(lines):
        text = line.strip()
        m = opener.match(text)
        if m:
            if open_at is not None:
                raise FlashcoreError(f"{path}:{i + 1}: a marker opens before the one at line {open_at[0] + 1} is closed with {closer}")
            open_at = (i, m.group("spec").strip())
        elif text == closer:
            if open_at is None:
                raise FlashcoreError(f"{path}:{i + 1}: {closer} closes no marker")
            found.append(Region(path, open_at[0] + 1, open_at[1], open_at[0] + 1, i))
            open_at = None
    if open_at is not None:
        raise FlashcoreError(f"{path}:{open_at[0] + 1}: the marker is never closed with {closer}")
    return found


@dataclass
class Ask:
    """What a marker asks for: 'bench 1,8,512,64 causal graph bf16'."""

    kind: str
    shape: str | None = None
    causal: bool = False
    mode: str = DEFAULT_MODE
    dtype: str = DEFAULT_DTYPE
    passes: str = DEFAULT_PASS


def parse_spec(region: Region, kinds: set[str]) -> Ask:
    words = region.spec.split()
    if not words or words[0] not in kinds:
        raise FlashcoreError(f"{region.file}:{region.line}: <!-- results:{region.spec} --> is not one of: {', '.join(sorted(kinds))}")
    ask = Ask(words[0])
    for word in words[1:]:
        if "," in word:
            ask.shape = word
        elif word == "causal":
            ask.causal = True
        elif word in DTYPES:
            ask.dtype = word
        elif word in PASSES:
            ask.passes = word
        else:
            ask.mode = word
    return ask


def pick(sections: list[Section], where: str, ask: Ask, every_mode: bool = False) -> list[Section]:
    """The sections an Ask names: one case (with a shape) or every case (without), in one mode or every mode."""
    chosen = [s for s in sections if s.dtype == ask.dtype and s.passes == ask.passes and (every_mode or s.mode == ask.mode)
              and (ask.shape is None or (s.shape, s.causal) == (ask.shape, ask.causal))]  # fmt: skip
    if not chosen:
        held = ", ".join(f"{s.case} {s.mode}" for s in sections)
        asked = " ".join(x for x in (ask.shape, "causal" if ask.causal and ask.shape else None,
                                     None if every_mode else ask.mode, None if ask.dtype == DEFAULT_DTYPE else ask.dtype) if x)  # fmt: skip
        raise FlashcoreError(f"{where}: the results file holds no {asked} run (it holds: {held})")
    return sorted(chosen, key=order) if ask.shape is None else chosen


def order(s: Section) -> tuple:
    """Shapes from short to long sequences, then by size; non-causal before causal."""
    from flashcore_cli.registry.shapes import parse_shape

    shape = parse_shape(s.shape)
    return shape.seq_len, shape.seq_len_kv, shape.batch * shape.heads, shape.head_dim, s.causal


def grouped_or_uneven(s: Section) -> bool:
    """A B,Hq:Hkv,Sq:Sk,D shape (inference: decode, chunked prefill), not the B,H,S,D ladder's."""
    return ":" in s.shape


def render_results(region: Region, sections: list[Section], source: str) -> list[str]:
    ask = parse_spec(region, {"bench", "modes", "summary", "inference"})
    where = f"{region.file}:{region.line}"
    if ask.kind == "summary":
        return summary_table([s for s in pick(sections, where, ask) if not grouped_or_uneven(s)], source)
    if ask.kind == "inference":
        return inference_table([s for s in pick(sections, where, ask) if grouped_or_uneven(s)], source)
    if ask.shape is None:
        raise FlashcoreError(f"{where}: <!-- results:{region.spec} --> names no shape (B,H,S,D)")
    if ask.kind == "modes":
        return modes_table(pick(sections, where, ask, every_mode=True), source)
    return bench_table(pick(sections, where, ask)[0], source)


def rewrite(path: Path, opener: re.Pattern, closer: str, render) -> tuple[str, str, list[Region]]:
    """The file's text and its text with every region re-rendered; and the regions that changed."""
    if not path.is_file():
        raise FlashcoreError(f"{path}: no such file")
    try:
        old = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FlashcoreError(f"{path} is not UTF-8 text (byte {exc.start}): give the Markdown file with the markers") from None
    except OSError as exc:
        raise FlashcoreError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    lines = old.split("\n")
    found = regions(path, lines, opener, closer)
    if not found:
        raise FlashcoreError(f"{path} has no {closer.replace('/', '')} markers: nothing to generate there")
    out, changed, at = [], [], 0
    for region in found:
        body = render(region)
        out += lines[at : region.start] + body
        if lines[region.start : region.end] != body:
            changed.append(region)
        at = region.end
    out += lines[at:]
    return old, "\n".join(out), changed


# ---------------------------------------------------------------- the chart
def chart_path(results_path: Path) -> Path:
    return results_path.with_name(results_path.stem + "-ladder.png")


def draw_ladder(sections: list[Section], path: Path) -> bool:
    """Each rung's speed against SDPA default (same run, same mode), one bar per case; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["name"] for s in sections for r in s.rows if r.get("kind") == "variant"))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.9 * len(names)), 4.6))
    width = 0.8 / len(sections)
    for i, s in enumerate(sections):
        xs, ys = [], []
        for j, name in enumerate(names):
            r = s.row(name) or {}
            if r.get("speedup_vs_sdpa"):
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(r["speedup_vs_sdpa"])
        ax.bar(xs, ys, width, label=s.case)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="SDPA default")
    ax.set_yscale("log", base=2)
    never_timed = {n: next((s.row(n) or {}).get("status", "-") for s in sections) for n in names
                   if not any((s.row(n) or {}).get("speedup_vs_sdpa") for s in sections)}  # fmt: skip
    ax.set_xticks(range(len(names)), [f"{n}\n({never_timed[n]})" if n in never_timed else n for n in names])
    ax.set_ylabel("speed vs SDPA default (its median / the rung's)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x" if v >= 1 else f"1/{1 / v:g}x"))
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{sections[0].environment.get('gpu', 'GPU ?')}, {how(sections[0])}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return True


def ladder_sections(region: Region, sections: list[Section]) -> list[Section]:
    """The sections a ladder-chart marker asks for: every case of its mode and dtype (default cold, fp16)."""
    ask = parse_spec(Region(region.file, region.line, "ladder " + region.spec, region.start, region.end), {"ladder"})
    if ask.shape or ask.causal:
        raise FlashcoreError(f"{region.file}:{region.line}: <!-- ladder-chart{region.spec} --> takes a mode and a dtype, no shape")
    return [s for s in pick(sections, f"{region.file}:{region.line}", ask) if not grouped_or_uneven(s)]


def render_ladder(region: Region, chosen: list[Section], source: str, png: Path) -> list[str]:
    link = Path(os.path.relpath(png, region.file.parent)).as_posix()
    return [
        f"![each rung's speed against SDPA default, {how(chosen[0])}]({link})",
        "",
        f"`flashcore bench --all` on {environment_line(chosen[0].environment)}, {how(chosen[0])}, one run per shape "
        f"(from `{source}`; drawn by `flashcore report readme`): median, TFLOP/s and speed against SDPA default in the same run.",
        "",
        *ladder_table(chosen),
    ]


# ---------------------------------------------------------------- what `flashcore report` does
@dataclass
class DocsUpdate:
    """What update_docs found and did: the results file as the tables name it, the files it read, the regions
    out of date (and, under check, a missing chart), the chart's path and whether it was drawn (None: check)."""

    source: str
    files: list[Path]
    stale: list[str]
    png: Path
    drawn: bool | None = None


def update_docs(results_text: str, readme_text: str, ladder_text: str, check: bool) -> DocsUpdate:
    """Regenerate the README's tables and the ladder's chart from a results file; under check, write nothing."""
    results_path = Path(results_text)
    sections = load_results(results_path)
    source = Path(os.path.relpath(results_path.resolve())).as_posix()  # as the tables name it, however it was typed
    if source.startswith("../"):
        source = results_path.resolve().as_posix()
    png = chart_path(results_path)
    charted: list[list[Section]] = []  # what each ladder-chart marker asked for: the PNG draws the first

    def ladder(region: Region) -> list[str]:
        charted.append(ladder_sections(region, sections))
        return render_ladder(region, charted[-1], source, png)

    files = [
        (Path(readme_text), OPEN, CLOSE, lambda region: render_results(region, sections, source)),
        (Path(ladder_text), LADDER_OPEN, LADDER_CLOSE, ladder),
    ]
    rewritten = [(path, *rewrite(path, opener, closer, render)) for path, opener, closer, render in files]
    stale = [f"{r.file}:{r.line} ({r.spec or 'ladder chart'})" for _, _, _, changed in rewritten for r in changed]
    update = DocsUpdate(source, [path for path, *_ in rewritten], stale, png)
    if check:
        if not png.is_file():
            stale.append(f"{png} (the chart is missing)")
        return update
    for path, old, new, _ in rewritten:
        if new != old:
            path.write_text(new)
    update.drawn = draw_ladder(charted[0], png)
    return update
