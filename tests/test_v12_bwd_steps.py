"""v12's backward schedule, checked on the host: each CTA (128 keys of one K/V head) must step through exactly the
(query head, query block) pairs in which some query sees some of its keys, over every query head of the K/V head's
group, mask every step where one of a consumer's keys lies right of a query's diagonal (causal bottom-right:
S != S_kv shifts it), and read LSE and D only within the rows the prep pass pads them to (64, 80 and 128 queries per
step). tests/fixtures/hosts/v12_bwd_steps.cu runs the kernel's own bwd_steps / bwd_needs_mask by
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


def test_v12_backward_steps_cover_exactly_the_visible_blocks_and_mask_every_partial_one(steps_check):
    run_host_check(steps_check, shapes())


def test_v12_backward_steps_check_fails_where_it_must(steps_check):
    """The check itself can fail: a malformed shape is a FAIL line and exit 1."""
    proc = subprocess.run([str(steps_check), "1,3,64,1,64,2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL 1,3,64,1,64,2")
