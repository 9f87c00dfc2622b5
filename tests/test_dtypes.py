"""The registry's `dtypes:` key (fp16, bf16): validated on load, shown by `flashcore list`, and a dtype a variant
does not declare is refused with one clear line (the Python API) or a SKIP with the reason (test, bench)."""

import pytest
from typer.testing import CliRunner

from flashcore_cli.cli import app
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.variants import load_registry

runner = CliRunner(env={"COLUMNS": "200"})


def registry_with(tmp_path, dtypes_yaml: str | None):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "k.cu").write_text("")
    line = f"    dtypes: {dtypes_yaml}\n" if dtypes_yaml is not None else ""
    path = tmp_path / "variants.yaml"
    path.write_text(f"variants:\n  - name: a\n    sources: [k.cu]\n    summary: s\n    head_dims: [64]\n    causal: true\n{line}")
    return path


def test_default_is_fp16_and_the_shipped_registry_declares_bf16_where_the_launcher_takes_it(tmp_path):
    assert load_registry(registry_with(tmp_path, None)).get("a").dtypes == ("fp16",)
    assert load_registry(registry_with(tmp_path, "[fp16, bf16]")).get("a").dtypes == ("fp16", "bf16")
    shipped = load_registry()
    assert shipped.get("v12").dtypes == ("fp16", "bf16")
    assert shipped.get("v8").dtypes == ("fp16",)


@pytest.mark.parametrize(
    "dtypes_yaml, needle",
    [
        ("[fp32]", "unknown dtype 'fp32' (known: fp16, bf16)"),
        ("bf16", "must be a non-empty list of element types"),
        ("[]", "must be a non-empty list of element types"),
        ("[bf16, bf16]", "lists a dtype twice"),
    ],
)
def test_bad_dtypes_are_one_clear_error(tmp_path, dtypes_yaml, needle):
    path = registry_with(tmp_path, dtypes_yaml)
    with pytest.raises(FlashcoreError) as info:
        load_registry(path)
    assert f"{path}: variant 'a': key 'dtypes'" in str(info.value) and needle in str(info.value)


def test_unsupported_reason_names_the_variant_and_its_dtypes():
    reg = load_registry()
    assert reg.get("v8").unsupported_reason(64, False, dtype="bf16") == "dtype bf16 is not supported by v8 (it takes fp16)"
    assert reg.get("v12").unsupported_reason(64, False, dtype="bf16") is None
    assert reg.get("v8").unsupported_reason(64, False) is None  # fp16 by default


def test_list_shows_the_dtypes(table_rows):
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    dtypes = {row["name"]: row["dtypes"] for row in table_rows}
    assert dtypes["v12"] == "fp16, bf16" and dtypes["v8"] == "fp16"


# ---------------------------------------------------------------- cases, test and bench carry the dtype
def test_a_case_carries_its_dtype_through_json_and_stays_hashable():
    import json

    from flashcore_cli.registry.shapes import Case, parse_shape

    case = Case(parse_shape("1,2,17,64"), True, 3, "one-hot", "bf16")
    assert Case.from_dict(json.loads(json.dumps(case.as_dict()))) == case
    assert len({case, Case(parse_shape("1,2,17,64"), True, 3, "one-hot")}) == 2
    assert case.label() == "1,2,17,64 causal one-hot bf16"
    assert "dtype" not in Case(parse_shape("1,2,17,64"), True, 3).as_dict()  # fp16 records read as before


def test_inputs_are_drawn_in_the_case_dtype():
    torch = pytest.importorskip("torch")
    from flashcore_cli.check.case import make_inputs
    from flashcore_cli.registry.shapes import INPUT_KINDS, Case, parse_shape

    for inputs in INPUT_KINDS:
        for dtype, expected in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            q, k, v = make_inputs(Case(parse_shape("1,2,33,64"), False, 1, inputs, dtype), device="cpu")
            assert q.dtype == k.dtype == v.dtype == expected


def test_test_plans_every_declared_dtype_with_fp16_seeds_unchanged():
    import dataclasses

    from flashcore_cli.check.correctness import plan_cases
    from flashcore_cli.registry.family import DENSE
    from flashcore_cli.registry.shapes import default_cases

    reg = load_registry()
    fp16_only = plan_cases(reg.get("v8"), None, 100)
    assert fp16_only == default_cases((64, 128), 100) and {c.dtype for c in fp16_only} == {"fp16"}
    both = plan_cases(reg.get("v12"), None, 100)
    assert all(c.grads for c in both)  # v12 declares a backward: every case checks gradients too
    assert [dataclasses.replace(c, grads=False) for c in both[: len(fp16_only)]] == fp16_only
    # then the family's odd cases (v12 takes windows, softcaps and sinks), then the same in bf16
    family = len(both) // 2 - len(fp16_only)
    assert family > 0 and all(c.family != DENSE for c in both[len(fp16_only) : len(fp16_only) + family])
    assert [c.dtype for c in both[: len(both) // 2]] == ["fp16"] * (len(both) // 2)
    assert [c.dtype for c in both[len(both) // 2 :]] == ["bf16"] * (len(both) // 2)
    assert len({c.seed for c in both}) == len(both)  # fresh inputs for every case


def test_a_dtype_a_variant_does_not_declare_is_a_skip_with_the_reason():
    from flashcore_cli.measure.bench import bench_variant
    from flashcore_cli.check.correctness import run_variant
    from flashcore_cli.registry.shapes import Case, parse_shape

    reg = load_registry()
    case = Case(parse_shape("1,2,64,64"), False, 1, dtype="bf16")
    outcome = run_variant(reg, reg.get("v8"), [case], arch="sm_90", timeout=10)  # nothing runnable: no worker
    assert [(c.status, c.detail) for c in outcome.cases] == [("SKIP", "dtype bf16 is not supported by v8 (it takes fp16)")]
    row = bench_variant(reg, reg.get("v8"), case, arch="sm_90", reps=100, warmup=1, timeout=10)["cold"]
    assert (row.status, row.detail) == ("SKIP", "dtype bf16 is not supported by v8 (it takes fp16)")


def test_bench_dtype_reaches_the_workers_and_the_record(monkeypatch, tmp_path, fake_bench_workers):
    """No GPU: the workers are faked; the option, the cases they get and the record are real."""
    import json

    from flashcore_cli.measure.bench import BenchRow

    seen = []

    def fake_references(case, *, reps, warmup, timeout, modes=("cold",), on_event=None, passes="fwd"):
        seen.append(case.dtype)
        return {m: [BenchRow("sdpa", "reference", "OK", {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0})] for m in modes}, {}

    def fake_variant(registry, variant, case, *, arch, reps, warmup, timeout, modes=("cold",), on_event=None, defines=None, passes="fwd",
                     pair=""):
        seen.append(case.dtype)
        return {m: BenchRow(variant.name, "variant", "OK", {"median_us": 8.0, "p10_us": 7.0, "p90_us": 9.0}) for m in modes}

    fake_bench_workers(references=fake_references, variant=fake_variant)
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "v12", "--dtype", "bf16", "--json", str(out), "--arch", "sm_90"])
    assert result.exit_code == 0, result.output
    assert seen == ["bf16", "bf16"]
    assert json.loads(out.read_text())["dtype"] == "bf16"


@pytest.mark.parametrize("command", [["bench"], ["sweep"]])
def test_a_bad_dtype_is_one_line_and_exit_2(command):
    result = runner.invoke(app, [*command, "v11", "--dtype", "fp8"])
    assert result.exit_code == 2
    assert "bad --dtype 'fp8': expected one of fp16, bf16" in " ".join(result.output.split())
