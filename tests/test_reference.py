"""The fp32 reference the correctness rule judges against (check/case.py), on the CPU: grouped-query heads read
their K/V head, the causal mask is bottom-right, a row that sees no key gives 0 and a finite gradient, and the
gradients are those of attention."""

import math

import pytest

torch = pytest.importorskip("torch")

from flashcore_cli.check.case import causal_mask, first_seen_row, reference, reference_grads  # noqa: E402
from flashcore_cli.registry.shapes import Case, Shape  # noqa: E402


def naive(q, k, v, causal, scale):
    """Row by row, straight from the definition."""
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    out = torch.zeros(b, h, sq, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hkv)
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    continue
                s = torch.stack([(q[bi, hi, i].double() * k[bi, kh, j].double()).sum() * scale for j in keys])
                p = torch.softmax(s, 0)
                out[bi, hi, i] = sum(p[n] * v[bi, kh, j].double() for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("shape", [Shape(1, 4, 3, 8, 2, 5), Shape(2, 2, 6, 8, 1, 4), Shape(1, 3, 5, 8, 3, 5), Shape(1, 8, 1, 8, 2, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_the_definition(shape, causal):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape.q_shape, generator=gen)
    k, v = (torch.randn(shape.kv_shape, generator=gen) for _ in range(2))
    got = reference(q, k, v, causal, 0.3)
    assert torch.allclose(got.double(), naive(q, k, v, causal, 0.3), atol=1e-5)


def test_rows_that_see_no_key_are_zero_with_finite_gradients():
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    k = torch.randn(1, 2, 4, 8, requires_grad=True)
    v = torch.randn(1, 2, 4, 8, requires_grad=True)
    out = reference(q, k, v, True, 0.5)
    assert first_seen_row(Case(Shape(1, 2, 6, 8, 2, 4), True, 1)) == 2
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert torch.equal(q.grad[:, :, :2], torch.zeros_like(q.grad[:, :, :2]))


def test_causal_mask_is_bottom_right():
    m = causal_mask(2, 4, "cpu")
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_reference_gradients_match_the_definition():
    gen = torch.Generator().manual_seed(3)
    shape = Shape(1, 4, 3, 8, 2, 5)
    leaves = [torch.randn(shape.q_shape, generator=gen)] + [torch.randn(shape.kv_shape, generator=gen) for _ in range(2)]
    d_o = torch.randn(shape.q_shape, generator=gen)
    got = [t.clone().requires_grad_() for t in leaves]
    reference(*got, True, 0.35).backward(d_o)
    exact = [t.double().requires_grad_() for t in leaves]
    naive(*exact, True, 0.35).backward(d_o.double())
    for g, e in zip(got, exact):
        assert torch.allclose(g.grad.double(), e.grad, atol=1e-4)


@pytest.mark.parametrize("shape", [Shape(2, 4, 3, 8, 2, 5), Shape(1, 6, 7, 8, 1, 4), Shape(2, 3, 5, 8, 3, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_grads_block_by_block_equal_the_whole_graphs(shape, causal):
    """reference_grads (one batch and K/V head at a time, what `flashcore test` checks gradients against) gives the
    output and the gradients of backpropagating through reference() whole: rows that see no key included."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(shape.q_shape, generator=gen)
    k, v = (torch.randn(shape.kv_shape, generator=gen) for _ in range(2))
    d_o = torch.randn(shape.q_shape, generator=gen)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    out = reference(*whole, causal, 0.4)
    out.backward(d_o)
    got = reference_grads(q, k, v, causal, 0.4, d_o)
    assert torch.allclose(got[0], out.detach(), atol=1e-6)
    for g, w in zip(got[1:], whole):
        assert g.shape == w.shape and torch.allclose(g, w.grad, atol=1e-5)


def test_the_reference_in_fp64_matches_the_definition_to_fp64_precision():
    """reference(..., dtype=torch.float64): what scripts/grad_precision.py takes the exact O from."""
    gen = torch.Generator().manual_seed(5)
    shape = Shape(1, 4, 6, 8, 2, 4)
    q = torch.randn(shape.q_shape, generator=gen)
    k, v = (torch.randn(shape.kv_shape, generator=gen) for _ in range(2))
    got = reference(q, k, v, True, 0.3, dtype=torch.float64)
    assert got.dtype == torch.float64 and torch.allclose(got, naive(q, k, v, True, 0.3), atol=1e-12)
