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


def progress(on: Console | None = None):
    """A transient progress bar on `on` (default: stdout's console; err_console keeps stdout for the result).
    Where stderr is no terminal (a CI log, `2> file`, a pipe) a bar would draw nothing: plain lines on stderr
    instead, one per step (PlainProgress)."""
    if not err_console.is_terminal:
        return PlainProgress(on or console)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=on or console,
        transient=True,
    )


def status(text: str):
    """A spinner on stdout's console while one long step runs; where stderr is no terminal, the step as one
    plain line on stderr instead (as progress())."""
    if not err_console.is_terminal:
        from contextlib import nullcontext

        PlainProgress._say(text)
        return nullcontext()
    return console.status(text)


class PlainProgress:
    """The part of rich's Progress the commands use (add_task, advance, update, console), written as plain
    lines on stderr: a task's description when it starts or changes, and each step done as
    'description: done (3/20)' (`done`, an update field, names the step: the variant, the arch)."""

    def __init__(self, on: Console):
        self.console = on  # what a command prints beside the bar goes where it would with a bar
        self._tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        task = len(self._tasks)
        self._tasks[task] = {"description": description, "total": total, "completed": 0}
        self._say(f"{description}{f' (0/{total:g})' if total else ''}")
        return task

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def update(self, task: int, *, description: str | None = None, advance: float | None = None,
               completed: float | None = None, total: float | None = None, done: str | None = None, **fields) -> None:  # fmt: skip
        state = self._tasks[task]
        if total is not None:
            state["total"] = total
        if description is not None and description != state["description"]:
            state["description"] = description
            if not advance:
                self._say(description)
        if advance or completed is not None:
            state["completed"] = completed if completed is not None else state["completed"] + advance
            if advance:
                count = f" ({state['completed']:g}/{state['total']:g})" if state["total"] else ""
                self._say(f"{state['description']}{': ' + done if done else ''}{count}")

    @staticmethod
    def _say(line: str) -> None:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)


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
