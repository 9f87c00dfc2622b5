"""v12 on what the contract's new fields allow (GPU, Hopper only): grouped-query and multi-query heads, queries
shorter and longer than the keys (causal bottom-right: query i sees keys j <= i + S_kv - S), and the row
log-sum-exp. `flashcore test` draws S_kv = S and H_kv = H only, so these cases live here until it draws more.

Rules: O passes as `flashcore test` passes it (max |out - ref| <= max(one ulp at 1.0, 2 x SDPA's error), SDPA run on
the same inputs with K and V repeated per group and the same mask, over the rows that see a key); a row that sees
no key must read O = 0 and LSE = +inf. LSE: v12's l sums P rounded to the element type, so its LSE may be off by
that rounding, at most the type's unit roundoff u in l (2^-11 fp16, 2^-8 bf16), plus fp32's rounding of m."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ULP_AT_ONE = {"fp16": 2.0**-10, "bf16": 2.0**-7}

# B, H, H_kv, S, S_kv, D: GQA at equal lengths; decode (S = 1, 4) against long caches, MQA; chunked prefill
# (S < S_kv); S > S_kv, where causal leaves the first S - S_kv rows with no key (and whole items with no tile:
# the one-consumer, two-consumer and three-consumer kernels); odd lengths off the 128-key tile.
SHAPES = [
    (2, 16, 4, 1000, 1000, 64),
    (1, 8, 1, 1, 8192, 128),
    (1, 32, 8, 4, 16384, 128),
    (2, 8, 2, 512, 4096, 64),
    (1, 8, 8, 17, 1000, 64),
    (1, 4, 4, 1000, 300, 64),
    (1, 4, 2, 5000, 129, 64),
    (1, 16, 4, 3000, 2000, 128),
    (1, 16, 16, 16384, 4096, 64),
]


@pytest.fixture(scope="module")
def v12():
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v12 runs on sm_90a (Hopper) only")
    from flashcore_cli import load_variant

    return load_variant("v12")


def reference(q, k, v, causal: bool, scale: float):
    """fp32 O and LSE, one batch slice at a time; rows that see no key: O = 0, LSE = +inf (the contract)."""
    import torch

    group = q.shape[1] // k.shape[1]
    s, s_kv = q.shape[2], k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    hidden = None
    if causal:  # bottom-right: key j is hidden from query i when j > i + S_kv - S
        rows = torch.arange(s, device=q.device)[:, None]
        hidden = torch.arange(s_kv, device=q.device)[None, :] > rows + (s_kv - s)
    for b in range(q.shape[0]):
        kb = k[b].float().repeat_interleave(group, dim=0)
        vb = v[b].float().repeat_interleave(group, dim=0)
        scores = torch.matmul(q[b].float(), kb.transpose(-1, -2)) * scale
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))
        lse[b] = torch.logsumexp(scores, dim=-1)
        seen = torch.isfinite(lse[b])
        out[b] = torch.where(seen[..., None], torch.matmul(torch.softmax(scores, dim=-1), vb), 0.0)
        lse[b] = torch.where(seen, lse[b], float("inf"))
    return out, lse, hidden


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(map(str, s)))
def test_v12_gqa_seqlen_kv_and_lse_match_fp32(v12, shape, dtype, causal):
    import torch
    import torch.nn.functional as F

    b, h, h_kv, s, s_kv, d = shape
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(100 * SHAPES.index(shape) + 10 * (dtype == "bf16") + causal)
    q = torch.randn(b, h, s, d, generator=gen, device="cuda", dtype=torch_dtype)
    k = torch.randn(b, h_kv, s_kv, d, generator=gen, device="cuda", dtype=torch_dtype)
    v = torch.randn(b, h_kv, s_kv, d, generator=gen, device="cuda", dtype=torch_dtype)
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse, hidden = reference(q, k, v, causal, scale)
    seen = torch.isfinite(ref_lse)

    group = h // h_kv
    mask = None if hidden is None else ~hidden  # SDPA's boolean mask: True where a key takes part
    sdpa = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                          attn_mask=mask, scale=scale)
    sdpa_error = (sdpa.float() - ref_o).abs()[seen].max().item()
    tolerance = max(ULP_AT_ONE[dtype], 2.0 * sdpa_error)

    out = torch.full_like(q, float("nan"))  # unwritten rows stay NaN and fail
    v12(q, k, v, causal=causal, scale=scale, out=out)
    # NaNs of the lse's size, freed at once: the caching allocator hands that block to the lse, so an unwritten
    # row reads NaN rather than whatever the block held.
    torch.full((b, h, s), float("nan"), device="cuda")
    o_lse, lse = v12(q, k, v, causal=causal, scale=scale, return_lse=True)
    torch.cuda.synchronize()

    o_error = (out.float() - ref_o).abs()
    assert not torch.isnan(o_error).any(), "O has unwritten (NaN) elements"
    assert o_error.max().item() <= tolerance, f"O off by {o_error.max().item():.3g} (tolerance {tolerance:.3g})"
    assert torch.equal(out, o_lse), "O differs between the out= call and the return_lse call"
    assert (out[~seen.unsqueeze(-1).expand_as(out)] == 0).all(), "a row that sees no key has O != 0"
    assert torch.isinf(lse[~seen]).all() and (lse[~seen] > 0).all(), "a row that sees no key has LSE != +inf"
    lse_error = (lse[seen] - ref_lse[seen]).abs()
    lse_tolerance = UNIT_ROUNDOFF[dtype] + 1e-6 * (1.0 + ref_lse[seen].abs())
    worst = (lse_error - lse_tolerance).argmax()
    assert (lse_error <= lse_tolerance).all(), (
        f"LSE off by {lse_error[worst].item():.3g} at a row whose LSE is {ref_lse[seen][worst].item():.4g}"
    )
