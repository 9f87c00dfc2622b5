"""Reference rows timed beside the variants: PyTorch SDPA (its default and each backend the GPU runs)
and the project's own Triton FlashAttention forward."""

from __future__ import annotations


SDPA_DEFAULT = "sdpa"
# The math backend materialises the fp32 score matrix, B * H * S * S * 4 bytes, in every call; past this
# it is skipped (at 1,16,16384,64 it would be 16 GiB a call, and minutes of bench for a row nobody reads).
MATH_SCORE_LIMIT_BYTES = 4 << 30


def math_skip_reason(shape) -> str:
    """Why the sdpa-math row is not timed at this (B, H, S, D) shape, or "" when it is."""
    b, h, s, _ = shape
    score_bytes = b * h * s * s * 4
    if score_bytes <= MATH_SCORE_LIMIT_BYTES:
        return ""
    return (f"the math backend would materialise {score_bytes / 2**30:.1f} GiB of fp32 scores per call "
            f"(limit {MATH_SCORE_LIMIT_BYTES / 2**30:.0f} GiB)")


def reference_functions(q, k, v, causal: bool):
    """(name, zero-argument callable or None, context manager to time it in, reason when None)."""
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    rows = [(SDPA_DEFAULT, sdpa, contextlib.nullcontext(), "")]
    for label, backend in (
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        ("sdpa-math", SDPBackend.MATH),
    ):
        if backend == SDPBackend.MATH and (why := math_skip_reason(tuple(q.shape))):
            rows.append((label, None, None, why))
            continue
        # the backend is pinned around the whole timing loop, not inside each timed call
        rows.append((label, sdpa, sdpa_kernel([backend]), ""))

    try:
        from flashcore_cli.measure import triton_attention
    except ImportError as exc:
        rows.append(("triton", None, None, f"the Triton reference could not be imported: {exc}"))
        return rows
    if triton_attention.available():

        def triton():
            return triton_attention.triton_attention(q, k, v, causal=causal)

        triton.describe = triton_attention.tuned_config  # the tile it runs, known after the first (tuning) call
        rows.append(("triton", triton, contextlib.nullcontext(), ""))
    else:
        rows.append(("triton", None, None, triton_attention.unavailable_reason()))
    return rows
