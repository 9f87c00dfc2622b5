"""`flashcore tune`: the grid, safe constraints, the device-limit checks (a real nvcc), and a real tuning run on
the lent GPU."""

import json

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES
from flashcore_cli.cli import app
from flashcore_cli.registry.constraints import compile_constraint
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.builder.ptxas import KernelResources, VariantReport
from flashcore_cli.registry.variants import TuneSpace
from flashcore_cli.measure.tune import Candidate, grid, judge, parse_params

TUNE_REGISTRY = str(FIXTURES / "instruments" / "tune.yaml")
SPACE = TuneSpace(params={"BLOCK_M": [32, 48, 64], "STAGES": [2, 3]}, constraints=["BLOCK_M % 32 == 0 or STAGES == 2"])
runner = CliRunner()


def test_params_default_to_the_registry_and_can_be_narrowed():
    assert parse_params(None, SPACE, "v") == {"BLOCK_M": [32, 48, 64], "STAGES": [2, 3]}
    assert parse_params(["BLOCK_M=64,32,64"], SPACE, "v") == {"BLOCK_M": [64, 32], "STAGES": [2, 3]}
    assert parse_params(["STAGES=4"], SPACE, "v")["STAGES"] == [4]  # values beyond the declared ones may be tried


@pytest.mark.parametrize(
    "values, needle",
    [
        (["WARPS=4"], "does not declare it"),
        (["BLOCK_M"], "expected NAME=v1,v2"),
        (["BLOCK_M=32,x"], "must be integers"),
        (["BLOCK_M=32", "BLOCK_M=64"], "given twice"),
    ],
)
def test_bad_params(values, needle):
    with pytest.raises(FlashcoreError, match=needle):
        parse_params(values, SPACE, "v")
    with pytest.raises(FlashcoreError, match="declares no tuning parameters"):
        parse_params(None, TuneSpace(), "baseline")


def test_grid_applies_the_constraints():
    candidates = grid(parse_params(None, SPACE, "v"), SPACE.constraints)
    assert [c.label for c in candidates] == [
        "BLOCK_M=32 STAGES=2", "BLOCK_M=32 STAGES=3", "BLOCK_M=48 STAGES=2", "BLOCK_M=48 STAGES=3",
        "BLOCK_M=64 STAGES=2", "BLOCK_M=64 STAGES=3",
    ]  # fmt: skip
    assert [c.label for c in candidates if c.skipped] == ["BLOCK_M=48 STAGES=3"]


@pytest.mark.parametrize(
    "text, values, holds",
    [
        ("BLOCK_M % 16 == 0", {"BLOCK_M": 48}, True),
        ("16 <= BLOCK_M <= 64 and not STAGES > 3", {"BLOCK_M": 64, "STAGES": 3}, True),
        ("BLOCK_M // 16 * STAGES <= 8 or BLOCK_M == 32", {"BLOCK_M": 64, "STAGES": 3}, False),
        ("-BLOCK_M + 2 * STAGES < 0", {"BLOCK_M": 4, "STAGES": 1}, True),
        ("BLOCK_M / 32 == 2 and (BLOCK_M - 64) == 0", {"BLOCK_M": 64}, True),
    ],
)
def test_constraints_evaluate(text, values, holds):
    assert compile_constraint(text, ["BLOCK_M", "STAGES"]).holds(values) is holds


@pytest.mark.parametrize(
    "text, needle",
    [
        ("__import__('os').system('echo pwned')", "Call is not allowed"),
        ("BLOCK_M.__class__", "Attribute is not allowed"),
        ("BLOCK_M ** 64 > 0", "Pow is not allowed"),
        ("[BLOCK_M][0] == 1", "not allowed"),
        ("(lambda: 1)()", "not allowed"),
        ("'a' * 10 == BLOCK_M", "not an integer"),
        ("True", "not an integer"),
        ("WARPS > 1", "'WARPS' is not a tuning parameter"),
        ("BLOCK_M > 1 && STAGES > 1", "and/or/not"),
        ("BLOCK_M if STAGES else 1", "IfExp is not allowed"),
    ],
)
def test_unsafe_or_foreign_constraints_are_rejected_before_evaluation(text, needle):
    with pytest.raises(FlashcoreError, match=needle):
        compile_constraint(text, ["BLOCK_M", "STAGES"])


def test_division_by_zero_is_a_clear_error():
    with pytest.raises(FlashcoreError, match="divides by zero"):
        compile_constraint("64 % STAGES == 0", ["STAGES"]).holds({"STAGES": 0})


def kernel(**kw):
    base = dict(mangled="m", kernel="void k<64>(P)", arch="sm_90", registers=64, threads=128, head_dim=64, dynamic_smem=0, ctas_per_sm=4)
    return KernelResources(**{**base, **kw})


def test_limits_skip_spills_and_kernels_that_do_not_fit():
    c = Candidate({"T": 1})
    judge(c, VariantReport("v", "sm_90", kernels=[kernel()]), head_dim=64)
    assert not c.skipped and c.resources == "64 regs, 0.0 KB smem, 4 CTA/SM"
    c = Candidate({"T": 2})
    judge(c, VariantReport("v", "sm_90", kernels=[kernel(spill_stores=8, spill_loads=4)]), head_dim=64)
    assert c.skipped == "spills (8+4 B)"
    c = Candidate({"T": 3})
    judge(c, VariantReport("v", "sm_90", kernels=[kernel(ctas_per_sm=0, limiter="needs 300000 B smem")]), head_dim=64)
    assert c.skipped == "does not fit: needs 300000 B smem"
    c = Candidate({"T": 4})
    judge(c, VariantReport("v", "sm_90", error="k.cu(3): error: too big\nmore"), head_dim=64)
    assert c.skipped == "compile failed: k.cu(3): error: too big"


def test_dry_run_checks_every_combination_with_a_real_compile(nvcc, fresh_cache, table_rows):
    result = runner.invoke(app, ["--registry", TUNE_REGISTRY, "tune", "limits", "--shape", "1,8,512,64", "--dry-run"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "TILE (5) = 5 combination(s), 1 rejected by the constraints" in out
    assert "2 to run on the GPU; 3 skipped" in out
    rows = {row["parameters"]: row for row in table_rows}  # the ranking table's cells, however rich wraps them
    assert rows.keys() == {f"TILE={t}" for t in (16, 24, 64, 240, 512)}
    assert rows["TILE=16"]["status"] == rows["TILE=64"]["status"] == "to run"
    assert rows["TILE=24"]["note"].startswith("compile failed:") and "static assertion failed" in rows["TILE=24"]["note"]
    assert rows["TILE=240"]["note"].startswith("does not fit: needs 245760 B smem")
    assert rows["TILE=512"]["note"] == "constraint: TILE < 512"


def test_tune_without_a_tune_block_is_exit_2():
    result = runner.invoke(app, ["tune", "baseline"])
    assert result.exit_code == 2 and "declares no tuning parameters" in result.output


@pytest.mark.gpu
def test_tune_stores_the_winner_for_this_gpu(tmp_path, monkeypatch, fresh_cache):
    import torch

    from flashcore_cli.builder.tuned import tuned_defines, tuned_path

    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path / "results"))
    args = ["--registry", TUNE_REGISTRY, "tune", "tunable", "--param", "FC_TUNE_UNUSED=1,2,3", "--shape", "1,2,128,64"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "winner on" in result.output
    gpu = torch.cuda.get_device_name()
    assert tuned_path("tunable", gpu).is_file()
    assert tuned_defines("tunable", gpu)["FC_TUNE_UNUSED"] in {"1", "2"}  # 3 is rejected by the constraint
    (record,) = (tmp_path / "results").glob("tune-*.json")
    candidates = json.loads(record.read_text())["candidates"]
    assert sorted(c["status"] for c in candidates if not c["skipped"]) == ["OK", "OK"]


def in_process(fn, jobs, gpus, on_done=None):
    results = []
    for i, job in enumerate(jobs):
        results.append(fn(job))
        if on_done:
            on_done(i, results[-1], gpus[0])
    return results


def test_the_command_end_to_end_with_fake_trials(monkeypatch, tmp_path, fresh_cache):
    """No GPU: the probe and the trial workers are faked (FC_TUNE_UNUSED=2 is made fastest); the grid, the
    trial specs, the ranking and the stored winner are real."""
    from flashcore_cli.measure import gpus
    from flashcore_cli.core import isolate
    from flashcore_cli.builder import ptxas
    from flashcore_cli.core.isolate import WorkerOutcome
    from flashcore_cli.builder.tuned import tuned_defines

    specs = []

    def fake_run_worker(request, *, run_timeout, **_):
        specs.append(request)
        value = int(request.defines["FC_TUNE_UNUSED"])
        median = {1: 30.0, 2: 20.0}[value]
        checks = [{"event": "case", "case": c, "status": "OK", "detail": ""} for c in request.cases]
        timing = {"event": "timing", "median_us": median, "p10_us": median - 0.2, "p90_us": median + 0.2, "samples_us": [median] * 100}
        return WorkerOutcome("done", [{"event": "built", "key": f"k{value}"}, {"event": "device", "gpu": "NVIDIA H100 80GB HBM3"},
                                      *checks, timing, {"event": "done"}])  # fmt: skip

    report = VariantReport("tunable", "sm_90", [kernel(kernel="void baseline_fwd<64>(FlashcoreParams)")])
    monkeypatch.setattr(ptxas, "compile_probe", lambda variant, arch, extra_defines=None: report)
    monkeypatch.setattr(isolate, "run_worker", fake_run_worker)
    monkeypatch.setattr(gpus, "map_on_gpus", in_process)
    monkeypatch.setattr(gpus, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["--registry", TUNE_REGISTRY, "tune", "tunable", "--shape", "1,2,128,64", "--mode", "host"])
    assert result.exit_code == 0, result.output
    assert [s.defines for s in specs] == [{"FC_TUNE_UNUSED": "1"}, {"FC_TUNE_UNUSED": "2"}]  # 3: the constraint
    assert all(s.ignore_tuned and s.task == "trial" and s.modes == ["host"] for s in specs)
    (saved,) = tmp_path.glob("tune-*.json")
    assert json.loads(saved.read_text())["mode"] == "host"
    cases = {(c["shape"], c["causal"]) for c in specs[0].cases}
    assert cases == {(s, causal) for s in ("1,2,128,64", "2,3,17,64", "2,3,97,64") for causal in (False, True)}
    assert tuned_defines("tunable", "NVIDIA H100 80GB HBM3") == {"FC_TUNE_UNUSED": "2"}
    out = " ".join(result.output.split())
    assert "winner on NVIDIA H100 80GB HBM3: FC_TUNE_UNUSED=2 (20.0 us)" in out and "1.50x" in out


def test_a_decode_rung_is_checked_within_its_query_rows():
    """check_cases stays inside what the variant takes: a rung with max_seq_len (decode: 16) is checked at 1 and
    16 query rows of the tune shape's heads, against 17 and 97 keys (not at 17 and 97 query rows, which it refuses
    and every trial would crash on)."""
    from flashcore_cli.measure.tune import check_cases
    from flashcore_cli.registry.shapes import parse_shape
    from flashcore_cli.registry.variants import load_registry

    decode = load_registry(None).get("decode")
    cases = check_cases(decode, parse_shape("8,32:8,1:8192,128"), 7)
    assert {(c.shape.seq_len, c.shape.seq_len_kv) for c in cases} == {(1, 8192), (1, 17), (16, 97)}
    for c in cases:
        assert not decode.unsupported_reason(c.shape.head_dim, c.causal, gqa=c.shape.heads_kv != c.shape.heads,
                                             seqlen_kv=c.shape.seq_len_kv != c.shape.seq_len, seq_len=c.shape.seq_len)
