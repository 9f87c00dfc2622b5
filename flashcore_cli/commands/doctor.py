"""`flashcore doctor`: what is here and what to do."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from flashcore_cli.core.console import console


def doctor(ctx: typer.Context) -> int:
    """GPU, driver, CUDA, torch, triton, ninja, ncu, compute-sanitizer, cache: what is here and what to do."""
    return run_doctor(ctx.obj["registry"])


def run_doctor(registry_path) -> int:
    from flashcore_cli.inspect.doctor import all_checks

    with console.status("checking the GPU, the toolchain and the Python packages"):
        checks = all_checks(registry_path)
    table = Table(title="flashcore doctor")
    for col in ("", "piece", "found", "what to do"):
        table.add_column(col, overflow="fold")
    for c in checks:
        todo = f"{c.advice} (needed for {c.needed_for})" if c.advice and c.needed_for else c.advice
        table.add_row("[green]ok[/]" if c.ok else "[bold red]missing[/]", c.name, escape(c.found), escape(todo))
    console.print(table)
    missing = [c.name for c in checks if not c.ok]
    console.print(f"missing: {', '.join(missing)}" if missing else "[green]everything flashcore uses is here[/]")
    return 0

