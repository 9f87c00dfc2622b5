"""v11's gradient error beside SDPA's backends, over seeds, at the cases where the backward's D matters.

    python3 scripts/grad_precision.py [--seeds 5]          (on a GPU; prints one block per case)

Each case (a B,Hq:Hkv,Sq:Sk,D shape, causal or not, an input kind of `flashcore test`, a dtype) is drawn with
several seeds. Every row is judged as `flashcore test` judges (check/case.py): max |grad - fp32 reference| over
max(atol, 2 x SDPA default's error); the row prints the worst ratio over the seeds, how many seeds exceed 1, and
the median max error of dq / dk / dv. Rows:
    v11         the training forward (out, lse, out_residual) and the backward from it: what autograd runs
    v11_O16     the backward from out and lse alone: D = rowsum(dO o O) from the rounded O (FlashAttention-2's)
    v11_Dexact  the backward with D from the fp64 reference's O (through grad_lse): the best D can do
    flash, eff, cudnn, math   SDPA's backends, each forced (rows missing where a backend refuses the case)
`default=[...]` names the backend whose gradients are bitwise SDPA default's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import warnings


def gradients(attn, case, backends) -> tuple[dict, list]:
    """Every row's (dq, dk, dv) for one seeded case, the fp32 reference's, and SDPA default's backend."""
    import torch
    from torch.nn.attention import sdpa_kernel

    from flashcore_cli.check.case import first_seen_row, grad_output, make_inputs, reference, reference_grads, sdpa

    q, k, v = make_inputs(case)
    d_o = grad_output(case)
    causal, scale, first = case.causal, 1 / math.sqrt(case.shape.head_dim), first_seen_row(case)
    _, *ref, _ = reference_grads(q, k, v, causal, scale, d_o)
    o64 = reference(q, k, v, causal, scale, dtype=torch.float64)

    def sdpa_grads(context):
        ls = [t.clone().requires_grad_() for t in (q[:, :, first:].contiguous(), k, v)]
        with context:
            out = sdpa(*ls, causal, scale)
        out.backward(d_o[:, :, first:])
        return [t.grad for t in ls]

    rows = {"default": sdpa_grads(contextlib.nullcontext())}
    for name, backend in backends.items():
        with contextlib.suppress(RuntimeError):
            rows[name] = sdpa_grads(sdpa_kernel([backend]))
    out, lse, residual = attn.forward_train(q, k, v, causal=causal, scale=scale)
    rows["v11"] = list(attn.backward(d_o, q, k, v, out, lse, causal=causal, scale=scale, out_residual=residual))
    rows["v11_O16"] = list(attn.backward(d_o, q, k, v, out, lse, causal=causal, scale=scale))
    # D = rowsum(dO o O) - dLSE: a dLSE of rowsum(dO o (O - O64)) makes it rowsum(dO o O64)
    shift = ((d_o.float() * out.float()).sum(-1) - (d_o.double() * o64).sum(-1).float()).contiguous()
    rows["v11_Dexact"] = list(attn.backward(d_o, q, k, v, out, lse, causal=causal, scale=scale, grad_lse=shift))
    default = [n for n in backends if n in rows and all(torch.equal(a, b) for a, b in zip(rows[n], rows["default"]))]
    # SDPA's rows exclude the query rows that see no key (first_seen_row); v11's have them all
    errors = {name: [(g[0].float() - ref[0][:, :, (0 if name.startswith("v11") else first):]).abs().max().item(),
                     *((a.float() - r).abs().max().item() for a, r in zip(g[1:], ref[1:]))]
              for name, g in rows.items()}  # fmt: skip
    return errors, default


CASES = [  # (shape, causal, inputs, dtype): the extreme-magnitude gradient cases of `flashcore test`, and ordinary ones
    ("1,32:8,4:1000,64", True, "large", "fp16"), ("1,32:8,4:1000,128", True, "large", "fp16"),
    ("1,32:8,4:1000,64", False, "large", "fp16"), ("1,8:2,200:333,64", True, "large", "fp16"),
    ("1,4,256,64", True, "large", "fp16"), ("1,4,256,128", False, "large", "fp16"),
    ("3,2,97,64", True, "randn", "bf16"), ("3,2,97,128", True, "randn", "bf16"), ("1,8,512,64", True, "randn", "fp16"),
    ("1,32:8,4:1000,64", True, "large", "bf16"), ("2,4:4,513:1000,64", True, "randn", "fp16"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # SDPA's "kernel not used because" warnings when a backend is forced
    from torch.nn.attention import SDPBackend

    from flashcore_cli.api import load_variant
    from flashcore_cli.check.case import ATOL_BY_DTYPE
    from flashcore_cli.registry.shapes import Case, parse_shape

    attn = load_variant("v11")
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "eff": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip
    for shape, causal, inputs, dtype in CASES:
        runs = [gradients(attn, Case(parse_shape(shape), causal, 1000 + 97 * s, inputs, dtype), backends)
                for s in range(args.seeds)]  # fmt: skip
        print(f"== {shape} causal={causal} {inputs} {dtype}: default={runs[0][1]}")
        atol = ATOL_BY_DTYPE[dtype]
        for name in ["v11", "v11_O16", "v11_Dexact", *backends]:
            if not all(name in errors for errors, _ in runs):
                continue
            ratios = [max(e[name][t] / max(atol, 2 * e["default"][t]) for t in range(3)) for e, _ in runs]
            median = [sorted(e[name][t] for e, _ in runs)[len(runs) // 2] for t in range(3)]
            print(f"  {name:11s} err/tol max {max(ratios):6.2f}  over 1 in {sum(r > 1 for r in ratios)}/{len(runs)}"
                  f"  median err dq/dk/dv {median[0]:.3g}/{median[1]:.3g}/{median[2]:.3g}")


if __name__ == "__main__":
    main()
