"""The rich consoles every command prints to, and the small rendering helpers they share."""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.statuses import BUILD_FAIL, CRASH, MISMATCH, NOT_RUN, OK, SKIP, TIMEOUT

# Tables are wide: give pipes and CI logs room instead of folding every cell.
console = Console(width=None if sys.stdout.isatty() else 180)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)

STATUS_STYLE = {
    OK: "green",
    SKIP: "dim",
    NOT_RUN: "dim",
    MISMATCH: "bold red",
    TIMEOUT: "bold magenta",
    CRASH: "bold red",
    BUILD_FAIL: "bold yellow",
}


def styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def progress(on: Console | None = None) -> Progress:
    """A transient progress bar on `on` (default: stdout's console; err_console keeps stdout for the result)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=on or console,
        transient=True,
    )


def short_kernel(name: str) -> str:
    """'void v8_fwd<64>(FlashcoreParams)' -> 'v8_fwd<64>' (also with more parameters after the params struct)."""
    return re.sub(r"^void |\(FlashcoreParams(, [^()]*)?\)$", "", name)


def dtype_label(dtype: str) -> str:
    """' bf16' after a shape in titles; nothing for fp16, the default."""
    return "" if dtype == DEFAULT_DTYPE else f" {dtype}"


def timing_note(kind: str, timing: dict) -> str:
    """A timed row's note: its kind, how many calls one sample holds (graph, host), discarded samples."""
    parts = [kind]
    if timing.get("calls_per_sample", 1) > 1:
        parts.append(f"{timing['calls_per_sample']} calls/sample")
    if timing.get("timed_out_samples"):
        parts.append(f"{timing['timed_out_samples']} sample(s) discarded: start timed out")
    return ", ".join(parts)
