"""`flashcore doctor`: what is here and what to do."""

from __future__ import annotations

import typer


def doctor(ctx: typer.Context) -> int:
    """GPU, driver, CUDA, torch, triton, ninja, ncu, compute-sanitizer, cache: what is here and what to do."""
    from flashcore_cli.inspect.doctor import run_doctor

    return run_doctor(ctx.obj["registry"])

