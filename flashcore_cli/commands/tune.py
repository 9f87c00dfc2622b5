"""`flashcore tune`: search a variant's declared -D parameters; store the fastest correct one for this GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.commands.options import DEFAULT_REPS, DEFAULT_WARMUP, Arch, Causal, Mode, Name, Reps, Warmup


def tune(
    ctx: typer.Context,
    name: Name,
    *,
    param: Annotated[Optional[list[str]], typer.Option("--param", help="NAME=v1,v2 (repeat; default: the registry's values)")] = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D to time at (default: 1,8,512,64)")] = None,
    causal: Causal = False,
    reps: Reps = DEFAULT_REPS,
    warmup: Warmup = DEFAULT_WARMUP,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per trial (after its build)")] = 600.0,
    arch: Arch = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the grid, constraints and ptxas limits only (no GPU)")] = False,
    mode: Mode = "cold",
) -> int:
    """Search a variant's declared -D parameters; store the fastest correct one for this GPU."""
    from flashcore_cli.measure.tune import run_tune

    return run_tune(ctx.obj["registry"], name, param, shape, causal, reps, warmup, timeout, arch, dry_run, mode)

