"""`flashcore watch NAME`: on every save of a file the variant is built from, rebuild it, check it at the
shapes asked for and (--bench) time it beside SDPA and beside the previous build, with the ptxas deltas.

    flashcore watch v11 --shape 1,8,512,64 --bench

The loop polls the modification times of the variant's source closure (its .cu files and the headers they
include, build/cache.py source_closure) and of the registry, a few times a second (stdlib only). A save starts
an iteration once the files have been still for a moment (an editor's several writes are one change), and
only when their content differs from what was built last (a touch, or a save without an edit, is no change).
An iteration runs the same isolated workers as `flashcore test` and `flashcore bench` (check/correctness.py
run_variant, measure/bench.py bench_variant and bench_references, in BENCH_MODE: bench's default, cold): a
compile error or a mismatch is shown and the loop goes on; Ctrl-C kills the running worker's process group and
leaves with exit 130.

The loop itself (Watcher) takes its steps as functions (WatchSteps), so tests drive it with fakes on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flashcore_cli.builder.ptxas import KernelResources, kernel_base_name
from flashcore_cli.check.correctness import CaseOutcome, VariantOutcome
from flashcore_cli.core.errors import EXIT_INTERRUPTED, FlashcoreError
from flashcore_cli.core.statuses import BUILD_FAIL, CRASH, MISMATCH, OK, SKIP, TIMEOUT
from flashcore_cli.measure.modes import DEFAULT_MODE

POLL_SECONDS = 0.2  # between two looks at the files' mtimes
SETTLE_SECONDS = 0.25  # how long the files must be still before a change starts an iteration
MAX_ERROR_LINES = 12
BENCH_MODE = DEFAULT_MODE  # what --bench times in (modes.py)


@dataclass
class Iteration:
    """What one rebuild gave: what the screen shows, and what the next one compares with."""

    number: int
    changed: list[str]
    status: str = "ERROR"  # OK, MISMATCH, BUILD-FAIL, CRASH, TIMEOUT, SKIP (the worst case's), ERROR (no run)
    build: dict = field(default_factory=dict)  # the worker's "built" event ({} when the build failed)
    errors: str = ""  # the compiler's first errors, a crash's or a setup error's words
    cases: list[CaseOutcome] = field(default_factory=list)
    resources: list[KernelResources] | None = None  # ptxas, per kernel (None: no build)
    deltas: list[str] = field(default_factory=list)
    median_us: float | None = None
    sdpa_us: float | None = None
    previous_us: float | None = None
    timing: dict = field(default_factory=dict)  # this build's timed row (median_us, and p10_us / p90_us)
    previous_timing: dict = field(default_factory=dict)  # the last timed build's
    bench_note: str = ""
    seconds: float = 0.0

    @property
    def worst(self) -> CaseOutcome | None:
        """The checked case with the largest error relative to its tolerance."""
        checked = [c for c in self.cases if c.max_error is not None and c.tolerance]
        return max(checked, key=lambda c: c.max_error / c.tolerance) if checked else None

    def mismatch_lines(self, limit: int = 5) -> list[str]:
        lines = []
        for c in self.cases:
            if c.status != MISMATCH:
                continue
            where = "; ".join(f"{_index(m['index'])} expected {m['expected']:.4g}, got {m['got']:.4g}" for m in c.mismatches[:2])
            lines.append(f"{c.case.label()}: max error {c.max_error:.4g} > tolerance {c.tolerance:.4g}; first at {where or c.detail}")
            if len(lines) == limit:
                break
        return lines


def _index(index) -> str:
    b, h, s, d = index
    return f"(b={b}, h={h}, s={s}, d={d})"


@dataclass
class WatchSteps:
    """What an iteration calls. run_watch passes the real ones (isolated workers); tests pass fakes.

    load()          -> (registry, variant), read again each iteration (an edited registry takes effect)
    check(r, v)     -> VariantOutcome: build (or load) and check the cases (`flashcore test`'s worker)
    resources(b)    -> the kernels' ptxas resources of a "built" event
    bench(r, v)     -> (median us or None, a note): time the bench case, in BENCH_MODE (None: no --bench)
    sdpa()          -> SDPA's median us at the bench case, or None (called once, at the first bench)
    """

    load: Callable[[], tuple]
    check: Callable[..., VariantOutcome]
    resources: Callable[[dict], list[KernelResources]]
    bench: Callable[..., tuple[dict | None, str]] | None = None  # (the timed row: median_us, p10_us, p90_us; a note)
    sdpa: Callable[[], float | None] | None = None


def watched_files(registry, variant) -> list[Path]:
    """The variant's sources, every header they include from the project, and the registry file."""
    from flashcore_cli.builder.cache import source_closure

    files = source_closure(list(variant.sources), list(variant.include_dirs))
    registry_path = getattr(registry, "path", None)
    return [*files, Path(registry_path).resolve()] if registry_path else files


class Watcher:
    def __init__(self, steps: WatchSteps, render: Callable[[Iteration, list[Iteration]], None], *,
                 files: Callable[..., list[Path]] = watched_files, interval: float = POLL_SECONDS,
                 settle: float = SETTLE_SECONDS, sleep=time.sleep, clock=time.monotonic,
                 max_iterations: int | None = None):  # fmt: skip
        self.steps = steps
        self.render = render
        self.files = files
        self.interval = interval
        self.settle = settle
        self.sleep = sleep
        self.clock = clock
        self.max_iterations = max_iterations
        self.history: list[Iteration] = []
        self._paths: list[Path] = []
        self._stamps: dict[Path, tuple | None] = {}
        self._digest = ""
        self._sdpa: float | None = None
        self._sdpa_asked = False

    def run(self) -> int:
        """Iterate now, then on every change, until Ctrl-C (130) or max_iterations (0)."""
        changed = ["(start)"]
        try:
            while True:
                it = self.iterate(changed)
                self.history.append(it)
                self.render(it, self.history)
                if self.max_iterations is not None and len(self.history) >= self.max_iterations:
                    return 0
                changed = self.wait_for_change()
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    # ---------------------------------------------------------------- one iteration
    def iterate(self, changed: list[str]) -> Iteration:
        start = self.clock()
        it = Iteration(len(self.history) + 1, changed)
        try:
            registry, variant = self.steps.load()
            self._paths = list(self.files(registry, variant))
        except FlashcoreError as exc:  # a broken registry: say so, keep watching what was watched
            it.errors = str(exc)
            self._remember_content()
            it.seconds = self.clock() - start
            return it
        self._remember_content()  # before the build: a save during it starts the next iteration
        try:
            outcome = self.steps.check(registry, variant)
        except FlashcoreError as exc:  # e.g. a source the registry names is gone: say so, keep watching
            it.errors = str(exc)
            it.seconds = self.clock() - start
            return it
        it.cases = outcome.cases
        it.status = outcome.status
        it.build = dict(outcome.build)
        failed_build = [c for c in outcome.cases if c.status == BUILD_FAIL]
        if failed_build:
            it.errors = _first_lines(failed_build[0].detail)
        elif it.status in (CRASH, TIMEOUT):
            bad = next(c for c in outcome.cases if c.status == it.status)
            it.errors = _first_lines(bad.detail or outcome.detail)
        elif it.status == SKIP:
            it.errors = next((c.detail for c in outcome.cases if c.detail), "")
        if it.build:
            try:
                it.resources = self.steps.resources(it.build)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                it.deltas = [f"ptxas resources unreadable: {exc}"]
            previous = next((h.resources for h in reversed(self.history) if h.resources is not None), None)
            if it.resources is not None:
                it.deltas = resource_deltas(previous, it.resources)
        if self.steps.bench is not None and it.status == OK:
            self._bench(registry, variant, it)
        it.seconds = self.clock() - start
        return it

    def _bench(self, registry, variant, it: Iteration) -> None:
        if not self._sdpa_asked and self.steps.sdpa is not None:
            self._sdpa_asked = True
            self._sdpa = self.steps.sdpa()
        it.sdpa_us = self._sdpa
        timing, it.bench_note = self.steps.bench(registry, variant)
        it.timing = timing or {}
        it.median_us = it.timing.get("median_us")
        previous = next((h for h in reversed(self.history) if h.median_us), None)
        if previous is not None:
            it.previous_us, it.previous_timing = previous.median_us, previous.timing

    # ---------------------------------------------------------------- waiting for a save
    def wait_for_change(self) -> list[str]:
        """Poll until a watched file's content differs from what the last iteration built, once the files
        have been still for `settle` seconds; the files that changed (relative names)."""
        while True:
            self.sleep(self.interval)
            now = self._stamp()
            if now == self._stamps:
                continue
            still_since, last = self.clock(), now
            while self.clock() - still_since < self.settle:  # an editor's several writes: one change
                self.sleep(min(self.interval, self.settle))
                current = self._stamp()
                if current != last:
                    still_since, last = self.clock(), current
            changed = [p for p in self._paths if last.get(p) != self._stamps.get(p)]
            self._stamps = last
            if self._content_digest() == self._digest:  # touched, or saved without an edit
                continue
            return [_short(p) for p in changed]

    def _stamp(self) -> dict[Path, tuple | None]:
        stamps = {}
        for p in self._paths:
            try:
                st = p.stat()
                stamps[p] = (st.st_mtime_ns, st.st_size)
            except OSError:  # mid-rename by an editor, or deleted: a change, settled like any other
                stamps[p] = None
        return stamps

    def _content_digest(self) -> str:
        h = hashlib.sha256()
        for p in self._paths:
            h.update(str(p).encode())
            try:
                h.update(hashlib.sha256(p.read_bytes()).digest())
            except OSError:
                h.update(b"(missing)")
        return h.hexdigest()

    def _remember_content(self) -> None:
        self._stamps = self._stamp()
        self._digest = self._content_digest()


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return path.name


def _first_lines(text: str, limit: int = MAX_ERROR_LINES) -> str:
    lines = (text or "").strip().splitlines()
    return "\n".join(lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else []))


# ---------------------------------------------------------------- ptxas deltas
_FIELDS = (("regs", "registers", ""), ("static smem", "static_smem", " B"), ("spills", "spills", " B"), ("stack", "stack_frame", " B"))


def resource_deltas(before: list[KernelResources] | None, after: list[KernelResources]) -> list[str]:
    """One line per kernel whose registers, static shared memory, spills or stack changed since the previous
    build (kernels matched by name and arch), and one per kernel that appeared or went."""
    if before is None:
        return []
    old = {(kernel_base_name(k.kernel), k.arch): k for k in before}
    new = {(kernel_base_name(k.kernel), k.arch): k for k in after}
    lines = []
    for key, k in new.items():
        name = key[0]
        if key not in old:
            lines.append(f"{name}: new ({k.registers} regs, {k.static_smem} B static smem, {k.spills} B spills)")
            continue
        o = old[key]
        parts = []
        for label, attr, unit in _FIELDS:
            a, b = getattr(o, attr), getattr(k, attr)
            if a != b:
                parts.append(f"{label} {a}{unit} -> {b}{unit} ({b - a:+d})")
        if parts:
            lines.append(f"{name}: " + ", ".join(parts))
    lines += [f"{key[0]}: gone" for key in old if key not in new]
    return lines






def worker_steps(registry_path, variant_name: str, shapes, *, causal: bool, dtype: str, arch: str, timeout: float,
                 seed: int, bench: bool = False, reps: int = 100, family=None) -> WatchSteps:  # fmt: skip
    """The real steps: `flashcore test`'s worker at the shapes (one case per shape: this causal mode, this
    dtype, seeds from `seed`; the family, --window etc., where given), and with bench `flashcore bench`'s (in
    BENCH_MODE) at the first shape, its speedup against SDPA (or FlexAttention where SDPA cannot express the case)."""
    from flashcore_cli.registry.family import DENSE
    from flashcore_cli.registry.shapes import Case
    from flashcore_cli.registry.variants import load_registry

    family = family or DENSE
    bench_case = Case(shapes[0], causal, seed, dtype=dtype, family=family)

    def load():
        reg = load_registry(registry_path)
        return reg, reg.get(variant_name)

    def check(reg, variant):
        from flashcore_cli.check.correctness import plan_cases, run_variant

        cases = plan_cases(variant, shapes, seed, causal_modes=(causal,), dtypes=(dtype,), family=family)
        return run_variant(reg, variant, cases, arch=arch, timeout=timeout)

    def time_it(reg, variant):
        from flashcore_cli.measure.bench import bench_variant

        row = bench_variant(reg, variant, bench_case, arch=arch, reps=reps, warmup=10, timeout=timeout, modes=(BENCH_MODE,))[BENCH_MODE]
        if row.median:
            return row.timing, ""
        return None, f"not timed: {row.status} {(row.detail or '').splitlines()[0] if row.detail else ''}".strip()

    def sdpa():
        from flashcore_cli.measure.bench import baseline_for, baseline_median, bench_references

        rows, _ = bench_references(bench_case, reps=reps, warmup=10, timeout=timeout, modes=(BENCH_MODE,))
        return baseline_median(rows[BENCH_MODE], baseline_for(family, causal))

    return WatchSteps(load, check, resources_of, time_it if bench else None, sdpa if bench else None)


def resources_of(built: dict) -> list[KernelResources]:
    """The kernels' ptxas resources of a build, from its build.json (the worker's event names the folder)."""
    info = json.loads((Path(built["directory"]) / "build.json").read_text())
    return [KernelResources(**r) for r in info.get("resources", [])]
