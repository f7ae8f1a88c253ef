"""A GGUF file's tokenizer, built with the `tokenizers` library from the file's metadata.

`tokenizer.ggml.model` "gpt2" is byte-level BPE: `tokenizer.ggml.tokens` (id order), `merges`
("a b" pairs, by rank), `token_type` (control tokens become special added tokens, user-defined ones
plain added tokens), `pre` (llama.cpp's name for the pre-tokenizer: the regex that splits text
before BPE), `bos_token_id` with `add_bos_token`, `eos_token_id` with `add_eos_token`.
SentencePiece "llama" vocabularies are spm_vocab.py and spm_tokenizer.py (llama.cpp's own algorithm).
The chat template (`tokenizer.chat_template`) is returned as text, never rendered here.

Most pre-tokenizers are a Hugging Face `Split`; those of DeepSeek-LLM, DeepSeek-V3 and Kimi-K2 files
cut the text as llama.cpp cuts it (unicode.cpp, unicode_regex_split), which a `Split` would not:
llama.cpp applies a pre-type's regexes one after the other, each to every piece the previous one
left (the matches and the text between them become pieces). It runs no Unicode regex engine: a
regex that names a category (\\p{N}, \\p{L}, \\p{P}, \\p{M}, \\p{S}) runs on a "collapsed" text in
which every code point above 127 is one placeholder for its category (whitespace: a vertical tab,
anything else: one more placeholder) and each \\p{X} becomes its placeholder plus the ASCII members
of X; any other regex runs on the code points with non-ASCII whitespace replaced by a vertical tab
(so "\\u3000-\\u3002" no longer matches the ideographic space). Both are ECMAScript regexes whose \\s
is ASCII whitespace and whose $ is the end of the piece. Kimi-K2's regex needs set intersection
(letters that are not Han), so llama.cpp splits it with a hand-written matcher, ported here line by
line. The categories come from Python's unicodedata, llama.cpp's from its own copy of
UnicodeData.txt: the two differ only where their Unicode versions do.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

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
# llama.cpp's own regex lists, each applied to the pieces the one before left (llama_split.py):
# letters, punctuation, whitespace, CJK and digits of DeepSeek-LLM; 1-3 digits, CJK and kana, then
# words of DeepSeek-V3 (its list spelled as llama-vocab.cpp spells it, non-ASCII as escapes).
DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
)
DEEPSEEK_V3_SPLITS = (
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)

KIMI_K2 = "\\p{Han}+"  # llama.cpp's name for its hand-written Kimi-K2 matcher (_kimi_k2_split)


@dataclass(frozen=True)
class PreTokenizer:
    split: str | None  # a regex applied before byte-level BPE; None: GPT-2's own regex
    individual_digits: bool = False  # every digit its own piece first (SmolLM)
    ignore_merges: bool = False  # a piece that is a whole token is taken whole (llama3)
    nfc: bool = False  # the model's own tokenizer.json normalises to NFC (Qwen2)
    llama_splits: tuple[str, ...] = ()  # instead of `split`: llama.cpp's regex list, split as it splits


PRE_TOKENIZERS = {
    "default": PreTokenizer(None),
    "gpt-2": PreTokenizer(None),
    "smollm": PreTokenizer(None, individual_digits=True),
    "llama-bpe": PreTokenizer(LLAMA3_SPLIT, ignore_merges=True),
    "llama3": PreTokenizer(LLAMA3_SPLIT, ignore_merges=True),
    "qwen2": PreTokenizer(QWEN2_SPLIT, nfc=True),
    "deepseek-llm": PreTokenizer(None, llama_splits=DEEPSEEK_LLM_SPLITS),
    "deepseek-v3": PreTokenizer(None, llama_splits=DEEPSEEK_V3_SPLITS),
    "glm4": PreTokenizer(LLAMA3_SPLIT, ignore_merges=True),
    "kimi-k2": PreTokenizer(None, llama_splits=(KIMI_K2,)),
}


# unicode-data.cpp's unicode_set_whitespace (Unicode's White_Space property).
WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
VERTICAL_TAB = "\x0b"
# The placeholder of each category in the collapsed text, and the category's ASCII members
# (unicode.cpp: k_ucat_cpt, k_ucat_map); \p{Lu} and the other letter classes are all letters.
PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
OTHER = "\xd0"
ASCII_MEMBERS = {
    "N": "0-9",
    "L": "A-Za-z",
    "P": "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    "M": "",
    "S": "\\$\\+<->^`\\|~",
}
CATEGORY_CLASS = re.compile(r"\\p\{(N|L|P|M|S|Lu|Ll|Lt|Lm|Lo)\}")


def category(cpt: int) -> str:
    """llama.cpp's category of a code point: the first letter of its Unicode category, "U" for an
    unassigned one (Cn)."""
    cat = unicodedata.category(chr(cpt))
    return "U" if cat == "Cn" else cat[0]


def _collapsed(text: str) -> str:
    out = []
    for char in text:
        cpt = ord(char)
        if cpt < 128:
            out.append(char)
        elif cpt in WHITESPACE:
            out.append(VERTICAL_TAB)
        else:
            out.append(PLACEHOLDER.get(category(cpt), OTHER))
    return "".join(out)


def _plain(text: str) -> str:
    return "".join(VERTICAL_TAB if ord(c) > 0x7F and ord(c) in WHITESPACE else c for c in text)


@lru_cache(maxsize=None)
def _compiled(expr: str) -> tuple[re.Pattern[str], Callable[[str], str]]:
    """The regex as Python runs it, and the text it runs on (collapsed or plain)."""
    collapsed = CATEGORY_CLASS.search(expr) is not None
    out, inside, i = [], False, 0
    while i < len(expr):
        char = expr[i]
        if char == "\\":
            found = CATEGORY_CLASS.match(expr, i) if collapsed else None
            if found:
                cat = found.group(1)[0]
                members = PLACEHOLDER[cat] + ASCII_MEMBERS[cat]
                out.append(members if inside else f"[{members}]")
                i = found.end()
                continue
            out.append(expr[i : i + 2])
            i += 2
            continue
        if char == "[":
            inside = True
        elif char == "]":
            inside = False
        out.append("\\Z" if char == "$" and not inside else char)  # ECMAScript's $: the end of the piece
        i += 1
    return re.compile("".join(out), re.ASCII), (_collapsed if collapsed else _plain)


def _regex_split(text: str, expr: str, lengths: list[int]) -> list[int]:
    pattern, view = _compiled(expr)
    seen = view(text)
    out, start = [], 0
    for length in lengths:
        piece, done = seen[start : start + length], 0
        for match in pattern.finditer(piece):
            if match.start() > done:
                out.append(match.start() - done)
            if match.end() > match.start():
                out.append(match.end() - match.start())
            done = match.end()
        if done < length:
            out.append(length - done)
        start += length
    return out


def is_han(cpt: int) -> bool:
    """unicode.cpp's unicode_cpt_is_han: the CJK ideograph blocks."""
    return (
        0x4E00 <= cpt <= 0x9FFF
        or 0x3400 <= cpt <= 0x4DBF
        or 0x20000 <= cpt <= 0x2A6DF
        or 0x2A700 <= cpt <= 0x2EBEF
        or 0xF900 <= cpt <= 0xFAFF
        or 0x2F800 <= cpt <= 0x2FA1F
    )


def _kimi_k2_split(text: str, lengths: list[int]) -> list[int]:
    """unicode.cpp's unicode_regex_split_custom_kimi_k2, for
    [\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
    |[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
    |\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
    as llama.cpp matches it: letters are \\p{L} without the Han blocks (marks are not letters),
    with no upper/lower distinction."""
    cpts = [ord(c) for c in text]
    out: list[int] = []
    start = 0
    for length in lengths:
        ini, end = start, start + length
        start = end

        def cpt(pos: int) -> int:
            return cpts[pos] if ini <= pos < end else -1

        def cat(pos: int) -> str:
            return category(cpts[pos]) if ini <= pos < end else ""  # "": no flags (out of the piece)

        def space(pos: int) -> bool:
            return ini <= pos < end and cpts[pos] in WHITESPACE

        def letter(pos: int) -> bool:
            return cat(pos) == "L" and not is_han(cpt(pos))

        prev = ini

        def add(to: int) -> None:
            nonlocal prev
            if to > prev:
                out.append(to - prev)
            prev = to

        pos = ini
        while pos < end:
            c, k = cpt(pos), cat(pos)
            if is_han(c):
                while is_han(cpt(pos)):
                    pos += 1
                add(pos)
                continue
            leading = not (c in (0x0D, 0x0A) or k in ("L", "N"))
            if letter(pos) or (leading and letter(pos + 1)):
                pos += leading
                while letter(pos):
                    pos += 1
                if cpt(pos) == 0x27 and pos + 1 < end:  # (?i:'s|'t|'re|'ve|'m|'ll|'d)?
                    after = chr(cpt(pos + 1)).lower()
                    if after in ("s", "t", "m", "d"):
                        pos += 2
                    elif pos + 2 < end and (after, chr(cpt(pos + 2)).lower()) in (("r", "e"), ("v", "e"), ("l", "l")):
                        pos += 3
                add(pos)
                continue
            if k == "N":  # \p{N}{1,3}
                first = pos
                while cat(pos) == "N":
                    pos += 1
                    if pos - first >= 3:
                        add(pos)
                        first = pos
                add(pos)
                continue
            at = pos + 1 if c == 0x20 else pos  # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
            if cat(at) not in ("", "L", "N") and not space(at):
                pos = at
                while cat(pos) not in ("", "L", "N") and not space(pos):
                    pos += 1
                while cpt(pos) in (0x0D, 0x0A):
                    pos += 1
                add(pos)
                continue
            run, last_newline = 0, 0
            while space(pos + run):
                if cpt(pos + run) in (0x0D, 0x0A):
                    last_newline = pos + run + 1
                run += 1
            if last_newline:  # \s*[\r\n]+
                pos = last_newline
            elif run > 1 and pos + run < end:  # \s+(?!\S)
                pos += run - 1
            elif run:  # \s+
                pos += run
            else:
                pos += 1
            add(pos)
    return out


def split(text: str, exprs: tuple[str, ...]) -> list[tuple[int, int]]:
    """The (start, end) code point offsets of the pieces llama.cpp cuts `text` into with `exprs`."""
    lengths = [len(text)] if text else []
    for expr in exprs:
        lengths = _kimi_k2_split(text, lengths) if expr == KIMI_K2 else _regex_split(text, expr, lengths)
    spans, at = [], 0
    for length in lengths:
        spans.append((at, at + length))
        at += length
    return spans


class LlamaSplit:
    """A `tokenizers` custom pre-tokenizer that cuts each piece as `split` does."""

    def __init__(self, exprs: tuple[str, ...]):
        self.exprs = exprs

    def _cut(self, _index, normalized):
        return [normalized[a:b] for a, b in split(str(normalized), self.exprs)]

    def pre_tokenize(self, pretok) -> None:
        pretok.split(self._cut)


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
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:  # (map: a vocabulary is long)
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
    if pre.llama_splits:
        steps.append(pre_tokenizers.PreTokenizer.custom(LlamaSplit(pre.llama_splits)))
    own_regex = pre.split is None and not pre.llama_splits
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=own_regex))
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
