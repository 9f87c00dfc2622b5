"""`flashcore report merge` and `report readme`: the README's tables and docs/ladder.md's chart, generated from a
run record."""

from __future__ import annotations

from typing import Annotated

import typer


REPORT_HELP = "The README's tables and docs/ladder.md's chart, generated from a run record."


def report_merge(
    records: Annotated[list[str], typer.Argument(help="bench records (`flashcore bench --json FILE`) or results files", show_default=False)],
    *,
    out: Annotated[str, typer.Option("--out", "-o", help="the results file to write, e.g. docs/results/h200.json")],
) -> int:
    """One results file from several bench records of one GPU (shapes, causal and not, modes)."""
    from flashcore_cli.report.readme import run_merge

    return run_merge(records, out)


def report_readme(
    results: Annotated[str, typer.Argument(help="the results file, e.g. docs/results/h200.json", show_default=False)],
    *,
    readme: Annotated[str, typer.Option("--readme", help="the file with <!-- results:... --> markers")] = "README.md",
    ladder: Annotated[str, typer.Option("--ladder", help="the file with the <!-- ladder-chart --> marker")] = "docs/ladder.md",
    check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 if a table or the chart is out of date")] = False,
) -> int:
    """Rewrite the README's tables and docs/ladder.md's chart from a results file (--check: only compare)."""
    from flashcore_cli.report.readme import run_readme

    return run_readme(results, readme, ladder, check)

