"""The playground's instruments (sanitize, profile, sass, sweep, compare, tune, doctor, new, watch), registered
onto the main app by register(): each command is a function of its own here, which register() wraps in
handle_errors and adds (report merge and report readme under `flashcore report`). Like cli.py, this module only parses and delegates: each command's work lives
in the module of the same name (sanitize.py, profile.py, sass.py, sweep.py, compare.py, tune.py, doctor.py,
scaffold.py, loop/watch.py), imported when the command runs so `flashcore --help` stays fast."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.measure.modes import mode_help

Name = Annotated[str, typer.Argument(help="variant name or alias (see `flashcore list`)", show_default=False)]
Shape = Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D")]
Causal = Annotated[bool, typer.Option("--causal", help="causal masking")]
Arch = Annotated[Optional[str], typer.Option("--arch", help="target arch, e.g. sm_90 (default: the GPU present, else sm_90)")]
Mode = Annotated[str, typer.Option("--mode", help=mode_help())]  # a str: parse_modes checks it against modes.py's MODES


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
    reps: Annotated[int, typer.Option("--reps", help="timed calls per row and point (at least 100)")] = 100,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls first")] = 10,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant and point (after its build)")] = 300.0,
    json_path: Annotated[Optional[str], typer.Option("--json", help="also write the record to this JSON file")] = None,
    arch: Arch = None,
    mode: Mode = "cold",
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16, for every row, references included")] = "fp16",
    passes: Annotated[str, typer.Option("--pass", help="what a timed call does: fwd, bwd or fwd+bwd")] = "fwd",
) -> int:
    """Time variants and the references along the sequence length, over every visible GPU; record and chart."""
    from flashcore_cli.measure.sweep import run_sweep

    return run_sweep(ctx.obj["registry"], names, seq, batch, heads, dim, causal, plot, reps, warmup, timeout, json_path, arch, mode,
                     dtype, passes)  # fmt: skip


def compare(
    a: Annotated[str, typer.Argument(help="the earlier run's record (bench or sweep JSON)", show_default=False)],
    b: Annotated[str, typer.Argument(help="the later run's record", show_default=False)],
    *,
    threshold: Annotated[float, typer.Option("--threshold", help="slower by more than this fraction (and beyond the spread) fails")] = 0.05,
    mode: Annotated[Optional[str], typer.Option("--mode", help="the mode to compare when a record holds several (cold, graph, host)")] = None,
) -> int:
    """Faster / slower / same per row of two run records (of the same mode); exit 1 on a regression (for CI)."""
    from flashcore_cli.report.compare import run_compare

    return run_compare(a, b, threshold, mode)


def tune(
    ctx: typer.Context,
    name: Name,
    *,
    param: Annotated[Optional[list[str]], typer.Option("--param", help="NAME=v1,v2 (repeat; default: the registry's values)")] = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D to time at (default: 1,8,512,64)")] = None,
    causal: Causal = False,
    reps: Annotated[int, typer.Option("--reps", help="timed calls per trial (at least 100)")] = 100,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls first")] = 10,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per trial (after its build)")] = 600.0,
    arch: Arch = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the grid, constraints and ptxas limits only (no GPU)")] = False,
    mode: Mode = "cold",
) -> int:
    """Search a variant's declared -D parameters; store the fastest correct one for this GPU."""
    from flashcore_cli.measure.tune import run_tune

    return run_tune(ctx.obj["registry"], name, param, shape, causal, reps, warmup, timeout, arch, dry_run, mode)


def doctor(ctx: typer.Context) -> int:
    """GPU, driver, CUDA, torch, triton, ninja, ncu, compute-sanitizer, cache: what is here and what to do."""
    from flashcore_cli.inspect.doctor import run_doctor

    return run_doctor(ctx.obj["registry"])


def new(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the new variant's name (letters, digits, '_')", show_default=False)],
    *,
    from_: Annotated[str, typer.Option("--from", help="the variant to start from, e.g. v8")],
) -> int:
    """Scaffold a variant from another: kernels/NAME.cu with a fresh header, renamed kernels, a registry entry."""
    from flashcore_cli.builder.scaffold import run_new

    # the option as given, not the resolved path: where nothing is found from here, `new` starts a registry here
    return run_new(ctx.find_root().obj.get("registry_option"), name, from_)


def watch(
    ctx: typer.Context,
    name: Name,
    *,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="B,H,S,D to check at (repeat; default 1,8,512,64); the first is timed")] = None,
    causal: Causal = False,
    bench: Annotated[bool, typer.Option("--bench", help="also time the first shape (cold) beside SDPA and the previous build")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="fp16 or bf16")] = "fp16",
    arch: Arch = None,
    interval: Annotated[float, typer.Option("--interval", help="seconds between two looks at the files")] = 0.2,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per check or timing (after its build)")] = 120.0,
    reps: Annotated[int, typer.Option("--reps", help="timed calls with --bench (at least 100)")] = 100,
) -> int:
    """On every save of a variant's sources: rebuild, check, (--bench) time; errors shown, the loop goes on."""
    from flashcore_cli.loop.watch import run_watch

    return run_watch(ctx.obj["registry"], name, shape, causal, bench, dtype, arch, interval, timeout, reps)



def report_merge(
    records: Annotated[list[str], typer.Argument(help="bench records (`flashcore bench --json FILE`) or results files", show_default=False)],
    *,
    out: Annotated[str, typer.Option("--out", "-o", help="the results file to write, e.g. docs/results/h200.json")],
) -> int:
    """One results file from several bench records of one GPU (shapes, causal and not, modes)."""
    from flashcore_cli.report.readme import run_merge

    return run_merge(records, out)


def report_readme(
    results: Annotated[str, typer.Argument(help="the results file, e.g. docs/results/h200.json", show_default=False)],
    *,
    readme: Annotated[str, typer.Option("--readme", help="the file with <!-- results:... --> markers")] = "README.md",
    ladder: Annotated[str, typer.Option("--ladder", help="the file with the <!-- ladder-chart --> marker")] = "docs/ladder.md",
    check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 if a table or the chart is out of date")] = False,
) -> int:
    """Rewrite the README's tables and docs/ladder.md's chart from a results file (--check: only compare)."""
    from flashcore_cli.report.readme import run_readme

    return run_readme(results, readme, ladder, check)


INSTRUMENTS = (sanitize, profile, sass, sweep, compare, tune, doctor, new, watch)
REPORT_HELP = "The README's tables and docs/ladder.md's chart, generated from a run record."


def register(app, handle_errors) -> None:
    """Add the instrument commands to `app`; each is wrapped in handle_errors like the core commands."""
    for command in INSTRUMENTS:
        app.command()(handle_errors(command))
    report_app = typer.Typer(help=REPORT_HELP, no_args_is_help=True)
    app.add_typer(report_app, name="report")
    report_app.command("merge")(handle_errors(report_merge))
    report_app.command("readme")(handle_errors(report_readme))
