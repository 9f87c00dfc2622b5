"""The decode rung's split plan, checked on the host: over many shapes and SM counts, the CTAs of its grid
must take every key tile of every (K/V head, m-block) exactly once, no split may be empty, the partial records
must fit the workspace without overlapping, and the launcher's plan and flashcore_forward_workspace must agree.
tests/fixtures/hosts/decode_split.cu runs the kernel's own plan_split / cta_work / record_offset /
workspace_bytes / plan_for; nvcc builds it (no GPU needed)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from conftest import host_check_program

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


def run(exe, wanted: list[str]) -> list[str]:
    proc = subprocess.run([str(exe), *wanted], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    failed = [line for line in lines if not line.startswith("OK ")]
    assert proc.returncode == 0 and not failed, "\n".join(failed[:10]) + proc.stderr
    assert [line.split()[1] for line in lines] == wanted  # one verdict per case, in order
    return lines


def test_decode_split_covers_every_key_once_and_records_fit_the_workspace(split_check):
    lines = run(split_check, cases())
    splits = {int(line.split()[2].split("=")[1]) for line in lines}
    assert 1 in splits and max(splits) > 32  # both regimes: whole heads per CTA, and heads cut into many splits


def test_decode_split_counts_at_the_target_shapes(split_check):
    wanted = [f"{b},{h},{h_kv},{s},{s_kv},{d},264" for (b, h, h_kv, s, s_kv, d) in TARGETS]
    got = [int(line.split()[2].split("=")[1]) for line in run(split_check, wanted)]
    assert got == list(TARGETS.values())


def test_decode_split_check_rejects_a_malformed_case(split_check):
    proc = subprocess.run([str(split_check), "1,8,1,1,64"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL 1,8,1,1,64: not B,H,H_kv,S,S_kv,D,slots")
