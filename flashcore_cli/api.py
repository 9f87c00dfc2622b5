"""The Python API: a registered variant as a callable usable from any PyTorch program.

    attn = load_variant("v11")
    out = attn(q, k, v, causal=False, scale=None)        # q, k, v: [B, H, S, D] CUDA, fp16 (or bf16 where declared)
    out = torch.ops.flashcore.v11(q, k, v, causal=True)  # the same kernel as a PyTorch custom op

Each variant is a custom op, flashcore::<name>, with the schema
    (Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> Tensor
a fake (meta) implementation that gives the output's shape, dtype and device, and a CUDA implementation that
calls the variant's built extension. So torch.compile traces a model that calls it with no graph break, and
CUDA graphs capture it. The op and its fake implementation are registered without building anything
(register_op); the CUDA implementation builds (or loads from the cache) on its first call, unless
load_variant built it already. The op is forward-only: it has no backward.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from flashcore_cli.core.errors import FlashcoreEnvironmentError, FlashcoreInputError
from flashcore_cli.registry.variants import Variant, load_registry

NAMESPACE = "flashcore"
SCHEMA = "(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> Tensor"
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}  # registry name -> torch.<name>


@dataclass
class _Op:
    """One registered op: the variant it runs and, once built, the extension module its CUDA impl calls."""

    variant: Variant
    module: Any = None


_LIBRARY = None  # torch.library.Library(NAMESPACE, "FRAGMENT"), made on first use and kept alive here
_OPS: dict[str, _Op] = {}  # op name (without the namespace) -> its entry


def op_name(variant_name: str) -> str:
    """The op's name in the flashcore namespace: the variant's name where it is an identifier, else made one
    ("64x64" -> "v_64x64", "my-v8" -> "my_v8"), with a short hash where two variant names would collide."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", variant_name)
    if not re.match(r"[A-Za-z]", name):
        name = "v_" + name
    taken = _OPS.get(name)
    if name != variant_name and taken is not None and taken.variant.name != variant_name:
        name += "_" + hashlib.sha1(variant_name.encode()).hexdigest()[:6]
    return name


def register_op(variant: Variant):
    """Define flashcore::<name> for `variant` (schema, fake impl, CUDA impl) and return the op
    (torch.ops.flashcore.<name>). Builds nothing. Idempotent: a second call for the same variant name returns
    the same op, re-pointed at this Variant (e.g. another registry's) and keeping a module already built for it."""
    import torch

    global _LIBRARY
    name = op_name(variant.name)
    entry = _OPS.get(name)
    if entry is not None:
        if entry.variant != variant:
            entry.variant, entry.module = variant, None
        return getattr(getattr(torch.ops, NAMESPACE), name)
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    entry = _OPS[name] = _Op(variant)

    def fake(q, k, v, causal=False, scale=None):
        check_inputs(entry.variant, q, k, v, causal)
        return torch.empty_like(q)

    def cuda(q, k, v, causal=False, scale=None):
        check_inputs(entry.variant, q, k, v, causal)
        if entry.module is None:  # first call without load_variant: build (or load) for this GPU now
            major, minor = torch.cuda.get_device_capability(q.device)
            entry.module = _build(entry.variant, f"sm_{major}{minor}", force=False).module
        return entry.module.forward(q, k, v, causal, scale, None)

    _LIBRARY.define(name + SCHEMA)
    _LIBRARY.impl(name, cuda, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name)


def check_inputs(variant: Variant, q, k, v, causal: bool, out=None) -> None:
    """What can be checked from shapes, dtypes and devices alone (also on fake tensors, under torch.compile):
    FlashcoreInputError (a ValueError) naming the variant and the problem. Meta tensors pass the device check,
    so the fake impl can be tested without a GPU."""
    import torch

    name = variant.name
    takes = _torch_dtypes(variant.dtypes)
    tensors = {"q": q, "k": k, "v": v} | ({"out": out} if out is not None else {})
    for label, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise FlashcoreInputError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
        if not (t.is_cuda or t.is_meta):
            raise FlashcoreInputError(f"{name}: {label} is on {t.device}; flashcore kernels need CUDA tensors")
        if t.dtype not in takes:
            raise FlashcoreInputError(
                f"{name}: {label} is {t.dtype}; {name} takes {' or '.join(map(str, takes))} (its dtypes: {', '.join(variant.dtypes)})"
            )
        if t.dim() != 4:
            raise FlashcoreInputError(f"{name}: {label} has shape {tuple(t.shape)}; expected 4-D [B, H, S, D]")
    for label, t in tensors.items():
        if t.shape != q.shape:
            raise FlashcoreInputError(
                f"{name}: {label} has shape {tuple(t.shape)} but q has {tuple(q.shape)} (self-attention: all equal)"
            )
        if t.dtype != q.dtype:
            raise FlashcoreInputError(f"{name}: {label} is {t.dtype} but q is {q.dtype}")
        if t.device != q.device:
            raise FlashcoreInputError(f"{name}: {label} is on {t.device} but q is on {q.device}")
        if not t.is_contiguous():
            raise FlashcoreInputError(f"{name}: {label} is not contiguous; call .contiguous() first")
    reason = variant.unsupported_reason(q.shape[-1], bool(causal))
    if reason:
        raise FlashcoreInputError(reason)


@functools.lru_cache(maxsize=None)
def _torch_dtypes(names: tuple[str, ...]) -> tuple:
    import torch

    return tuple(getattr(torch, TORCH_DTYPES[d]) for d in names)


class Attention:
    """One built variant. Calls validate their inputs and raise FlashcoreInputError (a ValueError) naming
    the problem — never a crash or silent garbage. A call without `out` runs the variant's custom op (what
    torch.compile traces); `out=` writes into a given tensor, in eager mode only."""

    def __init__(self, variant: Variant, build):
        self.variant = variant
        self.build = build
        self._module = build.module
        self.op = register_op(variant)
        _OPS[op_name(variant.name)].module = build.module

    @property
    def name(self) -> str:
        return self.variant.name

    def __repr__(self) -> str:
        return f"<flashcore variant {self.name} [{self.build.arch}] key={self.build.key}>"

    def __call__(self, q, k, v, causal: bool = False, scale: float | None = None, out=None):
        import torch

        if not torch.compiler.is_compiling():  # traced, the fake impl checks what fake tensors can show
            self._validate(q, k, v, causal, out)
        scale = None if scale is None else float(scale)
        if out is not None:
            return self._module.forward(q, k, v, bool(causal), scale, out)
        return self.op(q, k, v, bool(causal), scale)

    def plan(self, head_dim: int) -> list[tuple[str, int, int]]:
        return list(self._module.plan(head_dim))

    def _validate(self, q, k, v, causal, out) -> None:
        check_inputs(self.variant, q, k, v, causal, out)
        for label, t in {"q": q, "k": k, "v": v, "out": out}.items():
            if t is not None and not t.is_cuda:
                raise FlashcoreInputError(f"{self.name}: {label} is on {t.device}; flashcore kernels need CUDA tensors")
            if t is not None and t.data_ptr() % 16:
                raise FlashcoreInputError(
                    f"{self.name}: {label} does not start on a 16-byte boundary (a view at an odd offset?); "
                    "the kernels use 16-byte loads: pass a .clone()"
                )


def _build(variant: Variant, arch: str, force: bool):
    from flashcore_cli.build.jit import build_variant
    from flashcore_cli.build.tuned import current_gpu_name, tuned_defines

    defines = tuned_defines(variant.name, current_gpu_name())
    return build_variant(variant, arch, force=force, extra_defines=defines or None)


def load_variant(name: str, *, registry=None, arch: str | None = None, force: bool = False) -> Attention:
    """Build (or load from the cache) a variant for `arch` (default: the GPU's), and register (or reuse) its
    op flashcore::<name>. Raises FlashcoreError for an unknown variant or a broken registry,
    FlashcoreEnvironmentError (a RuntimeError) where this machine cannot build it (a CPU build of torch, a GPU
    the variant does not run on), BuildError when the compiler fails."""
    from flashcore_cli.build.toolchain import cpu_torch_problem

    variant = load_registry(registry).get(name)
    problem = cpu_torch_problem()
    if problem:
        raise FlashcoreEnvironmentError(f"load_variant('{name}'): {problem}")
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            from flashcore_cli.registry.archs import DEFAULT_ARCH

            arch = DEFAULT_ARCH
        else:
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
    return Attention(variant, _build(variant, arch, force))
