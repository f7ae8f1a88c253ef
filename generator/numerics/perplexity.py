"""Scoring a text: a scored token's log-probability from the two float32 parts the firmware sends
(and the reference computes), and llama.cpp's perplexity protocol over chunks of a token stream,
so that the numbers compare with `llama-perplexity`'s."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Score:
    """Prompt token `index` scored given the tokens before it: log p = lp - log(z), z computed as
    op_exp_sum does (firmware_src/runtime/ops.c), so both parts are bit-exact on every board."""

    index: int
    token: int
    lp: np.float32  # its logit minus the largest logit
    z: np.float32  # the sum over the vocabulary of exp(logit - largest logit)

    @property
    def logprob(self) -> float:
        return float(self.lp) - math.log(float(self.z))


@dataclass(frozen=True)
class Chunk:
    tokens: list[int]  # n_ctx tokens, the first replaced by BOS where the model has one
    score_from: int  # the logits of tokens score_from ... n_ctx - 2 score the token after each


def chunks(tokens: list[int], n_ctx: int, bos: int | None, limit: int | None = None) -> list[Chunk]:
    """llama.cpp's perplexity chunks: consecutive runs of n_ctx tokens of the text tokenized once,
    each starting with BOS (replacing its first token), scored over the second half."""
    if n_ctx < 4:
        raise ValueError("a chunk needs at least 4 tokens")
    count = len(tokens) // n_ctx
    if limit is not None:
        count = min(count, limit)
    out = []
    for c in range(count):
        chunk = list(tokens[c * n_ctx : (c + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(Chunk(chunk, n_ctx // 2))
    return out


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    error: float  # its standard error, as llama-perplexity prints it after "+/-"
    tokens: int  # tokens scored


def perplexity(logprobs: list[float]) -> Perplexity:
    """exp of the mean negative log-likelihood, and its standard error by llama.cpp's formula."""
    n = len(logprobs)
    if n == 0:
        raise ValueError("no scored tokens")
    nll = -math.fsum(logprobs) / n
    nll2 = math.fsum(lp * lp for lp in logprobs) / n - nll * nll
    ppl = math.exp(nll)
    spread = math.sqrt(nll2 / (n - 1)) if n > 1 and nll2 > 0 else 0.0
    return Perplexity(ppl, ppl * spread, n)
