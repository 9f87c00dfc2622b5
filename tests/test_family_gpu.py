"""The attention family on the GPU (issue 47): every variant that declares window, softcap or sinks, through the
Python API and its autograd formula, against the fp32 reference; the LSE with a sink; the refusals.

`flashcore test` checks the family's odd cases (shapes.FAMILY_CASES) under the project's rule through the
variant's direct calls; these tests hold the autograd path (torch.ops.flashcore.<name>, its dsinks) to the same
numbers, and the LSE the forward writes (which the backward and dsinks read) to its definition."""

from __future__ import annotations

import math

import pytest

from flashcore_cli.registry.family import Family
from flashcore_cli.registry.variants import load_registry

pytestmark = pytest.mark.gpu

REGISTRY = load_registry()
FAMILY = [v.name for v in REGISTRY.variants if any(v.supports(f) for f in ("window", "softcap", "sinks"))]


def _attn(name):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from flashcore_cli.api import load_variant

    variant = REGISTRY.get(name)
    major, minor = torch.cuda.get_device_capability()
    if variant.target_arch(f"sm_{major}{minor}") is None:
        pytest.skip(f"{name} does not run on sm_{major}{minor}")
    return load_variant(name)


def _family_for(variant) -> Family:
    return Family(64 if variant.supports("window") else -1, -1, 30.0 if variant.supports("softcap") else 0.0,
                  variant.supports("sinks"))  # fmt: skip


@pytest.mark.parametrize("name", FAMILY)
def test_autograd_path_matches_the_reference_and_the_direct_backward(name):
    import torch

    from flashcore_cli.check.case import UNIT_ROUNDOFF, grad_tolerance, make_sinks, reference_grads
    from flashcore_cli.registry.shapes import Case, parse_shape

    attn = _attn(name)
    variant = attn.variant
    if not variant.supports("backward"):
        pytest.skip(f"{name} is forward-only")
    family = _family_for(variant)
    case = Case(parse_shape("2,8:2,300:333,64" if variant.supports("gqa") else "2,4,300,64"), True, 11, family=family,
                grads=True)  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(s, generator=gen, device="cuda", dtype=torch.float16)
               for s in (case.shape.q_shape, case.shape.kv_shape, case.shape.kv_shape))  # fmt: skip
    sinks = make_sinks(case)
    d_o = torch.randn(case.shape.q_shape, generator=gen, device="cuda", dtype=torch.float16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = sinks.clone().requires_grad_() if sinks is not None else None
    kwargs = {"causal": True, **family.kwargs(True)}
    out = attn(*leaves, **kwargs, sinks=sink_leaf)
    out.backward(d_o)
    scale = 1 / math.sqrt(64)
    sink_terms = torch.zeros(case.shape.heads, device="cuda")
    ref_out, *ref = reference_grads(q, k, v, True, scale, d_o, family=family, sinks=sinks, sink_terms=sink_terms)
    _, *pt = reference_grads(q, k, v, True, scale, d_o, family=family, sinks=sinks, dtype=torch.float16)
    got = [t.grad for t in leaves] + ([sink_leaf.grad] if sinks is not None else [])
    # the same kernels called directly: the same forward bits; gradients as close to the reference (dQ, and dK/dV
    # of grouped heads, are summed by fp32 atomics in an order that varies from call to call)
    o, lse, residual = attn.forward_train(q, k, v, **kwargs, sinks=sinks)
    assert torch.equal(o, out.detach())
    dsinks = torch.empty_like(sinks) if sinks is not None else None
    direct = [*attn.backward(d_o, q, k, v, o, lse, **kwargs, sinks=sinks, out_residual=residual, dsinks=dsinks), dsinks]
    for name_, g, d, r, p in zip(("dq", "dk", "dv", "dsinks"), got, direct, ref, pt):
        if r is None:
            continue
        tol = grad_tolerance(case, r, (p.float() - r).abs().max().item())
        if name_ == "dsinks":  # a sum over rows of terms that each carry the dtype's rounding (check/case.py)
            tol = max(tol, 2 * UNIT_ROUNDOFF["fp16"] * sink_terms.max().item())
        for path, x in (("autograd", g), ("direct", d)):
            assert x is not None and torch.isfinite(x).all(), (name_, path)
            assert (x.float() - r).abs().max().item() <= tol, (name_, path, (x.float() - r).abs().max().item(), tol)


@pytest.mark.parametrize("name", [n for n in FAMILY if REGISTRY.get(n).supports("lse")])
def test_lse_includes_the_sink_and_rows_that_see_nothing(name):
    import torch

    attn = _attn(name)
    variant = attn.variant
    sq, sk = (8, 300) if variant.max_seq_len else (300, 100)
    h = 6
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, h, sq, 64, generator=gen, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, h, sk, 64, generator=gen, device="cuda", dtype=torch.float16) for _ in range(2))
    window = (5, 5) if variant.supports("window") else (-1, -1)
    sinks = torch.tensor([0.0, 15.0, -15.0, 2.0, -2.0, 40.0], device="cuda") if variant.supports("sinks") else None
    out, lse = attn(q, k, v, window_size=window, sinks=sinks, return_lse=True)
    scale = 1 / 8
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    i = torch.arange(sq, device="cuda")[:, None] + sk - sq
    j = torch.arange(sk, device="cuda")[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    if window != (-1, -1):
        mask = (j >= i - window[0]) & (j <= i + window[1])
    s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[None, :, None, None].expand(1, h, sq, 1)], dim=-1)
    want = torch.logsumexp(s, -1)
    empty = ~mask.any(-1)
    if sinks is None:
        assert torch.isinf(lse[:, :, empty]).all() and (lse[:, :, empty] > 0).all()
    finite = torch.isfinite(want)
    assert torch.allclose(lse[finite], want[finite], atol=2e-3, rtol=1e-3), (lse[finite] - want[finite]).abs().max()
    assert (out[:, :, empty] == 0).all()


@pytest.mark.parametrize("name", ["v8", *FAMILY])
def test_the_family_is_refused_in_one_line(name):
    import torch

    from flashcore_cli.core.errors import FlashcoreInputError

    attn = _attn(name)
    variant = attn.variant
    q = torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.float16)
    if not variant.supports("window"):
        with pytest.raises(FlashcoreInputError, match="sliding window"):
            attn(q, q, q, window_size=(8, 0))
    with pytest.raises(FlashcoreInputError, match="window_size"):
        attn(q, q, q, window_size=(-2, 0))
    if variant.supports("sinks"):
        for bad, words in ((torch.zeros(3, device="cuda"), "shape"), (torch.zeros(4, device="cuda", dtype=torch.float16), "float32"),
                           (torch.zeros(4), "is on cpu")):  # fmt: skip
            with pytest.raises(FlashcoreInputError, match=words):
                attn(q, q, q, sinks=bad)
    else:
        with pytest.raises(FlashcoreInputError, match="sinks"):
            attn(q, q, q, sinks=torch.zeros(4, device="cuda"))
    with pytest.raises(FlashcoreInputError, match="softcap"):
        attn(q, q, q, softcap=-1.0)
