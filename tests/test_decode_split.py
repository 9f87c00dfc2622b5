"""The decode rung's split plan, checked on the host: over many shapes and SM counts, the CTAs of its grid
must take every key tile of every (K/V head, m-block) exactly once, no split may be empty, the partial records
must fit the workspace without overlapping, and the launcher's plan and flashcore_forward_workspace must agree.
tests/fixtures/hosts/decode_split.cu runs the kernel's own plan_split / cta_work / record_offset /
workspace_bytes / plan_for; nvcc builds it (no GPU needed). The same program built with the tuning knobs
(-DDECODE_SPLITS=N, DECODE_MIN_BLOCKS, DECODE_RING_KB) checks that a forced split count is obeyed by the
launcher's plan and the workspace alike, and that the plan counts the CTAs per SM the knobs give."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

from conftest import host_check_program, run_host_check

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "hosts" / "decode_split.cu"

# The brief's five H200 shapes (B, H, H_kv, S, S_kv, D) and the split count the plan gives them on 132 SMs
# with two CTAs each: one wave of CTAs, or two when the heads alone fill one.
TARGETS = {
    (8, 32, 8, 1, 8192, 128): 4,
    (64, 32, 8, 1, 4096, 128): 1,
    (1, 32, 8, 1, 131072, 128): 33,
    (16, 64, 8, 1, 16384, 128): 2,
    (4, 32, 8, 4, 16384, 128): 8,
}


@pytest.fixture(scope="module")
def split_check(tmp_path_factory):
    return host_check_program(tmp_path_factory, SOURCE, "compute_90")


def build_with_knobs(tmp_path_factory, defines: dict[str, int]) -> Path:
    """The same host program built with -DNAME=value knobs (as `flashcore tune decode` builds the kernel)."""
    from flashcore_cli.builder.toolchain import find_nvcc
    from flashcore_cli.core.errors import FlashcoreError

    try:
        nvcc = find_nvcc()
    except FlashcoreError:
        pytest.skip("nvcc is not installed")
    exe = tmp_path_factory.mktemp("decode_split_knobs") / "decode_split"
    cmd = [str(nvcc), "-std=c++17", "-gencode", "arch=compute_90,code=compute_90", f"-I{ROOT / 'kernels'}",
           *(f"-D{k}={v}" for k, v in defines.items()), str(SOURCE), "-o", str(exe)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe


def cases() -> list[str]:
    out = []
    edges = [1, 2, 63, 64, 65, 97, 255, 256, 257, 1025, 4097, 8192, 131072]
    for b, h, h_kv in ((1, 1, 1), (2, 8, 2), (3, 32, 8), (1, 32, 1), (8, 32, 8), (2, 64, 2)):
        for s in (1, 3, 16):
            for s_kv in edges:
                for slots in (264, 58, 1):
                    out.append(f"{b},{h},{h_kv},{s},{s_kv},{128 if s_kv % 2 else 64},{slots}")
    out += [f"{b},{h},{h_kv},{s},{s_kv},{d},264" for (b, h, h_kv, s, s_kv, d) in TARGETS]
    out.append("70000,2,1,1,5,64,264")  # B * H_kv past 65535: a 1-D grid
    rng = random.Random(7)  # a fixed draw: the same cases every run
    for _ in range(200):
        h_kv = rng.choice((1, 2, 4, 8))
        out.append(f"{rng.randint(1, 16)},{h_kv * rng.choice((1, 4, 8, 32))},{h_kv},{rng.randint(1, 16)},"
                   f"{rng.randint(1, 20000)},{rng.choice((64, 128))},{rng.choice((1, 58, 114, 228, 264, 1000))}")
    # slots = 0: the launcher's own plan (plan_for) and flashcore_forward_workspace
    out += [f"{b},{h},{h_kv},{s},{s_kv},{d},0" for (b, h, h_kv, s, s_kv, d) in TARGETS]
    out += ["1,4,1,16,97,64,0", "2,8,8,2,1,128,0"]
    return out


def test_decode_split_covers_every_key_once_and_records_fit_the_workspace(split_check):
    lines = run_host_check(split_check, cases())
    splits = {int(line.split()[2].split("=")[1]) for line in lines}
    assert 1 in splits and max(splits) > 32  # both regimes: whole heads per CTA, and heads cut into many splits


def test_decode_split_counts_at_the_target_shapes(split_check):
    wanted = [f"{b},{h},{h_kv},{s},{s_kv},{d},264" for (b, h, h_kv, s, s_kv, d) in TARGETS]
    got = [int(line.split()[2].split("=")[1]) for line in run_host_check(split_check, wanted)]
    assert got == list(TARGETS.values())


def test_decode_split_check_rejects_a_malformed_case(split_check):
    proc = subprocess.run([str(split_check), "1,8,1,1,64"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL 1,8,1,1,64: not B,H,H_kv,S,S_kv,D,slots")


def splits_of(lines: list[str]) -> list[int]:
    return [int(line.split()[2].split("=")[1]) for line in lines]


# DECODE_SPLITS=N: N splits, clamped to the tiles and kMaxSplits (256), then to the most that leave no split
# empty (33 of 128 tiles: runs of 4 tiles make 32 splits). At the targets (launcher's plan, slots = 0), then at
# heads of 1, 2, 10 and 2048 tiles.
FORCED = {
    8: [8, 8, 8, 8, 8, 1, 2, 5, 8],
    33: [32, 32, 33, 32, 32, 1, 2, 10, 33],
    300: [128, 64, 256, 256, 256, 1, 2, 10, 256],
}
FORCED_EXTRA = ["1,8,2,1,1,128,0", "2,8,2,3,97,64,0", "1,4,1,1,640,128,264", "1,8,8,1,131072,64,58"]


@pytest.mark.parametrize("forced", sorted(FORCED))
def test_a_forced_split_count_is_obeyed_by_the_launcher_and_the_workspace(tmp_path_factory, forced):
    exe = build_with_knobs(tmp_path_factory, {"DECODE_SPLITS": forced})
    # every case's coverage, records and workspace; slots = 0: plan_for and flashcore_forward_workspace; the
    # program itself fails any plan whose count is not the forced one
    run_host_check(exe, cases())
    wanted = [f"{b},{h},{h_kv},{s},{s_kv},{d},0" for (b, h, h_kv, s, s_kv, d) in TARGETS] + FORCED_EXTRA
    assert splits_of(run_host_check(exe, wanted)) == FORCED[forced]


# DECODE_MIN_BLOCKS caps the CTAs per SM the plan counts on (what shared memory fits, at most the knob):
# 132 SMs x 1 = 132 slots, and with a 64 KB ring x 3 = 396 slots, at the five targets.
PER_SM = {
    (("DECODE_MIN_BLOCKS", 1),): [2, 1, 16, 1, 4],
    (("DECODE_RING_KB", 64), ("DECODE_MIN_BLOCKS", 3)): [6, 3, 49, 3, 12],
}


@pytest.mark.parametrize("knobs", list(PER_SM), ids=lambda k: " ".join(f"{n}={v}" for n, v in k))
def test_the_plan_counts_the_ctas_per_sm_the_knobs_give(tmp_path_factory, knobs):
    exe = build_with_knobs(tmp_path_factory, dict(knobs))
    wanted = [f"{b},{h},{h_kv},{s},{s_kv},{d},0" for (b, h, h_kv, s, s_kv, d) in TARGETS]
    assert splits_of(run_host_check(exe, wanted)) == PER_SM[knobs]


def test_the_registry_tunes_the_knobs_the_decode_sources_define():
    """Every parameter of the decode entry's tune block is an #ifndef knob of the decode sources, its default
    (the shipped build) is among the declared values, and the constraints admit the all-defaults combination."""
    from flashcore_cli.measure.tune import grid
    from flashcore_cli.registry.variants import load_registry

    space = load_registry(ROOT / "variants.yaml").get("decode").tune
    text = "".join(path.read_text() for path in sorted((ROOT / "kernels" / "decode").glob("*.cu*")))
    defaults = {name: int(value) for name, value in re.findall(r"#ifndef (DECODE_\w+)\n#define \1 (\d+)", text)}
    assert set(space.params) == set(defaults)
    assert all(defaults[name] in values for name, values in space.params.items())
    shipped = grid({k: [v] for k, v in defaults.items()}, space.constraints)
    assert len(shipped) == 1 and not shipped[0].skipped


WINDOW_SOURCE = ROOT / "tests" / "fixtures" / "hosts" / "decode_window.cu"
BIG = 2**31 - 1


def window_cases(count: int, seed: int) -> list[str]:
    """B,H,H_kv,S,S_kv,left,right,slots: the issue's window row and its edges, rows that see no key (S > S_kv, a
    window of the diagonal alone, one ending before key 0), two-sided and huge windows, then random ones."""
    fixed = ["1,32,8,1,131072,4096,0,0", "1,32,8,1,131072,4095,0,0", "1,32,8,1,4096,-1,0,0", "4,32,8,4,16384,1024,0,0",
             "1,8,1,16,5,2,0,0", "1,8,1,16,5,0,0,0", "1,4,1,16,100,0,0,0", "1,4,1,16,100,3,5,0",
             f"1,4,1,16,100,{BIG},{BIG},0", f"1,4,1,3,1000,{BIG},0,0", f"1,4,1,3,1000,10,{BIG},0", "1,4,1,3,1,5,0,0"]  # fmt: skip
    rng = random.Random(seed)
    lefts = [-1, 0, 1, 5, 15, 16, 63, 64, 65, 100, 1000, 4096]
    rights = [-1, 0, 1, 3, 17, 64, 200]
    cases = []
    for _ in range(count):
        hkv, s = rng.randint(1, 2), rng.randint(1, 16)
        skv = rng.randint(1, 700) if rng.random() < 0.67 else rng.randint(1, 9000)
        left = rng.choice(lefts) if rng.random() < 0.75 else rng.randint(0, 2999)
        cases.append(f"{rng.randint(1, 2)},{hkv * 2 ** rng.randint(0, 3)},{hkv},{s},{skv},{left},{rng.choice(rights)},"
                     f"{rng.choice([0, 1, 7, 58, 264])}")  # fmt: skip
    return fixed + cases


def test_a_window_reads_and_folds_only_the_keys_its_rows_see(tmp_path_factory):
    exe = host_check_program(tmp_path_factory, WINDOW_SOURCE, "compute_90")
    lines = run_host_check(exe, window_cases(400, 47))
    # a 4096 window over a 131072-key cache reads the window's 65 tiles per K/V head (8 of them), not the cache's 2048
    assert "tiles 65 " in lines[0] and "tiles read 520 over" in lines[0], lines[0]
