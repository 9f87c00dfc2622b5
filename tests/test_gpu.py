"""GPU tests: run them on the lent GPU (`python3 -m pytest -q -m gpu`); skipped without CUDA."""

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, REPO
from flashcore_cli.cli import app

pytestmark = pytest.mark.gpu
runner = CliRunner()


def flashcore(*args, env=None, timeout=1800):
    return subprocess.run(
        [sys.executable, "-m", "flashcore_cli", *args], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, **(env or {})}, timeout=timeout,
    )  # fmt: skip


def test_build_then_cached_load_is_fast():
    from flashcore_cli import load_variant

    load_variant("baseline")  # built or cached
    start = time.perf_counter()
    attn = load_variant("baseline")
    assert attn.build.cached
    assert time.perf_counter() - start < 1.0
    assert attn.plan(64)[0][0] == "baseline_fwd<64>"


def test_two_processes_building_at_once_share_one_build(tmp_path):
    env = {"FLASHCORE_CACHE": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen([sys.executable, "-m", "flashcore_cli", "build", "baseline"], cwd=REPO,
                         env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    builds = list((tmp_path / "cache" / "build").glob("baseline-*/build.json"))
    assert len(builds) == 1
    assert sum("cached" in o for o in outputs) == 1, outputs  # the second waited for the first, then loaded it


def test_every_variant_passes_the_default_shape_set(tmp_path):
    out = tmp_path / "test.json"
    proc = flashcore("test", "--all", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    for v in record["variants"]:
        statuses = {c["status"] for c in v["cases"]}
        assert statuses <= {"OK", "SKIP"}, (v["variant"], statuses)
        assert "OK" in statuses


def test_hanging_and_faulting_variants_do_not_stop_the_run():
    proc = flashcore("--registry", str(FIXTURES / "faults.yaml"), "test", "--all", "--timeout", "15", "--shapes", "1,2,64,64")
    assert proc.returncode == 1
    lines = proc.stdout
    assert "hang: TIMEOUT" in lines
    assert "baseline: OK" in lines
    assert "fault: CRASH" in lines and "illegal memory access" in lines


def test_bench_prints_variants_beside_sdpa_and_triton(tmp_path):
    out = tmp_path / "bench.json"
    proc = flashcore("bench", "baseline", "--shape", "1,8,512,64", "--reps", "100", "--json", str(out),
                     env={"FLASHCORE_RESULTS": str(tmp_path / "results")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    rows = {r["name"]: r for r in record["rows"]}
    assert rows["sdpa"]["status"] == "OK" and rows["baseline"]["status"] == "OK"
    assert len(rows["baseline"]["samples_us"]) == 100
    assert rows["baseline"]["p10_us"] <= rows["baseline"]["median_us"] <= rows["baseline"]["p90_us"]
    assert record["environment"]["gpu"] and record["environment"]["torch"]
    assert rows["baseline"]["key"]
    assert list((tmp_path / "results").glob("bench-*.json"))


def test_bad_input_raises_clear_errors():
    import torch

    from flashcore_cli import load_variant
    from flashcore_cli.core.errors import FlashcoreInputError

    attn = load_variant("baseline")
    q = torch.randn(1, 2, 33, 64, device="cuda", dtype=torch.float16)
    cases = [
        ((q.cpu(), q.cpu(), q.cpu()), "CUDA tensors"),
        ((q.float(), q.float(), q.float()), "float16"),
        ((q, q[:, :, :17].contiguous(), q), "shape"),  # k and v of different shapes (a slice alone: "contiguous")
        ((q.transpose(2, 3).contiguous().transpose(2, 3), q, q), "contiguous"),
        ((q[..., :32].contiguous(),) * 3, "head dim 32"),
        ((q[0],) * 3, "4-D"),
        ((torch.empty(q.numel() + 1, device="cuda", dtype=torch.float16)[1:].view(q.shape),) * 3, "16-byte"),
    ]
    for args, needle in cases:
        with pytest.raises(FlashcoreInputError, match=needle):
            attn(*args)
    out = attn(q, q, q)
    assert out.shape == q.shape and not torch.isnan(out).any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 300, 64), (1, 2, 300, 128), (2, 40, 200, 64)])
def test_v11_is_exact_on_one_hot_rows(shape, causal):
    """q = k = v = randn * 30 (issue 16): every row is one-hot, SDPA is exact, and so must v11 be. Before its
    l_i summed the fp16 P that P V multiplies, v11 was one output ulp off there (0.0625 at |v| ~ 100)."""
    import math

    import torch

    from flashcore_cli import load_variant
    from flashcore_cli.check.case import reference

    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda") * 30).half()
    scale = 1.0 / math.sqrt(shape[3])
    ref = reference(x, x, x, causal, scale)
    out = load_variant("v11")(x, x, x, causal=causal, scale=scale)
    assert (out.float() - ref).abs().max().item() == 0.0


def test_v11_passes_the_default_set_in_fp16_and_bf16(tmp_path):
    """`flashcore test v11` checks every dtype v11 declares, each under the rule with SDPA's error in that dtype."""
    out = tmp_path / "test.json"
    proc = flashcore("test", "v11", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = json.loads(out.read_text())["variants"][0]["cases"]
    for dtype in ("fp16", "bf16"):
        statuses = {c["status"] for c in cases if c.get("dtype", "fp16") == dtype}
        assert statuses == {"OK"}, (dtype, statuses)


def test_bench_bf16_times_v11_beside_sdpa_in_bf16(tmp_path):
    out = tmp_path / "bench.json"
    proc = flashcore("bench", "v11", "v8", "--dtype", "bf16", "--shape", "1,8,512,64", "--reps", "100", "--json", str(out),
                     env={"FLASHCORE_RESULTS": str(tmp_path / "results")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    rows = {r["name"]: r for r in record["rows"]}
    assert record["dtype"] == "bf16"
    assert rows["sdpa"]["status"] == "OK" and rows["v11"]["status"] == "OK"
    assert rows["v8"]["status"] == "SKIP" and "dtype bf16 is not supported by v8" in rows["v8"]["detail"]
