"""The Python API: a registered variant as a callable usable from any PyTorch program, training included.

    attn = load_variant("v11")
    out = attn(q, k, v, causal=False, scale=None)        # q [B, H, S, D]; k, v [B, H_kv, S_kv, D]; CUDA fp16/bf16
    out, lse = attn(q, k, v, return_lse=True)            # lse: fp32 [B, H, S], natural log (variants with `lse`)
    out.sum().backward()                                 # dq, dk, dv through the variant's backward
    out, lse, _ = torch.ops.flashcore.v11(q, k, v, causal=True)  # the same kernel as a PyTorch custom op
    out = attn(q, k, v, causal=True, window_size=(1024, 0), softcap=50.0, sinks=sinks)  # the family (below)

Each variant is a custom op, flashcore::<name>, with the schema
    (Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, bool training=True,
     int[] window_size=[-1, -1], float softcap=0.0, Tensor? sinks=None) -> (Tensor out, Tensor lse, Tensor out_residual)
(lse is an empty tensor for a variant without the `lse` feature; out_residual, for a variant with a backward
when `training`, is O's rounding residual, the fp32 O minus `out`, which the backward adds back so that its
D = rowsum(dO o O) comes from the fp32 O: at near-one-hot rows that keeps dQ and dK 2-10x closer to the exact
gradient than D from the rounded O; empty otherwise), a fake (meta) implementation that gives the outputs'
shapes, dtypes and devices, a CUDA implementation that calls the variant's built extension, and an autograd
formula (register_autograd). A variant with a backward also has flashcore::<name>_backward
    (Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float? scale,
     Tensor? grad_lse, Tensor? out_residual, int[] window_size, float softcap, Tensor? sinks)
        -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)
which the formula calls (dsinks is empty without sinks); a forward-only variant's formula raises FlashcoreUnsupportedError naming it, so a
gradient never silently stops at a flashcore kernel. So torch.compile traces a model — and its training step —
that calls it with no graph break, and CUDA graphs capture it. The ops are registered without building anything
(register_op); the CUDA implementations build (or load from the cache) on their first call, unless load_variant
built the variant already.

Causal masks are aligned bottom-right (query i sees keys j <= i + S_kv - S), as in FlashAttention 2.1+. The
attention family, where the variant declares it (`flashcore list`; kernels/flashcore.h states the semantics):
window_size=(left, right) a sliding window (-1 unbounded; causal sets right to 0), softcap=c the scores' c * tanh(s /
c), sinks an fp32 [H] tensor of one logit per query head in every row's denominator, with its gradient.

An eager call that records no gradient skips the op's Python dispatch and calls the extension directly (the
host cost of a call is then the binding's, whose C++ checks raise ValueError, re-raised here as
FlashcoreInputError naming the variant).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from flashcore_cli.core.dtypes import TORCH_NAMES
from flashcore_cli.core.errors import FlashcoreEnvironmentError, FlashcoreInputError, FlashcoreUnsupportedError
from flashcore_cli.registry.variants import Variant, load_registry

NAMESPACE = "flashcore"
SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, bool training=True, "
          "int[] window_size=[-1, -1], float softcap=0.0, Tensor? sinks=None) -> (Tensor, Tensor, Tensor)")
BACKWARD_SCHEMA = ("(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float? scale, "
                   "Tensor? grad_lse, Tensor? out_residual, int[] window_size, float softcap, Tensor? sinks) "
                   "-> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip


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
    """Define flashcore::<name> for `variant` (schema, fake impl, CUDA impl, autograd formula; and
    flashcore::<name>_backward where it has a backward) and return the op (torch.ops.flashcore.<name>). Builds
    nothing. Idempotent: a second call for the same variant name returns the same op, re-pointed at this
    Variant (e.g. another registry's) and keeping a module already built for it."""
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

    def module_for(t):
        if entry.module is None:  # first call without load_variant: build (or load) for this GPU now
            major, minor = torch.cuda.get_device_capability(t.device)
            entry.module = _build(entry.variant, f"sm_{major}{minor}", force=False).module
        return entry.module

    def fake(q, k, v, causal=False, scale=None, training=True, window_size=(-1, -1), softcap=0.0, sinks=None):
        check_inputs(entry.variant, q, k, v, causal, window_size=window_size, softcap=softcap, sinks=sinks)
        return torch.empty_like(q), _lse_like(entry.variant, q), _residual_like(entry.variant, q, training)

    def cuda(q, k, v, causal=False, scale=None, training=True, window_size=(-1, -1), softcap=0.0, sinks=None):
        check_inputs(entry.variant, q, k, v, causal, window_size=window_size, softcap=softcap, sinks=sinks)
        module = module_for(q)
        family = {"window_size": tuple(window_size), "softcap": softcap, "sinks": sinks}
        if training and entry.variant.supports("backward"):
            return module.forward_train(q, k, v, causal, scale, **family)
        if entry.variant.supports("lse"):
            return *module.forward_lse(q, k, v, causal, scale, **family), _residual_like(entry.variant, q, False)
        return (module.forward(q, k, v, causal, scale, None, **family), _lse_like(entry.variant, q),
                _residual_like(entry.variant, q, False))  # fmt: skip

    _LIBRARY.define(name + SCHEMA)
    _LIBRARY.impl(name, cuda, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)

    if variant.supports("backward"):
        _define_backward_op(name, module_for)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale, _training, window_size, softcap, sinks = _full_inputs(inputs)
        out, lse, residual = output
        ctx.set_materialize_grads(False)  # an unused lse gets no gradient (None), not a tensor of zeros
        ctx.mark_non_differentiable(residual)  # the backward's aid, not a function of q, k, v to differentiate
        ctx.save_for_backward(q, k, v, out, lse, residual, sinks)
        ctx.causal, ctx.scale, ctx.window_size, ctx.softcap = causal, scale, tuple(window_size), softcap

    def backward(ctx, grad_out, grad_lse, _grad_residual):
        if not entry.variant.supports("backward"):
            raise FlashcoreUnsupportedError(
                f"{entry.variant.name} is forward-only: it has no backward, so no gradient can flow through it "
                "(`flashcore list` shows the variants with one; or call it on detached tensors)"
            )
        q, k, v, out, lse, residual, sinks = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        op = getattr(getattr(torch.ops, NAMESPACE), name + "_backward")
        dq, dk, dv, dsinks = op(grad_out.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale,
                                None if grad_lse is None else grad_lse.contiguous(),
                                residual if residual.numel() else None, list(ctx.window_size), ctx.softcap, sinks)  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, dsinks if sinks is not None else None

    torch.library.register_autograd(f"{NAMESPACE}::{name}", backward, setup_context=setup_context, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name)


def _define_backward_op(name: str, module_for) -> None:
    """flashcore::<name>_backward: its schema, CUDA impl (the built module's backward, dsinks into a tensor of its
    own) and fake impl."""
    import torch

    def backward_fake(grad_out, q, k, v, out, lse, causal, scale, grad_lse, out_residual, window_size, softcap, sinks):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), _dsinks_like(q, sinks)

    def backward_cuda(grad_out, q, k, v, out, lse, causal, scale, grad_lse, out_residual, window_size, softcap, sinks):
        dsinks = _dsinks_like(q, sinks)
        dq, dk, dv = module_for(q).backward(grad_out, q, k, v, out, lse, causal, scale, grad_lse, out_residual,
                                            window_size=tuple(window_size), softcap=softcap, sinks=sinks,
                                            dsinks=dsinks if sinks is not None else None)  # fmt: skip
        return dq, dk, dv, dsinks

    _LIBRARY.define(name + "_backward" + BACKWARD_SCHEMA)
    _LIBRARY.impl(name + "_backward", backward_cuda, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}_backward", backward_fake, lib=_LIBRARY)


def _full_inputs(inputs) -> tuple:
    """The op's inputs with the defaults of the ones the caller left out (setup_context gets only those given)."""
    defaults = (False, None, True, (-1, -1), 0.0, None)
    return (*inputs, *defaults[len(inputs) - 3:])


def _dsinks_like(q, sinks):
    """The backward op's fourth output: fp32 like sinks where there are sinks, else empty."""
    import torch

    return torch.zeros_like(sinks) if sinks is not None else q.new_empty((0,), dtype=torch.float32)


def _lse_like(variant: Variant, q):
    """The op's second output: fp32 [B, H, S] where the variant computes the log-sum-exp, else empty."""
    import torch

    shape = tuple(q.shape[:3]) if variant.supports("lse") else (0,)
    return q.new_empty(shape, dtype=torch.float32)


def _residual_like(variant: Variant, q, training: bool):
    """The op's third output: like q where a training forward of a variant with a backward writes O's rounding
    residual, else empty."""
    return q.new_empty(q.shape if training and variant.supports("backward") else (0,))


def check_inputs(variant: Variant, q, k, v, causal: bool, out=None, *, window_size=(-1, -1), softcap: float = 0.0,
                 sinks=None) -> None:  # fmt: skip
    """What can be checked from shapes, dtypes and devices alone (also on fake tensors, under torch.compile):
    FlashcoreInputError (a ValueError) naming the variant and the problem. Meta tensors pass the device check,
    so the fake impl can be tested without a GPU. q (and out) [B, H, S, D]; k, v [B, H_kv, S_kv, D] with H_kv
    a divisor of H, other than H only where the variant has `gqa`, S_kv other than S only with `seqlen_kv`."""
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
        like = k if label == "v" else q if label in ("out", "q") else None
        if like is not None and t.shape != like.shape:
            raise FlashcoreInputError(f"{name}: {label} has shape {tuple(t.shape)} but {'k' if label == 'v' else 'q'} has {tuple(like.shape)}")
        if t.dtype != q.dtype:
            raise FlashcoreInputError(f"{name}: {label} is {t.dtype} but q is {q.dtype}")
        if t.device != q.device:
            raise FlashcoreInputError(f"{name}: {label} is on {t.device} but q is on {q.device}")
        if not t.is_contiguous():
            raise FlashcoreInputError(f"{name}: {label} is not contiguous; call .contiguous() first")
    (batch, heads, seq, dim), (kb, heads_kv, seq_kv, kd) = q.shape, k.shape
    if (kb, kd) != (batch, dim):
        raise FlashcoreInputError(f"{name}: k has shape {tuple(k.shape)} but q has {tuple(q.shape)} (batch and head dim must match)")
    if heads_kv < 1 or heads % heads_kv:
        raise FlashcoreInputError(f"{name}: q has {heads} heads and k {heads_kv}: the query heads must be a multiple of the key/value heads")
    if seq_kv < 1 and seq > 0:
        raise FlashcoreInputError(f"{name}: k and v have no rows: attention needs at least one key")
    family = _check_family(name, q, window_size, softcap, sinks).normalized(bool(causal), seq, seq_kv)
    reason = variant.unsupported_reason(dim, bool(causal), gqa=heads_kv != heads, seqlen_kv=seq_kv != seq, seq_len=seq,
                                        **family.needs(bool(causal)))  # fmt: skip
    if reason:
        raise FlashcoreInputError(f"{name}: {reason}" if not reason.startswith(name) else reason)


def _check_family(name: str, q, window_size, softcap, sinks):
    """The family of a call as a Family, or FlashcoreInputError naming the bad value (flashcore.h's rules)."""
    import math

    import torch

    from flashcore_cli.registry.family import Family

    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise FlashcoreInputError(f"{name}: window_size must be a pair (left, right) of ints, got {window_size!r}") from None
    if min(left, right) < -1:
        raise FlashcoreInputError(f"{name}: window_size must be -1 (unbounded) or >= 0 on each side, got ({left}, {right})")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise FlashcoreInputError(f"{name}: softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise FlashcoreInputError(f"{name}: sinks must be a torch.Tensor, got {type(sinks).__name__}")
        if sinks.dtype != torch.float32:
            raise FlashcoreInputError(f"{name}: sinks is {sinks.dtype}; it must be float32, one logit per query head")
        if sinks.dim() != 1 or sinks.shape[0] != q.shape[1]:
            raise FlashcoreInputError(f"{name}: sinks has shape {tuple(sinks.shape)}; expected [{q.shape[1]}], one logit per query head")
        if sinks.device != q.device:
            raise FlashcoreInputError(f"{name}: sinks is on {sinks.device} but q is on {q.device}")
        if not sinks.is_contiguous():
            raise FlashcoreInputError(f"{name}: sinks is not contiguous; call .contiguous() first")
    return Family(left, right, float(softcap), sinks is not None)


@functools.lru_cache(maxsize=None)
def _torch_dtypes(names: tuple[str, ...]) -> tuple:
    import torch

    return tuple(getattr(torch, TORCH_NAMES[d]) for d in names)


class Attention:
    """One built variant. Calls validate their inputs and raise FlashcoreInputError (a ValueError) naming
    the problem — never a crash or silent garbage. A call that records a gradient (or runs under
    torch.compile) goes through the variant's custom op and its autograd formula; an eager call that records
    none calls the extension directly. `out=` writes into a given tensor (eager, no gradient)."""

    def __init__(self, variant: Variant, build):
        self.variant = variant
        self.build = build
        self._module = build.module
        self.op = register_op(variant)
        _OPS[op_name(variant.name)].module = build.module
        self._head_dims = frozenset(variant.head_dims)
        self._lse = variant.supports("lse")

    @property
    def name(self) -> str:
        return self.variant.name

    def __repr__(self) -> str:
        return f"<flashcore variant {self.name} [{self.build.arch}] key={self.build.key}>"

    def __call__(self, q, k, v, causal: bool = False, scale: float | None = None, out=None, return_lse: bool = False,
                 window_size=(-1, -1), softcap: float = 0.0, sinks=None):  # fmt: skip
        import torch

        if return_lse and not self._lse:
            raise FlashcoreUnsupportedError(f"{self.name} does not compute the row log-sum-exp (it has no 'lse' feature)")
        scale = None if scale is None else float(scale)
        causal = bool(causal)
        family = {"window_size": window_size, "softcap": softcap, "sinks": sinks}
        dense = _dense(family)
        # a call that records a gradient runs the training forward (out_residual for the backward)
        grad = torch.is_grad_enabled() and any(_requires_grad(t) for t in (q, k, v, sinks))
        if torch.compiler.is_compiling():  # traced: the fake impl checks what fake tensors can show
            result = self.op(q, k, v, causal, scale, grad, list(window_size), float(softcap), sinks)
            return result[:2] if return_lse else result[0]
        if out is not None and (grad or return_lse):
            raise FlashcoreInputError(f"{self.name}: out= records no gradient and returns no lse; call without out")
        if grad or self._module is None or not _plain_cuda(q):
            check_inputs(self.variant, q, k, v, causal, out, **family)
            self._check_alignment(q, k, v, out)
            result = self.op(q, k, v, causal, scale, grad, list(window_size), float(softcap), sinks)
            return result[:2] if return_lse else result[0]
        # the head dim is the one registry fact the binding does not check itself (and a q not 4-D has no shape[3]);
        # the family's values get their Python check, so a bad one is named as the API names it
        if not dense or q.dim() != 4 or q.shape[3] not in self._head_dims:
            check_inputs(self.variant, q, k, v, causal, out, **family)
        try:
            if return_lse:
                return self._module.forward_lse(q, k, v, causal, scale, **_native(family))
            return self._module.forward(q, k, v, causal, scale, out, **_native(family))
        except (ValueError, TypeError) as exc:  # the binding's checks: one line, naming the variant
            raise FlashcoreInputError(f"{self.name}: {str(exc).splitlines()[0]}") from None

    def forward_train(self, q, k, v, causal: bool = False, scale: float | None = None, window_size=(-1, -1),
                      softcap: float = 0.0, sinks=None):  # fmt: skip
        """(out, lse, out_residual): the forward a training step runs (what the autograd formula saves), straight
        from the extension; out_residual (O's rounding residual) goes to backward() with out and lse."""
        if not self.variant.supports("backward"):
            raise FlashcoreUnsupportedError(f"{self.name} is forward-only: it has no training forward")
        family = {"window_size": window_size, "softcap": softcap, "sinks": sinks}
        if not _dense(family):  # the family's values named as the API names them (a dense call: the binding's checks)
            check_inputs(self.variant, q, k, v, causal, **family)
        try:
            return self._module.forward_train(q, k, v, bool(causal), None if scale is None else float(scale), **_native(family))
        except (ValueError, TypeError) as exc:
            raise FlashcoreInputError(f"{self.name}: {str(exc).splitlines()[0]}") from None

    def backward(self, grad_out, q, k, v, out, lse, causal: bool = False, scale: float | None = None, grad_lse=None,
                 out_residual=None, into=None, window_size=(-1, -1), softcap: float = 0.0, sinks=None, dsinks=None):  # fmt: skip
        """(dq, dk, dv) of one forward call straight from the extension (what the autograd formula runs), into
        the given (dq, dk, dv) tensors when `into` names them (a check poisons them first). out_residual: the
        training forward's (forward_train); without it D = rowsum(dO o O) is taken from the rounded O. With sinks,
        dL/dsinks is written into `dsinks` (fp32 like sinks) where it is given."""
        if not self.variant.supports("backward"):
            raise FlashcoreUnsupportedError(f"{self.name} is forward-only: it has no backward")
        dq, dk, dv = into if into is not None else (None, None, None)
        family = {"window_size": window_size, "softcap": softcap, "sinks": sinks}
        if not _dense(family):
            check_inputs(self.variant, q, k, v, causal, **family)
        try:
            return self._module.backward(grad_out, q, k, v, out, lse, bool(causal), None if scale is None else float(scale),
                                         grad_lse, out_residual, dq, dk, dv, **_native(family), dsinks=dsinks)  # fmt: skip
        except (ValueError, TypeError) as exc:
            raise FlashcoreInputError(f"{self.name}: {str(exc).splitlines()[0]}") from None

    def plan(self, head_dim: int) -> list[tuple[str, int, int]]:
        return list(self._module.plan(head_dim))

    def forward_note(self) -> str | None:
        """What this thread's last forward ran in place of the kernel the variant's plan prefers, and why (v11's
        cp.async kernel when the driver could not make its TMA kernel's tensor maps); None: nothing substituted."""
        return self._module.forward_note()

    def _check_alignment(self, q, k, v, out) -> None:
        for label, t in {"q": q, "k": k, "v": v, "out": out}.items():
            if t is not None and t.is_cuda and t.data_ptr() % 16:
                raise FlashcoreInputError(
                    f"{self.name}: {label} does not start on a 16-byte boundary (a view at an odd offset?); "
                    "the kernels use 16-byte loads: pass a .clone()"
                )


def _dense(family: dict) -> bool:
    """Whether a call's family keywords are all at their defaults."""
    return tuple(family["window_size"]) == (-1, -1) and not family["softcap"] and family["sinks"] is None


def _native(family: dict) -> dict:
    """The family's keywords as the binding takes them (a window as a tuple of two ints, the softcap a float); none
    for a dense call, so that a module built before the family's arguments existed still takes it."""
    if _dense(family):
        return {}
    return {"window_size": tuple(int(w) for w in family["window_size"]), "softcap": float(family["softcap"]),
            "sinks": family["sinks"]}  # fmt: skip


def _requires_grad(t) -> bool:
    return getattr(t, "requires_grad", False)


def _plain_cuda(t) -> bool:
    import torch

    return type(t) is torch.Tensor and t.is_cuda


def _build(variant: Variant, arch: str, force: bool):
    from flashcore_cli.builder.jit import build_variant
    from flashcore_cli.builder.tuned import current_gpu_name, tuned_defines

    defines = tuned_defines(variant.name, current_gpu_name())
    return build_variant(variant, arch, force=force, extra_defines=defines or None)


def load_variant(name: str, *, registry=None, arch: str | None = None, force: bool = False) -> Attention:
    """Build (or load from the cache) a variant for `arch` (default: the GPU's), and register (or reuse) its
    op flashcore::<name>. Raises FlashcoreError for an unknown variant or a broken registry,
    FlashcoreEnvironmentError (a RuntimeError) where this machine cannot build it (a CPU build of torch, a GPU
    the variant does not run on), BuildError when the compiler fails."""
    from flashcore_cli.builder.toolchain import cpu_torch_problem

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
