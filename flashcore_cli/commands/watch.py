"""`flashcore watch`: on every save of a variant's sources, rebuild, check and (--bench) time."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.commands.options import DEFAULT_REPS, Arch, Causal, Name, Reps


def watch(
    ctx: typer.Context,
    name: Name,
    *,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="B,H,S,D to check at (repeat; default 1,8,512,64); the first is timed")] = None,
    causal: Causal = False,
    bench: Annotated[bool, typer.Option("--bench", help="also time the first shape (cold) beside SDPA and the previous build")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16")] = "fp16",
    arch: Arch = None,
    interval: Annotated[float, typer.Option("--interval", help="seconds between two looks at the files")] = 0.2,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per check or timing (after its build)")] = 120.0,
    reps: Reps = DEFAULT_REPS,
) -> int:
    """On every save of a variant's sources: rebuild, check, (--bench) time; errors shown, the loop goes on."""
    from flashcore_cli.loop.watch import run_watch

    return run_watch(ctx.obj["registry"], name, shape, causal, bench, dtype, arch, interval, timeout, reps)

