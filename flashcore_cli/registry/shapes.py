"""Shapes (B,H,S,D), the default correctness shape set, and FLOP counts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from flashcore_cli.core.errors import FlashcoreError

MISSION_SHAPE = "1,8,512,64"


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq_len: int
    head_dim: int

    def __str__(self) -> str:
        return f"{self.batch},{self.heads},{self.seq_len},{self.head_dim}"

    def as_dict(self) -> dict:
        return asdict(self)


# How a case's inputs are drawn (check.make_inputs): "randn" (q, k, v independent standard normal), or one
# of the extreme magnitudes where SDPA is often exact, so a variant must be too:
#   "large"    q, k, v independent randn * 30: logits of |x| ~ 1000 at D=64;
#   "one-hot"  q = k = v = randn * 30: each row's own key wins by thousands, so every row is one-hot;
#   "uniform"  every key row the same: all scores of a row are equal, uniform rows.
INPUT_KINDS = ("randn", "large", "one-hot", "uniform")

# The element types of q, k, v (and the output), by the names the registry's `dtypes:` and --dtype use.
DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class Case:
    shape: Shape
    causal: bool
    seed: int
    inputs: str = "randn"
    dtype: str = "fp16"  # DTYPES

    def label(self) -> str:
        inputs = "" if self.inputs == "randn" else " " + self.inputs
        return f"{self.shape}{' causal' if self.causal else ''}{inputs}{'' if self.dtype == 'fp16' else ' ' + self.dtype}"

    def as_dict(self) -> dict:
        """Defaults left out, so an fp16 randn case reads as it did before cases had kinds and dtypes."""
        d = {"shape": str(self.shape), "causal": self.causal, "seed": self.seed}
        if self.inputs != "randn":
            d["inputs"] = self.inputs
        if self.dtype != "fp16":
            d["dtype"] = self.dtype
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(parse_shape(d["shape"]), bool(d["causal"]), int(d["seed"]), str(d.get("inputs", "randn")),
                   str(d.get("dtype", "fp16")))  # fmt: skip


def parse_dtype(text: str) -> str:
    """--dtype: one of DTYPES (fp16, bf16); also accepts torch's names float16 / bfloat16."""
    value = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(str(text).strip().lower(), str(text).strip().lower())
    if value not in DTYPES:
        raise FlashcoreError(f"bad --dtype '{text}': expected one of {', '.join(DTYPES)}")
    return value


def parse_shape(text: str) -> Shape:
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 4 or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise FlashcoreError(f"bad shape '{text}': expected B,H,S,D as four positive integers, e.g. {MISSION_SHAPE}")
    b, h, s, d = (int(p) for p in parts)
    if min(b, h, s, d) < 1:
        raise FlashcoreError(f"bad shape '{text}': every dimension must be at least 1")
    if b * h * s * d >= 2**31:
        raise FlashcoreError(f"bad shape '{text}': more than 2^31 elements per tensor")
    return Shape(b, h, s, d)


def parse_shapes(values: list[str] | None) -> list[Shape]:
    """Shapes given as repeated options and/or separated by ';' or spaces within one option."""
    shapes: list[Shape] = []
    for value in values or []:
        for token in re.split(r"[;\s]+", value.strip()):
            if token:
                shapes.append(parse_shape(token))
    return shapes


# The default correctness set: the mission shape, awkward sequence lengths (1, 17, 97, 1000, 1025) over
# several batches and heads. Every case runs causal and non-causal, at every head dim a variant declares.
DEFAULT_SHAPES = [
    (1, 8, 512),
    (2, 3, 1),
    (1, 2, 17),
    (3, 2, 97),
    (1, 4, 1000),
    (2, 1, 1025),
    (4, 2, 128),
]


# And the extreme magnitudes (INPUT_KINDS): one-hot rows in both of v11's regimes on a 132-SM GPU (short at
# 1,2,300, long at 2,40,200), large logits, and uniform rows at an odd length.
EXTREME_SHAPES = [
    ("one-hot", (1, 2, 300)),
    ("one-hot", (2, 40, 200)),
    ("large", (1, 4, 256)),
    ("uniform", (1, 3, 97)),
]


def default_cases(head_dims, base_seed: int, dtype: str = "fp16") -> list[Case]:
    cases = expand_cases([Shape(b, h, s, d) for d in head_dims for (b, h, s) in DEFAULT_SHAPES], base_seed, dtype=dtype)
    for d in head_dims:
        for inputs, (b, h, s) in EXTREME_SHAPES:
            for causal in (False, True):
                cases.append(Case(Shape(b, h, s, d), causal, base_seed + len(cases), inputs, dtype))
    return cases


def expand_cases(shapes: list[Shape], base_seed: int, causal_modes=(False, True), dtype: str = "fp16") -> list[Case]:
    cases = []
    for shape in shapes:
        for causal in causal_modes:
            cases.append(Case(shape, causal, base_seed + len(cases), dtype=dtype))
    return cases


def attention_flops(shape: Shape, causal: bool) -> float:
    flops = 4.0 * shape.batch * shape.heads * shape.seq_len**2 * shape.head_dim
    return flops / 2 if causal else flops
