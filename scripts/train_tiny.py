"""Train a small causal transformer three times from the same seed and data — attention by PyTorch's math backend
in fp32 (the reference), by SDPA in bf16, and by a flashcore variant in bf16 — and check that the variant's loss
curve stays as close to the fp32 one as SDPA's does.

    python3 scripts/train_tiny.py [--variant v11] [--steps 300]

The rule (the project's correctness rule, applied to a training run): over every step, the variant's loss, smoothed
over a window of 10 steps, differs from the fp32 run's by at most max(0.02, 2 x the largest such difference of
SDPA's bf16 run). The data is a fixed random Markov chain over 64 tokens, so the loss falls towards the chain's
entropy and a model whose attention gradients were wrong (or missing) falls behind. Exit 1 when the rule fails.
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


def markov_batches(vocab: int, batch: int, seq: int, steps: int, seed: int):
    """`steps` batches of token sequences from one random sparse transition matrix (each token has 4 likely
    successors), all drawn up front so every run sees the same data."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=gen) * 0.5
    favourites = torch.randint(0, vocab, (vocab, 4), generator=gen)
    logits.scatter_(1, favourites, 4.0)
    probs = torch.softmax(logits, dim=1)
    data = torch.empty(steps, batch, seq + 1, dtype=torch.long)
    data[:, :, 0] = torch.randint(0, vocab, (steps, batch), generator=gen)
    for t in range(seq):
        data[:, :, t + 1] = torch.multinomial(probs[data[:, :, t].reshape(-1)], 1, generator=gen).view(steps, batch)
    return data


def train(attention, args, data) -> list[float]:
    import torch

    torch.manual_seed(args.seed)
    model = build_model(args.vocab, args.dim, args.heads, args.layers, attention).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        batch = data[step].cuda()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def smooth(xs: list[float], window: int = 10) -> list[float]:
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="v11")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if args.steps < 10:
        print("--steps must be at least 10 (the curves are compared over a 10-step window)")
        return 2

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcore_cli import load_variant

    attn = load_variant(args.variant)
    data = markov_batches(args.vocab, args.batch, args.seq, args.steps, args.seed)

    def fp32(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)

    def sdpa_bf16(q, k, v):
        return F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)

    def variant_bf16(q, k, v):
        return attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)

    curves = {name: train(fn, args, data) for name, fn in (("fp32 math", fp32), ("sdpa bf16", sdpa_bf16),
                                                            (f"{args.variant} bf16", variant_bf16))}  # fmt: skip
    ref = smooth(curves["fp32 math"])
    gaps = {name: max(abs(a - b) for a, b in zip(smooth(c), ref)) for name, c in curves.items()}
    tolerance = max(0.02, 2 * gaps["sdpa bf16"])

    every = max(1, args.steps // 10)
    print(f"a {args.layers}-layer causal transformer (dim {args.dim}, {args.heads} heads of {args.dim // args.heads}, "
          f"seq {args.seq}, batch {args.batch}), {args.steps} steps of AdamW, seed {args.seed}; loss:")  # fmt: skip
    names = list(curves)
    print("step  " + "  ".join(f"{n:>14}" for n in names))
    for i in list(range(0, args.steps, every)) + [args.steps - 1]:
        print(f"{i:4d}  " + "  ".join(f"{curves[n][i]:14.4f}" for n in names))
    entropy_note = f"(uniform: {math.log(args.vocab):.3f})"
    print(f"largest gap to fp32 over the 10-step smoothed curves {entropy_note}: "
          + ", ".join(f"{n} {gaps[n]:.4f}" for n in names[1:]))  # fmt: skip
    variant_gap = gaps[f"{args.variant} bf16"]
    ok = variant_gap <= tolerance and all(math.isfinite(x) for x in curves[f"{args.variant} bf16"])
    print(f"rule: {args.variant}'s gap <= max(0.02, 2 x SDPA's) = {tolerance:.4f}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
