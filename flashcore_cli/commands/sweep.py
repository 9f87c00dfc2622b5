"""`flashcore sweep`: time variants and the references along the sequence length, over every visible GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.commands.options import DEFAULT_REPS, DEFAULT_WARMUP, Arch, Causal, Dtype, JsonOut, Mode, Pass, Reps, Warmup


def sweep(
    ctx: typer.Context,
    names: Annotated[Optional[list[str]], typer.Argument(help="variants (default: all)", show_default=False)] = None,
    *,
    seq: Annotated[Optional[str], typer.Option("--seq", help="sequence lengths, e.g. 512,1024,2048 (default: 512 ... 16384)")] = None,
    batch: Annotated[int, typer.Option("--batch", help="B")] = 1,
    heads: Annotated[int, typer.Option("--heads", help="H")] = 8,
    dim: Annotated[int, typer.Option("--dim", help="head dim D")] = 64,
    causal: Causal = False,
    plot: Annotated[Optional[str], typer.Option("--plot", help="draw the chart to this PNG (needs matplotlib)")] = None,
    reps: Reps = DEFAULT_REPS,
    warmup: Warmup = DEFAULT_WARMUP,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant and point (after its build)")] = 300.0,
    json_path: JsonOut = None,
    arch: Arch = None,
    mode: Mode = "cold",
    dtype: Dtype = "fp16",
    passes: Pass = "fwd",
) -> int:
    """Time variants and the references along the sequence length, over every visible GPU; record and chart."""
    from flashcore_cli.measure.sweep import run_sweep

    return run_sweep(ctx.obj["registry"], names, seq, batch, heads, dim, causal, plot, reps, warmup, timeout, json_path, arch, mode,
                     dtype, passes)  # fmt: skip

