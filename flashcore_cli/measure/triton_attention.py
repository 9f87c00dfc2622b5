"""A Triton FlashAttention forward: the reference row `flashcore bench` times beside PyTorch SDPA.

    triton_attention(q, k, v, causal=False, scale=None) -> torch.Tensor

q, k, v are [B, H, S, D] fp16 (or bf16) tensors on one CUDA device (self-attention: one S for all three),
D in {16, 32, 64, 128}, any S >= 1. `causal` means query i sees keys 0..i. `scale` defaults to
1/sqrt(D). The output is a new [B, H, S, D] tensor of q's dtype.

How it works (the FlashAttention-2 forward):
  * one program per (BLOCK_M query rows, batch*head); Q's tile stays in registers;
  * it walks K/V in BLOCK_N-key blocks, S = Q K^T accumulates in fp32 (tensor cores), and an online
    softmax keeps a running row max m and row sum l; scores are turned into base-2 logits by one
    multiply with scale*log2(e), so every exponential is an exp2;
  * P (in q's dtype) @ V accumulates into an fp32 [BLOCK_M, D] tile, rescaled by exp2(m_old - m_new) whenever
    the row max grows; the tile is divided by l once at the end;
  * the key walk has two phases: blocks that need no mask at all (loads without bounds, no `where`),
    then the few blocks that do -- under causal the diagonal blocks (key blocks past the diagonal
    are never visited), otherwise the one partial tail block when BLOCK_N does not divide S.

`triton` and `torch` are imported lazily / behind a guard so that this module imports, and
`flashcore --help` stays fast, on machines without either. With TRITON_INTERPRET=1 set before this
module is imported, the kernel runs in Triton's CPU interpreter on CPU tensors, with a fixed small
tile instead of autotuning (that is how the CPU tests exercise it).
"""

import math
from typing import Optional

__all__ = ["triton_attention", "available", "unavailable_reason", "tuned_config", "CONFIGS", "SUPPORTED_HEAD_DIMS"]

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)

# (BLOCK_M, BLOCK_N, num_warps, num_stages): the autotune space, kept small so tuning stays quick.
# 64-row tiles give small grids (the mission shape 1,8,512,64 has only 8 heads) more programs;
# 128-row tiles with 8 warps are the throughput configs for long sequences on Hopper.
CONFIGS = (
    (64, 32, 4, 4),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (64, 128, 4, 2),
    (128, 32, 4, 4),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
)

# The tile used under TRITON_INTERPRET=1 (no autotuning there; small so partial and diagonal
# blocks are exercised by tiny test shapes: BLOCK_M > BLOCK_N puts several key blocks on a diagonal).
INTERPRET_CONFIG = (32, 16, 4, 1)

_LOG2E = 1.4426950408889634

_TRITON_ERROR: Optional[str] = None
try:  # never let a missing or broken triton break the import of this module
    import triton
    import triton.language as tl
except Exception as exc:  # ImportError, or a triton that fails while importing
    triton = None
    tl = None
    _TRITON_ERROR = f"triton is not importable ({type(exc).__name__}: {exc})"


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


if triton is not None:

    @triton.jit
    def _attn_fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                         offs_m, offs_n, offs_d, lo, hi, N_CTX, qk_scale,
                         BLOCK_N: tl.constexpr, MASK_TAIL: tl.constexpr, MASK_CAUSAL: tl.constexpr):
        """Fold key blocks [lo, hi) into the running (acc, l, m) of one query tile."""
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + offs_n
            k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd
            v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if MASK_TAIL:
                k = tl.load(k_ptrs, mask=cols[:, None] < N_CTX, other=0.0)
            else:
                k = tl.load(k_ptrs)
            s = tl.dot(q, tl.trans(k))
            if MASK_TAIL:
                s = tl.where(cols[None, :] < N_CTX, s, float("-inf"))
            if MASK_CAUSAL:
                s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
            # Base-2 logits with scale * log2(e) folded in: qk_scale > 0 (the wrapper makes it so), so the
            # row max can be taken on raw scores and scale-and-subtract is one FMA per score.
            # Every row sees key 0 in the first block it visits, so m_new is finite from there on
            # and exp2(-inf - finite) = 0 handles the first block; no NaN guard needed.
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            if MASK_TAIL:
                v = tl.load(v_ptrs, mask=cols[:, None] < N_CTX, other=0.0)
            else:
                v = tl.load(v_ptrs)
            acc = tl.dot(p.to(v.dtype), v, acc=acc)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _attn_fwd(Q, K, V, Out, qk_scale,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_ob, stride_oh, stride_om, stride_od,
                  H, N_CTX,
                  N_CTX_KEY, BH_KEY,  # autotune keys only (power-of-two buckets), unused in the body
                  HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        if IS_CAUSAL:
            # longest rows (most key blocks) first, so the tail of the grid is short programs
            start_m = tl.num_programs(0) - 1 - tl.program_id(0)
        else:
            start_m = tl.program_id(0)
        off_bh = tl.program_id(1)
        off_b = (off_bh // H).to(tl.int64)
        off_h = (off_bh % H).to(tl.int64)
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        k_base = K + off_b * stride_kb + off_h * stride_kh
        v_base = V + off_b * stride_vb + off_h * stride_vh
        o_base = Out + off_b * stride_ob + off_h * stride_oh

        m0 = start_m * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m[:, None] < N_CTX

        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_ok, other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        if IS_CAUSAL:
            # keys [0, full_hi) are visible to every row of this tile and in bounds (full_hi <= m0 < N_CTX)
            full_hi = (m0 // BLOCK_N) * BLOCK_N
            acc, l_i, m_i = _attn_fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                             stride_vn, stride_vd, offs_m, offs_n, offs_d, 0, full_hi,
                                             N_CTX, qk_scale, BLOCK_N, False, False)
            # the diagonal: blocks holding keys in [full_hi, m0 + BLOCK_M) ∩ [0, N_CTX); nothing past it
            diag_hi = tl.minimum(m0 + BLOCK_M, N_CTX)
            acc, l_i, m_i = _attn_fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                             stride_vn, stride_vd, offs_m, offs_n, offs_d, full_hi, diag_hi,
                                             N_CTX, qk_scale, BLOCK_N, True, True)
        else:
            full_hi = (N_CTX // BLOCK_N) * BLOCK_N
            acc, l_i, m_i = _attn_fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                             stride_vn, stride_vd, offs_m, offs_n, offs_d, 0, full_hi,
                                             N_CTX, qk_scale, BLOCK_N, False, False)
            # at most one partial block when BLOCK_N does not divide N_CTX (empty range otherwise)
            acc, l_i, m_i = _attn_fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                             stride_vn, stride_vd, offs_m, offs_n, offs_d, full_hi, N_CTX,
                                             N_CTX, qk_scale, BLOCK_N, True, False)

        acc = acc / l_i[:, None]
        tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                 acc.to(Out.dtype.element_ty), mask=row_ok)

    def _prune_configs(configs, named_args, **kwargs):
        """Drop tiles that cannot win, so tuning stays quick: tiles far larger than the sequence (tiny S),
        and tiles whose fp32 accumulator + score tile exceed ~160 registers a thread (ptxas spills them:
        128x64 with 4 warps at D=128 spills 150-600 bytes on sm_90)."""
        s = named_args["N_CTX"]
        d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM", 64))
        cap_m = max(64, _next_pow2(s))
        cap_n = max(32, _next_pow2(s))
        kept = []
        for c in configs:
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            if bm > cap_m or bn > cap_n:
                continue
            if (bm * d + bm * bn) > 160 * 32 * c.num_warps:
                continue
            kept.append(c)
        return kept or list(configs)

    _attn_fwd_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in CONFIGS
        ],
        key=["N_CTX_KEY", "BH_KEY", "HEAD_DIM", "IS_CAUSAL"],
        prune_configs_by={"early_config_prune": _prune_configs},
    )(_attn_fwd)

    _INTERPRETED = type(_attn_fwd).__name__ == "InterpretedFunction"
else:
    _INTERPRETED = False


def _interpreting() -> bool:
    """True when the kernel was built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRETED


def unavailable_reason() -> str:
    """Why triton_attention cannot run here ('' when it can)."""
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    try:
        import torch
    except Exception as exc:
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if _interpreting():
        return ""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return ""


def tuned_config() -> str:
    """The tile the autotuner chose for the last shape it ran, e.g. "tile 64x64, 4 warps, 3 stages" ('' before
    any tuned call, under the interpreter, or without triton). Bench records carry it: the choice is made per
    process from warm timings, so two runs can time different tiles."""
    if triton is None or _interpreting():
        return ""
    config = getattr(_attn_fwd_tuned, "best_config", None)
    kwargs = getattr(config, "kwargs", None) or {}
    if "BLOCK_M" not in kwargs or "BLOCK_N" not in kwargs:
        return ""
    return (f"tile {kwargs['BLOCK_M']}x{kwargs['BLOCK_N']}, {getattr(config, 'num_warps', '?')} warps, "
            f"{getattr(config, 'num_stages', '?')} stages")


def available() -> bool:
    """True when triton imports and a CUDA device is present (or the Triton CPU interpreter is on)."""
    return unavailable_reason() == ""


def _check(q, k, v) -> None:
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"triton_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"triton_attention: {name} must be [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"triton_attention: {name} must be float16 or bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"triton_attention: {name} is {t.dtype} but q is {q.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError("triton_attention: q, k, v must have one shape (self-attention), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"triton_attention: q, k, v on different devices: {q.device}, {k.device}, {v.device}")
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"triton_attention: head dim D={d} not supported (supported: {SUPPORTED_HEAD_DIMS})")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"triton_attention: tensors must be on a CUDA device, got {q.device} "
                         "(CPU tensors only run under TRITON_INTERPRET=1)")


def triton_attention(q, k, v, causal: bool = False, scale: Optional[float] = None):
    """softmax(scale * q @ k^T [+ causal mask]) @ v, FlashAttention-style in Triton. Returns a new tensor.

    On a GPU the tile is autotuned over CONFIGS (the first call per shape bucket tunes: seconds);
    under TRITON_INTERPRET=1 the fixed INTERPRET_CONFIG runs instead.
    """
    return _launch(q, k, v, causal, scale, INTERPRET_CONFIG if _interpreting() else None)


def _launch(q, k, v, causal, scale, config):
    """Run the kernel; config=None autotunes, else (BLOCK_M, BLOCK_N, num_warps, num_stages) is used as is
    (tests use this to check every tile in CONFIGS, not only the one autotuning picks)."""
    if triton is None:
        raise RuntimeError(f"triton_attention unavailable: {unavailable_reason()}")
    import torch

    _check(q, k, v)
    # any layout works (strides are passed), but the last dim must be unit-stride for vector loads
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B, H, S, D = q.shape
    out = torch.empty((B, H, S, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"triton_attention: scale must be finite, got {scale}")
    # The kernel needs a positive scale (see _attn_fwd_blocks); other scales are rewritten exactly:
    # softmax(c q k^T) = softmax(|c| (-q) k^T) for c < 0, and c = 0 gives the same scores as q = 0.
    if scale < 0:
        q, scale = -q, -scale
    elif scale == 0:
        q, scale = torch.zeros_like(q), 1.0
    qk_scale = scale * _LOG2E
    causal = bool(causal)

    args = (q, k, v, out, qk_scale,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            H, S, _next_pow2(S), _next_pow2(B * H))

    if config is not None:
        bm, bn, w, st = config
        grid = (triton.cdiv(S, bm), B * H)
        if _interpreting():
            _attn_fwd[grid](*args, HEAD_DIM=D, IS_CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
                            num_warps=w, num_stages=st)
        else:
            with torch.cuda.device(q.device):
                _attn_fwd[grid](*args, HEAD_DIM=D, IS_CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
                                num_warps=w, num_stages=st)
        return out

    def grid(meta):
        return (triton.cdiv(S, meta["BLOCK_M"]), B * H)

    with torch.cuda.device(q.device):
        _attn_fwd_tuned[grid](*args, HEAD_DIM=D, IS_CAUSAL=causal)
    return out


def best_config(S: int, D: int, causal: bool, BH: int) -> Optional[dict]:
    """The config autotuning chose for a shape bucket (None before the first call on it), for reports."""
    if triton is None or _interpreting():
        return None
    key_vals = (_next_pow2(S), _next_pow2(BH), D, bool(causal))
    try:  # the autotuner's cache is keyed by the `key` values in order, then argument dtypes
        for key, cfg in dict(getattr(_attn_fwd_tuned, "cache", {})).items():
            if tuple(key[: len(key_vals)]) == key_vals:
                return {"BLOCK_M": cfg.kwargs.get("BLOCK_M"), "BLOCK_N": cfg.kwargs.get("BLOCK_N"),
                        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    except Exception:
        return None
    return None
