"""The flashcore command line. This module only parses; the work lives in commands.py and the modules it
calls. torch is never imported here, so `flashcore --help` stays fast."""

from __future__ import annotations

import functools
from typing import Annotated, Optional

import typer

from flashcore_cli.errors import FlashcoreError

app = typer.Typer(
    name="flashcore",
    help="A JIT-compiled playground for FlashAttention-style CUDA kernels: build, inspect, check and time variants.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

Names = Annotated[Optional[list[str]], typer.Argument(help="variant names or aliases (see `flashcore list`)", show_default=False)]
All = Annotated[bool, typer.Option("--all", help="every registered variant")]
JsonOut = Annotated[Optional[str], typer.Option("--json", help="write the full record to this JSON file")]
Arch = Annotated[Optional[str], typer.Option("--arch", help="target arch, e.g. sm_90 (default: the GPU present, else sm_90)")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="base seed for the random inputs (default: a fresh one, printed)")]


def handle_errors(fn):
    """User-facing errors print one clear message (no traceback) and exit with their code (2: bad input)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            code = fn(*args, **kwargs)
        except FlashcoreError as exc:
            from rich.markup import escape

            from flashcore_cli.commands import err_console

            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(exc.exit_code) from None
        raise typer.Exit(code or 0)

    return wrapper


@app.callback()
def _global(
    ctx: typer.Context,
    registry: Annotated[
        Optional[str], typer.Option("--registry", envvar="FLASHCORE_REGISTRY", help="registry file (default: the project's variants.yaml)")
    ] = None,
) -> None:
    ctx.obj = {"registry": registry}


@app.command("list")
@handle_errors
def list_(ctx: typer.Context) -> int:
    """Print the registry: every variant, its head dims, causal support and idea."""
    from flashcore_cli.commands import cmd_list

    return cmd_list(ctx.obj["registry"])


@app.command()
@handle_errors
def build(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    arch: Arch = None,
    force: Annotated[bool, typer.Option("--force", help="rebuild even when the cache has this exact build")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="print where each build log is")] = False,
) -> int:
    """JIT-build variants (torch cpp_extension + ninja) into the content-addressed cache; print ptxas resources."""
    from flashcore_cli.commands import cmd_build

    return cmd_build(ctx.obj["registry"], names, all_, arch, force, verbose)


@app.command()
@handle_errors
def ptxas(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    arch: Annotated[Optional[str], typer.Option("--arch", help="comma-separated archs, e.g. sm_89,sm_90")] = None,
    json_path: JsonOut = None,
    fail_on_spill: Annotated[bool, typer.Option("--fail-on-spill", help="exit 1 if any kernel spills registers")] = False,
) -> int:
    """Registers, shared memory, spills, stack and CTAs/SM per kernel — nvcc only, no GPU needed."""
    from flashcore_cli.commands import cmd_ptxas

    return cmd_ptxas(ctx.obj["registry"], names, all_, arch, json_path, fail_on_spill)


@app.command()
@handle_errors
def test(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    shapes: Annotated[
        Optional[list[str]], typer.Option("--shapes", help="B,H,S,D shapes (repeat, or separate with ';'); default: the standard set")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant (after its build) before it is killed")] = 120.0,
    json_path: JsonOut = None,
    seed: Seed = None,
    arch: Arch = None,
) -> int:
    """Check variants against an fp32 reference, each in its own process under a timeout."""
    from flashcore_cli.commands import cmd_test

    return cmd_test(ctx.obj["registry"], names, all_, shapes, timeout, json_path, seed, arch)


@app.command()
@handle_errors
def bench(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D (default: the mission shape 1,8,512,64)")] = None,
    causal: Annotated[bool, typer.Option("--causal", help="causal masking")] = False,
    reps: Annotated[int, typer.Option("--reps", help="timed calls per row (at least 100)")] = 200,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls first")] = 20,
    json_path: JsonOut = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant (after its build)")] = 300.0,
    seed: Seed = None,
    arch: Arch = None,
) -> int:
    """Time variants beside PyTorch SDPA (default and each backend) and the Triton reference, in one run."""
    from flashcore_cli.commands import cmd_bench

    return cmd_bench(ctx.obj["registry"], names, all_, shape, causal, reps, warmup, json_path, timeout, seed, arch)


from flashcore_cli import cli_tools  # noqa: E402  (the instruments: sanitize, profile, sass, sweep, ...)

cli_tools.register(app, handle_errors)


def main() -> None:
    app()
