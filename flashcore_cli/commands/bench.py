"""`flashcore bench`: time variants beside PyTorch SDPA (default and each backend) and the Triton reference,
in one run; the tables, one per mode."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from flashcore_cli.commands.options import (DEFAULT_REPS, DEFAULT_WARMUP, All, Arch, Causal, Dtype, JsonOut, Names, Pass,
                                            Reps, Seed, Sinks, Softcap, Warmup, Window, check_counts, family_options,
                                            usable_paths)
from flashcore_cli.core.console import console, dtype_label, progress, styled, timing_note
from flashcore_cli.core.dtypes import DEFAULT_DTYPE
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.passes import DEFAULT_PASS
from flashcore_cli.measure.modes import DEFAULT_MODE, mode_help
from flashcore_cli.registry.archs import target_arch
from flashcore_cli.registry.variants import load_registry, require_runnable


def bench(
    ctx: typer.Context,
    names: Names = None,
    *,
    all_: All = False,
    shape: Annotated[Optional[str], typer.Option("--shape", help="B,H,S,D, or B,Hq:Hkv,Sq:Sk,D for grouped-query heads and "
                                                 "keys of another length (default: the mission shape 1,8,512,64)")] = None,
    causal: Causal = False,
    reps: Reps = DEFAULT_REPS,
    warmup: Warmup = DEFAULT_WARMUP,
    json_path: JsonOut = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per variant (after its build)")] = 300.0,
    seed: Seed = None,
    arch: Arch = None,
    mode: Annotated[str, typer.Option("--mode", help=f"{mode_help()}; several, comma-separated, in one record")] = DEFAULT_MODE,
    dtype: Dtype = DEFAULT_DTYPE,
    passes: Pass = DEFAULT_PASS,
    pair: Annotated[Optional[str], typer.Option("--pair", help="a reference row (e.g. sdpa-cudnn) also timed in each variant's "
                                                "worker, its samples in turn with the variant's: the row REF~VARIANT "
                                                "(cold mode)")] = None,
    window: Window = None,
    softcap: Softcap = None,
    sinks: Sinks = False,
) -> int:
    """Time variants beside PyTorch SDPA (default and each backend), FlexAttention and the Triton reference, in one run."""
    return cmd_bench(ctx.obj["registry"], names, all_, shape, causal, reps, warmup, json_path, timeout, seed, arch, mode,
                     dtype, passes, pair, family_options(window, softcap, sinks))  # fmt: skip


def cmd_bench(registry_path, names, all_, shape_text, causal, reps, warmup, json_path, timeout, seed, arch, mode=DEFAULT_MODE,
              dtype_text=DEFAULT_DTYPE, pass_text=DEFAULT_PASS, pair=None, family=None) -> int:  # fmt: skip
    from flashcore_cli.core.gpu import require_gpu
    from flashcore_cli.measure.bench import BenchRun, bench_references, bench_variant, finish
    from flashcore_cli.measure.references import REFERENCE_ROWS
    from flashcore_cli.check.correctness import new_seed, write_json
    from flashcore_cli.registry.shapes import MISSION_SHAPE, Case, parse_dtype, parse_pass, parse_shape
    from flashcore_cli.measure.modes import MODES, parse_modes
    from flashcore_cli.registry.family import DENSE

    family = family or DENSE
    modes = parse_modes(mode)
    dtype = parse_dtype(dtype_text)
    passes = parse_pass(pass_text)
    reg = load_registry(registry_path)
    variants = reg.select(names, True) if not names else reg.select(names, all_)
    shape = parse_shape(shape_text or MISSION_SHAPE)
    check_counts(reps, warmup, timeout)
    if pair is not None and pair not in REFERENCE_ROWS:
        raise FlashcoreError(f"--pair {pair!r}: expected a reference row, one of {', '.join(REFERENCE_ROWS)}")
    if pair is not None and modes != ["cold"]:
        raise FlashcoreError(f"--pair: paired samples are taken in cold mode only (not --mode {','.join(modes)})")
    arch = target_arch(arch)
    if names:  # the variants asked for by name: a shape none of them runs is a bad value (with --all: SKIP rows)
        require_runnable(variants, [shape], causal=causal, dtype=dtype, backward=passes != DEFAULT_PASS, family=family)
    usable_paths(json_path, results=True, create=False)  # checked, nothing made before a refusal (no GPU)
    require_gpu("bench")
    usable_paths(json_path, results=True)
    seed = seed if seed is not None else new_seed()
    case = Case(shape, causal, seed, dtype=dtype, grads=passes != DEFAULT_PASS, family=family)
    run = BenchRun(shape, causal, seed, modes, dtype=dtype, passes=passes, family=family)
    console.print(f"bench {shape}{' causal' if causal else ''}{family.label(causal)}{dtype_label(dtype)}{pass_label(passes)}: "
                  f"{reps} samples per row and mode; seed {seed}")  # fmt: skip
    for m in modes:
        console.print(f"  {MODES[m].title}")
    with progress() as bar:
        task = bar.add_task("references (SDPA backends, FlexAttention, Triton)", total=len(variants) + 1)
        refs, run.environment = bench_references(case, reps=reps, warmup=warmup, timeout=timeout, modes=modes,
                                                 passes=passes)  # fmt: skip
        run.add(refs)
        bar.update(task, advance=1, done="references")
        for v in variants:
            bar.update(task, description=f"{v.name}: build, check, time")
            rows = bench_variant(reg, v, case, arch=arch, reps=reps, warmup=warmup, timeout=timeout, modes=modes,
                                 passes=passes, pair=pair or "")  # fmt: skip
            run.add({m: [row, *([row.paired] if row.paired else []), *([row.plain] if row.plain else [])] for m, row in rows.items()})
            bar.update(task, advance=1, done=v.name)
    finish(run)
    render_bench(run)
    from flashcore_cli.core.records import save_record

    record = run.record()
    saved = save_record(record, "bench", f"{shape}{'-causal' if causal else ''}{family.label(causal).replace(' ', '-')}"
                                         f"{'' if dtype == 'fp16' else '-' + dtype}{'' if passes == 'fwd' else '-' + passes}")  # fmt: skip
    console.print(f"record: {saved}")
    if json_path:
        write_json(json_path, record)
        console.print(f"wrote {json_path}")
    return 0


BYTES_COUNTED = {"fwd": "Q, K, V read, O written", "bwd": "Q, K, V, O, dO read, dQ, dK, dV written",
                 "fwd+bwd": "the forward's and the backward's"}  # fmt: skip


def pass_label(passes: str) -> str:
    return "" if passes == DEFAULT_PASS else f" ({passes})"


def render_bench(run) -> None:
    """One table per mode, its title naming the mode; speedups against SDPA in the same mode; each row's place
    against the GPU's tensor and memory peaks (roofline.py)."""
    from flashcore_cli.measure.bench import baseline_median
    from flashcore_cli.measure.roofline import roofline

    env = run.environment
    peaks = run.peaks
    for mode in run.modes:
        title = (
            f"{run.shape}{' causal' if run.causal else ''}{run.family.label(run.causal)}{dtype_label(run.dtype)}"
            f"{pass_label(run.passes)} on "
            f"{env.get('gpu', '?')}, {mode} mode (torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
            f"driver {env.get('driver', '?')})"
        )
        table = Table(title=title)
        for col, just in (("name", "left"), ("status", "left"), ("median us", "right"), ("p10 us", "right"),
                          ("p90 us", "right"), ("TFLOP/s", "right"), ("% tensor", "right"), ("GB/s", "right"),
                          ("% memory", "right"), ("bound", "left"), (f"vs {run.baseline}", "right"), ("note", "left")):  # fmt: skip
            table.add_column(col, justify=just, overflow="fold")
        rows = run.rows.get(mode, [])
        sdpa = baseline_median(rows, run.baseline)
        for r in rows:
            if r.median:
                flops, bytes_moved = r.flops or run.flops, r.bytes_moved or run.bytes_moved  # a plain row's own
                tflops = flops / (r.median * 1e-6) / 1e12
                roof = roofline(flops, bytes_moved, r.median, peaks)
                pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
                speed = f"{sdpa / r.median:.2f}x" if sdpa else "-"
                table.add_row(
                    r.name, styled(r.status), f"{r.median:.1f}", f"{r.timing['p10_us']:.1f}", f"{r.timing['p90_us']:.1f}",
                    f"{tflops:.1f}", pct(roof.tensor_fraction), f"{roof.gbps:.0f}", pct(roof.memory_fraction), roof.bound,
                    speed, timing_note(r.kind, r.timing) + (f", {r.detail}" if r.detail else ""),
                )  # fmt: skip
            else:
                table.add_row(r.name, styled(r.status), *["-"] * 9,
                              (r.detail or "").splitlines()[0][:120] if r.detail else "")  # fmt: skip
        console.print(table)
        for r in rows:  # --pair: the two rows of each pair, timed in turn
            mine = next((x for x in rows if x.name == r.paired_with and x.kind == "variant"), None)
            if r.paired_with and r.median and mine is not None and mine.median:
                console.print(f"{mine.name} vs {r.name}, samples taken in turn (one clock and power state): "
                              f"{r.median / mine.median:.2f}x ({r.name}'s median / {mine.name}'s)")  # fmt: skip
    if peaks is not None and peaks.tensor_tflops:
        console.print(f"peaks ({env.get('gpu', '?')}): tensor {peaks.tensor_tflops:.0f} TFLOP/s dense 16-bit "
                      f"({peaks.sm_count} SMs x {peaks.sm_clock_mhz} MHz x {peaks.tensor_flops_per_sm_clock} FLOP/clock), "
                      f"memory {peaks.memory_gbps:.0f} GB/s (2 x {peaks.memory_clock_mhz} MHz x {peaks.bus_width_bits} bit / 8); "
                      f"bytes: {run.bytes_moved / 1e6:.1f} MB per call ({BYTES_COUNTED[run.passes]})")  # fmt: skip
    console.print(f"vs {run.baseline}: {run.baseline}'s median / this row's median, in the same mode (above 1: faster than "
                  f"{run.baseline}){'' if run.baseline == 'sdpa' else '; SDPA cannot express this case'}")  # fmt: skip

