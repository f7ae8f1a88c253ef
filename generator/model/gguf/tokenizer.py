"""A GGUF file's tokenizer, built with the `tokenizers` library from the file's metadata.

`tokenizer.ggml.model` "gpt2" is byte-level BPE: `tokenizer.ggml.tokens` (id order), `merges`
("a b" pairs, by rank), `token_type` (control tokens become special added tokens, user-defined ones
plain added tokens), `pre` (llama.cpp's name for the pre-tokenizer: the regex that splits text
before BPE), `bos_token_id` with `add_bos_token`, `eos_token_id` with `add_eos_token`.
SentencePiece "llama" vocabularies are spm_vocab.py and spm_tokenizer.py (llama.cpp's own algorithm).
The chat template (`tokenizer.chat_template`) is returned as text, never rendered here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ColibriError
from ..vocab_limits import check_merges, check_tokens
from .file import GgufFile

# Token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), as Hugging Face tokenizer.json files spell them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    split: str | None  # a regex applied before byte-level BPE; None: GPT-2's own regex
    individual_digits: bool = False  # every digit its own piece first (SmolLM)
    ignore_merges: bool = False  # a piece that is a whole token is taken whole (llama3)
    nfc: bool = False  # the model's own tokenizer.json normalises to NFC (Qwen2)


PRE_TOKENIZERS = {
    "default": PreTokenizer(None),
    "gpt-2": PreTokenizer(None),
    "smollm": PreTokenizer(None, individual_digits=True),
    "llama-bpe": PreTokenizer(LLAMA3_SPLIT, ignore_merges=True),
    "llama3": PreTokenizer(LLAMA3_SPLIT, ignore_merges=True),
    "qwen2": PreTokenizer(QWEN2_SPLIT, nfc=True),
}


def supported(gguf: GgufFile) -> bool:
    """Does the file carry a tokenizer this module builds?"""
    return gguf.metadata.get("tokenizer.ggml.model") == "gpt2"


def chat_template(gguf: GgufFile) -> str | None:
    template = gguf.metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ColibriError(f"{gguf.path.name}: tokenizer.chat_template must be a string")
    return template


def _strings(gguf: GgufFile, key: str) -> list[str]:
    value = gguf.metadata.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ColibriError(f"{gguf.path.name}: metadata {key!r} must be an array of strings")
    return value


def _token_id(gguf: GgufFile, key: str, n: int) -> int | None:
    value = gguf.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ColibriError(f"{gguf.path.name}: metadata {key!r} must be a token id below {n}, got {value!r}")
    return value


def _flag(gguf: GgufFile, key: str, default: bool) -> bool:
    value = gguf.metadata.get(key, default)
    if not isinstance(value, bool):
        raise ColibriError(f"{gguf.path.name}: metadata {key!r} must be true or false")
    return value


def build_tokenizer(gguf: GgufFile):
    """The file's tokenizer as a `tokenizers.Tokenizer`, the name to give in messages, and the ids
    to put before and after a text with its special tokens (ColibriError for a broken or
    unsupported one)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    where = gguf.path.name
    kind = gguf.metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ColibriError(f"{where}: tokenizer model {kind!r} is not supported (supported: gpt2, byte-level BPE)")
    pre_name = gguf.metadata.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre_name, str) or pre_name not in PRE_TOKENIZERS:
        raise ColibriError(f"{where}: unsupported pre-tokenizer {pre_name!r} (supported: {', '.join(PRE_TOKENIZERS)})")
    pre = PRE_TOKENIZERS[pre_name]
    tokens = _strings(gguf, "tokenizer.ggml.tokens")
    check_tokens(where, tokens)
    merges = _strings(gguf, "tokenizer.ggml.merges")
    check_merges(where, merges)
    scores = gguf.metadata.get("tokenizer.ggml.scores")
    if isinstance(scores, np.ndarray) and scores.dtype.kind == "f" and not np.isfinite(scores).all():
        first = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise ColibriError(f"{where}: tokenizer.ggml.scores[{first}] is {_word(scores[first])}, not a finite number")
    types = gguf.metadata.get("tokenizer.ggml.token_type")
    if types is None:
        types = np.full(len(tokens), NORMAL, np.int32)
    if not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or len(types) != len(tokens):
        raise ColibriError(f"{where}: tokenizer.ggml.token_type must be one integer per token ({len(tokens)})")
    vocab = {}
    for i, text in enumerate(tokens):
        if text in vocab:
            raise ColibriError(f"{where}: token {text!r} appears twice (ids {vocab[text]} and {i})")
        vocab[text] = i
    pairs = []
    for rank, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right or left + right not in vocab or left not in vocab or right not in vocab:
            raise ColibriError(f"{where}: merge {rank} {merge!r} is not two tokens whose join is a token")
        pairs.append((left, right))

    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges, fuse_unk=False, byte_fallback=False)
    )
    if pre.nfc:
        tok.normalizer = normalizers.NFC()
    steps = []
    if pre.individual_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if pre.split is not None:
        steps.append(pre_tokenizers.Split(Regex(pre.split), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=pre.split is None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    kinds = types.tolist()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, kinds) if k == CONTROL]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, kinds) if k == USER_DEFINED])

    bos = _token_id(gguf, "tokenizer.ggml.bos_token_id", len(tokens))
    eos = _token_id(gguf, "tokenizer.ggml.eos_token_id", len(tokens))
    add_bos = _flag(gguf, "tokenizer.ggml.add_bos_token", False)
    add_eos = _flag(gguf, "tokenizer.ggml.add_eos_token", False)
    for flag, token, name in ((add_bos, bos, "bos"), (add_eos, eos, "eos")):
        if flag and token is None:
            raise ColibriError(f"{where}: tokenizer.ggml.add_{name}_token without tokenizer.ggml.{name}_token_id")
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # BOS and EOS are added around the ids by the caller: a TemplateProcessing would read their
    # texts as its own template language ("<s> $B" is two pieces, ":" a type id).
    before = (bos,) if add_bos and bos is not None else ()
    after = (eos,) if add_eos and eos is not None else ()
    return tok, where, before, after


def _word(value: float) -> str:
    """NaN, +inf or -inf, as the messages spell a score that is not a finite number."""
    return "NaN" if np.isnan(value) else f"{value:+}"
