"""Budgets for building a tokenizer from a model's vocabulary (tokenizer.json, or a GGUF file's
BPE or SentencePiece metadata), checked before the tokenizer is built: a vocabulary comes from the
internet, and a tokenizer is built in memory for every command that reads text.

The limits, with the largest real vocabularies measured beside them (docs/models.md says them):
tokens 1,048,576 (Gemma 3's 262,144 is the largest published), a token's text 1,024 UTF-8 bytes
(SmolLM2's longest is 162, Gemma 3's 48), merges 2,097,152 (SmolLM2 has 48,900, Qwen2's 151,387),
a merge's text 2,049 bytes (two tokens and a space), tokenizer.json 128 MiB (Gemma 3's is 33 MB).
Scores must be finite numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..errors import ColibriError

MAX_TOKENS = 1 << 20
MAX_TOKEN_BYTES = 1024
MAX_MERGES = 1 << 21
MAX_MERGE_BYTES = 2 * MAX_TOKEN_BYTES + 1
MAX_TOKENIZER_JSON_BYTES = 128 << 20


def check_tokens(where: str, tokens: Sequence[str]) -> None:
    """The vocabulary's size and its longest token within the budgets."""
    if len(tokens) > MAX_TOKENS:
        raise ColibriError(f"{where}: {len(tokens):,} tokens exceed the limit of {MAX_TOKENS:,}")
    for i, text in enumerate(tokens):
        if len(text) > MAX_TOKEN_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES:
            raise ColibriError(
                f"{where}: token {i} is {len(text.encode('utf-8', 'surrogatepass')):,} bytes long (limit {MAX_TOKEN_BYTES:,})"
            )


def check_merges(where: str, merges: Sequence) -> None:
    if len(merges) > MAX_MERGES:
        raise ColibriError(f"{where}: {len(merges):,} merges exceed the limit of {MAX_MERGES:,}")
    for rank, merge in enumerate(merges):
        size = len(merge) if isinstance(merge, str) else sum(len(p) for p in merge if isinstance(p, str)) + 1
        if size > MAX_MERGE_BYTES:
            raise ColibriError(f"{where}: merge {rank} is {size:,} characters long (limit {MAX_MERGE_BYTES:,})")


def check_scores(where: str, scores: Iterable[float], tokens: Sequence[str]) -> None:
    """Every score a finite number (NaN or an infinity would make the merge order undefined)."""
    for i, score in enumerate(scores):
        if not math.isfinite(score):
            raise ColibriError(f"{where}: the score of token {i} ({tokens[i][:40]!r}) is {score}, not a finite number")
