"""The Python API: a registered variant as a callable usable from any PyTorch program.

    attn = load_variant("v8")
    out = attn(q, k, v, causal=False, scale=None)
"""

from __future__ import annotations

from flashcore_cli.errors import FlashcoreEnvironmentError, FlashcoreInputError
from flashcore_cli.registry import Variant, load_registry


class Attention:
    """One built variant. Calls validate their inputs and raise FlashcoreInputError (a ValueError) naming
    the problem — never a crash or silent garbage."""

    def __init__(self, variant: Variant, build):
        self.variant = variant
        self.build = build
        self._module = build.module

    @property
    def name(self) -> str:
        return self.variant.name

    def __repr__(self) -> str:
        return f"<flashcore variant {self.name} [{self.build.arch}] key={self.build.key}>"

    def __call__(self, q, k, v, causal: bool = False, scale: float | None = None, out=None):
        self._validate(q, k, v, causal, out)
        return self._module.forward(q, k, v, bool(causal), None if scale is None else float(scale), out)

    def plan(self, head_dim: int) -> list[tuple[str, int, int]]:
        return list(self._module.plan(head_dim))

    def _validate(self, q, k, v, causal, out) -> None:
        import torch

        name = self.name
        tensors = {"q": q, "k": k, "v": v} | ({"out": out} if out is not None else {})
        for label, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise FlashcoreInputError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
            if not t.is_cuda:
                raise FlashcoreInputError(f"{name}: {label} is on {t.device}; flashcore kernels need CUDA tensors")
            if t.dtype != torch.float16:
                raise FlashcoreInputError(f"{name}: {label} is {t.dtype}; flashcore kernels take torch.float16")
            if t.dim() != 4:
                raise FlashcoreInputError(f"{name}: {label} has shape {tuple(t.shape)}; expected 4-D [B, H, S, D]")
        for label, t in tensors.items():
            if t.shape != q.shape:
                raise FlashcoreInputError(
                    f"{name}: {label} has shape {tuple(t.shape)} but q has {tuple(q.shape)} (self-attention: all equal)"
                )
            if t.device != q.device:
                raise FlashcoreInputError(f"{name}: {label} is on {t.device} but q is on {q.device}")
            if not t.is_contiguous():
                raise FlashcoreInputError(f"{name}: {label} is not contiguous; call .contiguous() first")
            if t.data_ptr() % 16:
                raise FlashcoreInputError(
                    f"{name}: {label} does not start on a 16-byte boundary (a view at an odd offset?); "
                    "the kernels use 16-byte loads: pass a .clone()"
                )
        reason = self.variant.unsupported_reason(q.shape[-1], bool(causal))
        if reason:
            raise FlashcoreInputError(reason)


def load_variant(name: str, *, registry=None, arch: str | None = None, force: bool = False) -> Attention:
    """Build (or load from the cache) a variant for `arch` (default: the GPU's). Raises FlashcoreError for an
    unknown variant or a broken registry, FlashcoreEnvironmentError (a RuntimeError) where this machine cannot
    build it (a CPU build of torch, a GPU the variant does not run on), BuildError when the compiler fails."""
    from flashcore_cli.build import build_variant
    from flashcore_cli.toolchain import cpu_torch_problem
    from flashcore_cli.tuned import current_gpu_name, tuned_defines

    variant = load_registry(registry).get(name)
    problem = cpu_torch_problem()
    if problem:
        raise FlashcoreEnvironmentError(f"load_variant('{name}'): {problem}")
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            from flashcore_cli.archs import DEFAULT_ARCH

            arch = DEFAULT_ARCH
        else:
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
    defines = tuned_defines(variant.name, current_gpu_name())
    return Attention(variant, build_variant(variant, arch, force=force, extra_defines=defines or None))
