"""flashcore: a JIT-compiled playground for FlashAttention-style CUDA kernels.

    from flashcore_cli import load_variant
    attn = load_variant("v11")
    out = attn(q, k, v, causal=False, scale=None)   # q [B, H, S, D]; k, v [B, H_kv, S_kv, D]; fp16 CUDA tensors
    out.sum().backward()                            # variants with a backward; a forward-only one raises

Errors: FlashcoreInputError (bad tensors: a ValueError), FlashcoreUnsupportedError (a gradient or an lse the
variant does not give: a NotImplementedError), FlashcoreEnvironmentError (this machine cannot build or run it:
a RuntimeError); all are FlashcoreError.
"""

from flashcore_cli.core.errors import (
    FlashcoreEnvironmentError,
    FlashcoreError,
    FlashcoreInputError,
    FlashcoreUnsupportedError,
)

__version__ = "0.1.0"


def load_variant(name: str, *, registry=None, arch=None, force: bool = False):
    """Build (or load from the cache) a registered variant and return it as a callable."""
    from flashcore_cli.api import load_variant as _load_variant

    return _load_variant(name, registry=registry, arch=arch, force=force)


__all__ = [
    "load_variant",
    "FlashcoreError",
    "FlashcoreInputError",
    "FlashcoreUnsupportedError",
    "FlashcoreEnvironmentError",
    "__version__",
]
