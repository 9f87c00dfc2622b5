"""`flashcore compare`: faster / slower / same per row of two run records."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from flashcore_cli.core.console import console, err_console
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, FlashcoreError

def compare(
    a: Annotated[str, typer.Argument(help="the earlier run's record (bench or sweep JSON)", show_default=False)],
    b: Annotated[str, typer.Argument(help="the later run's record", show_default=False)],
    *,
    threshold: Annotated[float, typer.Option("--threshold", help="slower by more than this fraction (and beyond the spread) fails")] = 0.05,
    mode: Annotated[Optional[str], typer.Option("--mode", help="the mode to compare when a record holds several (cold, graph, host)")] = None,
) -> int:
    """Faster / slower / same per row of two run records (of the same mode); exit 1 on a regression (for CI)."""
    return run_compare(a, b, threshold, mode)


def run_compare(path_a: str, path_b: str, threshold: float, mode: str | None = None) -> int:
    from flashcore_cli.core.passes import DEFAULT_PASS
    from flashcore_cli.report.compare import SAME_RULE, compare, is_results_file, load_pair, record_mode, warnings_for

    if not 0 <= threshold < 1:
        raise FlashcoreError(f"--threshold {threshold}: give a fraction between 0 and 1 (0.05 is 5%)")
    if mode is not None:  # a mode no record can hold is a bad value, named as one (not "no warm-mode rows")
        from flashcore_cli.measure.modes import parse_modes

        (mode,) = parse_modes(mode, several=False)
    a, b = load_pair(path_a, path_b, mode)
    if record_mode(a) != record_mode(b):
        raise FlashcoreError(
            f"{path_a} was timed in {record_mode(a)} mode and {path_b} in {record_mode(b)} mode: times in different "
            "modes measure different things; compare two records of the same mode"
        )
    pass_a, pass_b = a.get("pass", DEFAULT_PASS), b.get("pass", DEFAULT_PASS)
    if not (is_results_file(a) or is_results_file(b)) and pass_a != pass_b:
        raise FlashcoreError(f"{path_a} timed the {pass_a} pass and {path_b} the {pass_b} pass: compare two records of one pass")
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
        f"same: {SAME_RULE}; regression: slower beyond that and by more than {threshold:.0%}, or OK in A and failing in B"
    )
    if regressions:
        console.print(f"[bold red]{regressions} regression(s)[/]")
        return EXIT_CHECK_FAILED
    console.print("[green]no regression[/]")
    return 0


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("median_us"):
        return f"{row['median_us']:.1f} ({row['p10_us']:.1f}-{row['p90_us']:.1f})"
    return row.get("status", "?")

