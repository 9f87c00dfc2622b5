"""`flashcore ptxas`: registers, shared memory, spills, stack and occupancy per kernel, from nvcc alone."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flashcore_cli.commands.options import All, Archs, JsonOut, Names
from flashcore_cli.core.console import console, err_console, progress, short_kernel
from flashcore_cli.core.errors import EXIT_CHECK_FAILED
from flashcore_cli.registry.archs import parse_archs
from flashcore_cli.registry.variants import load_registry


def ptxas(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    arch: Archs = None,
    json_path: JsonOut = None,
    fail_on_spill: Annotated[bool, typer.Option("--fail-on-spill", help="exit 1 if any kernel spills registers")] = False,
) -> int:
    """Registers, shared memory, spills, stack and CTAs/SM per kernel — nvcc only, no GPU needed."""
    return cmd_ptxas(ctx.obj["registry"], names, all_, arch, json_path, fail_on_spill)


def cmd_ptxas(registry_path, names, all_, arch_text, json_path, fail_on_spill) -> int:
    import json

    from flashcore_cli.builder.ptxas import TRIVIAL_REGISTERS, report_all
    from flashcore_cli.core.records import output_file, write_output

    reg = load_registry(registry_path)
    variants = reg.select(names, all_)
    archs = parse_archs(arch_text)
    if json_path:
        output_file(json_path, "--json")  # a folder or an unwritable path: refused before the compiles
    with progress() as bar:
        task = bar.add_task(f"nvcc -Xptxas -v: {len(variants)} variant(s) x {', '.join(archs)}", total=len(variants) * len(archs))
        reports = report_all(variants, archs, on_done=lambda r: bar.update(task, advance=1, done=f"{r.variant} {r.arch}"))
    table = Table(title="ptxas resources (per __global__ kernel)")
    for col, just in (("variant", "left"), ("kernel", "left"), ("arch", "left"), ("regs", "right"), ("static smem", "right"),
                      ("dyn smem", "right"), ("spill st/ld", "right"), ("stack", "right"), ("threads", "right"),
                      ("CTAs/SM", "right")):  # fmt: skip
        table.add_column(col, justify=just, overflow="fold")
    errors = spills = 0
    for r in reports:
        if r.not_built:
            table.add_row(r.variant, f"[dim]not built for {r.arch} ({r.not_built})[/]", r.arch, *[""] * 7)
            continue
        if r.error:
            errors += 1
            table.add_row(r.variant, f"[red]compile failed[/]\n{r.error}", r.arch, *[""] * 7)
            continue
        for k in r.kernels:
            spill = f"{k.spill_stores}/{k.spill_loads}"
            if k.spills:
                spills += 1
                spill = f"[bold red]{spill}[/]"
            occ = "-" if k.ctas_per_sm is None else f"{k.ctas_per_sm} ({k.limiter})"
            regs = f"[bold yellow]{k.registers}[/]" if r.warnings and k.registers <= TRIVIAL_REGISTERS and not k.static_smem else str(k.registers)
            table.add_row(
                r.variant, short_kernel(k.kernel), r.arch, regs, _kb(k.static_smem),
                "-" if k.dynamic_smem is None else _kb(k.dynamic_smem), spill, f"{k.stack_frame} B",
                "-" if k.threads is None else str(k.threads), occ,
            )  # fmt: skip
    console.print(table)
    for r in reports:
        for warning in r.warnings:
            err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if json_path:
        write_output(json_path, json.dumps({"kind": "flashcore-ptxas", "reports": [r.as_dict() for r in reports]}, indent=1, default=str), "--json")
        console.print(f"wrote {json_path}")
    if errors:
        err_console.print(f"[red]{errors} compile(s) failed[/]")
        return EXIT_CHECK_FAILED
    if fail_on_spill and spills:
        err_console.print(f"[red]{spills} kernel(s) spill registers[/]")
        return EXIT_CHECK_FAILED
    return 0


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n else "0"

