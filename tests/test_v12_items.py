"""v12's work list, checked on the host: the plan it launches with (persistent CTAs, 64-, 128- or 192-row items,
mixed lists at D=64) must cover every query row of every head exactly once, give each item exactly the key tiles
its rows see (S_kv keys; causal bottom-right, so S != S_kv shifts the diagonal and may leave items with none), mask
exactly the tiles a row sees in part, read the K/V head its query head shares (grouped-query), and deal every item
to one CTA. tests/fixtures/hosts/v12_items.cu runs the kernel's own item_at / item_tiles / tile_needs_mask /
kv_head / snake_index / plan_for; nvcc builds it (no GPU needed)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from conftest import host_check_program, run_host_check

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "hosts" / "v12_items.cu"


@pytest.fixture(scope="module")
def items_check(tmp_path_factory):
    return host_check_program(tmp_path_factory, SOURCE, "compute_90a")


def shapes() -> list[str]:
    edges = [1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 384, 385, 1000, 2048, 3000, 4096, 5000]
    out = [f"{b},{h},{s},{d},{c}" for b, h in ((1, 1), (2, 16), (1, 16), (4, 16), (8, 16))
           for s in edges for d in (64, 128) for c in (0, 1)]
    out += [f"1,16,16384,64,{c}" for c in (0, 1)]
    rng = random.Random(12)  # a fixed draw: the same shapes every run
    out += [f"{rng.randint(1, 8)},{rng.randint(1, 40)},{rng.randint(1, 9000)},{rng.choice((64, 128))},{rng.randint(0, 1)}"
            for _ in range(150)]
    return out


def shapes_kv() -> list[str]:
    """B,H,S,D,causal,S_kv,H_kv: queries shorter and longer than keys (causal offsets of either sign), decode
    and chunked prefill, grouped-query and multi-query heads."""
    lengths = [1, 17, 64, 65, 128, 129, 255, 384, 1000, 4096]
    out = [f"{b},{h},{s},{d},{c},{s_kv},{h_kv}" for b, h, h_kv in ((1, 1, 1), (2, 16, 4))
           for s in lengths for s_kv in lengths if s != s_kv for d in (64, 128) for c in (0, 1)]
    decode_and_prefill = ((8, 1, 8192), (64, 1, 4096), (1, 1, 131072), (4, 4, 16384), (1, 512, 8192), (1, 8192, 512))
    out += [f"{b},32,{s},128,{c},{s_kv},8" for b, s, s_kv in decode_and_prefill for c in (0, 1)]
    rng = random.Random(13)
    for _ in range(150):
        h_kv = rng.randint(1, 8)
        out.append(f"{rng.randint(1, 8)},{h_kv * rng.choice((1, 2, 4, 8))},{rng.randint(1, 9000)},"
                   f"{rng.choice((64, 128))},{rng.randint(0, 1)},{rng.randint(1, 9000)},{h_kv}")
    return out


def test_v12_work_list_covers_every_row_once_and_every_item_is_dealt_once(items_check):
    lines = run_host_check(items_check, shapes())
    plans = {tuple(int(kv.split("=")[1]) for kv in line.split()[2:5]) for line in lines}
    # the set reaches every kind of list the launcher makes: 1 (short grids), 2 and 3 consumers, and mixed lists
    assert {1, 2, 3} <= {consumers for consumers, _, _ in plans}
    assert any(small > 0 for _, _, small in plans)


def test_v12_work_list_over_other_key_lengths_and_shared_kv_heads(items_check):
    lines = run_host_check(items_check, shapes_kv())
    empty = {line.split()[1]: int(line.split()[5].split("=")[1]) for line in lines}
    # causal with S > S_kv leaves items whose rows see no key (no tiles, still written); never without causal
    assert empty["1,1,4096,64,1,17,1"] > 0 and empty["1,1,4096,64,0,17,1"] == 0
    assert all(n == 0 for shape, n in empty.items() if shape.split(",")[4] == "0")


def test_v12_work_check_rejects_a_malformed_shape(items_check):
    proc = subprocess.run([str(items_check), "2,16,4096"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL 2,16,4096: not B,H,S,D,causal")
    proc = subprocess.run([str(items_check), "2,16,4096,64,1,4096,5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "H_kv dividing H" in proc.stdout


WINDOW_SOURCE = ROOT / "tests" / "fixtures" / "hosts" / "v12_items_window.cu"


def window_cases(count: int, seed: int) -> list[str]:
    """B,H,S,D,causal,S_kv,H_kv,left,right: the issue's rows, windows of one key and of more than the keys, windows
    that leave items empty (S > S_kv, a window ending before key 0), two-sided and huge windows, then random ones."""
    import random

    big = 2**31 - 1
    fixed = ["1,16,16384,128,1,16384,16,1024,0", "2,16,8192,64,1,8192,16,4096,0", "2,16,8192,64,1,8192,16,128,0",
             "1,8,512,64,1,512,8,0,0", "1,8,512,64,0,512,8,64,64", "1,4,1500,128,1,700,4,32,0",
             "1,4,129,64,0,1,4,5,5", f"1,4,1000,64,0,1000,4,{big},{big}", f"1,4,300,128,1,1000,2,{big},0",
             "1,4,700,64,0,1500,4,-1,7", "2,8,1000,64,0,300,2,0,2000"]  # fmt: skip
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        hkv = rng.choice([1, 2, 4])
        s = rng.choice([rng.randint(1, 300), rng.randint(300, 3000)])
        skv = rng.choice([s, rng.randint(1, 3000)])
        left = rng.choice([-1, 0, 1, 63, 64, 127, 128, 200, 1024, rng.randint(0, 4000), big])
        right = rng.choice([-1, 0, 0, 1, 7, rng.randint(0, 300), big])
        causal = int(right == 0)
        cases.append(f"{rng.randint(1, 2)},{hkv * rng.choice([1, 2, 4])},{s},{rng.choice([64, 128])},{causal},{skv},{hkv},"
                     f"{left},{right}")  # fmt: skip
    return fixed + cases


def test_v12_work_list_under_windows_reads_only_the_tiles_its_rows_see(tmp_path_factory):
    exe = host_check_program(tmp_path_factory, WINDOW_SOURCE, "compute_90a")
    run_host_check(exe, window_cases(600, 47))
