"""Shapes, the default correctness shape set, and FLOP and byte counts.

A shape is B,H,S,D (batch, heads, sequence length, head dim): q, k, v and o all [B, H, S, D]. Grouped-query
attention and keys of another length than the queries' are written B,Hq:Hkv,Sq:Sk,D — q and o [B, Hq, Sq, D],
k and v [B, Hkv, Sk, D], Hq a multiple of Hkv — e.g. 8,32:8,1:8192,128 (decode: one query row of 32 heads against
8192 cached keys of 8 heads). Under causal masking query i sees keys j <= i + Sk - Sq (bottom-right, as in
FlashAttention 2.1+ and torch's causal_lower_right); with Sq > Sk the first Sq - Sk rows see no key and their
output is 0.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from flashcore_cli.core.dtypes import ALIASES, DEFAULT_DTYPE, DTYPES
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.core.passes import DEFAULT_PASS, PASSES
from flashcore_cli.registry.family import DENSE, Family, window_pairs

MISSION_SHAPE = "1,8,512,64"


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int  # Hq: query heads
    seq_len: int  # Sq: query rows
    head_dim: int
    heads_kv: int = 0  # Hkv (0: as many as the query heads)
    seq_len_kv: int = 0  # Sk (0: as many as the query rows)

    def __post_init__(self):
        if not self.heads_kv:
            object.__setattr__(self, "heads_kv", self.heads)
        if not self.seq_len_kv:
            object.__setattr__(self, "seq_len_kv", self.seq_len)

    def __str__(self) -> str:
        heads = f"{self.heads}" + (f":{self.heads_kv}" if self.heads_kv != self.heads else "")
        seq = f"{self.seq_len}" + (f":{self.seq_len_kv}" if self.seq_len_kv != self.seq_len else "")
        return f"{self.batch},{heads},{seq},{self.head_dim}"

    @property
    def gqa(self) -> bool:
        return self.heads_kv != self.heads

    @property
    def other_kv_len(self) -> bool:
        return self.seq_len_kv != self.seq_len

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq_len, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_kv, self.seq_len_kv, self.head_dim)

    def as_dict(self) -> dict:
        return asdict(self)


# How a case's inputs are drawn (check.make_inputs): "randn" (q, k, v independent standard normal), or one
# of the extreme magnitudes where SDPA is often exact, so a variant must be too:
#   "large"    q, k, v independent randn * 30: logits of |x| ~ 1000 at D=64;
#   "one-hot"  q = k = v = randn * 30: each row's own key wins by thousands, so every row is one-hot;
#   "uniform"  every key row the same: all scores of a row are equal, uniform rows.
INPUT_KINDS = ("randn", "large", "one-hot", "uniform")

@dataclass(frozen=True)
class Case:
    shape: Shape
    causal: bool
    seed: int
    inputs: str = "randn"
    dtype: str = DEFAULT_DTYPE  # DTYPES
    grads: bool = False  # check dq, dk, dv too (variants with a backward)
    family: Family = DENSE  # window, softcap, sinks (registry/family.py)

    def label(self) -> str:
        inputs = "" if self.inputs == "randn" else " " + self.inputs
        return (f"{self.shape}{' causal' if self.causal else ''}{self.family.label(self.causal)}{inputs}"
                f"{'' if self.dtype == DEFAULT_DTYPE else ' ' + self.dtype}{' +grads' if self.grads else ''}")  # fmt: skip

    def as_dict(self) -> dict:
        """Defaults left out, so an fp16 randn forward case reads as it did before cases had kinds and dtypes."""
        d = {"shape": str(self.shape), "causal": self.causal, "seed": self.seed}
        if self.inputs != "randn":
            d["inputs"] = self.inputs
        if self.dtype != DEFAULT_DTYPE:
            d["dtype"] = self.dtype
        if self.grads:
            d["grads"] = True
        d.update(self.family.as_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(parse_shape(d["shape"]), bool(d["causal"]), int(d["seed"]), str(d.get("inputs", "randn")),
                   str(d.get("dtype", DEFAULT_DTYPE)), bool(d.get("grads", False)), Family.from_dict(d))  # fmt: skip

    def needs(self) -> dict:
        """What of a variant this case needs beyond head dim, causal and dtype (Variant.unsupported_reason)."""
        return {"gqa": self.shape.gqa, "seqlen_kv": self.shape.other_kv_len, "backward": self.grads,
                "seq_len": self.shape.seq_len,
                **self.family.normalized(self.causal, self.shape.seq_len, self.shape.seq_len_kv).needs(self.causal)}  # fmt: skip


def parse_dtype(text: str) -> str:
    """--dtype: one of DTYPES (fp16, bf16); also accepts torch's names float16 / bfloat16."""
    value = ALIASES.get(str(text).strip().lower(), str(text).strip().lower())
    if value not in DTYPES:
        raise FlashcoreError(f"bad --dtype '{text}': expected one of {', '.join(DTYPES)}")
    return value


SHAPE_SYNTAX = "B,H,S,D or B,Hq:Hkv,Sq:Sk,D"


def parse_shape(text: str) -> Shape:
    """B,H,S,D, or B,Hq:Hkv,Sq:Sk,D (either pair may be written alone: B,H,Sq:Sk,D or B,Hq:Hkv,S,D)."""
    parts = [p.strip() for p in str(text).split(",")]
    pattern = [r"\d+", r"\d+(:\d+)?", r"\d+(:\d+)?", r"\d+"]
    if len(parts) != 4 or not all(re.fullmatch(pat, p) for pat, p in zip(pattern, parts)):
        raise FlashcoreError(f"bad shape '{text}': expected {SHAPE_SYNTAX} as positive integers, e.g. {MISSION_SHAPE} "
                             "or 8,32:8,1:8192,128")  # fmt: skip
    b, d = int(parts[0]), int(parts[3])
    h, _, hkv = parts[1].partition(":")
    s, _, skv = parts[2].partition(":")
    h, s = int(h), int(s)
    hkv, skv = int(hkv or h), int(skv or s)
    if min(b, h, s, d, hkv, skv) < 1:
        raise FlashcoreError(f"bad shape '{text}': every dimension must be at least 1")
    if h % hkv:
        raise FlashcoreError(f"bad shape '{text}': the query heads ({h}) must be a multiple of the key/value heads ({hkv})")
    if max(b * h * s * d, b * hkv * skv * d) >= 2**31:
        raise FlashcoreError(f"bad shape '{text}': more than 2^31 elements per tensor")
    return Shape(b, h, s, d, hkv, skv)


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


# Grouped-query heads and queries shorter (or longer) than the keys, (B, Hq, Hkv, Sq, Sk): MHA and GQA and MQA
# (Hq / Hkv of 1, 4, 8, 32), decode (Sq = 1), speculative decoding (Sq = 3), chunked prefill (Sq < Sk), and
# Sq > Sk, where the first Sq - Sk rows of a causal case see no key. A variant without the `gqa` or `seqlen_kv`
# feature SKIPs the cases that need it.
GQA_SHAPES = [
    (1, 4, 1, 1, 1),
    (2, 8, 2, 1, 97),
    (1, 32, 1, 3, 1025),
    (1, 8, 1, 17, 4097),
    (2, 4, 4, 513, 1000),
    (1, 32, 4, 64, 333),
    (1, 6, 2, 300, 128),
    (2, 16, 8, 100, 1200),  # a backward grid of more key blocks than SMs (v11's long configuration)
    # decode rungs (at most 16 query rows): every query tile shape of a group, long and odd caches, Sq > Sk
    (3, 64, 8, 1, 4099),
    (1, 32, 8, 4, 1000),
    (2, 8, 8, 16, 600),
    (1, 12, 4, 7, 33),
    (2, 16, 2, 16, 5),
]
# Extreme magnitudes on grouped, uneven shapes (one-hot rows need q and k of one shape: the MHA set has them).
EXTREME_GQA_SHAPES = [
    ("large", (1, 32, 8, 4, 1000)),
    ("uniform", (2, 8, 2, 1, 97)),
    ("large", (1, 8, 2, 200, 333)),
]


# The attention family's odd cases (registry/family.py), run for a variant that declares any of window, softcap or
# sinks (a case that needs a feature it lacks SKIPs with the reason): (B, Hq, Hkv, Sq, Sk, causal, Family, inputs).
# Windows of one key, of more than the sequence, non-causal two-sided, windows that leave rows empty (Sq > Sk, or a
# window that ends before key 0), softcaps with logits far past the cap, sinks far above and below the row maxima
# (make_sinks draws every third head +15 and every third -15), the three together on grouped, uneven shapes, and
# decode's rows (Sq <= 16) under a window.
FAMILY_CASES = [
    (1, 4, 4, 1000, 1000, True, Family(128), "randn"),
    (1, 4, 4, 1000, 1000, False, Family(64, 64), "randn"),
    (2, 3, 3, 97, 97, True, Family(0), "randn"),
    (1, 2, 2, 300, 300, True, Family(5000), "randn"),
    (1, 2, 2, 300, 100, False, Family(5, 5), "randn"),
    (1, 6, 2, 300, 128, True, Family(32), "randn"),
    (1, 2, 2, 300, 300, True, Family(16), "one-hot"),
    (1, 4, 4, 256, 256, True, Family(softcap=50.0), "large"),
    (2, 8, 2, 200, 333, False, Family(softcap=30.0), "randn"),
    (1, 6, 6, 512, 512, False, Family(sinks=True), "randn"),
    (2, 6, 3, 97, 1025, True, Family(sinks=True), "large"),
    (1, 3, 3, 97, 97, False, Family(sinks=True), "uniform"),
    (1, 3, 3, 17, 17, False, Family(2, 0, sinks=True), "randn"),
    (2, 16, 8, 100, 1200, True, Family(256, softcap=20.0, sinks=True), "randn"),
    (1, 4, 4, 777, 777, True, Family(200, softcap=50.0, sinks=True), "large"),
    (3, 32, 8, 1, 4099, True, Family(1024, sinks=True), "randn"),
    (1, 32, 8, 4, 1000, True, Family(100), "randn"),
    (2, 16, 2, 16, 600, False, Family(7, 3, sinks=True), "randn"),
    (1, 8, 8, 16, 5, True, Family(2, sinks=True), "randn"),
]


def family_cases(head_dims, base_seed: int, dtype: str = DEFAULT_DTYPE) -> list[Case]:
    cases = []
    for d in head_dims:
        for b, h, hkv, sq, sk, causal, family, inputs in FAMILY_CASES:
            cases.append(Case(Shape(b, h, sq, d, hkv, sk), causal, base_seed + len(cases), inputs, dtype, family=family))
    return cases


def default_cases(head_dims, base_seed: int, dtype: str = DEFAULT_DTYPE) -> list[Case]:
    cases = expand_cases([Shape(b, h, s, d) for d in head_dims for (b, h, s) in DEFAULT_SHAPES], base_seed, dtype=dtype)
    for d in head_dims:
        for inputs, (b, h, s) in EXTREME_SHAPES:
            for causal in (False, True):
                cases.append(Case(Shape(b, h, s, d), causal, base_seed + len(cases), inputs, dtype))
    cases += expand_cases([Shape(b, h, sq, d, hkv, sk) for d in head_dims for (b, h, hkv, sq, sk) in GQA_SHAPES],
                          base_seed + len(cases), dtype=dtype)  # fmt: skip
    for d in head_dims:
        for inputs, (b, h, hkv, sq, sk) in EXTREME_GQA_SHAPES:
            for causal in (False, True):
                cases.append(Case(Shape(b, h, sq, d, hkv, sk), causal, base_seed + len(cases), inputs, dtype))
    return cases


def expand_cases(shapes: list[Shape], base_seed: int, causal_modes=(False, True), dtype: str = DEFAULT_DTYPE) -> list[Case]:
    cases = []
    for shape in shapes:
        for causal in causal_modes:
            cases.append(Case(shape, causal, base_seed + len(cases), dtype=dtype))
    return cases


def visible_pairs(shape: Shape, causal: bool, family: Family = DENSE) -> float:
    """(query, key) pairs the scores are computed for, per head: Sq * Sk, or under causal masking S^2 / 2 when
    Sq = Sk (the FlashAttention convention) and the exact count of j <= i + Sk - Sq otherwise; under a sliding
    window, the exact count of the pairs it leaves visible."""
    sq, sk = shape.seq_len, shape.seq_len_kv
    if family.has_window(causal):
        return window_pairs(sq, sk, family.window(causal))
    if not causal:
        return float(sq * sk)
    if sq == sk:
        return sq * sq / 2
    offset = sk - sq
    # rows i = 0 .. Sq - 1 see min(Sk, max(0, i + offset + 1)) keys
    first_full = max(0, min(sq, sk - offset))  # rows before this see fewer than Sk keys
    first_any = max(0, min(sq, -offset))  # rows before this see none
    partial = sum(range(first_any + offset + 1, first_full + offset + 1)) if first_full > first_any else 0
    return float(partial + (sq - first_full) * sk)


def attention_flops(shape: Shape, causal: bool, family: Family = DENSE) -> float:
    """4 B Hq D x the visible (query, key) pairs: two matmuls of 2 flops per multiply-add (the forward)."""
    return 4.0 * shape.batch * shape.heads * shape.head_dim * visible_pairs(shape, causal, family)


def visible_keys(shape: Shape, causal: bool, family: Family = DENSE) -> int:
    """The keys at least one query row sees (per K/V head), which a kernel that skips what a window hides need
    not read: all Sk but under a window's left edge. The last row's diagonal is key Sk - 1, which it always sees;
    each row's window moves right with it, so the union runs from the first row's first key to Sk - 1."""
    left = family.window(causal)[0]
    if left < 0:
        return shape.seq_len_kv
    return shape.seq_len_kv - max(0, shape.seq_len_kv - shape.seq_len - left)


# FLOPs of a pass (core/passes.py): a backward's are 2.5 x the forward's (FlashAttention's convention: five
# matmuls against two, one of them the recomputed S).
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def parse_pass(text: str) -> str:
    value = str(text).strip().lower()
    if value not in PASSES:
        raise FlashcoreError(f"bad --pass '{text}': expected one of {', '.join(PASSES)}")
    return value


def pass_flops(shape: Shape, causal: bool, passes: str = DEFAULT_PASS, family: Family = DENSE) -> float:
    return attention_flops(shape, causal, family) * PASS_FLOP_FACTOR[passes]


def pass_bytes(shape: Shape, passes: str = DEFAULT_PASS, causal: bool = False, family: Family = DENSE) -> float:
    """The bytes a pass must move at the least (16-bit elements): the forward reads Q, K, V and writes O; the
    backward reads Q, K, V, O, dO and writes dQ, dK, dV; both, the sum. Under a window, only the K/V rows some
    query sees (visible_keys)."""
    q = shape.batch * shape.heads * shape.seq_len * shape.head_dim
    kv = shape.batch * shape.heads_kv * visible_keys(shape, causal, family) * shape.head_dim
    forward = 2 * q + 2 * kv
    backward = 4 * q + 4 * kv
    return 2.0 * {"fwd": forward, "bwd": backward, "fwd+bwd": forward + backward}[passes]
