"""Correctness of one variant on one case, in the process that owns the GPU (see isolate.py).

Reference: attention in fp32 on the same fp16 (or bf16) inputs, the K/V heads repeated for grouped-query cases,
the causal mask bottom-right (query i sees keys j <= i + Sk - Sq), a row that sees no key giving 0; the family
(registry/family.py) as flashcore.h states it: a sliding window's mask, the softcap's c * tanh(s / c), the sinks as
one more column of each row's softmax that carries no value.

The output passes when
    max |out - ref| <= max(ATOL, 2 x max |peer - ref|)
where the peer is PyTorch's own scaled_dot_product_attention in the case's dtype on the same inputs (with the
window as a boolean mask; the rows that see no key, where SDPA gives NaN, left out of its error), or, where SDPA
cannot express the case (softcap, sinks), the same naive attention as the reference kept in the case's dtype
(FlashAttention's `attention_ref(upcast=False)`). ATOL is one ulp at 1.0 in that dtype (fp16 2^-10, bf16 2^-7),
so a case where the peer happens to be exact (S = 1: the output is V) still allows the output's own rounding.

Gradients (a case with `grads`, for variants with a backward): dQ, dK, dV (and dsinks) for one random dO under
FlashAttention-3's own test rule (hopper/test_flash_attn.py; the owner's decision, DESIGN.md):
    max |g - g_ref| <= 2 x max |g_pt - g_ref| + 2 x max |(g_ref + 0.3 - 0.3) - g_ref|
with g_ref the fp32 reference's, g_pt the naive attention's kept in the case's dtype (q scaled first: reorder_ops),
and the last term (one rounding at the gradient's own magnitude) computed in that dtype; with a softcap 3 x and 3e-4
more, as FA3's tests. Where SDPA expresses the case, 2 x its backward's error is the bound when larger (at near-one-
hot rows the naive attention is exact while a fused backward's D carries O's rounding); never below ATOL; dsinks
also allows 2 u sum |p_sink D|, the rounding of the terms it sums. The gradient outputs are poisoned with NaN before
the backward writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flashcore_cli.core.dtypes import TORCH_NAMES
from flashcore_cli.core.statuses import MISMATCH, OK
from flashcore_cli.registry.family import DENSE, Family
from flashcore_cli.registry.shapes import Case

ATOL = 2.0**-10
ATOL_BY_DTYPE = {"fp16": ATOL, "bf16": 2.0**-7}
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
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
    return window_mask(seq_len, seq_len_kv, (-1, 0), device)


def window_mask(seq_len: int, seq_len_kv: int, window: tuple[int, int], device):
    """True where query i may see key j under window (left, right): i + Sk - Sq - left <= j <= i + Sk - Sq + right,
    -1 unbounded (flashcore.h); (-1, 0) is causal."""
    import torch

    left, right = window
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len_kv, device=device)[None, :]
    diag = i + (seq_len_kv - seq_len)
    mask = torch.ones(seq_len, seq_len_kv, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    return mask


def case_mask(case: Case, device):
    """The case's mask (None: every key visible)."""
    window = case.family.window(case.causal)
    return None if window == (-1, -1) else window_mask(case.shape.seq_len, case.shape.seq_len_kv, window, device)


def make_sinks(case: Case, device="cuda"):
    """The case's sinks, fp32 [Hq] (None without): from a seed of its own, of every size against a row's max — about
    N(0, 4), and every third head +15 (the sink dominates its rows), every third -15 (it barely shows)."""
    import torch

    if not case.family.sinks:
        return None
    gen = torch.Generator(device=device).manual_seed(case.seed + 104729)
    sinks = torch.randn(case.shape.heads, generator=gen, device=device, dtype=torch.float32) * 4.0
    offsets = torch.tensor([0.0, 15.0, -15.0], device=device).repeat(case.shape.heads // 3 + 1)[: case.shape.heads]
    return (sinks + offsets).contiguous()


def reference(q, k, v, causal: bool, scale: float, dtype=None, *, family: Family = DENSE, sinks=None):
    """Attention in fp32 (or `dtype`, e.g. torch.float64, or the inputs' own for the naive peer; differentiable),
    one batch and K/V head at a time to bound the Sq x Sk scores' memory (without a graph to keep, each block's
    scores are freed before the next). K/V heads are repeated for grouped-query inputs; a row that sees no key
    gives 0. Gradients: reference_grads, block by block too."""
    import torch

    group = q.shape[1] // k.shape[1]
    mask = _mask(q, k, causal, family)
    return torch.stack([
        torch.cat([_reference_block(q[b, h * group:(h + 1) * group], k[b, h:h + 1], v[b, h:h + 1], mask, scale,
                                    dtype, family.softcap, None if sinks is None else sinks[h * group:(h + 1) * group])
                   for h in range(k.shape[1])])
        for b in range(q.shape[0])
    ])  # fmt: skip


def _mask(q, k, causal: bool, family: Family):
    window = family.window(causal)
    return None if window == (-1, -1) else window_mask(q.shape[2], k.shape[2], window, q.device)


def _reference_block(q, k, v, mask, scale: float, dtype=None, softcap: float = 0.0, sinks=None, sink_probs=None):
    """reference() of one batch: q [Hq, Sq, D], k and v [Hkv, Sk, D] (Hq a multiple of Hkv), in fp32 or `dtype`;
    mask [Sq, Sk] (True: visible) or None; sinks [Hq] or None. With sinks, `sink_probs` (a list) gets each row's
    sink probability, [Hq, Sq]."""
    import torch

    dtype = dtype or torch.float32
    group = q.shape[0] // k.shape[0]
    # q scaled before the product (FlashAttention's reorder_ops): in a 16-bit dtype q.k of the extreme cases (x 30)
    # would overflow before the scale; in fp32 the order changes nothing that matters
    scores = torch.matmul(q.to(dtype) * scale, k.to(dtype).repeat_interleave(group, dim=0).transpose(-1, -2))
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    seen = None
    if mask is not None:
        seen = mask.any(-1, keepdim=True)  # rows with at least one visible key
        # masked scores -inf; a row with none visible keeps finite scores (no NaN, even in its gradient)
        scores = scores.masked_fill(~mask & seen, float("-inf"))
    values = v.to(dtype).repeat_interleave(group, dim=0)
    if sinks is not None:  # one more column per row, the head's sink, that carries no value
        column = sinks.to(dtype)[:, None, None].expand(scores.shape[0], scores.shape[1], 1)
        if seen is not None:  # a row that sees no key: its sink alone (O = 0)
            scores = scores.masked_fill(~seen, float("-inf"))
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
        if sink_probs is not None:
            sink_probs.append(probs[..., -1].detach())
        return torch.matmul(probs[..., :-1], values)
    out = torch.matmul(torch.softmax(scores, dim=-1), values)
    return out * seen if seen is not None else out


def reference_grads(q, k, v, causal: bool, scale: float, d_o, *, family: Family = DENSE, sinks=None, dtype=None,
                    sink_terms=None):  # fmt: skip
    """(out, dq, dk, dv, dsinks) of reference() for the upstream gradient d_o, in fp32 (or `dtype`: the naive
    peer), one (batch, K/V head) at a time: the autograd graph of one block (its Hq / Hkv query heads' scores,
    softmax and their gradients) is freed before the next, so a long sequence needs the memory of one head group,
    not of every head at once (the whole graph of 1,16,16384,64 is over 60 GB). dsinks is None without sinks.
    sink_terms (an fp32 [Hq] tensor, with sinks) gets, per head, the sum over its rows of |p_sink * D|, the size of
    the terms dsinks sums (D = rowsum(dO o O))."""
    import torch

    dtype = dtype or torch.float32
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    dq, dk, dv = (torch.empty(t.shape, dtype=dtype, device=q.device) for t in (q, k, v))
    dsinks = torch.zeros(q.shape[1], dtype=torch.float32, device=q.device) if sinks is not None else None
    group = q.shape[1] // k.shape[1]
    mask = _mask(q, k, causal, family)
    for b in range(q.shape[0]):
        for h in range(k.shape[1]):
            heads = slice(h * group, (h + 1) * group)
            leaves = [t.to(dtype).requires_grad_() for t in (q[b, heads], k[b, h : h + 1], v[b, h : h + 1])]
            if sinks is not None:
                leaves.append(sinks[heads].float().requires_grad_())
            probs = [] if sink_terms is not None else None
            block = _reference_block(*leaves[:3], mask, scale, dtype, family.softcap, leaves[3] if sinks is not None else None,
                                     probs)  # fmt: skip
            grads = torch.autograd.grad(block, leaves, d_o[b, heads].to(dtype))
            if probs:
                rows_d = (d_o[b, heads].float() * block.detach().float()).sum(-1)
                sink_terms[heads] += (probs[0].float() * rows_d).abs().sum(-1)
            out[b, heads] = block.detach()
            dq[b, heads], dk[b, h : h + 1], dv[b, h : h + 1] = grads[:3]
            if sinks is not None:
                dsinks[heads] += grads[3].float()
    return out, dq, dk, dv, dsinks


def sdpa(q, k, v, causal: bool, scale: float, mask=None):
    """PyTorch's own attention in the inputs' dtype, with the same masking convention as the reference (a window
    as the boolean `mask`)."""
    import torch.nn.functional as F

    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
    if causal and q.shape[2] != k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                              scale=scale, **gqa)  # fmt: skip
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)


def sdpa_grad_errors(case: Case, q, k, v, d_o, scale: float, grads, seen) -> dict[str, float]:
    """max |g_sdpa - g_ref| of SDPA's backward in the case's dtype for dq, dk, dv: the gradient rule's other bound,
    twice a production kernel's error, which the fused backwards' near-one-hot rows need where the naive peer is
    exact (backward-precision.md). SDPA runs on the rows that see a key (one run of rows: each row's window moves
    right with it), where it gives no NaN; the bottom-right alignment of the rows it keeps is unchanged."""
    rows = seen.nonzero().flatten().tolist() if seen is not None else [0, case.shape.seq_len - 1]
    if not rows:
        return {}
    lo, hi = rows[0], rows[-1] + 1
    leaves = [t.clone().requires_grad_() for t in (q[:, :, lo:hi].contiguous(), k, v)]
    mask = case_mask(case, q.device)[lo:hi] if case.family.has_window(case.causal) else None
    out = sdpa(*leaves, case.causal, scale, mask)
    out.backward(d_o[:, :, lo:hi])
    errors = {"dq": _error(leaves[0].grad, grads[0][:, :, lo:hi]), "dk": _error(leaves[1].grad, grads[1]),
              "dv": _error(leaves[2].grad, grads[2])}  # fmt: skip
    return {name: e for name, e in errors.items() if math.isfinite(e)}


def sdpa_expresses(case: Case) -> bool:
    """Whether SDPA can run the case: dense, causal or a window (a boolean mask); not a softcap or sinks."""
    return case.family.softcap == 0 and not case.family.sinks


def first_seen_row(case: Case) -> int:
    """The first query row that sees a key: Sq - Sk under causal masking with Sq > Sk, else 0. SDPA is timed
    and judged on the rows from there (it gives NaN on the others, where the reference defines 0); the
    bottom-right alignment of the rows it keeps is unchanged."""
    return max(0, case.shape.seq_len - case.shape.seq_len_kv) if case.causal else 0


def _error(got, ref, rows=None) -> float:
    """max |got - ref| in fp32 (NaN if got has one), over the query rows `rows` ([Sq] bool) when given."""
    diff = (got.float() - ref.float()).abs()
    if rows is not None:
        diff = diff[:, :, rows]
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


def grad_tolerance(case: Case, g_ref, pt_error: float) -> float:
    """FlashAttention-3's rule for one gradient: 2 x the naive low-precision attention's error plus 2 x one rounding
    at the gradient's magnitude (in the case's dtype); with a softcap 3 x and 3e-4 more (its tests' numbers); never
    below one ulp at 1.0. check_case widens it where a production kernel's own error is larger (sdpa_grad_errors,
    and dsinks' sum of rounded terms)."""
    import torch

    dtype = torch_dtype(case.dtype)
    rounding = ((g_ref.to(dtype) + 0.3 - 0.3).float() - g_ref.to(dtype).float()).abs().max().item() if g_ref.numel() else 0.0
    if not math.isfinite(pt_error):  # the naive attention overflowed: no peer error, never a tolerance of NaN
        pt_error = 0.0
    factor, extra = (3.0, 3e-4) if case.family.softcap > 0 else (2.0, 0.0)
    # never below the forward's floor, one ulp at 1.0: at one-hot rows the naive attention's dS is exactly 0 (its P is
    # exactly one-hot), while a fused backward's D = rowsum(dO o O) carries O's rounding (backward-precision.md)
    return max(ATOL_BY_DTYPE[case.dtype], factor * pt_error + 2.0 * rounding + extra)


def _grad_references(case: Case, q, k, v, sinks, scale: float, d_o, seen, refs: dict, tolerances: dict,
                     peer_errors: dict):  # fmt: skip
    """The fp32 reference's output (returned) and gradients (into refs), each gradient's tolerance and its naive
    peer's error (module docstring: FA3's rule, or twice SDPA's backward error, never below ATOL)."""
    import torch

    family = {"family": case.family, "sinks": sinks}
    sink_terms = torch.zeros(case.shape.heads, device=q.device) if sinks is not None else None
    ref, *grads = reference_grads(q, k, v, case.causal, scale, d_o, **family, sink_terms=sink_terms)
    _, *pt_grads = reference_grads(q, k, v, case.causal, scale, d_o, dtype=torch_dtype(case.dtype), **family)
    sdpa_errors = sdpa_grad_errors(case, q, k, v, d_o, scale, grads[:3], seen) if sdpa_expresses(case) else {}
    for name, g_ref, g_pt in zip(("dq", "dk", "dv", "dsinks"), grads, pt_grads):
        if g_ref is None:
            continue
        refs[name] = g_ref
        peer_errors[name] = _error(g_pt, g_ref)
        tolerances[name] = max(grad_tolerance(case, g_ref, peer_errors[name]), 2.0 * sdpa_errors.get(name, 0.0))
    if sink_terms is not None:  # a sum of per-row terms, each carrying the dtype's rounding of P and O
        tolerances["dsinks"] = max(tolerances["dsinks"], 2.0 * UNIT_ROUNDOFF[case.dtype] * sink_terms.max().item())
    return ref


def check_case(attn, case: Case) -> CaseResult:
    """Run the variant on fresh seeded inputs into NaN-poisoned outputs and compare (and its backward, for a
    case with grads)."""
    import torch

    q, k, v = make_inputs(case)
    sinks = make_sinks(case)
    originals = [t.clone() for t in (q, k, v)]
    scale = 1.0 / math.sqrt(case.shape.head_dim)
    atol = ATOL_BY_DTYPE[case.dtype]
    dtype = torch_dtype(case.dtype)
    family = {"family": case.family, "sinks": sinks}
    mask = case_mask(case, q.device)
    seen = mask.any(-1) if mask is not None else None  # the rows that see a key (SDPA's error is over these)

    refs, tolerances, peer_errors = {}, {}, {}
    if case.grads:
        d_o = grad_output(case)
        ref = _grad_references(case, q, k, v, sinks, scale, d_o, seen, refs, tolerances, peer_errors)
    else:
        ref = reference(q, k, v, case.causal, scale, **family)
    if sdpa_expresses(case):  # over the rows that see a key (SDPA gives NaN on the others)
        peer_errors["out"] = _error(sdpa(q, k, v, case.causal, scale, mask if case.family.has_window(case.causal) else None),
                                    ref, seen)  # fmt: skip
    else:
        peer_errors["out"] = _error(reference(q, k, v, case.causal, scale, dtype, **family), ref)
    tolerances["out"] = max(atol, 2.0 * peer_errors["out"]) if not math.isnan(peer_errors["out"]) else atol

    outputs = {}
    out = torch.full_like(q, float("nan"))  # unwritten elements stay NaN and fail
    kwargs = {"causal": case.causal, "scale": scale, **case.family.kwargs(case.causal), "sinks": sinks}
    if case.grads:  # what a training step runs: the training forward, then the backward from what it saved
        out, lse, residual = attn.forward_train(q, k, v, **kwargs)
        poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        dsinks = torch.full_like(sinks, float("nan")) if sinks is not None else None
        outputs["dq"], outputs["dk"], outputs["dv"] = attn.backward(d_o, q, k, v, out, lse, **kwargs, out_residual=residual,
                                                                    into=poisoned, dsinks=dsinks)  # fmt: skip
        if sinks is not None:
            outputs["dsinks"] = dsinks
    else:
        attn(q, k, v, **kwargs, out=out)
    torch.cuda.synchronize()
    outputs = {"out": out, **outputs}
    refs = {"out": ref, **refs}

    result = CaseResult(case.as_dict(), OK, 0.0, 0.0, peer_errors["out"])
    worst = -1.0
    parts = []
    for name, got in outputs.items():
        tolerance = tolerances[name]
        max_error, off, shown = _judge(name, got, refs[name], tolerance)
        result.tensors[name] = {"max_error": max_error, "tolerance": tolerance, "sdpa_error": peer_errors[name]}
        ratio = math.inf if math.isnan(max_error) else max_error / tolerance if tolerance else (0.0 if max_error == 0 else math.inf)
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
