"""Correctness of one variant on one case, in the process that owns the GPU (see isolate.py).

Reference: attention in fp32 on the same fp16 (or bf16) inputs. A variant passes when
    max |out - ref| <= max(ATOL, 2 x max |sdpa - ref|)
where sdpa is PyTorch's own scaled_dot_product_attention in the case's dtype on the same inputs
(flash-attention's rule: be no worse than twice the error of a production kernel). ATOL is one ulp at 1.0
in that dtype (fp16 2^-10, bf16 2^-7), so a case where SDPA happens to be exact (S = 1: the output is V)
still allows the output's own rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flashcore_cli.registry.shapes import Case

ATOL = 2.0**-10
ATOL_BY_DTYPE = {"fp16": ATOL, "bf16": 2.0**-7}
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPES[name])
MAX_MISMATCHES_SHOWN = 5


@dataclass
class CaseResult:
    case: dict
    status: str  # OK, MISMATCH
    max_error: float
    tolerance: float
    sdpa_error: float
    mismatches: list[dict] = field(default_factory=list)
    detail: str = ""


def make_inputs(case: Case, device="cuda"):
    """q, k, v for a case, drawn as its `inputs` kind says (shapes.INPUT_KINDS), from its seed."""
    import torch

    gen = torch.Generator(device=device).manual_seed(case.seed)
    shape = (case.shape.batch, case.shape.heads, case.shape.seq_len, case.shape.head_dim)
    dtype = torch_dtype(case.dtype)

    def randn(scale: float = 1.0, rows: int | None = None):
        size = shape if rows is None else (*shape[:2], rows, shape[3])
        return (torch.randn(size, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    if case.inputs == "large":
        return [randn(30.0) for _ in range(3)]
    if case.inputs == "one-hot":
        x = randn(30.0)
        return [x, x.clone(), x.clone()]
    if case.inputs == "uniform":
        q, row, v = randn(), randn(rows=1), randn()
        return [q, row.expand(shape).contiguous(), v]
    return [torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(3)]


def reference(q, k, v, causal: bool, scale: float):
    """fp32 attention, one (batch) slice at a time to bound the S x S scores' memory."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    s_len = q.shape[2]
    mask = None
    if causal:
        mask = torch.ones(s_len, s_len, dtype=torch.bool, device=q.device).triu(1)
    for b in range(q.shape[0]):
        scores = torch.matmul(q[b].float(), k[b].float().transpose(-1, -2)) * scale
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
        out[b] = torch.matmul(torch.softmax(scores, dim=-1), v[b].float())
    return out


def check_case(attn, case: Case) -> CaseResult:
    """Run the variant once on fresh seeded inputs into a NaN-poisoned output and compare."""
    import torch
    import torch.nn.functional as F

    q, k, v = make_inputs(case)
    originals = [t.clone() for t in (q, k, v)]
    scale = 1.0 / math.sqrt(case.shape.head_dim)
    ref = reference(q, k, v, case.causal, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale)
    sdpa_error = (sdpa.float() - ref).abs().max().item()
    tolerance = max(ATOL_BY_DTYPE[case.dtype], 2.0 * sdpa_error)

    out = torch.full_like(q, float("nan"))  # unwritten elements stay NaN and fail
    attn(q, k, v, causal=case.causal, scale=scale, out=out)
    torch.cuda.synchronize()

    diff = (out.float() - ref).abs()
    bad = torch.isnan(diff) | (diff > tolerance)
    max_error = float("nan") if torch.isnan(diff).any() else diff.max().item()
    modified = [name for name, t, o in zip("qkv", (q, k, v), originals) if not torch.equal(t, o)]
    result = CaseResult(case.as_dict(), "OK", max_error, tolerance, sdpa_error)
    if bad.any() or modified:
        result.status = "MISMATCH"
        idx = bad.nonzero()[:MAX_MISMATCHES_SHOWN].tolist()
        result.mismatches = [
            {"index": i, "expected": ref[tuple(i)].item(), "got": out[tuple(i)].float().item()} for i in idx
        ]
        parts = []
        if bad.any():
            parts.append(f"{int(bad.sum().item())} of {bad.numel()} elements off (NaN: {int(torch.isnan(diff).sum().item())})")
        if modified:
            parts.append(f"inputs modified: {', '.join(modified)}")
        result.detail = "; ".join(parts)
    return result
