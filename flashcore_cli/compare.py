"""`flashcore compare A.json B.json`: is B faster, slower or the same as A, row by row, with a noise-aware rule.

Rows are matched by name and case (shape and causal; a bench record's rows share the record's case). For a
row timed in both runs:
    same    when |median_B - median_A| <= the larger of the two runs' half p10-p90 spreads
            (a difference inside a run's own spread is not a measured difference);
    faster / slower otherwise, with the ratio of the medians.
A row is a regression when it is slower beyond that spread AND by more than --threshold (default 5%), or
when it was OK in A and is not in B (a variant that broke). Any regression makes the exit code 1, so the
command can gate CI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.errors import FlashcoreError

DEFAULT_THRESHOLD = 0.05


@dataclass
class Verdict:
    word: str  # "same", "faster", "slower", "broken", "fixed", "not timed"
    ratio: float | None = None  # median_A / median_B: above 1 means B is faster
    regression: bool = False

    def text(self) -> str:
        if self.word in ("faster", "slower") and self.ratio:
            factor = self.ratio if self.word == "faster" else 1 / self.ratio
            return f"{factor:.2f}x {self.word}" + (" (REGRESSION)" if self.regression else "")
        return self.word + (" (REGRESSION)" if self.regression else "")


def half_spread(row: dict) -> float:
    return (row["p90_us"] - row["p10_us"]) / 2


def timing_verdict(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """The rule on two timed rows (median_us, p10_us, p90_us)."""
    ma, mb = a["median_us"], b["median_us"]
    ratio = ma / mb
    if abs(mb - ma) <= max(half_spread(a), half_spread(b)):
        return Verdict("same", ratio)
    if mb < ma:
        return Verdict("faster", ratio)
    return Verdict("slower", ratio, regression=mb / ma - 1 > threshold)


def row_verdict(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    timed_a, timed_b = bool(a.get("median_us")), bool(b.get("median_us"))
    if timed_a and timed_b:
        return timing_verdict(a, b, threshold)
    if a.get("status") == "OK" and b.get("status") != "OK":
        return Verdict("broken", regression=True)
    if b.get("status") == "OK" and a.get("status") != "OK":
        return Verdict("fixed")
    return Verdict("not timed")


def load_record(path: str | Path) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise FlashcoreError(f"{path}: no such record") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashcoreError(f"{path}: not a JSON record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
        raise FlashcoreError(f"{path}: not a bench or sweep record (it has no 'rows'); `flashcore bench` and `flashcore sweep` write them")
    return record


def row_key(record: dict, row: dict) -> tuple[str, str, bool]:
    return row["name"], str(row.get("shape", record.get("shape", "?"))), bool(row.get("causal", record.get("causal", False)))


def keyed_rows(record: dict) -> dict[tuple, dict]:
    return {row_key(record, r): r for r in record["rows"]}


def warnings_for(a: dict, b: dict) -> list[str]:
    """What makes the two runs not like for like."""
    notes = []
    gpu_a, gpu_b = a.get("environment", {}).get("gpu"), b.get("environment", {}).get("gpu")
    if gpu_a and gpu_b and gpu_a != gpu_b:
        notes.append(f"the runs are on different GPUs (A: {gpu_a}, B: {gpu_b}): differences include the hardware")
    for field in ("torch", "cuda", "driver"):
        va, vb = a.get("environment", {}).get(field), b.get("environment", {}).get(field)
        if va and vb and va != vb:
            notes.append(f"{field} differs (A: {va}, B: {vb})")
    cases_a = {k[1:] for k in keyed_rows(a)}
    cases_b = {k[1:] for k in keyed_rows(b)}
    if cases_a != cases_b:
        def show(cases):
            return ", ".join(f"{s}{' causal' if c else ''}" for s, c in sorted(cases))

        notes.append(f"the runs cover different shapes (A: {show(cases_a)}; B: {show(cases_b)}): only rows of the same shape are compared")
    return notes


def compare(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> list[tuple[tuple, dict | None, dict | None, Verdict | None]]:
    """(key, row A, row B, verdict) for every row of either run; verdict None where a row is in one run only."""
    rows_a, rows_b = keyed_rows(a), keyed_rows(b)
    out = []
    for key in [*rows_a, *(k for k in rows_b if k not in rows_a)]:
        ra, rb = rows_a.get(key), rows_b.get(key)
        out.append((key, ra, rb, row_verdict(ra, rb, threshold) if ra and rb else None))
    return out


def run_compare(path_a: str, path_b: str, threshold: float) -> int:
    from rich.table import Table

    from flashcore_cli.commands import console, err_console

    if not 0 <= threshold < 1:
        raise FlashcoreError(f"--threshold {threshold}: give a fraction between 0 and 1 (0.05 is 5%)")
    a, b = load_record(path_a), load_record(path_b)
    results = compare(a, b, threshold)
    if not any(v is not None for *_, v in results):
        raise FlashcoreError(f"{path_a} and {path_b} have no row in common (same name, shape and causal); nothing to compare")
    for note in warnings_for(a, b):
        err_console.print(f"[yellow]warning:[/] {note}")
    table = Table(title=f"A = {path_a}\nB = {path_b}")
    for col, just in (("name", "left"), ("case", "left"), ("A median (p10-p90) us", "right"),
                      ("B median (p10-p90) us", "right"), ("change", "right"), ("verdict", "left")):  # fmt: skip
        table.add_column(col, justify=just, overflow="fold")
    style = {"same": "dim", "faster": "green", "slower": "yellow", "broken": "bold red", "fixed": "green"}
    regressions = 0
    for (name, shape, causal), ra, rb, verdict in results:
        case = f"{shape}{' causal' if causal else ''}"
        if verdict is None:
            table.add_row(name, case, _cell(ra), _cell(rb), "", f"[dim]only in {'A' if ra else 'B'}[/]")
            continue
        change = f"{(rb['median_us'] / ra['median_us'] - 1) * 100:+.1f}%" if ra.get("median_us") and rb.get("median_us") else ""
        color = "bold red" if verdict.regression else style.get(verdict.word, "white")
        table.add_row(name, case, _cell(ra), _cell(rb), change, f"[{color}]{verdict.text()}[/]")
        regressions += verdict.regression
    console.print(table)
    console.print(
        f"same: |median change| within the larger half p10-p90 spread of the two runs; regression: slower beyond "
        f"that spread and by more than {threshold:.0%}, or OK in A and failing in B"
    )
    if regressions:
        console.print(f"[bold red]{regressions} regression(s)[/]")
        return 1
    console.print("[green]no regression[/]")
    return 0


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("median_us"):
        return f"{row['median_us']:.1f} ({row['p10_us']:.1f}-{row['p90_us']:.1f})"
    return row.get("status", "?")
