"""The attention family a case or a timed row runs beyond dense/causal attention: a sliding window, a logit
softcap and attention sinks, named as FlashAttention names them (kernels/flashcore.h states the semantics):

    window_size=(left, right)  query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 is
                               unbounded; causal sets right to 0 (so (-1, 0) is causal itself)
    softcap=c                  scores s = scale * q.k become c * tanh(s / c) before the softmax; 0 is off
    sinks                      one fp32 logit per query head in every row's softmax denominator (no value)

A Family is the case's or row's choice; the sinks' values are drawn from the case's seed (check/case.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from flashcore_cli.core.errors import FlashcoreError

UNBOUNDED = -1
# The registry features (kernels/flashcore.h's FlashcoreFeature) a family case can need.
FAMILY_FEATURES = ("window", "softcap", "sinks")


@dataclass(frozen=True)
class Family:
    window_left: int = UNBOUNDED
    window_right: int = UNBOUNDED
    softcap: float = 0.0
    sinks: bool = False

    def window(self, causal: bool) -> tuple[int, int]:
        """(left, right) as the kernel sees it: causal sets right to 0."""
        return (self.window_left, 0 if causal else self.window_right)

    def normalized(self, causal: bool, seq_len: int, seq_len_kv: int) -> "Family":
        """The family as a kernel gets it (kernels/binding.cpp): causal's right edge 0, and an edge that hides no key
        -1 (a left edge of Sk - 1 or more, a right edge above 0 of Sq - 1 or more), so that a window past the
        sequence needs no variant that takes windows."""
        left, right = self.window(causal)
        left = left if 0 <= left < seq_len_kv - 1 else UNBOUNDED
        right = UNBOUNDED if right > 0 and right >= seq_len - 1 else right
        return Family(left, right, self.softcap, self.sinks)

    def has_window(self, causal: bool) -> bool:
        """A window beyond what causal alone is: (-1, -1) and (-1, 0) are not."""
        left, right = self.window(causal)
        return left >= 0 or right > 0

    def needs(self, causal: bool) -> dict[str, bool]:
        """The variant features (registry FEATURES) the family asks for."""
        return dict(zip(FAMILY_FEATURES, (self.has_window(causal), self.softcap > 0, self.sinks)))

    def is_dense(self, causal: bool) -> bool:
        return not any(self.needs(causal).values())

    def label(self, causal: bool) -> str:
        """' window 1024,0 softcap 50 sinks' (empty for none), as a case or row names it."""
        parts = []
        if self.has_window(causal):
            left, right = self.window(causal)
            parts.append(f"window {left},{right}")
        if self.softcap > 0:
            parts.append(f"softcap {self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        return "".join(" " + p for p in parts)

    def as_dict(self) -> dict:
        """The fields that are not the default (a dense case's record is as it was)."""
        d: dict = {}
        if (self.window_left, self.window_right) != (UNBOUNDED, UNBOUNDED):
            d["window"] = [self.window_left, self.window_right]
        if self.softcap > 0:
            d["softcap"] = self.softcap
        if self.sinks:
            d["sinks"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Family":
        left, right = d.get("window", (UNBOUNDED, UNBOUNDED))
        return cls(int(left), int(right), float(d.get("softcap", 0.0)), bool(d.get("sinks", False)))

    def kwargs(self, causal: bool) -> dict:
        """The window_size and softcap keywords of a variant's call (sinks are a tensor the caller draws)."""
        return {"window_size": self.window(causal), "softcap": float(self.softcap)}


DENSE = Family()


def parse_window(text: str | None) -> tuple[int, int]:
    """--window LEFT,RIGHT (each -1 or >= 0), or one number N for (N, -1): one FlashcoreError for anything else."""
    if text is None:
        return (UNBOUNDED, UNBOUNDED)
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values.append(UNBOUNDED)
    if len(values) != 2 or min(values) < -1:
        raise FlashcoreError(f"bad --window '{text}': expected LEFT,RIGHT, each -1 (unbounded) or >= 0, e.g. 1024,0")
    if max(values) >= 2**31:
        raise FlashcoreError(f"bad --window '{text}': each side must be below 2^31")
    return values[0], values[1]


def parse_softcap(value: float | None) -> float:
    if value is None:
        return 0.0
    if not math.isfinite(value) or value < 0:
        raise FlashcoreError(f"bad --softcap {value}: expected a finite number >= 0 (0: off), e.g. 50")
    return float(value)


def parse_family(window: str | None, softcap: float | None, sinks: bool) -> Family:
    left, right = parse_window(window)
    return Family(left, right, parse_softcap(softcap), bool(sinks))


def row_keys(row: int, seq_len: int, seq_len_kv: int, window: tuple[int, int]) -> int:
    """How many keys query row `row` sees under window (left, right) (causal as right = 0)."""
    left, right = window
    diag = row + seq_len_kv - seq_len
    lo = 0 if left < 0 else max(0, diag - left)
    hi = seq_len_kv - 1 if right < 0 else min(seq_len_kv - 1, diag + right)
    return max(0, hi - lo + 1)


@functools.lru_cache(maxsize=256)
def window_pairs(seq_len: int, seq_len_kv: int, window: tuple[int, int]) -> float:
    """The (query, key) pairs a window leaves visible, per head, counted exactly: the rows come in at most three
    runs (clipped on the left, full width, clipped on the right), each an arithmetic series, but a plain sum over
    the rows is exact and fast enough (a million rows in well under a second)."""
    return float(sum(row_keys(i, seq_len, seq_len_kv, window) for i in range(seq_len)))
