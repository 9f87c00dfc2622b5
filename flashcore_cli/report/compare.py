"""`flashcore compare A.json B.json`: is B faster, slower or the same as A, row by row, with a noise-aware rule.

Rows are matched by name and case (shape and causal; a bench record's rows share the record's case). For a
row timed in both runs (measure/timing.py timing_verdict; SAME_RULE below is how the footer and the README
say it):
    same    when |median_B - median_A| <= max(p90_A - p10_A, p90_B - p10_B) / 2, i.e. the medians differ by
            at most half the wider of the two runs' p10-p90 spreads (a difference inside a run's own spread
            is not a measured difference);
    faster / slower otherwise, with the ratio of the medians.
A row is a regression when it is slower beyond that spread AND by more than --threshold (default 5%), or
when it was OK in A and is not in B (a variant that broke). Any regression makes the exit code 1, so the
command can gate CI.

Records are validated before anything is compared: a hand-made or truncated record gets one line naming the
file and the row (exit 2), never a traceback. Times taken in different modes (cold, graph, host: see
`flashcore bench --mode`) measure different things, so two records of different modes are refused (exit 2).
A record of several modes keeps one {"mode", "rows"} section per mode under "runs"; --mode picks the
section to compare (needed when a record holds more than one).

A results file (`flashcore report merge`, docs/results/h200.json) holds many bench runs, one per shape, causal,
dtype and mode: compared with a bench or sweep record, its sections of the other record's cases (shape and
causal, in its dtype and mode) are compared; two results files compare the sections they share. A results
file with no section of the other's cases is refused, with the sections it has.

Reading a record is this module's: validate_record, and sections_of (a record's Sections, one bench run in one
mode each), which report/readme.py builds its tables on (readme imports this module, never the other way).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from flashcore_cli.core.dtypes import DEFAULT_DTYPE, DTYPES
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.passes import DEFAULT_PASS, PASSES  # each pass of a case is a section of its own
from flashcore_cli.core.statuses import OK
from flashcore_cli.measure.modes import OLD_RECORD_MODE
from flashcore_cli.measure.timing import DEFAULT_THRESHOLD, Verdict, timing_verdict

DEFAULT_MODE = OLD_RECORD_MODE  # records written before bench had modes were all cold-L2 timings
BENCH_KIND = "flashcore-bench"
TIMING_KEYS = ("median_us", "p10_us", "p90_us")
RESULTS_KIND = "flashcore-results"
# timing_verdict's "same", in words: the footer prints it, and the README says the same (a test holds them).
SAME_RULE = "the medians differ by at most half the wider of the two runs' p10-p90 spreads"


@dataclass
class Section:
    """The rows of one bench run in one mode: one table."""

    shape: str
    causal: bool
    mode: str
    rows: list[dict]
    environment: dict
    dtype: str = DEFAULT_DTYPE
    passes: str = DEFAULT_PASS  # what a timed call did: fwd, bwd or fwd+bwd (records from before passes: fwd)

    @property
    def case(self) -> str:
        return (self.shape + (" causal" if self.causal else "") + ("" if self.dtype == DEFAULT_DTYPE else f" {self.dtype}")
                + ("" if self.passes == DEFAULT_PASS else f" {self.passes}"))  # fmt: skip

    @property
    def key(self) -> tuple[str, bool, str, str, str]:
        return self.shape, self.causal, self.mode, self.dtype, self.passes

    def row(self, name: str) -> dict | None:
        return next((r for r in self.rows if r.get("name") == name), None)


def row_verdict(a: dict, b: dict, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    timed_a, timed_b = bool(a.get("median_us")), bool(b.get("median_us"))
    if timed_a and timed_b:
        return timing_verdict(a, b, threshold)
    if a.get("status") == OK and b.get("status") != OK:
        return Verdict("broken", regression=True)
    if b.get("status") == OK and a.get("status") != OK:
        return Verdict("fixed")
    return Verdict("not timed")


def read_json_record(path: str | Path) -> object:
    """The JSON a record file holds, or one FlashcoreError (no such file, a folder, not JSON)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FlashcoreError(f"{path}: no such record") from None
    except IsADirectoryError:
        raise FlashcoreError(f"{path} is a folder: give a record file (`flashcore bench --json FILE` writes one)") from None
    except OSError as exc:
        raise FlashcoreError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlashcoreError(f"{path}: not a JSON record ({exc})") from None


def is_results_file(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == RESULTS_KIND


def load_record(path: str | Path, mode: str | None = None, data: object = None) -> dict:
    """A validated record with the rows of one mode (`mode`, or the only one it has)."""
    path = Path(path)
    record = read_json_record(path) if data is None else data
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
        raise FlashcoreError(f"{path}: not a bench or sweep record (it has no 'rows'); `flashcore bench` and `flashcore sweep` write them")
    record = select_mode(path, record, mode)
    validate_record(path, record)
    return record


def record_cases(record: dict) -> set[tuple[str, bool, str, str, str]]:
    """(shape, causal, dtype, mode, pass) of every row of a one-mode record."""
    dtype, mode, passes = record.get("dtype", DEFAULT_DTYPE), record_mode(record), record.get("pass", DEFAULT_PASS)
    return {(_shape(shape), causal, dtype, mode, passes) for _, shape, causal in keyed_rows(record)}


def sections_of(record: dict, where: str) -> list[Section]:
    """One section per mode: a record of several modes keeps them under "runs"; an older one was timed cold."""
    from flashcore_cli.registry.shapes import parse_shape

    try:
        shape = str(parse_shape(str(record.get("shape", ""))))
    except FlashcoreError as exc:
        raise FlashcoreError(f"{where}: {exc}") from None
    if not isinstance(record.get("causal"), bool):
        raise FlashcoreError(f"{where}: 'causal' must be true or false")
    dtype = record.get("dtype", DEFAULT_DTYPE)  # records from before bf16 were fp16
    if dtype not in DTYPES:
        raise FlashcoreError(f"{where}: 'dtype' must be one of {', '.join(DTYPES)}")
    passes = record.get("pass", DEFAULT_PASS)
    if passes not in PASSES:
        raise FlashcoreError(f"{where}: 'pass' must be one of {', '.join(PASSES)}")
    runs = record.get("runs") or [record]
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("rows"), list) for r in runs):
        raise FlashcoreError(f"{where}: 'runs' must be a list of {{\"mode\": ..., \"rows\": [...]}} sections")
    sections = []
    for run in runs:
        mode = run.get("mode") or record.get("mode") or DEFAULT_MODE
        validate_record(f"{where} ({mode} mode)", {**record, "mode": mode, "rows": run["rows"]})
        sections.append(Section(shape, record["causal"], mode, run["rows"], record.get("environment") or {}, dtype, passes))
    return sections


def results_sections(path: Path, data: dict) -> list:
    """The sections (Section: one bench run in one mode) of a results file, validated."""
    records = data.get("records")
    if not isinstance(records, list) or not records:
        raise FlashcoreError(f"{path}: 'records' must be a non-empty list of bench records")
    sections = []
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or record.get("kind") != BENCH_KIND:
            raise FlashcoreError(f"{path}: record {number} is not a bench record (kind {BENCH_KIND!r})")
        sections += sections_of(record, f"{path}: record {number}")
    return sections


def section_key(section) -> tuple[str, bool, str, str, str]:
    return _shape(section.shape), section.causal, section.dtype, section.mode, section.passes


def from_results(path: Path, sections: list, wanted: set[tuple[str, bool, str, str]], other: str) -> dict:
    """One record of the results file's sections whose (shape, causal, dtype, mode) the other side has: each
    row carries its section's shape and causal, so rows match by case."""
    chosen = [s for s in sections if section_key(s) in wanted]
    if not chosen:
        have = "; ".join(sorted({_case_text(section_key(s)) for s in sections}))
        want = "; ".join(sorted({_case_text(k) for k in wanted})) or "none"
        raise FlashcoreError(f"{path} (a results file) has no section of {other}'s cases ({want}); it holds: {have}")
    (mode,) = {s.mode for s in chosen}
    dtypes = {s.dtype for s in chosen}
    # Rows match by name, shape and causal; sections of several dtypes (two results files) keep theirs apart by
    # a shape that names the dtype, as the README's tables do ("1,8,512,64 bf16").
    # A pass other than the forward always names itself ("1,8,512,64 fwd+bwd"): its rows are other calls.
    passes = lambda s: "" if s.passes == DEFAULT_PASS else f" {s.passes}"  # noqa: E731
    label = (lambda s: s.shape + ("" if s.dtype == DEFAULT_DTYPE else f" {s.dtype}") + passes(s)) if len(dtypes) > 1 else (
        lambda s: s.shape + passes(s))  # fmt: skip
    return {
        "kind": RESULTS_KIND,
        "mode": mode,
        "dtype": dtypes.pop() if len(dtypes) == 1 else DEFAULT_DTYPE,
        "environment": chosen[0].environment,
        "rows": [{**row, "shape": label(s), "causal": s.causal} for s in chosen for row in s.rows],
    }


def load_pair(path_a: str, path_b: str, mode: str | None) -> tuple[dict, dict]:
    """The two records to compare, each of one mode; a results file gives its sections of the other's cases."""
    data_a, data_b = read_json_record(path_a), read_json_record(path_b)
    results_a, results_b = is_results_file(data_a), is_results_file(data_b)
    a = None if results_a else load_record(path_a, mode, data_a)
    b = None if results_b else load_record(path_b, mode, data_b)
    if a is not None and b is not None:
        return a, b
    if a is not None or b is not None:
        known, known_path = (a, path_a) if a is not None else (b, path_b)
        results_path, results_data = (Path(path_b), data_b) if a is not None else (Path(path_a), data_a)
        merged = from_results(results_path, results_sections(results_path, results_data), record_cases(known), known_path)
        return (known, merged) if a is not None else (merged, known)
    sections_a, sections_b = results_sections(Path(path_a), data_a), results_sections(Path(path_b), data_b)
    common = {section_key(s) for s in sections_a} & {section_key(s) for s in sections_b}
    if mode is not None:
        common = {k for k in common if k[3] == mode}
    modes = sorted({k[3] for k in common})
    if len(modes) > 1:
        raise FlashcoreError(f"{path_a} and {path_b} share sections in several modes ({', '.join(modes)}): pick one with --mode")
    return from_results(Path(path_a), sections_a, common, path_b), from_results(Path(path_b), sections_b, common, path_a)


def _shape(text) -> str:
    """A shape as bench and merge write it ('1,8,512,64'), however it was spaced."""
    return ",".join(part.strip() for part in str(text).split(","))


def _case_text(key: tuple[str, bool, str, str, str]) -> str:
    shape, causal, dtype, mode, passes = key
    return f"{shape}{' causal' if causal else ''}{'' if dtype == DEFAULT_DTYPE else ' ' + dtype}{'' if passes == DEFAULT_PASS else ' ' + passes} {mode}"


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


