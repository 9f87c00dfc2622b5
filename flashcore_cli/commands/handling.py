"""How every command ends: run_app runs the app and says a request the parser refuses in one line (exit 2);
handle_errors gives each outcome its exit code (core/errors.py lists them): a
FlashcoreError is one line and its code (2: bad input), an unexpected exception one line and the path of a
log holding its traceback (3), Ctrl-C (or SIGTERM) 130. It also refuses empty option values and numbers given as
nan or inf, and resolves the registry a command uses."""

from __future__ import annotations

import functools

import typer

from flashcore_cli.core.errors import EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, FlashcoreError


def run_app(app: typer.Typer, args: list[str]) -> int:
    """Run the app on `args` and return its exit code. A command's own outcomes are handle_errors's; a request
    the parser refuses (an unknown option, a missing argument, a bad number) is one line, exit 2, as every other
    bad input: not the framed box typer draws."""
    from rich.markup import escape
    from typer.main import get_command

    from flashcore_cli.core.console import err_console

    try:
        code = get_command(app).main(args=args, standalone_mode=False)
    except KeyboardInterrupt:  # before a command began (or after it ended): the same as inside one
        err_console.print("[yellow]interrupted[/]")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise  # not the parser's: handle_errors saw it first, so this is typer's own
        if type(exc).__name__ == "NoArgsIsHelpError":  # `flashcore`, `flashcore report`: the help screen
            exc.show()
            return exc.exit_code
        ctx = getattr(exc, "ctx", None)
        hint = f" (`{ctx.command_path} --help` lists what it takes)" if ctx is not None else ""
        err_console.print(f"[bold red]error:[/] {escape(' '.join(exc.format_message().split()) + hint)}", highlight=False,
                          soft_wrap=True)  # fmt: skip
        return exc.exit_code
    return code if isinstance(code, int) else 0


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
            _refuse_non_finite(fn, kwargs)
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


def _refuse_non_finite(fn, values: dict) -> None:
    """A number option given as nan or inf (which click's float type accepts) passes every `<= 0` check:
    refused here, for every command's --timeout, --interval, --threshold, ... alike."""
    import math

    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            label = _option_name(fn, name) or name.upper()
            raise FlashcoreError(f"{label} {value}: give a finite number")


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

