"""Host-side text <-> token ids through the model's tokenizer (tokenizer.json, or a GGUF file's
metadata: byte-level BPE through the tokenizers library, SentencePiece through llama.cpp's own
algorithm); the firmware sees only ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from ..errors import ColibriError
from ..files import check_json_nesting, optional_file, read_limited
from . import vocab_limits
from .gguf import is_gguf


class _Backend(Protocol):
    def encode(self, text: str, add_special: bool) -> list[int]: ...
    def decode(self, ids: list[int], skip_special: bool) -> str: ...


class _HfBackend:
    """A `tokenizers.Tokenizer` behind the backend's two calls."""

    def __init__(self, tok: Any):  # a tokenizers.Tokenizer (imported where it is made)
        self._tok = tok

    def encode(self, text: str, add_special: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special).ids)

    def decode(self, ids: list[int], skip_special: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        text = _checked_tokenizer_json(path)
        try:
            self._backend: _Backend = _HfBackend(HFTokenizer.from_str(text))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise ColibriError(f"{path.name}: cannot load tokenizer ({str(e).splitlines()[0]})") from None

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
                backend = _HfBackend(build_tokenizer(gguf))
            else:
                return None
            tokenizer = Tokenizer.__new__(Tokenizer)
            tokenizer._backend = backend
            return tokenizer
        path = Path(model_dir) / "tokenizer.json"
        return Tokenizer(path) if optional_file(path, str(path)) else None

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The ids of `text`; special=False: without the tokens the tokenizer adds (BOS), for text
        that spells its special tokens itself (a rendered chat template)."""
        return self._backend.encode(text, special)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special)

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
