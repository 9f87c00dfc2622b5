"""v12's backward schedule, checked on the host: each CTA (128 keys of one K/V head) must step through exactly the
(query head, query block) pairs in which some query sees some of its keys, over every query head of the K/V head's
group, mask every step where one of a consumer's keys lies outside a query's window (causal or a sliding window,
bottom-right: S != S_kv shifts it; edges up to 2^31 - 1), and read LSE and D only within the rows the prep pass pads
them to (64 and 128 queries per step). tests/fixtures/hosts/v12_bwd_steps.cu runs the kernel's own bwd_steps / bwd_needs_mask by
brute force over every (query, key) pair; nvcc builds it (no GPU needed)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from conftest import host_check_program, run_host_check

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "hosts" / "v12_bwd_steps.cu"


@pytest.fixture(scope="module")
def steps_check(tmp_path_factory):
    return host_check_program(tmp_path_factory, SOURCE, "compute_90a")


def shapes() -> list[str]:
    """B,H,S,causal,S_kv,H_kv: equal and unequal lengths around the block sizes (causal offsets of either sign),
    decode-like and prefill-like, grouped-query and multi-query heads."""
    lengths = [1, 17, 63, 64, 65, 127, 128, 129, 200, 256, 257, 600]
    out = [f"{b},{h},{s},{c},{s_kv},{h_kv}" for b, h, h_kv in ((1, 1, 1), (2, 4, 2), (1, 8, 1))
           for s in lengths for s_kv in lengths for c in (0, 1)]
    rng = random.Random(30)  # a fixed draw: the same shapes every run
    for _ in range(60):
        h_kv = rng.randint(1, 4)
        out.append(f"{rng.randint(1, 3)},{h_kv * rng.choice((1, 2, 4))},{rng.randint(1, 1100)},{rng.randint(0, 1)},"
                   f"{rng.randint(1, 1100)},{h_kv}")
    return out


def window_shapes() -> list[str]:
    """B,H,S,causal,S_kv,H_kv,window_left,window_right: windows of 0, narrower and wider than a block, one-sided,
    past either end of the keys, up to 2^31 - 1 (the binding's bound), with causal (right edge 0) and without."""
    lengths = [1, 17, 64, 65, 129, 257, 600]
    windows = [(0, 0), (0, -1), (5, 0), (0, 7), (63, 64), (127, 0), (128, 128), (300, 2), (-1, 40), (40, -1),
               (2**31 - 1, 0), (2**31 - 1, 2**31 - 1), (-1, 2**31 - 1), (1000, 3)]
    out = [f"1,2,{s},0,{s_kv},1,{left},{right}" for s in lengths for s_kv in lengths for left, right in windows]
    out += [f"1,2,{s},1,{s_kv},2,{left},-1" for s in lengths for s_kv in lengths for left in (0, 100, 599)]
    rng = random.Random(47)  # a fixed draw: the same shapes every run
    for _ in range(100):
        h_kv = rng.randint(1, 3)
        left = rng.choice((-1, 0, rng.randint(0, 64), rng.randint(0, 1200)))
        right = rng.choice((-1, 0, rng.randint(0, 64), rng.randint(0, 1200)))
        out.append(f"{rng.randint(1, 2)},{h_kv * rng.choice((1, 2))},{rng.randint(1, 1100)},{rng.randint(0, 1)},"
                   f"{rng.randint(1, 1100)},{h_kv},{left},{right}")
    return out


def test_v12_backward_steps_cover_exactly_the_visible_blocks_and_mask_every_partial_one(steps_check):
    run_host_check(steps_check, shapes())


def test_v12_backward_steps_under_sliding_windows(steps_check):
    run_host_check(steps_check, window_shapes())


def test_v12_backward_steps_check_fails_where_it_must(steps_check):
    """The check itself can fail: a malformed shape is a FAIL line and exit 1."""
    proc = subprocess.run([str(steps_check), "1,3,64,1,64,2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL 1,3,64,1,64,2")
