"""`flashcore watch`'s loop on a CPU: fake build/check/bench steps, a tmp project whose edits trigger
iterations, a fake clock; what each iteration shows, and Ctrl-C."""

import os
import shutil

import pytest
from rich.console import Console

from conftest import REPO
from flashcore_cli.builder.ptxas import KernelResources
from flashcore_cli.check.correctness import CaseOutcome, VariantOutcome
from flashcore_cli.commands.watch import render_iteration
from flashcore_cli.loop.watch import Iteration, Watcher, WatchSteps, resource_deltas
from flashcore_cli.registry.shapes import Case, parse_shape
from flashcore_cli.registry.variants import load_registry


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(REPO / "kernels" / "flashcore.h", kernels)
    (kernels / "tile.cuh").write_text("constexpr int kBlockM = 64;\n")
    (kernels / "k.cu").write_text('#include "flashcore.h"\n#include "tile.cuh"\n// REGS=100\n')
    (kernels / "unrelated.cuh").write_text("// nobody includes me\n")
    (tmp_path / "variants.yaml").write_text(
        "variants:\n  - name: k\n    sources: [kernels/k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    return tmp_path


CASE = Case(parse_shape("1,8,512,64"), False, 7)


def fake_check(registry, variant):
    """What the worker would report, decided by the source's text: ERROR -> a compile error, WRONG -> a
    mismatch, SLOW -> OK but slower, else OK. REGS=n sets the kernel's registers."""
    text = (variant.kernels_dir / "k.cu").read_text()
    if "ERROR" in text:
        detail = "k.cu(3): error: expected a \";\"\n1 error detected in the compilation of \"k.cu\"."
        return VariantOutcome("k", [CaseOutcome(CASE, "BUILD-FAIL", detail=detail)])
    regs = int(text.split("REGS=")[1].split()[0])
    build = {"key": f"key{regs}", "cached": False, "build_seconds": 1.5, "directory": "/nowhere", "regs": regs}
    if "WRONG" in text:
        mismatch = [{"index": [0, 3, 17, 5], "expected": 0.25, "got": 0.75}]
        case = CaseOutcome(CASE, "MISMATCH", 0.5, 0.002, "1 of 262144 elements", mismatch)
    else:
        case = CaseOutcome(CASE, "OK", 0.0004, 0.002)
    return VariantOutcome("k", [case], build=build)


def fake_resources(built):
    return [KernelResources("_Z1kv", "k_fwd<64>", "sm_90", registers=built["regs"], spill_stores=max(0, built["regs"] - 200))]


def fake_bench(registry, variant):
    """A timed row: 12 us (SLOW), 8.1 us with a spread that covers 8 (NOISY), else 8 us."""
    text = (variant.kernels_dir / "k.cu").read_text()
    if "SLOW" in text:
        return {"median_us": 12.0, "p10_us": 11.9, "p90_us": 12.1}, ""
    if "NOISY" in text:
        return {"median_us": 8.1, "p10_us": 7.9, "p90_us": 8.3}, ""
    return {"median_us": 8.0, "p10_us": 7.95, "p90_us": 8.05}, ""


class Script:
    """A fake clock and sleep: after each iteration's screen, the next edit is made at the next sleep; once the
    edits run out, Ctrl-C (KeyboardInterrupt) arrives a few (fake) seconds later."""

    def __init__(self, edits):
        self.edits = list(edits)
        self.now = 1000.0
        self.armed = False
        self.idle = 0.0
        self.mtime = 1_700_000_000_000_000_000

    def clock(self):
        return self.now

    def arm(self, *_):
        self.armed = True

    def sleep(self, seconds):
        self.now += seconds
        if self.edits and (self.armed or self.idle > 2.0):  # after a screen, or after an edit that showed none
            self.armed = False
            self.idle = 0.0
            for path in self.edits.pop(0)():  # an edit returns the files it wrote
                self.mtime += 1_000_000_000
                os.utime(path, ns=(self.mtime, self.mtime))
            return
        self.idle += seconds
        if self.idle > 5.0:
            raise KeyboardInterrupt


def write(path, text):
    def edit():
        path.write_text(text)
        return [path]

    return edit


def run(project, edits, *, bench=False, sdpa=None, render=None):
    script = Script(edits)
    registry_path = project / "variants.yaml"

    def load():
        reg = load_registry(registry_path)
        return reg, reg.get("k")

    steps = WatchSteps(load, fake_check, fake_resources, fake_bench if bench else None, sdpa)
    shown = []

    def on_screen(it, history):
        shown.append(it)
        if render:
            render(it, history)
        script.arm()

    watcher = Watcher(steps, on_screen, sleep=script.sleep, clock=script.clock)
    return watcher.run(), shown


def test_an_error_is_shown_the_loop_goes_on_and_a_fix_is_ok(project):
    src = project / "kernels" / "k.cu"
    head = '#include "flashcore.h"\n#include "tile.cuh"\n'
    console = Console(record=True, width=160)
    edits = [write(src, head + "// REGS=100\nint x = ERROR\n"), write(src, head + "// REGS=110 WRONG\n"), write(src, head + "// REGS=104\n")]
    code, shown = run(project, edits, render=lambda it, h: render_iteration(console, it, h, title="watch k", clear=False))
    assert code == 130  # Ctrl-C: a clean exit, not a traceback
    assert [it.status for it in shown] == ["OK", "BUILD-FAIL", "MISMATCH", "OK"]
    assert shown[0].changed == ["(start)"] and shown[1].changed[0].endswith("k.cu")
    assert "expected a" in shown[1].errors and shown[1].resources is None
    assert "(b=0, h=3, s=17, d=5) expected 0.25, got 0.75" in shown[2].mismatch_lines()[0]
    # ptxas deltas: against the previous build that had resources (the failed one had none)
    assert shown[2].deltas == ["k_fwd<64>: regs 100 -> 110 (+10)"]
    assert shown[3].deltas == ["k_fwd<64>: regs 110 -> 104 (-6)"]
    text = console.export_text()
    for words in ("BUILD-FAIL", 'expected a ";"', "MISMATCH", "(b=0, h=3, s=17, d=5)", "regs 110 -> 104 (-6)", "built in 1.5 s",
                  "0.0004 vs tolerance 0.002 (0.20x)"):  # fmt: skip
        assert words in text, words


def test_a_header_edit_triggers_an_unrelated_file_or_a_touch_does_not(project):
    kernels = project / "kernels"

    def touch_only():
        return [kernels / "k.cu"]  # mtime moves, content does not

    edits = [write(kernels / "unrelated.cuh", "// edited\n"), touch_only, write(kernels / "tile.cuh", "constexpr int kBlockM = 128;\n")]
    code, shown = run(project, edits)
    assert code == 130
    assert len(shown) == 2  # the start, then the header edit only
    assert shown[1].changed[0].endswith("tile.cuh")


def test_several_quick_writes_are_one_iteration(project):
    src = project / "kernels" / "k.cu"
    head = '#include "flashcore.h"\n#include "tile.cuh"\n'

    def burst():  # an editor writing three times within the settle time (the script's sleep moves the clock)
        src.write_text(head + "// REGS=1")
        return [src]

    script_edits = [burst]
    code, shown = run(project, script_edits)
    assert len(shown) == 2 and code == 130

    # writes that keep coming while the loop settles restart its wait: one iteration, on the last content
    script = Script([])
    reg = load_registry(project / "variants.yaml")
    seen = []

    def check(registry, variant):
        seen.append(src.read_text())
        return fake_check(registry, variant)

    watcher = Watcher(WatchSteps(lambda: (reg, reg.get("k")), check, fake_resources), lambda it, h: None,
                      sleep=script.sleep, clock=script.clock)  # fmt: skip
    watcher.iterate(["(start)"])
    writes = iter([head + "// REGS=120\n", head + "// REGS=130\n", head + "// REGS=140\n"])

    def sleep(seconds):
        script.now += seconds
        text = next(writes, None)
        if text is not None:
            src.write_text(text)
            script.mtime += 1_000_000_000
            os.utime(src, ns=(script.mtime, script.mtime))

    watcher.sleep = sleep
    changed = watcher.wait_for_change()
    assert changed and changed[0].endswith("k.cu")
    it = watcher.iterate(changed)
    assert seen[-1].endswith("REGS=140\n") and it.resources[0].registers == 140


def test_bench_shows_sdpa_and_the_previous_build(project):
    src = project / "kernels" / "k.cu"
    head = '#include "flashcore.h"\n#include "tile.cuh"\n'
    calls = []

    def sdpa():
        calls.append(1)
        return 10.0

    console = Console(record=True, width=160)
    edits = [write(src, head + "// REGS=100 SLOW\n"), write(src, head + "// REGS=100 WRONG\n")]
    code, shown = run(project, edits, bench=True, sdpa=sdpa,
                      render=lambda it, h: render_iteration(console, it, h, title="watch k", clear=False))  # fmt: skip
    assert code == 130 and len(calls) == 1  # SDPA is measured once
    assert (shown[0].median_us, shown[0].sdpa_us, shown[0].previous_us) == (8.0, 10.0, None)
    assert (shown[1].median_us, shown[1].previous_us) == (12.0, 8.0)
    assert shown[2].status == "MISMATCH" and shown[2].median_us is None  # a wrong kernel is never timed
    text = console.export_text()
    assert "vs SDPA 10.0 us: 1.25x" in text and "vs previous 8.0 us: 1.50x slower" in text


def test_a_change_within_the_spread_is_same_not_slower(project):
    """8.0 then 8.1 us whose p10-p90 spread (7.9-8.3) covers the difference: "same (within noise)", not
    "0.99x slower"; then 12 us, outside both spreads: slower."""
    src = project / "kernels" / "k.cu"
    head = '#include "flashcore.h"\n#include "tile.cuh"\n'
    console = Console(record=True, width=160)
    edits = [write(src, head + "// REGS=100 NOISY\n"), write(src, head + "// REGS=100 SLOW\n")]
    code, shown = run(project, edits, bench=True, sdpa=lambda: 10.0,
                      render=lambda it, h: render_iteration(console, it, h, title="watch k", clear=False))  # fmt: skip
    assert code == 130 and [it.median_us for it in shown] == [8.0, 8.1, 12.0]
    text = " ".join(console.export_text().split())
    assert "vs previous 8.0 us: same (within noise)" in text and "vs previous 8.1 us: 1.48x slower" in text


def test_ctrl_c_during_a_build_leaves_cleanly(project):
    reg = load_registry(project / "variants.yaml")

    def check(registry, variant):
        raise KeyboardInterrupt  # what run_worker re-raises after killing the worker's process group

    watcher = Watcher(WatchSteps(lambda: (reg, reg.get("k")), check, fake_resources), lambda it, h: None)
    assert watcher.run() == 130


def test_a_broken_registry_is_shown_and_watched(project):
    registry = project / "variants.yaml"
    good = registry.read_text()
    edits = [write(registry, "variants: [\n"), write(registry, good)]
    code, shown = run(project, edits)
    assert [it.status for it in shown] == ["OK", "ERROR", "OK"]
    assert "variants.yaml" in shown[1].errors


def test_resource_deltas():
    def k(name, regs, smem=0, spill=0, arch="sm_90"):
        return KernelResources(f"_Z{name}", f"void {name}(FlashcoreParams)", arch, registers=regs, static_smem=smem, spill_stores=spill)

    assert resource_deltas(None, [k("a<64>", 100)]) == []
    assert resource_deltas([k("a<64>", 100)], [k("a<64>", 100)]) == []
    lines = resource_deltas([k("a<64>", 100, 1024), k("gone<1>", 10)], [k("a<64>", 96, 2048, 8), k("b<128>", 50)])
    assert lines == [
        "a<64>: regs 100 -> 96 (-4), static smem 1024 B -> 2048 B (+1024), spills 0 B -> 8 B (+8)",
        "b<128>: new (50 regs, 0 B static smem, 0 B spills)",
        "gone<1>: gone",
    ]


def test_an_iteration_without_a_build_renders():
    console = Console(record=True, width=120)
    it = Iteration(1, ["(start)"], errors="registry: broken")
    render_iteration(console, it, [it], title="watch k", clear=False)
    assert "registry: broken" in console.export_text()


def test_watch_is_a_command():
    from typer.testing import CliRunner

    from flashcore_cli.cli import app

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "watch" in result.output
    result = CliRunner().invoke(app, ["watch", "--help"])
    assert result.exit_code == 0 and "--bench" in result.output and "--shape" in result.output


def test_the_command_wires_the_workers_steps(project, monkeypatch, tmp_path):
    """`flashcore watch k --bench` with the workers replaced: the cases it checks, the case it times, SDPA's
    row, the build's resources read from its build.json; Ctrl-C at the first wait."""
    import json

    from typer.testing import CliRunner

    from flashcore_cli.check import correctness
    from flashcore_cli.cli import app
    from flashcore_cli.loop import watch
    from flashcore_cli.measure import bench
    from flashcore_cli.measure.bench import BenchRow

    build_dir = tmp_path / "build"
    build_dir.mkdir()
    (build_dir / "build.json").write_text(json.dumps({"resources": [{"mangled": "_Z1k", "kernel": "k_fwd<64>", "arch": "sm_90", "registers": 96}]}))
    asked = {}

    def run_variant(registry, variant, cases, *, arch, timeout, **kw):
        asked["cases"], asked["arch"] = cases, arch
        built = {"key": "abc", "cached": True, "build_seconds": 0.0, "directory": str(build_dir)}
        return VariantOutcome(variant.name, [CaseOutcome(c, "OK", 0.0001, 0.001) for c in cases], build=built)

    def bench_variant(registry, variant, case, *, arch, reps, warmup, timeout, modes, **kw):
        asked["bench"], asked["modes"] = case, modes
        return {"cold": BenchRow(variant.name, "variant", "OK", {"median_us": 9.0})}

    def bench_references(case, *, reps, warmup, timeout, modes, **kw):
        return {"cold": [BenchRow("sdpa", "reference", "OK", {"median_us": 11.7})]}, {}

    monkeypatch.setattr(correctness, "run_variant", run_variant)
    monkeypatch.setattr(bench, "bench_variant", bench_variant)
    monkeypatch.setattr(bench, "bench_references", bench_references)
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setattr(watch.Watcher, "wait_for_change", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    result = CliRunner().invoke(app, ["--registry", str(project / "variants.yaml"), "watch", "k", "--shape", "1,2,97,64", "--causal",
                                      "--bench", "--arch", "sm_90"])  # fmt: skip
    assert result.exit_code == 130, result.output
    assert [(str(c.shape), c.causal, c.dtype) for c in asked["cases"]] == [("1,2,97,64", True, "fp16")]
    assert (str(asked["bench"].shape), asked["bench"].causal, asked["modes"]) == ("1,2,97,64", True, ("cold",))
    text = " ".join(result.output.split())
    assert "k_fwd<64> 96 regs" in text and "9.0 us median (cold)" in text and "vs SDPA 11.7 us: 1.30x" in text
    assert "stopped" in text
