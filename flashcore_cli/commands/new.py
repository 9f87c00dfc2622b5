"""`flashcore new`: scaffold a variant from another."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from flashcore_cli.core.console import console


def new(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the new variant's name (letters, digits, '_')", show_default=False)],
    *,
    from_: Annotated[str, typer.Option("--from", help="the variant to start from, e.g. v8")],
) -> int:
    """Scaffold a variant from another: kernels/NAME.cu with a fresh header, renamed kernels, a registry entry."""
    # the option as given, not the resolved path: where nothing is found from here, `new` starts a registry here
    return run_new(ctx.find_root().obj.get("registry_option"), name, from_)


def run_new(registry_path, name: str, source_name: str) -> int:
    from flashcore_cli.builder.scaffold import registry_flag, scaffold, shared_label
    from flashcore_cli.registry.variants import load_registry

    target, registry, shared, renames = scaffold(registry_path, name, source_name)
    renamed = f": {', '.join(f'{k} -> {v}' for k, v in renames.items())}" if renames else ""
    console.print(f"wrote {escape(str(target))} (a copy of {source_name}{renamed})", highlight=False, soft_wrap=True)
    if shared:
        listed = ", ".join(shared_label(s, registry) for s in shared)
        console.print(f"shared with {source_name}, not copied: {escape(listed)}", highlight=False, soft_wrap=True)
    how = "appended the entry" if len(load_registry(registry).variants) > 1 else "a registry of its own, with the entry"
    console.print(f"wrote {escape(str(registry))} ({how} '{name}')", highlight=False, soft_wrap=True)
    flashcore = f"flashcore {registry_flag(registry)}"
    console.print(f"next: write its header, then `{escape(flashcore)}ptxas {name}` and `{escape(flashcore)}test {name}`", highlight=False, soft_wrap=True)
    return 0

