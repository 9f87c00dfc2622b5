"""`flashcore profile`: Nsight Compute on one variant's kernels, a short table, and the .ncu-rep kept.

The variant is built in a plain worker first; a second worker calls it once under
    ncu --clock-control none --kernel-name regex:^(<its kernels>) --set detailed --metrics <ours> --export F
so only the variant's own kernels are profiled (not PyTorch's input set-up), at the clocks the GPU runs
at (no locking to base clocks: the same conditions as `flashcore bench`). The report is read back through
`ncu --import F --csv --page details --print-units base`; the metrics this table needs are requested by
their raw names (they appear in the section "Command line profiler metrics"), so the table does not
depend on how a version of ncu labels its sections.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from flashcore_cli.core.errors import EXIT_CHECK_FAILED, FlashcoreError

DURATION = "gpu__time_duration.sum"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
TENSOR_HMMA = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_GMMA = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"  # Hopper's wgmma
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_BYTES = "dram__bytes.sum.per_second"
L2_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L2_BYTES = "lts__t_bytes.sum.per_second"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
BANK_LD = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
BANK_ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
    "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "short_scoreboard",
    "sleeping", "tex_throttle", "wait",
)  # fmt: skip
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
METRICS = [
    DURATION, SM_THROUGHPUT, TENSOR_HMMA, TENSOR_GMMA, DRAM_PCT, DRAM_BYTES, L2_PCT, L2_BYTES, OCCUPANCY,
    BANK_LD, BANK_ST, *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS),
]  # fmt: skip

# ncu --print-units base writes "ns" and "byte/s" (seen on the lent H200, ncu 2025.3); the long spellings
# are what --print-units auto can produce.
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
_BYTES_PER_SECOND = {
    "byte/s": 1.0, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12,
    "byte/second": 1.0, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9, "Tbyte/second": 1e12,
}  # fmt: skip
COUNTERS_DENIED = "ERR_NVGPUCTRPERM"


@dataclass
class ProfiledKernel:
    launch_id: str
    name: str
    block: str = ""
    grid: str = ""
    metrics: dict[str, tuple[str, float | str]] = field(default_factory=dict)  # name -> (unit, value)

    def value(self, metric: str) -> float | None:
        unit_value = self.metrics.get(metric)
        if unit_value is None or not isinstance(unit_value[1], float):
            return None
        return unit_value[1]

    def seconds(self, metric: str) -> float | None:
        unit_value = self.metrics.get(metric)
        if unit_value is None or not isinstance(unit_value[1], float) or unit_value[0] not in _SECONDS:
            return None
        return unit_value[1] * _SECONDS[unit_value[0]]

    def bytes_per_second(self, metric: str) -> float | None:
        unit_value = self.metrics.get(metric)
        if unit_value is None or not isinstance(unit_value[1], float) or unit_value[0] not in _BYTES_PER_SECOND:
            return None
        return unit_value[1] * _BYTES_PER_SECOND[unit_value[0]]

    def top_stalls(self, n: int = 3) -> list[tuple[str, float]]:
        """The largest stall reasons, in cycles a warp waits per issued instruction."""
        stalls = [(m.group(1), v) for k, (_, v) in self.metrics.items() if (m := _STALL.match(k)) and isinstance(v, float)]
        return sorted((s for s in stalls if s[1] > 0), key=lambda s: -s[1])[:n]

    def summary(self) -> dict:
        duration = self.seconds(DURATION)
        return {
            "launch": self.launch_id,
            "kernel": self.name,
            "block": self.block,
            "grid": self.grid,
            "duration_us": duration * 1e6 if duration is not None else None,
            "sm_throughput_pct": self.value(SM_THROUGHPUT),
            "tensor_hmma_pct": self.value(TENSOR_HMMA),
            "tensor_gmma_pct": self.value(TENSOR_GMMA),
            "dram_pct": self.value(DRAM_PCT),
            "dram_bytes_per_s": self.bytes_per_second(DRAM_BYTES),
            "l2_pct": self.value(L2_PCT),
            "l2_bytes_per_s": self.bytes_per_second(L2_BYTES),
            "achieved_occupancy_pct": self.value(OCCUPANCY),
            "top_stalls": self.top_stalls(),
            "smem_bank_conflicts_ld": self.value(BANK_LD),
            "smem_bank_conflicts_st": self.value(BANK_ST),
        }


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_ncu_details(text: str) -> list[ProfiledKernel]:
    """Kernel launches in `ncu --csv --page details` output (one row per launch, section and metric)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[str, ProfiledKernel] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        launch = row.get("ID", "")
        if not launch or not row.get("Metric Name"):
            continue
        k = kernels.setdefault(launch, ProfiledKernel(launch, row.get("Kernel Name", ""), row.get("Block Size", ""), row.get("Grid Size", "")))
        k.metrics[row["Metric Name"]] = (row.get("Metric Unit", ""), _number(row.get("Metric Value", "")))
    return list(kernels.values())


def failed_metrics(ncu_log: str, requested: list[str]) -> list[str]:
    """Requested metrics that ncu's error lines name (a metric this GPU or ncu version does not have)."""
    errors = [line for line in ncu_log.splitlines() if line.startswith("==ERROR==")]
    return [m for m in requested if any(m in line for line in errors)]


def ncu_problem(ncu_log: str) -> str | None:
    """What went wrong, in the user's terms, for the failures ncu reports in its log; None if none is known."""
    if COUNTERS_DENIED in ncu_log:
        return (
            "ncu cannot read this GPU's performance counters (ERR_NVGPUCTRPERM): profile as root, or let every user "
            "profile (the driver option NVreg_RestrictProfilingToAdminUsers=0); on a lent or containerised GPU, ask "
            "for a machine with profiling allowed"
        )
    if "No kernels were profiled" in ncu_log:
        return "ncu profiled no kernel: none matched the variant's kernel names, or the run failed before launching one"
    return None


def kernel_regex(function_names: list[str]) -> str:
    """Matches the kernels by ncu's default base name (the function name, with or without its template args)."""
    names = "|".join(re.escape(n) for n in sorted(set(function_names)))
    return f"regex:^({names})(<|\\(|$)"


def function_name(demangled: str) -> str:
    """'void fc::v8_fwd<64>(FlashcoreParams)' -> 'v8_fwd'."""
    name = re.sub(r"^void ", "", demangled)
    name = re.split(r"[<(]", name, maxsplit=1)[0]
    return name.rsplit("::", 1)[-1]


# ---------------------------------------------------------------- running it
def _ncu_profile(ncu: Path, regex: str, metrics: list[str], export: Path, log: Path) -> list[str]:
    return [
        str(ncu), "--clock-control", "none", "--target-processes", "all", "--kernel-name", regex,
        "--set", "detailed", "--metrics", ",".join(metrics), "--export", str(export), "--force-overwrite",
        "--log-file", str(log),
    ]  # fmt: skip


def read_report(ncu: Path, report: Path) -> list[ProfiledKernel]:
    proc = subprocess.run(
        [str(ncu), "--import", str(report), "--csv", "--page", "details", "--print-units", "base"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        raise FlashcoreError(f"ncu could not read back {report}: {(proc.stderr or proc.stdout).strip()[:1000]}", exit_code=EXIT_CHECK_FAILED)
    return parse_ncu_details(proc.stdout)


def collect(ncu: Path, regex: str, launch, workdir: Path) -> tuple[Path, list[ProfiledKernel], list[str]]:
    """Profile one launch (`launch(prefix)` runs the variant under the ncu command line `prefix`); when ncu names
    metrics it lacks, profile again without them. The report, its kernels, and the metrics dropped."""
    metrics, dropped = list(METRICS), []
    export, log = workdir / "profile", workdir / "ncu.log"
    for attempt in range(2):
        outcome = launch(_ncu_profile(ncu, regex, metrics, export, log))
        ncu_log = log.read_text(errors="replace") if log.is_file() else ""
        missing = failed_metrics(ncu_log, metrics) if attempt == 0 else []
        if not missing:
            break
        dropped += missing
        metrics = [m for m in metrics if m not in missing]
    if COUNTERS_DENIED in ncu_log:
        raise FlashcoreError(ncu_problem(ncu_log))  # the machine's setting, not the kernel: exit 2
    report = export.with_suffix(".ncu-rep")
    if not report.is_file():
        why = "\n".join(line for line in ncu_log.splitlines() if line.startswith(("==ERROR==", "==WARNING=="))) or outcome.log_tail
        raise FlashcoreError(f"{ncu_problem(ncu_log) or 'ncu wrote no report'} (worker {outcome.status}):\n{why}", exit_code=EXIT_CHECK_FAILED)
    kernels = read_report(ncu, report)
    if not kernels:
        raise FlashcoreError(f"ncu profiled no kernel matching {regex}: did the run fail?\n{ncu_problem(ncu_log) or outcome.log_tail}", exit_code=EXIT_CHECK_FAILED)
    return report, kernels, dropped


