"""`flashcore compare`: faster / slower / same per row of two run records."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def compare(
    a: Annotated[str, typer.Argument(help="the earlier run's record (bench or sweep JSON)", show_default=False)],
    b: Annotated[str, typer.Argument(help="the later run's record", show_default=False)],
    *,
    threshold: Annotated[float, typer.Option("--threshold", help="slower by more than this fraction (and beyond the spread) fails")] = 0.05,
    mode: Annotated[Optional[str], typer.Option("--mode", help="the mode to compare when a record holds several (cold, graph, host)")] = None,
) -> int:
    """Faster / slower / same per row of two run records (of the same mode); exit 1 on a regression (for CI)."""
    from flashcore_cli.report.compare import run_compare

    return run_compare(a, b, threshold, mode)

