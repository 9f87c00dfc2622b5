"""flashcore: a JIT-compiled playground for FlashAttention-style CUDA kernels.

    from flashcore_cli import load_variant
    attn = load_variant("v8")
    out = attn(q, k, v, causal=False, scale=None)   # q, k, v: [B, H, S, D] fp16 CUDA tensors
"""

__version__ = "0.1.0"


def load_variant(name: str, *, registry=None, arch=None, force: bool = False):
    """Build (or load from the cache) a registered variant and return it as a callable."""
    from flashcore_cli.api import load_variant as _load_variant

    return _load_variant(name, registry=registry, arch=arch, force=force)


__all__ = ["load_variant", "__version__"]
