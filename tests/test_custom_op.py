"""Each variant is a PyTorch custom op, flashcore::<name> (api.py): schema, fake impl, CUDA impl.

On CPU the op is registered without building anything and checked with meta and fake CUDA tensors: the schema,
the fake impl (opcheck), the clear messages, and that torch.compile traces a model calling it with no graph
break. On the lent GPU (marked) the whole opcheck runs on real tensors, a small attention block compiles with
fullgraph=True and matches eager within the correctness rule, and the op captures in a CUDA graph."""

import math
from types import SimpleNamespace

import pytest

from flashcore_cli.api import Attention, op_name, register_op
from flashcore_cli.core.errors import FlashcoreInputError
from flashcore_cli.registry.variants import load_registry

torch = pytest.importorskip("torch")

REGISTRY = load_registry()
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def unbuilt(name: str) -> Attention:
    """The variant's callable with no extension behind it: enough for anything that never runs the kernel."""
    return Attention(REGISTRY.get(name), SimpleNamespace(module=None, arch="sm_90", key="unbuilt"))


def meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


def fake_cuda_qkv(shape, dtype):
    """q, k, v as fake CUDA tensors: the fake impl runs, the CUDA impl never does (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        return mode, [torch.empty(shape, dtype=dtype, device="cuda") for _ in range(3)]


def test_registering_builds_nothing_and_is_idempotent():
    op = register_op(REGISTRY.get("v11"))
    assert op is register_op(REGISTRY.get("v11")) is torch.ops.flashcore.v11
    assert op is not register_op(REGISTRY.get("v8"))
    assert "bool causal=False, float? scale=None" in str(op.default._schema)


def test_op_names_are_identifiers():
    assert op_name("v11") == "v11"
    assert op_name("64x64") == "v_64x64"
    assert op_name("my-v8.2") == "my_v8_2"


@pytest.mark.parametrize("variant, dtype", [("v11", "fp16"), ("v11", "bf16"), ("v12", "bf16"), ("v8", "fp16")])
def test_opcheck_on_fake_cuda_tensors(variant, dtype):
    """The whole opcheck (schema, autograd registration, fake tensor, aot dispatch) where every tensor is a fake
    CUDA tensor: what runs is the schema and the fake impl; the GPU test repeats it on real tensors."""
    op = register_op(REGISTRY.get(variant))
    mode, (q, k, v) = fake_cuda_qkv((2, 3, 97, 64), DTYPES[dtype])
    with mode:
        result = torch.library.opcheck(op, (q, k, v), {"causal": True, "scale": 0.125})
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("variant", ["v12", "v11", "v8"])
def test_fake_impl_gives_shape_dtype_device(variant):
    v = REGISTRY.get(variant)
    op = register_op(v)
    q = meta(1, 2, 17, 128, dtype=torch.bfloat16 if "bf16" in v.dtypes else torch.float16)
    out, lse, residual = op(q, q, q, True, None)
    assert (out.shape, out.dtype, out.device.type) == (q.shape, q.dtype, "meta")
    assert (lse.shape, lse.dtype) == ((1, 2, 17) if v.supports("lse") else (0,), torch.float32)
    # O's rounding residual: written by a training forward of a variant with a backward, and only then
    assert (residual.shape, residual.dtype) == (q.shape if v.supports("backward") else (0,), q.dtype)
    assert op(q, q, q, True, None, False)[2].shape == (0,)


@pytest.mark.parametrize(
    "args, needle",
    [
        ((meta(1, 2, 8, 64, dtype=torch.float32),) * 3,
         "v11: q is torch.float32; v11 takes torch.float16 or torch.bfloat16 (its dtypes: fp16, bf16)"),
        ((meta(1, 2, 8, 32),) * 3, "head dim 32 is not supported by v11"),
        ((meta(1, 2, 8, 64), meta(1, 2, 9, 64), meta(1, 2, 8, 64)), "v has shape (1, 2, 8, 64) but k has (1, 2, 9, 64)"),
        ((meta(1, 2, 8, 64), meta(2, 2, 8, 64), meta(2, 2, 8, 64)), "batch and head dim must match"),
        ((meta(1, 6, 8, 64), meta(1, 4, 8, 64), meta(1, 4, 8, 64)), "the query heads must be a multiple of the key/value heads"),
        ((meta(2, 8, 64),) * 3, "expected 4-D"),
        ((torch.zeros(1, 2, 8, 64, dtype=torch.float16),) * 3, "flashcore kernels need CUDA tensors"),
    ],
)
def test_the_op_keeps_the_clear_messages(args, needle):
    with pytest.raises(FlashcoreInputError) as info:
        unbuilt("v11")(*args)
    assert needle in str(info.value)


def test_an_fp16_only_variant_refuses_bf16():
    q = meta(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(FlashcoreInputError, match=r"v8: q is torch.bfloat16; v8 takes torch.float16 \(its dtypes: fp16\)"):
        unbuilt("v8")(q, q, q)


def test_a_bf16_variant_refuses_mixed_dtypes():
    q = meta(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(FlashcoreInputError, match="v12: k is torch.float16 but q is torch.bfloat16"):
        register_op(REGISTRY.get("v12"))(q, meta(1, 2, 8, 64), q)


def attention_block(attn, heads: int):
    """x -> QKV projection -> the variant's op -> output projection: the block the GPU test compiles."""

    def block(x, w_qkv, w_out):
        b, s, e = x.shape
        qkv = (x @ w_qkv).view(b, s, 3, heads, e // heads).permute(2, 0, 3, 1, 4)
        o = attn(qkv[0].contiguous(), qkv[1].contiguous(), qkv[2].contiguous(), causal=True).to(x.dtype)
        return o.transpose(1, 2).reshape(b, s, e) @ w_out

    return block


def block_weights(embed: int, dtype, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*size, generator=gen, device=device, dtype=torch.float32).to(dtype) / math.sqrt(embed)
            for size in ((embed, 3 * embed), (embed, embed))]  # fmt: skip


def test_torch_compile_traces_the_block_with_no_graph_break():
    block = attention_block(unbuilt("v11"), heads=2)
    x, (w_qkv, w_out) = meta(2, 33, 128), [meta(128, 384), meta(128, 128)]
    explained = torch._dynamo.explain(block)(x, w_qkv, w_out)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    out = torch.compile(block, fullgraph=True, backend="aot_eager")(x, w_qkv, w_out)
    assert out.shape == x.shape and out.dtype == x.dtype


# ---------------------------------------------------------------- on the lent GPU
def _gpu_variants():
    names = ["v11"]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        names.append("v12")
    return names


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_opcheck(dtype, causal):
    from flashcore_cli import load_variant

    for name in _gpu_variants():
        attn = load_variant(name)
        if dtype not in attn.variant.dtypes:
            pytest.fail(f"{name} does not declare {dtype}")
        gen = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(2, 3, 97, 64, generator=gen, device="cuda").to(DTYPES[dtype]) for _ in range(3))
        result = torch.library.opcheck(attn.op, (q, k, v), {"causal": causal, "scale": 0.125})
        assert set(result.values()) == {"SUCCESS"}, (name, result)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gpu_compiled_block_matches_eager_within_the_rule(dtype):
    """The block under torch.compile(fullgraph=True), and eager, against the block in fp32 (fp32 weights, input
    and attention): each within max(atol, 2 x the error of the same block with PyTorch's SDPA in `dtype`)."""
    import torch.nn.functional as F

    from flashcore_cli import load_variant
    from flashcore_cli.check.case import ATOL, reference

    heads, embed = 8, 512
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(2, 300, embed, generator=gen, device="cuda").to(DTYPES[dtype])
    w_qkv, w_out = block_weights(embed, DTYPES[dtype], "cuda")
    scale = 1.0 / math.sqrt(embed // heads)
    fp32 = attention_block(lambda q, k, v, causal: reference(q, k, v, causal, scale), heads)
    ref = fp32(x.float(), w_qkv.float(), w_out.float())
    sdpa = attention_block(lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal), heads)
    tolerance = max(ATOL, 2.0 * (sdpa(x, w_qkv, w_out).float() - ref).abs().max().item())
    for name in _gpu_variants():
        block = attention_block(load_variant(name), heads)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(block)(x, w_qkv, w_out)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True)(x, w_qkv, w_out)
        eager = block(x, w_qkv, w_out)
        for label, out in (("compiled", compiled), ("eager", eager)):
            error = (out.float() - ref).abs().max().item()
            assert error <= tolerance, f"{name} {dtype} {label}: max error {error:.4g} > tolerance {tolerance:.4g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gpu_op_captures_in_a_cuda_graph(dtype):
    from flashcore_cli import load_variant

    attn = load_variant("v11")
    q, k, v = (torch.randn(1, 8, 512, 64, device="cuda").to(DTYPES[dtype]) for _ in range(3))
    expected = attn(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attn(q, k, v)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn(q, k, v)
    for t in (q, k, v):
        t.copy_(torch.flip(t, dims=[2]))  # new inputs in place; the replay must see them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, attn(q, k, v)) and not torch.equal(out, expected)

    compiled = torch.compile(lambda q, k, v: attn(q, k, v, causal=True), mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        got = compiled(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(got, attn(q, k, v, causal=True))
