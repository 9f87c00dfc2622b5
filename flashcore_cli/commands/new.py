"""`flashcore new`: scaffold a variant from another."""

from __future__ import annotations

from typing import Annotated

import typer


def new(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the new variant's name (letters, digits, '_')", show_default=False)],
    *,
    from_: Annotated[str, typer.Option("--from", help="the variant to start from, e.g. v8")],
) -> int:
    """Scaffold a variant from another: kernels/NAME.cu with a fresh header, renamed kernels, a registry entry."""
    from flashcore_cli.builder.scaffold import run_new

    return run_new(ctx.obj["registry"], name, from_)

