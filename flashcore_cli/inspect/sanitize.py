"""`flashcore sanitize`: one variant on a small shape under compute-sanitizer, in a worker of its own.

The variant is built first in a plain worker (the compile never runs under the sanitizer), then a second
worker launches it once under `compute-sanitizer --tool T`, whose log is parsed here: the error count from
its summary line, and each reported problem with its kernel, source line (every build has -lineinfo) and
thread. PyTorch's caching allocator is turned off in that worker, so an access past the end of a tensor
falls outside every allocation, where memcheck sees it, not inside a pooled segment, where it cannot.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path


TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
DEFAULT_SEQ_LEN = 97  # not a multiple of any tile: the last tile of every CTA row is partial

_LINE = re.compile(r"^=========(?: (?P<body>.*))?$")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_NOT_AN_ISSUE = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|"
    r"Warning: Maximum number of|This tool is deprecated|Please use)"
)
_HAZARD_COUNT = re.compile(r"\s*\[\d+ hazards?\]$")
# where a problem happened, in the forms compute-sanitizer has printed over its versions
_LOCATIONS = (
    re.compile(r"^(?P<func>.+)\+0x[0-9a-f]+ in (?P<file>.+):(?P<line>\d+)$"),
    re.compile(r"^(?P<func>.+)\+0x[0-9a-f]+$"),
    re.compile(r"^0x[0-9a-f]+ in (?P<file>[^:]+):(?P<line>\d+):(?P<func>.+)$"),
    re.compile(r"^0x[0-9a-f]+ in (?P<func>.+)$"),
)


@dataclass
class SanitizerIssue:
    severity: str  # "error" or "warning"
    what: str  # "Invalid __global__ write of size 4 bytes", "Race reported between Write access", ...
    kernel: str = ""
    where: str = ""  # file:line
    thread: str = ""  # "thread (0,0,0) in block (0,0,0)"
    details: list[str] = field(default_factory=list)


@dataclass
class SanitizerReport:
    tool: str
    issues: list[SanitizerIssue] = field(default_factory=list)
    summary_errors: int | None = None  # from the summary line; None when the log has none
    warnings: int = 0

    @property
    def errors(self) -> int:
        if self.summary_errors is not None:
            return self.summary_errors
        return sum(i.severity == "error" for i in self.issues)

    def as_dict(self) -> dict:
        return {"tool": self.tool, "errors": self.errors, "warnings": self.warnings, "issues": [asdict(i) for i in self.issues]}


def parse_location(text: str) -> tuple[str, str]:
    """(function, "file:line") from what follows 'at ' in a report; either may be empty."""
    text = _HAZARD_COUNT.sub("", text.strip())
    for pattern in _LOCATIONS:
        if m := pattern.match(text):
            g = m.groupdict()
            where = f"{g['file']}:{g['line']}" if g.get("file") else ""
            return g["func"].strip(), where
    return text, ""


def parse_sanitizer(text: str, tool: str = "memcheck") -> SanitizerReport:
    report = SanitizerReport(tool)
    current: SanitizerIssue | None = None
    for raw in text.splitlines():
        m = _LINE.match(raw.rstrip())
        if not m:
            continue  # the application's own output
        body = m.group("body") or ""
        if s := _ERROR_SUMMARY.search(body):
            report.summary_errors = int(s.group(1)) if report.summary_errors is None else report.summary_errors
        if s := _RACE_SUMMARY.search(body):
            report.summary_errors, report.warnings = int(s.group(1)), int(s.group(2))
        if not body.strip() or _NOT_AN_ISSUE.match(body):
            current = None
            continue
        if not body[0].isspace():  # a headline starts a new problem
            current = _headline(body)
            report.issues.append(current)
        elif current is not None:
            _continuation(current, body.strip())
    if report.summary_errors is None and tool == "racecheck":
        report.warnings = sum(i.severity == "warning" for i in report.issues)
    return report


def _headline(body: str) -> SanitizerIssue:
    severity = "error"
    for prefix, level in (("Error: ", "error"), ("Warning: ", "warning")):
        if body.startswith(prefix):
            severity, body = level, body[len(prefix) :]
    issue = SanitizerIssue(severity, body)
    if " at " in body:  # racecheck puts the first access's location on the headline
        issue.what, location = body.split(" at ", 1)
        issue.kernel, issue.where = parse_location(location)
    return issue


def _continuation(issue: SanitizerIssue, line: str) -> None:
    if line.startswith("at ") and not issue.kernel:
        issue.kernel, issue.where = parse_location(line[3:])
    elif line.startswith("by thread"):
        issue.thread = line[3:]
    elif line.startswith(("Saved host backtrace", "Host Frame", "Device Frame")):
        return
    else:
        issue.details.append(line)


# ---------------------------------------------------------------- running it
def sanitizer_command(tool: str, log: Path) -> list[str]:
    from flashcore_cli.builder.cudatools import require

    exe = require("compute-sanitizer", "`flashcore sanitize`")
    return [str(exe), "--tool", tool, "--log-file", str(log), "--print-limit", "100", "--show-backtrace", "device"]


