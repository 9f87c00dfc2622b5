"""The flashcore command line. This module only parses; the work lives in commands.py and the modules it
calls. torch is never imported here, so `flashcore --help` stays fast.

Every command runs inside handle_errors, which gives each outcome its exit code (errors.py lists them): a
FlashcoreError is one line and its code (2: bad input), an unexpected exception one line and the path of a
log holding its traceback (3), Ctrl-C 130. The entry point (entry.py) lets a closed pipe end the process
quietly (141) and replays a cached --help screen without importing this module.
"""

from __future__ import annotations

import functools
from typing import Annotated, Optional

import typer

from flashcore_cli.core.errors import EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, FlashcoreError
from flashcore_cli.measure.modes import DEFAULT_MODE, mode_help

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
    """Run a command and turn every outcome into its exit code: user-facing errors print one clear message (no
    traceback) and exit with their code (2: bad input); anything unexpected prints one line and the path of a
    log with the traceback, and exits 3; Ctrl-C exits 130. A command that takes `ctx` uses a registry: it is
    resolved here, with one dim line saying which when it is not the installed project's."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rich.markup import escape

        try:
            _refuse_empty_values(fn, kwargs)
            if "ctx" in kwargs:
                _resolve_registry(kwargs["ctx"])
            code = fn(*args, **kwargs)
        except FlashcoreError as exc:
            from flashcore_cli.core.console import err_console

            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            from flashcore_cli.core.console import err_console

            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            from flashcore_cli.core.console import err_console
            from flashcore_cli.core.records import write_crash_log

            log = write_crash_log(exc)
            message = (str(exc).strip().splitlines() or [""])[0][:300]
            err_console.print(
                f"[bold red]internal error:[/] {escape(type(exc).__name__)}{': ' + escape(message) if message else ''} "
                f"(a bug in flashcore; the traceback is in {escape(log)})",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INTERNAL_ERROR) from None
        raise typer.Exit(code or 0)

    return wrapper


def _refuse_empty_values(fn, values: dict) -> None:
    """An option or argument given as '' is a mistake (`--shape ""` from an unset shell variable), never a
    request for the default."""
    for name, value in values.items():
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, (list, tuple)) else [value])):
            label = _option_name(fn, name)
            if label:
                raise FlashcoreError(f"{label} is empty: give it a value, or leave the option out for its default")
            raise FlashcoreError(f"the {name.rstrip('_').upper()} argument is empty")


def _option_name(fn, parameter: str) -> str | None:
    """'--json' for the parameter json_path of a command (its typer.Option's first flag); None for an argument."""
    import typing

    try:
        hint = typing.get_type_hints(fn, include_extras=True).get(parameter)
    except Exception:  # an annotation that cannot be resolved: fall back on the parameter's name
        return "--" + parameter.rstrip("_").replace("_", "-")
    for info in typing.get_args(hint)[1:]:
        if isinstance(info, typer.models.OptionInfo):
            # Annotated[..., typer.Option("--json", ...)]: the first flag is stored as the default
            flags = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str) and d.startswith("--")]
            return flags[0] if flags else "--" + parameter.rstrip("_").replace("_", "-")
    return None


def _resolve_registry(ctx: typer.Context) -> None:
    """--registry, $FLASHCORE_REGISTRY, a variants.yaml here or above, the installed one (registry.py)."""
    from flashcore_cli.registry.variants import REGISTRY_ENV, resolve_registry

    obj = ctx.find_root().obj
    if not isinstance(obj, dict) or "registry" in obj:
        return
    choice = resolve_registry(obj.get("registry_option"))
    obj["registry"] = str(choice.path)
    if not choice.is_installed:
        from rich.markup import escape

        from flashcore_cli.core.console import err_console

        how = {"--registry": "given by --registry", REGISTRY_ENV: f"from ${REGISTRY_ENV}"}.get(choice.source, "found from the current directory")
        err_console.print(f"[dim]registry: {escape(str(choice.path))} ({how})[/]", highlight=False, soft_wrap=True)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from flashcore_cli import __version__

        try:
            text = version("flashcore")
        except PackageNotFoundError:  # run from a source tree that was never installed
            text = __version__
        typer.echo(f"flashcore {text}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    registry: Annotated[
        Optional[str],
        typer.Option(
            "--registry",
            help="registry file, or the folder holding variants.yaml (default: $FLASHCORE_REGISTRY, else a "
            "variants.yaml in the current folder or a parent, else the installed project's)",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_show_version, help="print flashcore's version and exit")
    ] = False,
) -> None:
    ctx.obj = {"registry_option": registry}


@app.command("list")
@handle_errors
def list_(
    ctx: typer.Context,
    *,
    no_check: Annotated[bool, typer.Option("--no-check", help="do not check the registry's head dims, dtypes and features "
                                           "against what each kernel declares (that check compiles a probe with nvcc, cached)")] = False,
) -> int:
    """Print the registry: every variant, its head dims, causal support and idea; exit 2 where an entry and its
    kernel disagree."""
    from flashcore_cli.commands import cmd_list

    return cmd_list(ctx.obj["registry"], check=not no_check)


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
        Optional[list[str]], typer.Option("--shapes", help="B,H,S,D or B,Hq:Hkv,Sq:Sk,D shapes (repeat, or separate with ';'); "
                                          "default: the standard set")
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
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D, or B,Hq:Hkv,Sq:Sk,D for grouped-query heads and "
                                                 "keys of another length (default: the mission shape 1,8,512,64)")] = None,
    causal: Annotated[bool, typer.Option("--causal", help="causal masking, bottom-right (query i sees keys j <= i + Sk - Sq)")] = False,
    reps: Annotated[int, typer.Option("--reps", help="timed samples per row and mode (at least 100)")] = 200,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls first")] = 20,
    json_path: JsonOut = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant (after its build)")] = 300.0,
    seed: Seed = None,
    arch: Arch = None,
    mode: Annotated[str, typer.Option("--mode", help=f"{mode_help()}; several, comma-separated, in one record")] = DEFAULT_MODE,
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16: q, k, v of every row, references included "
                                       "(a variant that does not declare it: SKIP)")] = "fp16",
    passes: Annotated[str, typer.Option("--pass", help="what a timed call does: fwd, bwd (the backward of a saved forward) "
                                        "or fwd+bwd; backward FLOPs = 2.5 x forward")] = "fwd",
    pair: Annotated[Optional[str], typer.Option("--pair", help="a reference row (e.g. sdpa-cudnn) also timed in each variant's "
                                                "worker, its samples in turn with the variant's: the row REF~VARIANT "
                                                "(cold mode)")] = None,
) -> int:
    """Time variants beside PyTorch SDPA (default and each backend) and the Triton reference, in one run."""
    from flashcore_cli.commands import cmd_bench

    return cmd_bench(ctx.obj["registry"], names, all_, shape, causal, reps, warmup, json_path, timeout, seed, arch, mode,
                     dtype, passes, pair)  # fmt: skip


from flashcore_cli import cli_tools  # noqa: E402  (the instruments: sanitize, profile, sass, sweep, ...)

cli_tools.register(app, handle_errors)

