"""Train a small causal transformer from one seed and one stream of data four times — attention by PyTorch's math
backend in fp32 (the reference), by SDPA in bf16, by a flashcore variant in bf16, and by the variant on detached
inputs (a control whose attention gets no gradient) — and check that the variant learns as SDPA does.

    python3 scripts/train_tiny.py [--variant v11] [--steps 300] [--device cuda]

The task needs attention: each sequence is a random first half and a copy of it, and the loss is taken on the
copy, which only attention can predict. The rules (the project's correctness rule, applied to a training run):
  1. the variant's mean loss over the run differs from the fp32 run's by at most max(0.1, 2 x that difference of
     SDPA's bf16 run) (the mean, not each step: the loss falls steeply once the model finds the copy, and a
     run that finds it a few steps earlier or later is not a worse one);
  2. the variant's final smoothed loss is below the control's by at least half of what the fp32 run gained over
     the control (a missing or wrong attention gradient learns like the control).
Exit 1 when a rule fails. `--device cpu --variant none` runs the fp32 reference and the control alone (a check of
the task itself, no GPU).
"""

from __future__ import annotations

import argparse
import math
import sys


def build_model(vocab: int, dim: int, heads: int, layers: int, attention):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            o = attention(q.contiguous(), k.contiguous(), v.contiguous())
            x = x + self.out(o.transpose(1, 2).reshape(b, s, dim).to(x.dtype))
            return x + self.mlp(self.norm2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.randn(1024, dim) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Model()


def copy_batches(vocab: int, batch: int, seq: int, steps: int, seed: int):
    """`steps` batches of sequences of seq + 1 tokens: a random first half, then its copy (the last token is the
    next-token target of the one before)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    half = (seq + 1) // 2
    first = torch.randint(0, vocab, (steps, batch, half), generator=gen)
    return torch.cat([first, first], dim=2)[:, :, : seq + 1]


def train(attention, args, data) -> list[float]:
    """Losses on the copied half, one per step."""
    import torch

    torch.manual_seed(args.seed)
    model = build_model(args.vocab, args.dim, args.heads, args.layers, attention).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    copied = slice(args.seq // 2, None)  # positions whose next token is a copy
    losses = []
    for step in range(args.steps):
        batch = data[step].to(args.device)
        logits = model(batch[:, :-1])[:, copied]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:][:, copied].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def smooth(xs: list[float], window: int = 10) -> list[float]:
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="v11", help="a variant with a backward, or none (the task check)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.steps < 10:
        print("--steps must be at least 10 (the curves are compared over a 10-step window)")
        return 2

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    data = copy_batches(args.vocab, args.batch, args.seq, args.steps, args.seed)

    def fp32(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)

    def control(q, k, v):  # attention with no gradient into q, k, v: what a silent zero gradient trains like
        return fp32(q.detach(), k.detach(), v.detach())

    runs = {"fp32 math": fp32, "control (no attention grad)": control}
    if args.variant != "none":
        from flashcore_cli import load_variant

        attn = load_variant(args.variant)
        runs["sdpa bf16"] = lambda q, k, v: F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                                           is_causal=True)  # fmt: skip
        runs[f"{args.variant} bf16"] = lambda q, k, v: attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    curves = {name: train(fn, args, data) for name, fn in runs.items()}
    final = {name: smooth(c)[-1] for name, c in curves.items()}
    mean = {name: sum(c) / len(c) for name, c in curves.items()}
    gaps = {name: abs(mean[name] - mean["fp32 math"]) for name in curves}

    every = max(1, args.steps // 10)
    print(f"a {args.layers}-layer causal transformer (dim {args.dim}, {args.heads} heads of {args.dim // args.heads}, "
          f"seq {args.seq}, batch {args.batch}) on the copy task, {args.steps} steps of AdamW, seed {args.seed}; loss "
          f"on the copied half (uniform: {math.log(args.vocab):.3f}):")  # fmt: skip
    names = list(curves)
    print("step  " + "  ".join(f"{n:>28}" for n in names))
    for i in list(range(0, args.steps, every)) + [args.steps - 1]:
        print(f"{i:4d}  " + "  ".join(f"{curves[n][i]:28.4f}" for n in names))
    learned = final["control (no attention grad)"] - final["fp32 math"]
    print("final smoothed loss: " + ", ".join(f"{n} {final[n]:.4f}" for n in names))
    print("mean loss over the run: " + ", ".join(f"{n} {mean[n]:.4f}" for n in names))
    ok = learned > 0.1
    print(f"the task needs attention: fp32 ends {learned:.3f} below the control (> 0.1): {'OK' if ok else 'FAILED'}")
    if args.variant != "none":
        name = f"{args.variant} bf16"
        tolerance = max(0.1, 2 * gaps["sdpa bf16"])
        close = gaps[name] <= tolerance and all(math.isfinite(x) for x in curves[name])
        learns = final["control (no attention grad)"] - final[name] >= learned / 2
        print(f"rule 1: {name}'s mean loss {gaps[name]:.4f} from fp32's <= max(0.1, 2 x SDPA's {gaps['sdpa bf16']:.4f}) "
              f"= {tolerance:.4f}: {'OK' if close else 'FAILED'}")  # fmt: skip
        print(f"rule 2: {name} ends {final['control (no attention grad)'] - final[name]:.3f} below the control "
              f"(>= {learned / 2:.3f}): {'OK' if learns else 'FAILED'}")  # fmt: skip
        ok = ok and close and learns
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
