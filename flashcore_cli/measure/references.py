"""Reference rows timed beside the variants: PyTorch SDPA (its default and each backend the GPU runs),
FlexAttention (torch.nn.attention.flex_attention, compiled) and the project's own Triton FlashAttention forward.

SDPA rows run where SDPA expresses the case (dense or causal); FlexAttention runs every case it can express
(dense, causal, a sliding window as a block mask, a softcap as a score mod; not sinks, which no score or mask
mod can add to the denominator), compiled once per shape and case before its timing: its compile time is not
charged to its row."""

from __future__ import annotations

from flashcore_cli.core.passes import DEFAULT_PASS


SDPA_DEFAULT = "sdpa"
TRITON = "triton"
FLEX = "flex"
# the rows after SDPA's default: each backend pinned
SDPA_BACKEND_ROWS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
REFERENCE_ROWS = (SDPA_DEFAULT, *SDPA_BACKEND_ROWS, FLEX, TRITON)  # every reference row's name, in run order
# The math backend materialises the fp32 score matrix, B * H * S * S * 4 bytes, in every call; past this
# it is skipped (at 1,16,16384,64 it would be 16 GiB a call, and minutes of bench for a row nobody reads).
MATH_SCORE_LIMIT_BYTES = 4 << 30


def math_skip_reason(shape, kv_shape=None) -> str:
    """Why the sdpa-math row is not timed at this q shape (B, H, S, D) and k shape, or "" when it is."""
    b, h, s, _ = shape
    s_kv = kv_shape[2] if kv_shape is not None else s
    score_bytes = b * h * s * s_kv * 4
    if score_bytes <= MATH_SCORE_LIMIT_BYTES:
        return ""
    return (f"the math backend would materialise {score_bytes / 2**30:.1f} GiB of fp32 scores per call "
            f"(limit {MATH_SCORE_LIMIT_BYTES / 2**30:.0f} GiB)")


def reference_functions(q, k, v, causal: bool, passes: str = DEFAULT_PASS, family=None):
    """(name, zero-argument callable or None, context manager to time it in, reason when None) for each
    reference row. `passes` (fwd, bwd, fwd+bwd) is what a call does: the forward; the backward
    (torch.autograd.grad of a saved forward's output); or both. SDPA takes grouped-query inputs with
    enable_gqa and a shorter query block with the bottom-right causal mask (flashcore's convention). With a
    family beyond causal (registry/family.py), SDPA's and Triton's rows say why they are not timed."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcore_cli.check.case import sdpa as sdpa_forward
    from flashcore_cli.registry.family import DENSE

    family = family or DENSE
    if not family.is_dense(causal):
        what = family.label(causal).strip()
        why = f"SDPA does not express {what} (only dense or causal attention)"
        rows = [(name, None, None, why) for name in (SDPA_DEFAULT, *SDPA_BACKEND_ROWS)]
        rows.append(flex_row(q, k, v, causal, passes, family))
        rows.append((TRITON, None, None, f"the Triton reference does not take {what}"))
        return rows

    def sdpa_rows(label, backend):
        if passes == "fwd":
            return lambda: sdpa_forward(q, k, v, causal, None)
        return sdpa_training_call(q, k, v, causal, passes, backend)

    rows = [(SDPA_DEFAULT, sdpa_rows(SDPA_DEFAULT, None), contextlib.nullcontext(), "")]
    backends = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH)
    for label, backend in zip(SDPA_BACKEND_ROWS, backends):
        if backend == SDPBackend.MATH and (why := math_skip_reason(tuple(q.shape), tuple(k.shape))):
            rows.append((label, None, None, why))
            continue
        # the backend is pinned around the whole timing loop (and the saved forward), not inside each timed call
        try:
            with sdpa_kernel([backend]):
                call = sdpa_rows(label, backend)
        except Exception as exc:  # this backend cannot run the shape: the row says why
            rows.append((label, None, None, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"))
            continue
        rows.append((label, call, sdpa_kernel([backend]), ""))
    rows.append(flex_row(q, k, v, causal, passes, family))

    if passes != "fwd":
        rows.append((TRITON, None, None, "the Triton reference is forward-only"))
        return rows
    if q.shape[1] != k.shape[1] or q.shape[2] != k.shape[2]:
        rows.append((TRITON, None, None, "the Triton reference takes q, k, v of one shape only"))
        return rows
    try:
        from flashcore_cli.measure import triton_attention
    except ImportError as exc:
        rows.append((TRITON, None, None, f"the Triton reference could not be imported: {exc}"))
        return rows
    if triton_attention.available():

        def triton():
            return triton_attention.triton_attention(q, k, v, causal=causal)

        triton.describe = triton_attention.tuned_config  # the tile it runs, known after the first (tuning) call
        rows.append((TRITON, triton, contextlib.nullcontext(), ""))
    else:
        rows.append((TRITON, None, None, triton_attention.unavailable_reason()))
    return rows


def sdpa_training_call(q, k, v, causal: bool, passes: str, backend):
    """SDPA's backward (bwd: from one saved forward, the graph retained) or forward and backward (fwd+bwd), as
    a zero-argument call: torch.autograd.grad of the output for a fixed random dO."""
    import torch

    from flashcore_cli.check.case import sdpa as sdpa_forward

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    d_o = torch.randn_like(q)
    if passes == "bwd":
        out = sdpa_forward(*leaves, causal, None)
        return lambda: torch.autograd.grad(out, leaves, d_o, retain_graph=True)
    return lambda: torch.autograd.grad(sdpa_forward(*leaves, causal, None), leaves, d_o)


def flex_row(q, k, v, causal: bool, passes: str, family):
    """FlexAttention's row: (FLEX, call, context, "") or (FLEX, None, None, why). Compiled here, for this shape
    and case, and run once (the compile) before the row is timed; the block mask is built once too. The mask
    is flashcore's: bottom-right causal and window (query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq +
    right), the softcap a score mod of c * tanh(s / c)."""
    import contextlib

    if family.sinks:
        return (FLEX, None, None, "FlexAttention cannot add a sink to the softmax denominator")
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return (FLEX, None, None, f"FlexAttention could not be imported: {exc}")
    left, right = family.window(causal)
    sq, sk = q.shape[2], k.shape[2]
    offset = sk - sq
    block_mask = None
    if (left, right) != (-1, -1):

        def mask_mod(b, h, i, j):
            diag = i + offset
            visible = j >= 0
            if left >= 0:
                visible = visible & (j >= diag - left)
            if right >= 0:
                visible = visible & (j <= diag + right)
            return visible

        block_mask = create_block_mask(mask_mod, None, None, sq, sk, device=q.device)
    score_mod = None
    if family.softcap > 0:
        cap = float(family.softcap)

        def score_mod(score, b, h, i, j):
            return cap * torch.tanh(score / cap)

    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = q.shape[1] != k.shape[1]

    def forward(q_, k_, v_):
        return compiled(q_, k_, v_, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

    if passes == "fwd":
        return (FLEX, lambda: forward(q, k, v), contextlib.nullcontext(), "")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    d_o = torch.randn_like(q)
    if passes == "bwd":
        out = forward(*leaves)
        return (FLEX, lambda: torch.autograd.grad(out, leaves, d_o, retain_graph=True), contextlib.nullcontext(), "")
    return (FLEX, lambda: torch.autograd.grad(forward(*leaves), leaves, d_o), contextlib.nullcontext(), "")
