"""The attention family (issue 47) without a GPU: the options and their one-line errors, the visible-pair and byte
counts against a brute-force count, the fp32 reference's semantics on the CPU (window, softcap, sinks, empty rows,
dsinks) against formulas written out here, and the cases a variant is given."""

import math

import pytest
from typer.testing import CliRunner

from conftest import REPO
from flashcore_cli.cli import app
from flashcore_cli.core.errors import EXIT_BAD_INPUT, FlashcoreError
from flashcore_cli.registry.family import DENSE, Family, parse_family, parse_window
from flashcore_cli.registry.shapes import Case, parse_shape, pass_bytes, visible_keys, visible_pairs

runner = CliRunner()
torch = pytest.importorskip("torch")


def test_window_parses_as_flashattention_names_it():
    assert parse_window("1024,0") == (1024, 0)
    assert parse_window("-1,-1") == (-1, -1)
    assert parse_window("128") == (128, -1)
    for bad in ("x", "1,2,3", "-2,0", "1,-5", "", "1.5,0"):
        with pytest.raises(FlashcoreError, match="bad --window"):
            parse_window(bad)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(FlashcoreError, match="bad --softcap"):
            parse_family(None, bad, False)


def test_family_labels_and_records_round_trip():
    f = Family(1024, -1, 50.0, True)
    assert f.window(True) == (1024, 0) and f.window(False) == (1024, -1)
    assert f.label(True) == " window 1024,0 softcap 50 sinks"
    assert Family(-1, 0).label(False) == "" and Family(-1, 0).is_dense(False)  # (-1, 0) is causal itself
    assert Family(-1, 0).needs(False) == {"window": False, "softcap": False, "sinks": False}
    assert Family(5, 5).needs(False)["window"] and Family(-1, 3).needs(False)["window"]
    case = Case(parse_shape("1,4,100,64"), True, 7, family=f, grads=True)
    assert Case.from_dict(case.as_dict()) == case
    assert "window" not in Case(parse_shape("1,4,100,64"), True, 7).as_dict()  # a dense case's record is as before


def _brute_pairs(sq, sk, window):
    left, right = window
    count = 0
    for i in range(sq):
        diag = i + sk - sq
        count += sum(1 for j in range(sk) if (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right))
    return count


@pytest.mark.parametrize("sq,sk,left,right,causal", [
    (100, 100, 10, -1, True), (100, 100, 10, 10, False), (7, 300, 50, -1, True), (300, 100, 5, 5, False),
    (300, 128, 32, -1, True), (64, 64, 0, -1, True), (50, 50, 5000, -1, True), (17, 5, 2, 3, False),
])  # fmt: skip
def test_visible_pairs_and_keys_count_exactly(sq, sk, left, right, causal):
    family = Family(left, right)
    window = family.window(causal)
    shape = parse_shape(f"1,2,{sq}:{sk},64")
    assert visible_pairs(shape, causal, family) == _brute_pairs(sq, sk, window)
    # the keys some row sees, by brute force
    seen = set()
    for i in range(sq):
        diag = i + sk - sq
        seen |= {j for j in range(sk) if (window[0] < 0 or j >= diag - window[0]) and (window[1] < 0 or j <= diag + window[1])}
    assert visible_keys(shape, causal, family) == len(seen) or (not seen and visible_keys(shape, causal, family) == 0)
    assert pass_bytes(shape, "fwd", causal, family) == 2.0 * (2 * sq * 2 * 64 + 2 * len(seen) * 2 * 64)


def test_dense_counts_are_unchanged():
    shape = parse_shape("1,8,512,64")
    assert visible_pairs(shape, True) == 512 * 512 / 2 and visible_pairs(shape, True, DENSE) == 512 * 512 / 2
    assert pass_bytes(shape, "fwd") == 2.0 * 4 * 8 * 512 * 64


def _naive(q, k, v, scale, mask, softcap, sinks):
    """Attention written out row by row in float64 (the definition in flashcore.h), for the reference to match."""
    hq, sq, d = q.shape
    out = torch.zeros(hq, sq, d, dtype=torch.float64)
    group = hq // k.shape[0]
    for h in range(hq):
        for i in range(sq):
            s = (q[h, i].double() @ k[h // group].double().T) * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            keys = mask[i] if mask is not None else torch.ones(k.shape[1], dtype=torch.bool)
            terms = [math.exp(x) for x in s[keys].tolist()]
            denominator = sum(terms) + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
            if denominator == 0:
                continue
            p = torch.zeros(k.shape[1], dtype=torch.float64)
            p[keys] = torch.tensor(terms, dtype=torch.float64) / denominator
            out[h, i] = p @ v[h // group].double()
    return out


@pytest.mark.parametrize("sq,sk,family,causal", [
    (9, 9, Family(2), True), (12, 5, Family(1, 1), False), (6, 6, Family(softcap=2.0), False),
    (8, 8, Family(sinks=True), False), (10, 4, Family(1, softcap=1.5, sinks=True), True), (5, 5, Family(0), True),
])  # fmt: skip
def test_reference_is_the_definition(sq, sk, family, causal):
    from flashcore_cli.check.case import case_mask, make_sinks, reference

    case = Case(parse_shape(f"1,4:2,{sq}:{sk},8"), causal, 3, family=family)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=gen) * 3 for s in ((1, 4, sq, 8), (1, 2, sk, 8), (1, 2, sk, 8)))
    sinks = make_sinks(case, device="cpu")
    got = reference(q, k, v, causal, 0.35, family=family, sinks=sinks)
    mask = case_mask(case, "cpu")
    want = _naive(q[0], k[0], v[0], 0.35, mask, family.softcap, sinks)
    assert torch.allclose(got[0].double(), want, atol=1e-5), (got[0] - want).abs().max()
    if mask is not None and not mask.any(-1).all():  # a row that sees no key gives 0, sinks or not
        assert (got[0][:, ~mask.any(-1)] == 0).all()


def test_reference_dsinks_is_the_formula():
    """dL/dsink_h = -sum_i p_sink(h, i) * (D_i) with D_i = dO_i . O_i (flashcore.h, bwd_passes.cuh)."""
    from flashcore_cli.check.case import make_sinks, reference_grads

    case = Case(parse_shape("1,6:3,11,8"), True, 5, family=Family(3, sinks=True))
    gen = torch.Generator().manual_seed(1)
    q, k, v, d_o = (torch.randn(1, h, 11, 8, generator=gen) for h in (6, 3, 3, 6))
    sinks = make_sinks(case, device="cpu")
    out, dq, dk, dv, dsinks = reference_grads(q, k, v, True, 0.4, d_o, family=case.family, sinks=sinks)
    # the LSE with the sink, from the definition
    group = 2
    lse = torch.empty(6, 11, dtype=torch.float64)
    for h in range(6):
        for i in range(11):
            s = (q[0, h, i].double() @ k[0, h // group].double().T) * 0.4
            diag = i
            keys = [j for j in range(11) if diag - 3 <= j <= diag]
            lse[h, i] = torch.logsumexp(torch.cat([s[keys], sinks[h : h + 1].double()]), 0)
    d = (d_o[0].double() * out[0].double()).sum(-1)
    want = -(torch.exp(sinks.double()[:, None] - lse) * d).sum(-1)
    assert torch.allclose(dsinks.double(), want, atol=1e-5), (dsinks, want)
    assert dsinks.abs().max() > 1e-3  # a check that could not fail would pass at zero


def test_family_cases_are_given_only_to_variants_that_take_the_family():
    from flashcore_cli.check.correctness import plan_cases
    from flashcore_cli.registry.variants import load_registry

    reg = load_registry(REPO / "variants.yaml")
    dense = plan_cases(reg.get("v8"), None, 1)
    assert all(c.family == DENSE for c in dense)
    asked = plan_cases(reg.get("v8"), [parse_shape("1,2,97,64")], 1, family=Family(16))
    assert asked and all(c.family == Family(16) for c in asked)
    reason = reg.get("v8").unsupported_reason(64, True, **Family(16).needs(True))
    assert reason and "sliding window" in reason


@pytest.mark.parametrize("args,words", [
    (["test", "v12", "--window", "a,b"], "bad --window"),
    (["bench", "v12", "--window", "-3,0"], "bad --window"),
    (["bench", "v12", "--softcap", "-1"], "bad --softcap"),
    (["bench", "v12", "--softcap", "nan"], "finite"),
    (["sweep", "v12", "--window", "1,2,3"], "bad --window"),
    (["test", "v8", "--window", "64,0", "--shapes", "1,2,97,64"], "sliding window"),
    (["bench", "baseline", "--sinks"], "sinks"),
])  # fmt: skip
def test_bad_family_values_are_one_line_exit_2(args, words):
    result = runner.invoke(app, ["--registry", str(REPO / "variants.yaml"), *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert words in " ".join(result.output.split())
    assert "Traceback" not in result.output


def _sink_variants():
    from flashcore_cli.registry.variants import load_registry

    return [v.name for v in load_registry(REPO / "variants.yaml").variants if v.supports("sinks") and v.supports("backward")]


@pytest.mark.parametrize("name", _sink_variants())
def test_autograd_reaches_the_sinks_on_meta_tensors(name):
    """The custom op's fake impl and autograd formula with the family (no kernel runs): every gradient, dsinks
    included, shaped as its input; a sink tensor of the wrong shape is one FlashcoreInputError."""
    from types import SimpleNamespace

    from flashcore_cli.api import Attention
    from flashcore_cli.core.errors import FlashcoreInputError
    from flashcore_cli.registry.variants import load_registry

    attn = Attention(load_registry(REPO / "variants.yaml").get(name), SimpleNamespace(module=None, arch="sm_90", key="unbuilt"))
    q, k, v = (torch.empty(s, dtype=torch.float16, device="meta", requires_grad=True) for s in ((1, 4, 16, 64), (1, 2, 40, 64), (1, 2, 40, 64)))
    sinks = torch.empty(4, dtype=torch.float32, device="meta", requires_grad=True)
    out = attn(q, k, v, causal=True, window_size=(8, 0), softcap=20.0, sinks=sinks)
    out.sum().backward()
    for t in (q, k, v, sinks):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype
    with pytest.raises(FlashcoreInputError, match="sinks has shape"):
        attn(q, k, v, sinks=torch.empty(3, dtype=torch.float32, device="meta"))


def test_the_naive_peer_does_not_overflow_and_a_nan_peer_never_loosens_a_check():
    """The 16-bit naive attention that sets the tolerance scales q first (reorder_ops): on the one-hot extreme
    (q = k = v = randn x 30) q.k alone is ~57600 > fp16's 65504 / 1.1; and a peer that still overflowed gives no
    NaN tolerance (a comparison with NaN passes everything) but the rule's own rounding and floor."""
    from flashcore_cli.check.case import ATOL_BY_DTYPE, grad_tolerance, make_inputs, reference

    case = Case(parse_shape("1,2,40,64"), True, 3, "one-hot", "fp16", grads=True)
    q, k, v = make_inputs(case, device="cpu")
    peer = reference(q, k, v, True, 1 / 8, torch.float16)
    assert torch.isfinite(peer).all()
    g = torch.randn(100) * 4
    assert grad_tolerance(case, g, float("nan")) >= ATOL_BY_DTYPE["fp16"]
    assert math.isfinite(grad_tolerance(case, g, float("nan")))
