"""eval: perplexity of a text from what the firmware computes on the board.

llama.cpp's protocol (so the numbers compare with `llama-perplexity`): the text is tokenized once,
cut into chunks of the firmware's context, each chunk starts with BOS, and the second half of each
chunk is scored. The firmware sends each scored token's log-probability as two float32 parts (score
frames); with `check`, the NumPy reference scores the same chunks and every part must be equal, bit
for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .compile.image import map_image
from .compile.plan import Plan
from .console import counted
from .device.session import RunRequest, RunResult
from .errors import ColibriError
from .numerics.perplexity import Perplexity, Score, chunks, perplexity
from .numerics.sampling import SamplingParams
from .reference import Reference


@dataclass
class Evaluation:
    result: Perplexity
    chunks: int
    n_ctx: int
    seconds: float  # on the board, over all chunks (wall time of the runs)
    scores: list[Score] = field(default_factory=list)
    reference_checked: bool = False

    @property
    def tokens_per_second(self) -> float:
        return self.result.tokens / self.seconds if self.seconds > 0 else 0.0


def evaluate(
    tokens: list[int],
    plan: Plan,
    bos: int | None,
    run: Callable[[RunRequest], RunResult],
    weights: Path | None = None,
    limit: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Score `tokens` chunk by chunk with `run` (one request per chunk); with `weights`, the NumPy
    reference scores them too and must agree bit for bit."""
    n_ctx = plan.n_ctx
    parts = chunks(tokens, n_ctx, bos, limit)
    if not parts:
        raise ColibriError(
            f"the text is {counted(len(tokens), 'token')}, less than one chunk of {n_ctx} (the firmware's "
            f"context): give a longer text or build with a smaller --ctx"
        )
    reference = Reference(plan, map_image(weights)) if weights is not None else None
    scores: list[Score] = []
    seconds = 0.0
    for i, chunk in enumerate(parts):
        request = RunRequest(chunk.tokens, 0, SamplingParams(), digests=False, score_from=chunk.score_from)
        t0 = time.monotonic()
        result = run(request)
        seconds += time.monotonic() - t0
        want = len(chunk.tokens) - 1 - chunk.score_from
        if len(result.scores) != want or [s.index for s in result.scores] != list(range(chunk.score_from + 1, n_ctx)):
            raise ColibriError(f"chunk {i + 1}: the board scored {len(result.scores)} tokens, expected {want}")
        if reference is not None:
            ref = reference.generate(chunk.tokens, 0, SamplingParams(), score_from=chunk.score_from).scores
            for got, exp in zip(result.scores, ref):
                if (got.token, got.lp.tobytes(), got.z.tobytes()) != (exp.token, exp.lp.tobytes(), exp.z.tobytes()):
                    raise ColibriError(
                        f"chunk {i + 1}, token {got.index}: the board's score (lp {float(got.lp)!r}, "
                        f"z {float(got.z)!r}) differs from the reference's (lp {float(exp.lp)!r}, "
                        f"z {float(exp.z)!r})"
                    )
        scores.extend(result.scores)
        if progress:
            so_far = perplexity([s.logprob for s in scores])
            progress(f"chunk {i + 1}/{len(parts)}: PPL {so_far.ppl:.4f} over {so_far.tokens} tokens")
    return Evaluation(
        perplexity([s.logprob for s in scores]), len(parts), n_ctx, seconds, scores, reference is not None
    )
