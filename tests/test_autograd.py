"""Gradients through flashcore (api.py): every variant's op has an autograd formula; a forward-only variant
raises when autograd reaches it (never a silent None), one with a backward calls flashcore::<name>_backward.

On CPU the wiring runs on meta and fake CUDA tensors (the fake impls answer, no kernel runs): the error, the
formula, opcheck with its autograd checks, and a torch.compile'd training step with no graph break. On the lent
GPU (marked) the gradients of the autograd path are checked against the fp32 reference and against the
variant's direct backward, and a small transformer trains beside SDPA (scripts/train_tiny.py)."""

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from flashcore_cli.api import Attention, register_op  # noqa: E402
from flashcore_cli.core.errors import FlashcoreUnsupportedError  # noqa: E402
from flashcore_cli.registry.variants import load_registry  # noqa: E402

REGISTRY = load_registry()
FORWARD_ONLY = [v.name for v in REGISTRY.variants if not v.supports("backward")]
WITH_BACKWARD = [v.name for v in REGISTRY.variants if v.supports("backward")]


def unbuilt(name: str) -> Attention:
    return Attention(REGISTRY.get(name), SimpleNamespace(module=None, arch="sm_90", key="unbuilt"))


def meta_qkv(shape=(1, 2, 16, 64), kv_shape=None, dtype=torch.float16):
    kv_shape = kv_shape or shape
    return (torch.empty(shape, dtype=dtype, device="meta", requires_grad=True),
            *(torch.empty(kv_shape, dtype=dtype, device="meta", requires_grad=True) for _ in range(2)))  # fmt: skip


def test_the_registry_has_a_variant_with_a_backward():
    assert "v11" in WITH_BACKWARD


@pytest.mark.parametrize("name", FORWARD_ONLY)
def test_a_forward_only_variant_raises_when_autograd_reaches_it(name):
    q, k, v = meta_qkv()
    out = unbuilt(name)(q, k, v, causal=True)
    assert out.requires_grad  # the op is on the graph: the gradient cannot silently stop here
    with pytest.raises(FlashcoreUnsupportedError, match=f"{name} is forward-only"):
        out.sum().backward()


@pytest.mark.parametrize("name", WITH_BACKWARD)
def test_a_variant_with_a_backward_gives_every_gradient(name):
    v = REGISTRY.get(name)
    kv_shape = (1, 1, 33, 64) if v.supports("gqa") and v.supports("seqlen_kv") else None
    q, k, vv = meta_qkv((1, 4, 16, 64), kv_shape)
    out = unbuilt(name)(q, k, vv, causal=True)
    out.sum().backward()
    for t in (q, k, vv):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


@pytest.mark.parametrize("name", WITH_BACKWARD)
def test_lse_is_returned_and_differentiable(name):
    q, k, v = meta_qkv()
    out, lse = unbuilt(name)(q, k, v, return_lse=True)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    (out.sum() + lse.sum()).backward()
    assert q.grad is not None


def test_return_lse_on_a_variant_without_it_is_refused():
    q, k, v = meta_qkv()
    with pytest.raises(FlashcoreUnsupportedError, match="log-sum-exp"):
        unbuilt("v8")(q, k, v, return_lse=True)


@pytest.mark.parametrize("name", [*WITH_BACKWARD, "v8"])
def test_opcheck_with_its_autograd_checks_on_fake_cuda_tensors(name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = register_op(REGISTRY.get(name))
    mode = FakeTensorMode()
    with mode:
        q, k, v = (torch.empty(2, 3, 97, 64, dtype=torch.float16, device="cuda", requires_grad=name in WITH_BACKWARD)
                   for _ in range(3))  # fmt: skip
        result = torch.library.opcheck(op, (q, k, v), {"causal": True, "scale": 0.125})
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("name", WITH_BACKWARD)
def test_a_compiled_training_step_has_no_graph_break(name):
    attn = unbuilt(name)

    def step(x, w_qkv, w_out):
        b, s, e = x.shape
        qkv = (x @ w_qkv).view(b, s, 3, 2, e // 2).permute(2, 0, 3, 1, 4)
        o = attn(qkv[0].contiguous(), qkv[1].contiguous(), qkv[2].contiguous(), causal=True)
        return (o.transpose(1, 2).reshape(b, s, e) @ w_out).float().pow(2).mean()

    x = torch.empty(2, 33, 128, dtype=torch.float16, device="meta")
    w_qkv = torch.empty(128, 384, dtype=torch.float16, device="meta", requires_grad=True)
    w_out = torch.empty(128, 128, dtype=torch.float16, device="meta", requires_grad=True)
    explained = torch._dynamo.explain(step)(x, w_qkv, w_out)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(x, w_qkv, w_out)
    loss.backward()
    assert w_qkv.grad is not None and w_qkv.grad.shape == w_qkv.shape


# ---------------------------------------------------------------- on the lent GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, kv", [((2, 4, 97, 64), (2, 4, 97, 64)), ((1, 8, 33, 128), (1, 2, 70, 128))])
def test_gpu_autograd_gradients_equal_the_direct_backward_and_pass_the_rule(dtype, shape, kv):
    from flashcore_cli import load_variant
    from flashcore_cli.check.case import ATOL_BY_DTYPE, reference, sdpa

    attn = load_variant("v11")
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    k, v = (torch.randn(kv, generator=gen, device="cuda").to(dtype) for _ in range(2))
    d_o = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attn(*leaves, causal=True).backward(d_o)
    out, lse, residual = attn.forward_train(q, k, v, causal=True)
    direct = attn.backward(d_o, q, k, v, out, lse, causal=True, out_residual=residual)
    assert torch.equal(leaves[1].grad, direct[1]) and torch.equal(leaves[2].grad, direct[2])  # dK, dV deterministic
    # the residual is what fp32 O lost to rounding: at most half an ulp of each element of out, and not all zero
    ulp = torch.finfo(dtype).eps * out.float().abs().clamp_min(torch.finfo(dtype).tiny)
    assert (residual.float().abs() <= ulp).all() and residual.abs().max() > 0
    ref_leaves = [t.float().requires_grad_() for t in (q, k, v)]
    reference(*ref_leaves, True, 1 / math.sqrt(shape[-1])).backward(d_o.float())
    sdpa_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sdpa(*sdpa_leaves, True, 1 / math.sqrt(shape[-1])).backward(d_o)
    for name, got, s, ref in zip("qkv", leaves, sdpa_leaves, ref_leaves):
        tolerance = max(ATOL_BY_DTYPE["fp16" if dtype == torch.float16 else "bf16"], 2 * (s.grad.float() - ref.grad).abs().max().item())
        error = (got.grad.float() - ref.grad).abs().max().item()
        assert error <= tolerance, f"d{name}: {error:.4g} > {tolerance:.4g}"


def test_the_training_task_needs_attention_gradients():
    """scripts/train_tiny.py's task on the CPU: the fp32 model learns the copy, the control whose attention gets no
    gradient does not (so the GPU run below can tell a silently missing gradient from a working one)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train_tiny.py"
    result = subprocess.run([sys.executable, str(script), "--device", "cpu", "--variant", "none", "--steps", "150"],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the task needs attention" in result.stdout and "OK" in result.stdout.splitlines()[-1]


@pytest.mark.gpu
def test_gpu_tiny_transformer_trains_like_sdpa():
    """scripts/train_tiny.py: the same causal transformer, seed and data with fp32 math, SDPA bf16, v11 bf16 and a
    control with no attention gradient; v11 must learn as SDPA does (its stated rules)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train_tiny.py"
    result = subprocess.run([sys.executable, str(script), "--steps", "300"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
