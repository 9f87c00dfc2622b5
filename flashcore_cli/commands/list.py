"""`flashcore list`: the registry as a table of what it declares, checked against what each kernel declares from the
ptxas probes already cached (`--check` compiles the missing ones)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flashcore_cli.core.console import console, err_console, progress
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.variants import load_registry


def list_(
    ctx: typer.Context,
    *,
    no_check: Annotated[bool, typer.Option("--no-check", help="do not check the registry's head dims, dtypes and features "
                                           "against the kernels' own, not even from the ptxas cache")] = False,
    check: Annotated[bool, typer.Option("--check", help="compile the ptxas probe of every kernel the cache lacks (nvcc, "
                                        "seconds to minutes), so every variant is checked")] = False,
) -> int:
    """Print the registry: every variant, its head dims, causal support and idea, as declared (nothing compiled);
    exit 2 where an entry and its kernel disagree (checked from the probes `flashcore ptxas` caches; --check
    compiles the missing ones)."""
    if check and no_check:
        raise FlashcoreError("--check and --no-check: give one or the other")
    return cmd_list(ctx.obj["registry"], check=not no_check, probe=check)


def cmd_list(registry_path, check: bool = True, probe: bool = False) -> int:
    """The registry as a table of what it declares, at once: nothing is compiled unless `probe`. With check,
    each variant's head dims, dtypes and features are checked against what its kernel declares, through the
    ptxas probe's cache for the default arch (`flashcore ptxas` fills it); with probe, the probes the cache
    lacks are compiled first (in parallel, progress on stderr). A disagreement is one error line (exit 2); a
    kernel not checked (no cached probe, no nvcc, a failed compile) leaves one note under the table."""
    from flashcore_cli.builder.ptxas import DeclarationProbes
    from flashcore_cli.registry.archs import default_arch

    reg = load_registry(registry_path)
    unchecked = None
    if check or probe:
        probes = DeclarationProbes(reg.variants, default_arch())
        if probes.todo and probe:
            with progress(err_console) as bar:
                task = bar.add_task(f"checking declarations: probing {len(probes.todo)} kernel(s) with nvcc", total=len(probes.todo))
                probes.compile(on_done=lambda: bar.advance(task))
        for v, _, _ in probes.todo:  # no probe cached and none compiled: said, never passed in silence
            probes.unchecked[v.name] = "not probed yet (`flashcore ptxas --all` or `flashcore list --check` compiles the probes)"
        problem = probes.disagreement()
        if problem:
            raise problem
        unchecked = probes.unchecked_note()
    show_archs = any(v.archs for v in reg.variants)  # a column only when some variant runs on some GPUs only
    table = Table(title=f"flashcore variants ({reg.path})")
    for col in ("name", "aliases", "head dims", "causal", "dtypes", "features", *(["archs"] if show_archs else []), "sources",
                "summary"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for v in reg.variants:
        table.add_row(
            v.name,
            ", ".join(v.aliases),
            ", ".join(map(str, v.head_dims)),
            "yes" if v.causal else "no",
            ", ".join(v.dtypes),
            ", ".join(v.features) + (f"{', ' if v.features else ''}S <= {v.max_seq_len}" if v.max_seq_len else "") or "-",
            *([", ".join(v.archs) or "any"] if show_archs else []),
            "\n".join(str(p.relative_to(reg.root)) for p in v.sources),
            v.summary,
        )
    console.print(table)
    if unchecked:
        err_console.print(f"[yellow]note:[/] {escape(unchecked)}", highlight=False, soft_wrap=True)
    return 0

