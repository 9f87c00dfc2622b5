"""The options several commands share, each declared once with its help and default, and the checks of their
values. A command's own options stay in its module.

--reps defaults to 100 everywhere: the design's rule is a median and p10/p90 over at least 100 calls (MIN_REPS),
every measurement the docs cite was taken with `--reps 100`, and a larger default only made bench slower than
sweep, tune and watch timing the same row. --warmup defaults to 20 everywhere (bench's, the command the others'
rows are compared with): a warm-up call costs microseconds.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.measure.modes import MIN_REPS, mode_help

DEFAULT_REPS = MIN_REPS
DEFAULT_WARMUP = 20

Names = Annotated[Optional[list[str]], typer.Argument(help="variant names or aliases (see `flashcore list`)", show_default=False)]
Name = Annotated[str, typer.Argument(help="variant name or alias (see `flashcore list`)", show_default=False)]
All = Annotated[bool, typer.Option("--all", help="every registered variant")]
JsonOut = Annotated[Optional[str], typer.Option("--json", help="write the full record to this JSON file")]
Arch = Annotated[Optional[str], typer.Option("--arch", help="target arch, e.g. sm_90 (default: the GPU present, else sm_90)")]
Archs = Annotated[Optional[str], typer.Option("--arch", help="comma-separated archs, e.g. sm_89,sm_90 (default: the GPU "
                                              "present, else sm_90)")]  # fmt: skip
Seed = Annotated[Optional[int], typer.Option("--seed", help="base seed for the random inputs (default: a fresh one, printed)")]
Causal = Annotated[bool, typer.Option("--causal", help="causal masking, bottom-right (query i sees keys j <= i + Sk - Sq)")]
Mode = Annotated[str, typer.Option("--mode", help=mode_help())]  # a str: parse_modes checks it against modes.py's MODES
Reps = Annotated[int, typer.Option("--reps", help=f"timed samples per row (at least {MIN_REPS})")]
Warmup = Annotated[int, typer.Option("--warmup", help="untimed calls first")]
Dtype = Annotated[str, typer.Option("--dtype", help="fp16 or bf16: q, k, v of every row, references included "
                                    "(a variant that does not declare it: SKIP)")]  # fmt: skip
Pass = Annotated[str, typer.Option("--pass", help="what a timed call does: fwd, bwd (the backward of a saved forward) "
                                   "or fwd+bwd; backward FLOPs = 2.5 x forward")]  # fmt: skip
# The attention family (registry/family.py): parsed by family_options, one error for a bad value.
Window = Annotated[Optional[str], typer.Option("--window", help="sliding window LEFT,RIGHT (FlashAttention's window_size; "
                                               "-1 unbounded, --causal sets RIGHT to 0), e.g. 1024,0")]  # fmt: skip
Softcap = Annotated[Optional[float], typer.Option("--softcap", help="logit softcap c: scores become c * tanh(s / c) (0: off)")]
Sinks = Annotated[bool, typer.Option("--sinks", help="attention sinks: one fp32 logit per query head in every row's "
                                     "softmax denominator, drawn from the seed")]  # fmt: skip


def family_options(window: str | None, softcap: float | None, sinks: bool):
    """The Family the --window, --softcap and --sinks options ask for (one FlashcoreError for a bad value)."""
    from flashcore_cli.registry.family import parse_family

    return parse_family(window, softcap, sinks)


def check_timeout(timeout: float) -> None:
    check_positive(timeout, "--timeout")


def check_positive(seconds: float, option: str) -> None:
    """A number of seconds must be above 0 (nan and inf never reach here: handling.py refuses them for every option)."""
    if seconds <= 0:
        raise FlashcoreError(f"{option} must be positive (seconds)")


def check_counts(reps: int, warmup: int, timeout: float) -> None:
    """--reps, --warmup and --timeout of a command that times rows."""
    check_reps(reps)
    if warmup < 1:
        raise FlashcoreError("--warmup must be at least 1")
    check_timeout(timeout)


def check_reps(reps: int) -> None:
    if reps < MIN_REPS:
        raise FlashcoreError(f"--reps {reps}: at least {MIN_REPS} timed calls are needed for a median and p10/p90")


def usable_paths(json_path, results: bool = False, create: bool = True) -> None:
    """The cache the builds write, the results folder and the --json file, checked before any work (one line,
    exit 2). create=False: checked only, nothing made, for a check before a refusal that may follow (no GPU)."""
    from flashcore_cli.core.records import RESULTS_ENV, output_file, results_dir, usable_cache, usable_folder

    usable_cache(create=create)
    if results:
        usable_folder(results_dir(), RESULTS_ENV, "results", create=create)
    if json_path:
        output_file(json_path, "--json", create=create)
