"""`flashcore report merge` and `report readme`: the README's tables and docs/ladder.md's chart, generated from a
run record."""

from __future__ import annotations

from typing import Annotated

import typer

from flashcore_cli.core.console import console, err_console
from flashcore_cli.core.errors import EXIT_CHECK_FAILED


REPORT_HELP = "The README's tables and docs/ladder.md's chart, generated from a run record."


def report_merge(
    records: Annotated[list[str], typer.Argument(help="bench records (`flashcore bench --json FILE`) or results files", show_default=False)],
    *,
    out: Annotated[str, typer.Option("--out", "-o", help="the results file to write, e.g. docs/results/h200.json")],
) -> int:
    """One results file from several bench records of one GPU (shapes, causal and not, modes)."""
    return run_merge(records, out)


def report_readme(
    results: Annotated[str, typer.Argument(help="the results file, e.g. docs/results/h200.json", show_default=False)],
    *,
    readme: Annotated[str, typer.Option("--readme", help="the file with <!-- results:... --> markers")] = "README.md",
    ladder: Annotated[str, typer.Option("--ladder", help="the file with the <!-- ladder-chart --> marker")] = "docs/ladder.md",
    check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 if a table or the chart is out of date")] = False,
) -> int:
    """Rewrite the README's tables and docs/ladder.md's chart from a results file (--check: only compare)."""
    return run_readme(results, readme, ladder, check)


def run_merge(paths: list[str], out: str) -> int:
    from flashcore_cli.report.compare import sections_of
    from flashcore_cli.report.readme import merge

    results = merge(paths, out)
    sections = [s for i, r in enumerate(results["records"], 1) for s in sections_of(r, f"record {i}")]
    console.print(f"wrote {out}: {len(results['records'])} record(s) from {results['gpu']}; "
                  f"{', '.join(f'{s.case} {s.mode}' for s in sections)}")  # fmt: skip
    return 0


def run_readme(results_text: str, readme_text: str, ladder_text: str, check: bool) -> int:
    from flashcore_cli.report.readme import update_docs

    update = update_docs(results_text, readme_text, ladder_text, check)
    source, stale, png = update.source, update.stale, update.png
    if check:
        if stale:
            err_console.print(f"[red]out of date with {source}:[/] {'; '.join(stale)}; regenerate with `flashcore report readme {source}`")
            return EXIT_CHECK_FAILED
        console.print(f"{' and '.join(str(p) for p in update.files)} match {source}")
        return 0
    console.print(f"{len(stale)} region(s) rewritten from {source}" + (f": {'; '.join(stale)}" if stale else ""))
    console.print(f"chart: {png}" if update.drawn else f"[yellow]matplotlib is not installed: {png} was not drawn (pip install matplotlib)[/]")
    return 0
