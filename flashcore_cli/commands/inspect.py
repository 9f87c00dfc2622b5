"""`flashcore sanitize`, `profile` and `sass`: a variant under compute-sanitizer, Nsight Compute, cuobjdump."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.commands.options import Arch, Causal, Name


def sanitize(
    ctx: typer.Context,
    name: Name,
    *,
    tool: Annotated[str, typer.Option("--tool", help="memcheck, racecheck, synccheck or initcheck")] = "memcheck",
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D (default: 1,2,97,<first head dim>)")] = None,
    causal: Causal = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the sanitized run before it is killed")] = 600.0,
    show: Annotated[int, typer.Option("--show", help="how many reported problems to print")] = 5,
    arch: Arch = None,
) -> int:
    """Run a variant once on a small shape under compute-sanitizer; exit 1 on any error."""
    from flashcore_cli.inspect.sanitize import run_sanitize

    return run_sanitize(ctx.obj["registry"], name, tool, shape, causal, timeout, show, arch)


def profile(
    ctx: typer.Context,
    name: Name,
    *,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D (default: the mission shape 1,8,512,64)")] = None,
    causal: Causal = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the profiled run before it is killed")] = 600.0,
    arch: Arch = None,
) -> int:
    """Nsight Compute on a variant's kernels only (clocks not locked): a short table, the .ncu-rep kept."""
    from flashcore_cli.inspect.profile import run_profile

    return run_profile(ctx.obj["registry"], name, shape, causal, timeout, arch)


def sass(
    ctx: typer.Context,
    name: Name,
    *,
    arch: Arch = None,
    out: Annotated[Optional[str], typer.Option("--out", help="write the whole SASS listing to this file")] = None,
) -> int:
    """The SASS of a variant's kernels (cuobjdump) and its instruction mix — no GPU needed."""
    from flashcore_cli.inspect.sass import run_sass

    return run_sass(ctx.obj["registry"], name, arch, out)

