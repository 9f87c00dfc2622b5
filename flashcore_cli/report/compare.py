"""`flashcore compare A.json B.json`: is B faster, slower or the same as A, row by row, with a noise-aware rule.

Rows are matched by name and case (shape and causal; a bench record's rows share the record's case). For a
row timed in both runs:
    same    when |median_B - median_A| <= the larger of the two runs' half p10-p90 spreads
            (a difference inside a run's own spread is not a measured difference);
    faster / slower otherwise, with the ratio of the medians.
A row is a regression when it is slower beyond that spread AND by more than --threshold (default 5%), or
when it was OK in A and is not in B (a variant that broke). Any regression makes the exit code 1, so the
command can gate CI.

Records are validated before anything is compared: a hand-made or truncated record gets one line naming the
file and the row (exit 2), never a traceback. Times taken in different modes (cold, graph, host: see
`flashcore bench --mode`) measure different things, so two records of different modes are refused (exit 2).
A record of several modes keeps one {"mode", "rows"} section per mode under "runs"; --mode picks the
section to compare (needed when a record holds more than one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.timing import DEFAULT_THRESHOLD, Verdict, timing_verdict

DEFAULT_MODE = "cold"  # records written before bench had modes were all cold-L2 timings
TIMING_KEYS = ("median_us", "p10_us", "p90_us")


def row_verdict(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    timed_a, timed_b = bool(a.get("median_us")), bool(b.get("median_us"))
    if timed_a and timed_b:
        return timing_verdict(a, b, threshold)
    if a.get("status") == "OK" and b.get("status") != "OK":
        return Verdict("broken", regression=True)
    if b.get("status") == "OK" and a.get("status") != "OK":
        return Verdict("fixed")
    return Verdict("not timed")


def load_record(path: str | Path, mode: str | None = None) -> dict:
    """A validated record with the rows of one mode (`mode`, or the only one it has)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise FlashcoreError(f"{path}: no such record") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashcoreError(f"{path}: not a JSON record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
        raise FlashcoreError(f"{path}: not a bench or sweep record (it has no 'rows'); `flashcore bench` and `flashcore sweep` write them")
    record = select_mode(path, record, mode)
    validate_record(path, record)
    return record


def select_mode(path: Path, record: dict, mode: str | None) -> dict:
    """The record as if it held one mode: its "runs" section of `mode` (a record of several modes needs it
    named), or the record itself."""
    runs = record.get("runs")
    if runs is None:
        if mode is not None and mode != record_mode(record):
            raise FlashcoreError(f"{path} was timed in {record_mode(record)} mode only; it has no {mode}-mode rows")
        return record
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) and isinstance(r.get("mode"), str)
                                                         and isinstance(r.get("rows"), list) for r in runs):  # fmt: skip
        raise FlashcoreError(f"{path}: 'runs' must be a non-empty list of {{\"mode\": ..., \"rows\": [...]}} sections")
    modes = [r["mode"] for r in runs]
    if mode is None and len(runs) > 1:
        raise FlashcoreError(f"{path} holds several modes ({', '.join(modes)}): pick one with --mode")
    section = runs[0] if mode is None else next((r for r in runs if r["mode"] == mode), None)
    if section is None:
        raise FlashcoreError(f"{path} has no {mode}-mode rows (its modes: {', '.join(modes)})")
    return {**record, "mode": section["mode"], "rows": section["rows"]}


def validate_record(path: str | Path, record: dict) -> None:
    """Every field the comparison reads has the type it needs; the first problem is one FlashcoreError
    naming the file and the row."""
    environment = record.get("environment", {})
    if not isinstance(environment, dict):
        raise FlashcoreError(f"{path}: 'environment' must be an object, got {_json_type(environment)}")
    mode = record.get("mode", DEFAULT_MODE)
    if not isinstance(mode, str) or not mode:
        raise FlashcoreError(f"{path}: 'mode' must be a string (cold, graph or host), got {_json_type(mode)}")
    for number, row in enumerate(record["rows"], 1):
        where = f"{path}: row {number}"
        if not isinstance(row, dict):
            raise FlashcoreError(f"{where} is {_json_type(row)}, not an object with 'name', 'status' and timings")
        name = row.get("name")
        if not isinstance(name, str) or not name:
            raise FlashcoreError(f"{where} has no 'name' (a string naming the variant or reference)" if name is None
                                 else f"{where}: 'name' must be a string, got {_json_type(name)}")  # fmt: skip
        where = f"{path}: row {number} ('{name}')"
        for key in ("status", "shape"):
            if key in row and not isinstance(row[key], str):
                raise FlashcoreError(f"{where}: '{key}' must be a string, got {_json_type(row[key])}")
        if "causal" in row and not isinstance(row["causal"], bool):
            raise FlashcoreError(f"{where}: 'causal' must be true or false, got {_json_type(row['causal'])}")
        if row.get("median_us") is None:
            continue  # not timed (a failed or skipped row): compared by status
        for key in TIMING_KEYS:
            if key not in row:
                raise FlashcoreError(f"{where} has 'median_us' but no '{key}' (the rule needs the p10-p90 spread)")
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise FlashcoreError(f"{where}: '{key}' must be a non-negative number of microseconds, got {_json_type(value)}")


def _json_type(value) -> str:
    """How a JSON value reads in an error: the type, and the value when it is short."""
    kinds = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", int: "a number", float: "a number"}
    if value is None:
        return "null"
    kind = kinds.get(type(value), type(value).__name__)
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else ""
    return f"{kind} ({shown})" if shown and len(shown) <= 40 else kind


def record_mode(record: dict) -> str:
    return record.get("mode", DEFAULT_MODE)


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


def run_compare(path_a: str, path_b: str, threshold: float, mode: str | None = None) -> int:
    from rich.table import Table

    from flashcore_cli.core.console import console, err_console

    if not 0 <= threshold < 1:
        raise FlashcoreError(f"--threshold {threshold}: give a fraction between 0 and 1 (0.05 is 5%)")
    a, b = load_record(path_a, mode), load_record(path_b, mode)
    if record_mode(a) != record_mode(b):
        raise FlashcoreError(
            f"{path_a} was timed in {record_mode(a)} mode and {path_b} in {record_mode(b)} mode: times in different "
            "modes measure different things; compare two records of the same mode"
        )
    results = compare(a, b, threshold)
    if not any(v is not None for *_, v in results):
        raise FlashcoreError(f"{path_a} and {path_b} have no row in common (same name, shape and causal); nothing to compare")
    for note in warnings_for(a, b):
        err_console.print(f"[yellow]warning:[/] {note}")
    table = Table(title=f"A = {path_a}\nB = {path_b}\n{record_mode(a)} mode")
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
