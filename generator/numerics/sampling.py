"""Token sampling and its portable RNG, mirrored by firmware_src/runtime/sampler.c.

Every target draws the same tokens because the RNG is 64-bit integer arithmetic and every
probability is computed with the float32 rules of numerics.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ColibriError
from ..model.load import generation_config
from .ops import F32, f32, softmax

MASK64 = (1 << 64) - 1
# A temperature below this is greedy (firmware_src/runtime/sampler.h SAMPLER_GREEDY_BELOW): dividing
# logits by a smaller one risks overflowing them to infinity, where softmax has no answer.
GREEDY_BELOW = F32(1e-3)
# llama.cpp's --repeat-last-n default: the window of the repetition penalty, in tokens.
DEFAULT_REPEAT_LAST_N = 64


@dataclass(frozen=True)
class SamplingParams:
    """temperature below GREEDY_BELOW (0 included) means greedy; top_k 0, top_p 1 and min_p 0
    disable those filters. repeat_penalty is llama.cpp's repetition penalty (1: off) over the last
    repeat_last_n tokens of the conversation (0: off; at least the tokens held: all of them)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    repeat_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N

    def as_f32(self) -> "SamplingParams":
        """The values exactly as the firmware holds them (float32)."""
        return SamplingParams(
            float(F32(self.temperature)),
            self.top_k,
            float(F32(self.top_p)),
            float(F32(self.min_p)),
            self.seed,
            float(F32(self.repeat_penalty)),
            self.repeat_last_n,
        )

    @property
    def penalizes(self) -> bool:
        return F32(self.repeat_penalty) != F32(1.0) and self.repeat_last_n > 0


class Rng:
    """xorshift64*: state ^= >>12, <<25, >>27; output the high 32 bits of state * M."""

    MULT = 0x2545F4914F6CDD1D

    def __init__(self, seed: int):
        self.state = (seed ^ 0x9E3779B97F4A7C15) & MASK64
        if self.state == 0:
            self.state = 0x9E3779B97F4A7C15

    def next_u32(self) -> int:
        s = self.state
        s ^= s >> 12
        s ^= (s << 25) & MASK64
        s ^= s >> 27
        self.state = s
        return ((s * self.MULT) & MASK64) >> 32

    def uniform(self) -> np.float32:
        """A float32 in [0, 1) with 24 random bits."""
        return F32(self.next_u32() >> 8) * F32(1.0 / 16777216.0)


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit; the lowest index wins a tie (-0 and +0 are equal). As in a scan
    from index 0 with `>`: a NaN at index 0 wins, a NaN anywhere else is never larger."""
    x = np.asarray(logits, dtype=np.float32)
    if np.isnan(x[0]):
        return 0
    x = np.where(np.isnan(x), np.float32(-np.inf), x)
    return int(np.flatnonzero(x == x.max())[0])


def penalized(logits: np.ndarray, params: SamplingParams, seen: Sequence[int]) -> np.ndarray:
    """llama.cpp's repetition penalty (the repeat part of llama_sampler_penalties), as
    firmware_src/runtime/sampler.c applies it: every distinct token among the last repeat_last_n
    seen has its logit divided by the penalty when positive, multiplied by it otherwise, once."""
    x = f32(logits)
    if not params.penalizes or not len(seen):
        return x
    window = np.asarray(seen[-params.repeat_last_n :], dtype=np.int64)
    ids = np.unique(window[(window >= 0) & (window < len(x))])
    x = x.copy()
    penalty, v = F32(params.repeat_penalty), x[ids]
    x[ids] = np.where(v <= F32(0), v * penalty, v / penalty)
    return x


def sample(logits: np.ndarray, params: SamplingParams, rng: Rng, seen: Sequence[int] = ()) -> int:
    """The next token: the repetition penalty over `seen` (the conversation's tokens so far) first,
    as in llama.cpp's chain, then greedy or the filters and a draw."""
    logits = penalized(logits, params, seen)
    if not F32(params.temperature) >= GREEDY_BELOW:
        return argmax(logits)
    probs = softmax(f32(logits) / F32(params.temperature))
    # Candidates by probability, highest first; ties by lower token id.
    order = np.lexsort((np.arange(len(probs)), -probs))
    p_sorted = probs[order]
    keep = len(order)
    if 0 < params.top_k < keep:
        keep = params.top_k
    if params.top_p < 1.0:
        cum = np.add.accumulate(p_sorted[:keep], dtype=np.float32)
        reached = np.nonzero(cum >= F32(params.top_p))[0]
        if len(reached):
            keep = int(reached[0]) + 1
    if params.min_p > 0.0:
        threshold = F32(params.min_p) * p_sorted[0]
        keep = max(1, int(np.count_nonzero(p_sorted[:keep] >= threshold)))
    kept = p_sorted[:keep]
    cum = np.add.accumulate(kept, dtype=np.float32)
    r = rng.uniform() * cum[-1]
    above = np.nonzero(r < cum)[0]
    chosen = int(above[0]) if len(above) else keep - 1
    return int(order[chosen])


def generation_defaults(model_dir: Path) -> SamplingParams:
    """generation_config.json's sampling settings, range-checked like the command line's: a value
    that the board would refuse, or read differently from the reference, is an error here. top_k of
    0 or below means no top-k filter (some configs write -1 for that)."""
    gen, gen_path = generation_config(model_dir)
    if gen.get("do_sample") is not True:
        return SamplingParams()

    def value(key: str, default, ok, what: str):
        v = gen.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            raise ColibriError(f"{gen_path}: {key} must be {what}, got {v!r}")
        return v

    finite = lambda v: v == v and abs(v) != float("inf")  # noqa: E731 - NaN and infinities fail
    temperature = float(value("temperature", 1.0, lambda v: finite(v) and v >= 0, "a finite number >= 0"))
    top_k = value("top_k", 50, lambda v: isinstance(v, int), "an integer")
    top_p = float(value("top_p", 1.0, lambda v: finite(v) and 0 < v <= 1, "in (0, 1]"))
    min_p = float(value("min_p", 0.0, lambda v: finite(v) and 0 <= v <= 1, "in [0, 1]"))
    return SamplingParams(temperature, max(0, top_k), top_p, min_p)
