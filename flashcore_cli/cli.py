"""The flashcore command line: the app, its global options, and the commands (commands/, one module per command
or small group) added in the order `--help` lists them, each wrapped in handle_errors (commands/handling.py).
torch is never imported here, so `flashcore --help` stays fast. The entry point (entry.py) lets a closed pipe
end the process quietly (141) and replays a cached --help screen without importing this module.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.commands import bench, build, compare, doctor, inspect, new, ptxas, report, sweep, test, tune, watch
from flashcore_cli.commands import list as list_command
from flashcore_cli.commands.handling import handle_errors

app = typer.Typer(
    name="flashcore",
    help="A JIT-compiled playground for FlashAttention-style CUDA kernels: build, inspect, check and time variants.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


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


app.command("list")(handle_errors(list_command.list_))
for _command in (build.build, ptxas.ptxas, test.test, bench.bench, inspect.sanitize, inspect.profile, inspect.sass,
                 sweep.sweep, compare.compare, tune.tune, doctor.doctor, new.new, watch.watch):  # fmt: skip
    app.command()(handle_errors(_command))
_report = typer.Typer(help=report.REPORT_HELP, no_args_is_help=True)
app.add_typer(_report, name="report")
_report.command("merge")(handle_errors(report.report_merge))
_report.command("readme")(handle_errors(report.report_readme))
