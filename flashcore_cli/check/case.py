"""Correctness of one variant on one case, in the process that owns the GPU (see isolate.py).

Reference: attention in fp32 on the same fp16 (or bf16) inputs, the K/V heads repeated for grouped-query cases,
the causal mask bottom-right (query i sees keys j <= i + Sk - Sq), a row that sees no key giving 0. A variant
passes when
    max |out - ref| <= max(ATOL, 2 x max |sdpa - ref|)
where sdpa is PyTorch's own scaled_dot_product_attention in the case's dtype on the same inputs
(flash-attention's rule: be no worse than twice the error of a production kernel). ATOL is one ulp at 1.0
in that dtype (fp16 2^-10, bf16 2^-7), so a case where SDPA happens to be exact (S = 1: the output is V)
still allows the output's own rounding.

Gradients (a case with `grads`, for variants with a backward): dQ, dK and dV each under the same rule against
the fp32 reference's gradients for one random dO, SDPA's own backward in the case's dtype setting the
tolerance. The gradient outputs are poisoned with NaN before the backward writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flashcore_cli.core.dtypes import TORCH_NAMES
from flashcore_cli.core.statuses import MISMATCH, OK
from flashcore_cli.registry.shapes import Case

ATOL = 2.0**-10
ATOL_BY_DTYPE = {"fp16": ATOL, "bf16": 2.0**-7}
MAX_MISMATCHES_SHOWN = 5


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_NAMES[name])


@dataclass
class CaseResult:
    case: dict
    status: str  # OK, MISMATCH
    max_error: float  # of the tensor whose error is the largest fraction of its tolerance
    tolerance: float
    sdpa_error: float
    mismatches: list[dict] = field(default_factory=list)
    detail: str = ""
    tensors: dict = field(default_factory=dict)  # name -> {"max_error", "tolerance", "sdpa_error"}


def make_inputs(case: Case, device="cuda"):
    """q, k, v for a case, drawn as its `inputs` kind says (shapes.INPUT_KINDS), from its seed."""
    import torch

    gen = torch.Generator(device=device).manual_seed(case.seed)
    q_shape, kv_shape = case.shape.q_shape, case.shape.kv_shape
    dtype = torch_dtype(case.dtype)

    def randn(shape, scale: float = 1.0):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    if case.inputs == "large":
        return [randn(q_shape, 30.0), randn(kv_shape, 30.0), randn(kv_shape, 30.0)]
    if case.inputs == "one-hot":  # needs q and k of one shape: each row's own key wins by thousands
        x = randn(q_shape, 30.0)
        return [x, x.clone(), x.clone()]
    if case.inputs == "uniform":
        q, row, v = randn(q_shape), randn((*kv_shape[:2], 1, kv_shape[3])), randn(kv_shape)
        return [q, row.expand(kv_shape).contiguous(), v]
    return [torch.randn(q_shape, generator=gen, device=device, dtype=dtype),
            *(torch.randn(kv_shape, generator=gen, device=device, dtype=dtype) for _ in range(2))]  # fmt: skip


def grad_output(case: Case, device="cuda"):
    """dL/dO for a gradient check: standard normal, from a seed of its own."""
    import torch

    gen = torch.Generator(device=device).manual_seed(case.seed + 7919)
    return torch.randn(case.shape.q_shape, generator=gen, device=device, dtype=torch_dtype(case.dtype))


def causal_mask(seq_len: int, seq_len_kv: int, device):
    """True where query i may see key j: j <= i + Sk - Sq (bottom-right)."""
    import torch

    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len_kv, device=device)[None, :]
    return j <= i + (seq_len_kv - seq_len)


def reference(q, k, v, causal: bool, scale: float, dtype=None):
    """Attention in fp32 (or `dtype`, e.g. torch.float64; differentiable), one batch and K/V head at a time to
    bound the Sq x Sk scores' memory (without a graph to keep, each block's scores are freed before the next). K/V
    heads are repeated for grouped-query inputs; a row that sees no key gives 0. Gradients: reference_grads, block
    by block too."""
    import torch

    group = q.shape[1] // k.shape[1]
    return torch.stack([
        torch.cat([_reference_block(q[b, h * group:(h + 1) * group], k[b, h:h + 1], v[b, h:h + 1], causal, scale,
                                    dtype) for h in range(k.shape[1])])
        for b in range(q.shape[0])
    ])  # fmt: skip


def _reference_block(q, k, v, causal: bool, scale: float, dtype=None):
    """reference() of one batch: q [Hq, Sq, D], k and v [Hkv, Sk, D] (Hq a multiple of Hkv), in fp32 or `dtype`."""
    import torch

    dtype = dtype or torch.float32
    group = q.shape[0] // k.shape[0]
    scores = torch.matmul(q.to(dtype), k.to(dtype).repeat_interleave(group, dim=0).transpose(-1, -2)) * scale
    seen = None
    if causal:
        mask = causal_mask(q.shape[1], k.shape[1], q.device)
        seen = mask.any(-1, keepdim=True)  # rows with at least one visible key
        # masked scores -inf; a row with none visible keeps finite scores (no NaN, even in its gradient)
        scores = scores.masked_fill(~mask & seen, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.to(dtype).repeat_interleave(group, dim=0))
    return out * seen if seen is not None else out


def reference_grads(q, k, v, causal: bool, scale: float, d_o):
    """(out, dq, dk, dv) of reference() for the upstream gradient d_o, in fp32, one (batch, K/V head) at a time:
    the autograd graph of one block (its Hq / Hkv query heads' scores, softmax and their gradients) is freed
    before the next, so a long sequence needs the memory of one head group, not of every head at once (the
    whole graph of 1,16,16384,64 is over 60 GB)."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dq, dk, dv = (torch.empty(t.shape, dtype=torch.float32, device=q.device) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        for h in range(k.shape[1]):
            heads = slice(h * group, (h + 1) * group)
            leaves = [t.float().requires_grad_() for t in (q[b, heads], k[b, h : h + 1], v[b, h : h + 1])]
            block = _reference_block(*leaves, causal, scale)
            grads = torch.autograd.grad(block, leaves, d_o[b, heads].float())
            out[b, heads] = block.detach()
            dq[b, heads], dk[b, h : h + 1], dv[b, h : h + 1] = grads
    return out, dq, dk, dv


def sdpa(q, k, v, causal: bool, scale: float):
    """PyTorch's own attention in the inputs' dtype, with the same masking convention as the reference."""
    import torch.nn.functional as F

    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if causal and q.shape[2] != k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                              scale=scale, **gqa)  # fmt: skip
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)


def first_seen_row(case: Case) -> int:
    """The first query row that sees a key: Sq - Sk under causal masking with Sq > Sk, else 0. SDPA is timed
    and judged on the rows from there (it gives NaN on the others, where the reference defines 0); the
    bottom-right alignment of the rows it keeps is unchanged."""
    return max(0, case.shape.seq_len - case.shape.seq_len_kv) if case.causal else 0


def _error(got, ref) -> float:
    """max |got - ref| in fp32 (NaN if got has one)."""
    diff = (got.float() - ref).abs()
    return float("nan") if diff.isnan().any() else diff.max().item() if diff.numel() else 0.0


def _judge(name: str, got, ref, tolerance: float) -> tuple[float, int, list[dict]]:
    """(max error, elements off, the first mismatches) of one output tensor; NaN counts as off."""
    import torch

    diff = (got.float() - ref).abs()
    bad = torch.isnan(diff) | (diff > tolerance)
    max_error = float("nan") if torch.isnan(diff).any() else (diff.max().item() if diff.numel() else 0.0)
    idx = bad.nonzero()[:MAX_MISMATCHES_SHOWN].tolist()
    shown = [{"tensor": name, "index": i, "expected": ref[tuple(i)].item(), "got": got[tuple(i)].float().item()} for i in idx]
    return max_error, int(bad.sum().item()), shown


def check_case(attn, case: Case) -> CaseResult:
    """Run the variant on fresh seeded inputs into NaN-poisoned outputs and compare (and its backward, for a
    case with grads)."""
    import torch

    q, k, v = make_inputs(case)
    originals = [t.clone() for t in (q, k, v)]
    scale = 1.0 / math.sqrt(case.shape.head_dim)
    atol = ATOL_BY_DTYPE[case.dtype]

    first = first_seen_row(case)
    sdpa_q = q[:, :, first:].contiguous()
    refs = {}
    if case.grads:
        d_o = grad_output(case)
        ref, *grads = reference_grads(q, k, v, case.causal, scale, d_o)
        refs = dict(zip(("dq", "dk", "dv"), grads))
        sdpa_leaves = [t.clone().requires_grad_() for t in (sdpa_q, k, v)]
        sdpa_out = sdpa(*sdpa_leaves, case.causal, scale)
        sdpa_out.backward(d_o[:, :, first:])
        sdpa_errors = {"out": _error(sdpa_out.detach(), ref[:, :, first:]),
                       "dq": _error(sdpa_leaves[0].grad, refs["dq"][:, :, first:]),
                       "dk": _error(sdpa_leaves[1].grad, refs["dk"]),
                       "dv": _error(sdpa_leaves[2].grad, refs["dv"])}  # fmt: skip
    else:
        ref = reference(q, k, v, case.causal, scale)
        sdpa_errors = {"out": _error(sdpa(sdpa_q, k, v, case.causal, scale), ref[:, :, first:])}

    outputs = {}
    out = torch.full_like(q, float("nan"))  # unwritten elements stay NaN and fail
    if case.grads:  # what a training step runs: the training forward, then the backward from what it saved
        out, lse, residual = attn.forward_train(q, k, v, causal=case.causal, scale=scale)
        poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        outputs["dq"], outputs["dk"], outputs["dv"] = attn.backward(d_o, q, k, v, out, lse, causal=case.causal, scale=scale,
                                                                    out_residual=residual, into=poisoned)  # fmt: skip
    else:
        attn(q, k, v, causal=case.causal, scale=scale, out=out)
    torch.cuda.synchronize()
    outputs = {"out": out, **outputs}
    refs = {"out": ref, **refs}

    result = CaseResult(case.as_dict(), OK, 0.0, 0.0, sdpa_errors["out"])
    worst = -1.0
    parts = []
    for name, got in outputs.items():
        tolerance = max(atol, 2.0 * sdpa_errors[name]) if not math.isnan(sdpa_errors[name]) else atol
        max_error, off, shown = _judge(name, got, refs[name], tolerance)
        result.tensors[name] = {"max_error": max_error, "tolerance": tolerance, "sdpa_error": sdpa_errors[name]}
        ratio = math.inf if math.isnan(max_error) else max_error / tolerance
        if ratio > worst:
            worst, result.max_error, result.tolerance = ratio, max_error, tolerance
        if off:
            result.mismatches += shown[: MAX_MISMATCHES_SHOWN - len(result.mismatches)]
            nans = int(torch.isnan(got.float()).sum().item())
            parts.append(f"{name}: {off} of {got.numel()} elements off (NaN: {nans}), max error {max_error:.4g} > {tolerance:.4g}")
    modified = [name for name, t, o in zip("qkv", (q, k, v), originals) if not torch.equal(t, o)]
    if modified:
        parts.append(f"inputs modified: {', '.join(modified)}")
    if parts:
        result.status = MISMATCH
        result.detail = "; ".join(parts)
    return result
