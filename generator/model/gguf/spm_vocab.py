"""A SentencePiece vocabulary (`tokenizer.ggml.model` "llama") as llama.cpp loads it from a GGUF file.

Keys: `tokenizer.ggml.tokens` (spaces spelled U+2581), `scores` (f32 or i32; absent: all 0),
`token_type` (absent: all normal), `bos/eos/unknown_token_id` (absent: llama.cpp's SPM defaults 1, 2
and 0), `add_bos_token` (default true), `add_eos_token` (default false) and `add_space_prefix`
(default true for every SPM file; Gemma's converter writes false).

Refused, one ColibriError line each: more tokens or a longer token than vocab_limits allows, tokens,
scores or types that are not one per token, a NaN or infinite score,
a token type llama.cpp does not know, a token spelled twice (llama.cpp asserts on it), a byte token
not spelled <0xXX>, an id key outside the vocabulary. Handled as llama.cpp handles them: an empty
token (renamed "[EMPTY_<id>]", so it never matches text), a vocabulary without some byte tokens (only
text that needs a missing byte fails, when it is encoded), control-looking end-of-generation tokens
typed normal (made control, as llama.cpp's loader does), and Phi-3's whitespace rule: in a file whose
general.name says phi-3 or phi3, the whitespace after a special token is dropped (llama.cpp's RSTRIP
attribute on every special token but <unk>, <s> and <|endoftext|>, and on </s>).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ...errors import ColibriError
from ..vocab_limits import check_tokens
from .file import GgufFile

# Token types (llama.cpp's llama_token_type); 0 is "undefined".
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6
# The types llama.cpp cuts the text at before SentencePiece sees it (its special-token cache).
SPECIAL_TYPES = (CONTROL, USER_DEFINED, UNKNOWN)

# Texts llama.cpp's loader treats as end of generation and forces to control type whatever the file says.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# llama.cpp sets the RSTRIP attribute by model name, for these names only (as substrings, lowercased).
RSTRIP_MODEL_NAMES = ("phi-3", "phi3")
RSTRIP_ALSO, RSTRIP_NEVER = ("</s>",), ("<unk>", "<s>", "<|endoftext|>")


@dataclass(frozen=True)
class SpmVocab:
    where: str  # the file's name, for messages
    tokens: list[str]
    scores: list[float]
    types: list[int]
    token_ids: dict[str, int]  # every token's text, whatever its type (llama.cpp merges into any of them)
    special: list[tuple[str, int]]  # the texts cut out before SentencePiece, longest (in UTF-8 bytes) first
    rstrip: frozenset[int]  # special tokens that swallow the whitespace after them
    byte_ids: list[int | None]  # the token of each byte value: <0xXX>, else a one-character token, else None
    byte_values: dict[int, int]  # byte token id -> the byte it spells
    bos: int | None
    eos: int | None
    unk: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @property
    def size(self) -> int:
        return len(self.tokens)


def is_spm(gguf: GgufFile) -> bool:
    return gguf.metadata.get("tokenizer.ggml.model") == "llama"


def read_spm_vocab(gguf: GgufFile) -> SpmVocab:
    """The vocabulary of a GGUF file whose tokenizer.ggml.model is "llama" (ColibriError if broken).
    Checked with whole-array operations: a 262,144-token vocabulary loads in a fraction of a second."""
    where = gguf.path.name
    meta = gguf.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    if gguf.value_types.get("tokenizer.ggml.tokens") != "ARRAY[STRING]" or not tokens:
        raise ColibriError(f"{where}: metadata 'tokenizer.ggml.tokens' must be a non-empty array of strings")
    n = len(tokens)
    check_tokens(where, tokens)
    if "" in tokens:
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    scores = _numbers(meta, where, "tokenizer.ggml.scores", n, 0.0, "fi")
    if not np.isfinite(scores).all():  # NaN or an infinity: the merge order would be undefined
        first = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise ColibriError(
            f"{where}: tokenizer.ggml.scores[{first}] is {_word(scores[first])} (token {tokens[first]!r})"
        )
    types = _numbers(meta, where, "tokenizer.ggml.token_type", n, NORMAL, "i").astype(np.int64)
    bad = np.flatnonzero((types < UNDEFINED) | (types > BYTE))
    if len(bad):
        raise ColibriError(f"{where}: token {bad[0]} ({tokens[bad[0]]!r}) has type {types[bad[0]]}, not one of 0..6")
    token_ids = dict(zip(tokens, range(n)))
    if len(token_ids) != n:
        seen: dict[str, int] = {}
        for i, text in enumerate(tokens):
            if seen.setdefault(text, i) != i:
                raise ColibriError(f"{where}: token {text!r} appears twice (ids {seen[text]} and {i})")
    for text in END_OF_GENERATION_TEXTS & token_ids.keys():
        types[token_ids[text]] = CONTROL

    byte_values = {}
    for i in np.flatnonzero(types == BYTE).tolist():
        spelled = BYTE_TOKEN.fullmatch(tokens[i])
        if spelled is None:
            raise ColibriError(f"{where}: byte token {i} is spelled {tokens[i]!r}, not <0xXX>")
        byte_values[i] = int(spelled.group(1), 16)
    byte_ids = [token_ids.get(f"<0x{b:02X}>", token_ids.get(chr(b)) if b < 0x80 else None) for b in range(256)]
    special_ids = np.flatnonzero(np.isin(types, SPECIAL_TYPES)).tolist()
    special_ids.sort(key=lambda i: -len(tokens[i].encode()))
    rstrip: set[int] = set()
    name = meta.get("general.name")
    if isinstance(name, str) and any(n in name.lower() for n in RSTRIP_MODEL_NAMES):
        rstrip = set(special_ids) | {token_ids[t] for t in RSTRIP_ALSO if t in token_ids}
        rstrip -= {token_ids[t] for t in RSTRIP_NEVER if t in token_ids}

    return SpmVocab(
        where=where,
        tokens=tokens,
        scores=scores.tolist(),
        types=types.tolist(),
        token_ids=token_ids,
        special=[(tokens[i], i) for i in special_ids],
        rstrip=frozenset(rstrip),
        byte_ids=byte_ids,
        byte_values=byte_values,
        bos=_token_id(meta, where, "tokenizer.ggml.bos_token_id", n, 1),
        eos=_token_id(meta, where, "tokenizer.ggml.eos_token_id", n, 2),
        unk=_token_id(meta, where, "tokenizer.ggml.unknown_token_id", n, 0),
        add_bos=_flag(meta, where, "tokenizer.ggml.add_bos_token", True),
        add_eos=_flag(meta, where, "tokenizer.ggml.add_eos_token", False),
        add_space_prefix=_flag(meta, where, "tokenizer.ggml.add_space_prefix", True),
    )


def _numbers(meta: dict, where: str, key: str, n: int, default: float, kinds: str) -> np.ndarray:
    value = meta.get(key)
    if value is None:
        return np.full(n, default)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds or value.ndim != 1 or len(value) != n:
        what = "number" if "f" in kinds else "integer"
        got = f"{len(value)} values" if isinstance(value, (list, np.ndarray)) else type(value).__name__
        raise ColibriError(f"{where}: metadata {key!r} must be one {what} per token ({n}), got {got}")
    return value


def _token_id(meta: dict, where: str, key: str, n: int, default: int) -> int | None:
    value = meta.get(key)
    if value is None:  # llama.cpp's default, if the vocabulary is that large
        return default if default < n else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ColibriError(f"{where}: metadata {key!r} must be a token id below {n}, got {value!r}")
    return value


def _flag(meta: dict, where: str, key: str, default: bool) -> bool:
    value = meta.get(key, default)
    if not isinstance(value, bool):
        raise ColibriError(f"{where}: metadata {key!r} must be true or false")
    return value


def _word(value: float) -> str:
    """NaN, +inf or -inf, as the messages spell a score that is not a finite number."""
    return "NaN" if np.isnan(value) else f"{value:+}"
