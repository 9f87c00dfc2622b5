"""What v11's rare gradient mismatches are made of: v11 beside FlashAttention-2's algorithm in fp64 with only P and
dS rounded to the element type (emu16) and beside SDPA's backends, judged by `flashcore test`'s rule.

    python3 scripts/grad_tail.py [SEEDS]      (on a GPU; SEEDS defaults to 20)

First every extreme-magnitude D=128 case of `flashcore test v11` (drawn from base seed 0; a test run draws a new
one): each row's max error of dq/dk/dv against the fp32 reference and its err/tol, with |v11 - emu16|. Then three
shapes where a run went over the rule (one test case, two stress launches), over SEEDS new seeds: the median and
worst err/tol of every row and how many seeds exceed 1. `default` is SDPA default's backward, whose error sets the tolerance (so its err/tol is 0.5)."""
import contextlib
import math
import sys
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashcore_cli.api import load_variant
from flashcore_cli.check.case import ATOL_BY_DTYPE, grad_output, make_inputs, reference_grads, sdpa, first_seen_row
from flashcore_cli.check.correctness import plan_cases
from flashcore_cli.registry.variants import load_registry
from flashcore_cli.registry.shapes import Case, parse_shape

warnings.filterwarnings("ignore")


def emulate(q, k, v, d_o, causal, scale, dtype):
    """fp64 FA2: P and dS rounded to `dtype` before the matmuls that take them (dV = P^T dO, dK = dS^T Q, dQ = dS K)."""
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    qq, do = q.double(), d_o.double()
    s = qq @ kk.transpose(-1, -2) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = p @ vv
    dp = do @ vv.transpose(-1, -2)
    d = (do * o).sum(-1, keepdim=True)
    ds = p * (dp - d)
    ds16, p16 = ds.to(dtype).double(), p.to(dtype).double()
    dq = scale * ds16 @ kk
    dk = (scale * ds16.transpose(-1, -2) @ qq).unflatten(1, (k.shape[1], group)).sum(2)
    dv = (p16.transpose(-1, -2) @ do).unflatten(1, (k.shape[1], group)).sum(2)
    return dq, dk, dv


def one(attn, case):
    q, k, v = make_inputs(case)
    d_o = grad_output(case)
    causal, scale, first = case.causal, 1 / math.sqrt(case.shape.head_dim), first_seen_row(case)
    _, *ref, _ = reference_grads(q, k, v, causal, scale, d_o)
    out, lse, res = attn.forward_train(q, k, v, causal=causal, scale=scale)
    got = attn.backward(d_o, q, k, v, out, lse, causal=causal, scale=scale, out_residual=res)
    emu = emulate(q, k, v, d_o, causal, scale, q.dtype)
    rows = {"v11": got, "emu16": emu}
    for name, be in [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("eff", SDPBackend.EFFICIENT_ATTENTION)]:
        ls = [t.clone().requires_grad_() for t in (q[:, :, first:].contiguous(), k, v)]
        try:
            with (sdpa_kernel([be]) if be else contextlib.nullcontext()):
                o = sdpa(*ls, causal, scale)
            o.backward(d_o[:, :, first:])
            rows[name] = [t.grad for t in ls]
        except RuntimeError:
            pass

    def err(name, t):
        g = rows[name][t].float()
        r = ref[t]
        if t == 0 and name not in ("v11", "emu16"):
            r = r[:, :, first:]
        return (g - r).abs().max().item()

    atol = ATOL_BY_DTYPE[case.dtype]
    errs = {n: [err(n, t) for t in range(3)] for n in rows}
    v_vs_emu = [(rows["v11"][t].double() - rows["emu16"][t]).abs().max().item() for t in range(3)]
    tol = [max(atol, 2 * errs["default"][t]) for t in range(3)]
    return errs, tol, v_vs_emu


# (shape, causal, inputs) where a run went over the rule: a `flashcore test` case on the H100 (dk 1.135 > 0.922, in a
# run of another base seed) and two stress launches (dk 1.32x, dq 1.12x)
TAIL_SHAPES = [("1,32:8,4:1000,128", True, "large"), ("3,4,19,128", False, "randn"), ("2,12:4,167,128", True, "randn")]


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    attn = load_variant("v11")
    cases = [c for c in plan_cases(load_registry().get("v11"), None, 0) if c.inputs == "large" and c.shape.head_dim == 128]
    print(torch.cuda.get_device_name())
    for c in cases:
        errs, tol, ve = one(attn, c)
        print(f"test case {c.shape} causal={c.causal} {c.dtype} seed {c.seed}: tol dq/dk/dv "
              f"{tol[0]:.3g}/{tol[1]:.3g}/{tol[2]:.3g}  |v11-emu16| {ve[0]:.3g}/{ve[1]:.3g}/{ve[2]:.3g}")
        for n, e in errs.items():
            print(f"   {n:8s} dq/dk/dv {e[0]:.4g}/{e[1]:.4g}/{e[2]:.4g}   err/tol {max(e[t] / tol[t] for t in range(3)):.2f}")
    for shape, causal, inputs in TAIL_SHAPES:
        ratios, ves = {}, []
        for s in range(seeds):
            errs, tol, ve = one(attn, Case(parse_shape(shape), causal, 5000 + 31 * s, inputs, "fp16"))
            ves.append(max(ve[t] / max(errs["v11"][t], 1e-30) for t in range(3)))
            for n, e in errs.items():
                ratios.setdefault(n, []).append(max(e[t] / tol[t] for t in range(3)))
        print(f"== {shape} causal={causal} {inputs}: {seeds} seeds; max |v11-emu16| / |v11-ref| = {max(ves):.3g}")
        for n, r in ratios.items():
            r = sorted(r)
            print(f"   {n:8s} err/tol median {r[len(r) // 2]:.2f} max {r[-1]:.2f} over 1: {sum(x > 1 for x in r)}/{len(r)}")


if __name__ == "__main__":
    main()
