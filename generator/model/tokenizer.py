"""Host-side text <-> token ids through the model's tokenizer (tokenizer.json, or a GGUF file's
metadata: byte-level BPE through the tokenizers library, SentencePiece through llama.cpp's own
algorithm); the firmware sees only ids."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from ..errors import ColibriError
from ..files import check_json_nesting, optional_file, read_limited
from . import vocab_limits
from .gguf import is_gguf

# The share of a Hugging Face checkpoint's rows it may have past its tokenizer's last id: padding to
# a multiple for tensor parallelism and reserved tokens (Qwen2.5: 271 of 151,936 rows, 0.18 %;
# DeepSeek-V3: 465 of 129,280, 0.36 %, the most among the families).
HF_PADDING_SHARE = 0.01


class _Backend(Protocol):
    def encode(self, text: str, add_special: bool) -> list[int]: ...
    def decode(self, ids: list[int], skip_special: bool) -> str: ...


class _HfBackend:
    """A `tokenizers.Tokenizer` behind the backend's two calls; `before` and `after`: the ids added
    around a text with its special tokens (a GGUF file's BOS and EOS, added here rather than by a
    TemplateProcessing, which would parse the tokens' texts as its template language)."""

    def __init__(self, tok: Any, where: str, before: tuple[int, ...] = (), after: tuple[int, ...] = ()):
        self._tok, self._where, self._before, self._after = tok, where, list(before), list(after)

    def size(self) -> int:
        """The ids it has a token for: its vocabulary and its added tokens."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special: bool) -> list[int]:
        with rust_panics_as_errors(self._where, "could not tokenize the text"):
            ids = list(self._tok.encode(text, add_special_tokens=add_special).ids)
        return self._before + ids + self._after if add_special else ids

    def decode(self, ids: list[int], skip_special: bool) -> str:
        with rust_panics_as_errors(self._where, "could not decode the tokens"):
            return self._tok.decode(list(ids), skip_special_tokens=skip_special)


@contextmanager
def rust_panics_as_errors(where: str, what: str):
    """A panic inside the tokenizers library (a regex from tokenizer.json that backtracks past
    Oniguruma's retry limit, say) as one ColibriError line. Rust prints a panic's message, and a
    backtrace where RUST_BACKTRACE is set, on file descriptor 2 before Python sees it: for the call,
    that descriptor goes to a scratch file, which is copied back to stderr unless the call panicked."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        panicked = None
        try:
            yield
        except BaseException as e:  # pyo3's PanicException derives from BaseException
            if type(e).__name__ != "PanicException":
                raise
            panicked = str(e).splitlines()[0] if str(e) else "a panic"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if panicked is None and scratch.tell():
                scratch.seek(0)
                os.write(2, scratch.read())
    if panicked is not None:
        raise ColibriError(f"{where}: the tokenizer {what} ({panicked[:200]})")


# transformers' clean_up_tokenization (tokenization_utils_base.py), its replacements in its order.
CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def cleans_up_spaces(config: dict, model_type: str) -> bool:
    """Whether transformers 5.24's decode cleans up the text of a tokenizer.json model of
    `model_type` with tokenizer_config.json `config`: clean_up_tokenization_spaces (default false),
    but never for a BPE model unless the config also sets BPE_CLEAN_UP (it would take out spaces
    that byte-level BPE decoded exactly)."""
    return bool(config.get("clean_up_tokenization_spaces")) and (model_type != "BPE" or bool(config.get(BPE_CLEAN_UP)))


def clean_up(text: str) -> str:
    for before, after in CLEAN_UPS:
        text = text.replace(before, after)
    return text


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        from .chat_template import read_tokenizer_config

        text = _checked_tokenizer_json(path)
        try:
            with rust_panics_as_errors(path.name, "could not be built"):
                tok = HFTokenizer.from_str(text)
                self._backend: _Backend = _HfBackend(tok, path.name)
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise ColibriError(f"{path.name}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
        config = read_tokenizer_config(path.parent / "tokenizer_config.json")
        self._clean_up = cleans_up_spaces(config, type(tok.model).__name__)

    @staticmethod
    def for_model(model_dir: Path) -> "Tokenizer | None":
        if is_gguf(model_dir):  # the tokenizer in the file's metadata, if it has one
            from .gguf.file import read_gguf
            from .gguf.spm_tokenizer import SpmTokenizer
            from .gguf.spm_vocab import is_spm, read_spm_vocab
            from .gguf.tokenizer import build_tokenizer, supported

            gguf = read_gguf(model_dir)
            backend: _Backend
            if is_spm(gguf):
                backend = SpmTokenizer(read_spm_vocab(gguf))
            elif supported(gguf):
                backend = _HfBackend(*build_tokenizer(gguf))
            else:
                return None
            tokenizer = Tokenizer.__new__(Tokenizer)
            tokenizer._backend, tokenizer._clean_up = backend, False
            return tokenizer
        path = Path(model_dir) / "tokenizer.json"
        return Tokenizer(path) if optional_file(path, str(path)) else None

    def check_covers(self, rows: int, model: Path) -> None:
        """Refuse a tokenizer.json that lacks tokens for more than padding of the model's `rows`
        output rows (HF_PADDING_SHARE): the ids past its end would be generated and decode to
        nothing. A GGUF file's vocabulary must cover every row (gguf/metadata.py refuses it at
        import)."""
        if not isinstance(self._backend, _HfBackend):
            return
        size = self._backend.size()
        if rows - size > rows * HF_PADDING_SHARE:
            raise ColibriError(
                f"{model}: tokenizer.json has {size} tokens but the model has {rows} output rows: ids "
                f"{size}..{rows - 1} would have no text (more than the {HF_PADDING_SHARE:.0%} of padding rows "
                f"a checkpoint may have; give the model's own tokenizer.json)"
            )

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The ids of `text`; special=False: without the tokens the tokenizer adds (BOS), for text
        that spells its special tokens itself (a rendered chat template)."""
        return self._backend.encode(text, special)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        text = self._backend.decode(list(ids), skip_special)
        return clean_up(text) if self._clean_up else text

    def unsettled(self, text: str) -> int:
        """How many characters at the end of a decoded `text` a later token may still change: with
        clean-up, from a last space that may yet start a clean-up's pattern (" n" of " n't")."""
        space = text.rfind(" ")
        if not self._clean_up or space < 0:
            return 0
        tail = text[space:]
        return len(tail) if any(before.startswith(tail) for before, _ in CLEAN_UPS) else 0

    def bos_id(self) -> int | None:
        """The token the tokenizer puts before a text, if it adds one (None: it adds none)."""
        with_special, without = self.encode("a"), self.encode("a", special=False)
        if len(with_special) == len(without) + 1 and with_special[1:] == without:
            return with_special[0]
        return None


def _checked_tokenizer_json(path: Path) -> str:
    """tokenizer.json's text once its vocabulary is within vocab_limits' budgets: its size, token
    count and lengths, merges, finite scores, no token listed twice, and (byte_fallback set) all 256
    byte tokens <0x00>..<0xFF>; ColibriError, one line, otherwise."""
    where = path.name
    data = read_limited(path, vocab_limits.MAX_TOKENIZER_JSON_BYTES, where)
    check_json_nesting(data, where)

    def unique(pairs):
        made = dict(pairs)
        if len(made) != len(pairs):
            seen: set = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ColibriError(f"{where}: {str(twice)[:40]!r} is listed twice in one JSON object")
        return made

    try:
        text = data.decode("utf-8")
        spec = json.loads(text, object_pairs_hook=unique)
    except UnicodeDecodeError:
        raise ColibriError(f"{where}: cannot load tokenizer (not UTF-8 text)") from None
    except ValueError as e:
        raise ColibriError(f"{where}: cannot load tokenizer (not valid JSON: {e})") from None
    if isinstance(spec, dict):
        for part in ("normalizer", "decoder"):
            growth = _growth(spec.get(part))
            if growth > MAX_GROWTH:
                raise ColibriError(
                    f"{where}: its {part} can make a text {growth:,.0f} times longer (the limit is {MAX_GROWTH})"
                )
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict):
        return text  # the tokenizers library says what is wrong
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        tokens = list(vocab)
        vocab_limits.check_tokens(where, tokens)
        if model.get("byte_fallback"):
            missing = [b for b in range(256) if f"<0x{b:02X}>" not in vocab]
            if missing:
                raise ColibriError(
                    f"{where}: byte_fallback is set but {len(missing)} of the 256 byte tokens are missing "
                    f"(the first: <0x{missing[0]:02X}>)"
                )
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs
        pairs = [v for v in vocab if isinstance(v, list) and len(v) == 2]
        tokens = [str(v[0]) for v in pairs]
        vocab_limits.check_tokens(where, tokens)
        vocab_limits.check_scores(where, [v[1] if isinstance(v[1], float) else 0.0 for v in pairs], tokens)
    merges = model.get("merges")
    if isinstance(merges, list):
        vocab_limits.check_merges(where, merges)
    added = spec.get("added_tokens")
    if isinstance(added, list):
        vocab_limits.check_tokens(
            f"{where}: added_tokens", [str(t.get("content", "")) for t in added if isinstance(t, dict)]
        )
    return text


# How many times longer a tokenizer.json's normalizer (or decoder) may make a text, in characters:
# the tokenizers library builds the whole result in memory and aborts the process (SIGABRT, not an
# exception) when it cannot, so a chain that multiplies the text (five Replace steps each turning
# "a" into ten) is refused before it is built. NFKC's worst case, 18 characters for one, is the
# largest a real tokenizer needs; the text itself is within files.PROMPT_BYTES or TEXT_BYTES.
MAX_GROWTH = 32
# Each step's worst case, characters out per character in (Unicode's normalization forms: UAX #15).
_STEP_GROWTH = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3, "BertNormalizer": 9, "ByteLevel": 4}


def _growth(step: Any) -> float:
    """The most one normalizer or decoder step (a Sequence: its steps in turn) multiplies a text's
    length by; steps that only remove, map one to one or add a constant count 1, and a step the
    library does not know is left to it to refuse."""
    if not isinstance(step, dict):
        return 1
    kind = step.get("type")
    if kind == "Sequence":
        inner = step.get("normalizers", step.get("decoders"))
        growth = 1.0
        for s in inner if isinstance(inner, list) else []:
            growth *= _growth(s)
        return growth
    if kind == "Replace":
        pattern, content = step.get("pattern"), step.get("content")
        if not isinstance(content, str) or not isinstance(pattern, dict):
            return 1
        if isinstance(pattern.get("String"), str) and pattern["String"]:
            return max(1.0, len(content) / len(pattern["String"]))
        return 1.0 + len(content)  # a regex may match one character, or none, anywhere
    if kind == "Precompiled":
        return _precompiled_growth(step.get("precompiled_charsmap"))
    return _STEP_GROWTH.get(kind, 1) if isinstance(kind, str) else 1


def _precompiled_growth(charsmap: Any) -> float:
    """A SentencePiece normalizer's charsmap (base64: a 4-byte trie size, the trie, then its
    replacements, each ending in a zero byte): at most its longest replacement, in characters, for each
    character or more it matches."""
    import base64
    import binascii
    import struct

    try:
        blob = base64.b64decode(charsmap or "", validate=True)
        (trie,) = struct.unpack_from("<I", blob)
    except (binascii.Error, struct.error, TypeError, ValueError):
        return 1  # the library refuses what it cannot read
    replacements = blob[4 + trie :].split(b"\0")
    return max(1, max((len(r.decode("utf-8", "replace")) for r in replacements), default=1))


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise ColibriError("--prompt-ids must be comma-separated integers, e.g. 1,422,13") from None
    if not ids:
        raise ColibriError("--prompt-ids is empty")
    if any(i < 0 for i in ids):
        raise ColibriError("--prompt-ids must not be negative")
    return ids
