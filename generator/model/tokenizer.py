"""Host-side text <-> token ids through the model's tokenizer (tokenizer.json, or a GGUF file's
metadata: byte-level BPE through the tokenizers library, SentencePiece through llama.cpp's own
algorithm); the firmware sees only ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..errors import ColibriError
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

        try:
            self._backend: _Backend = _HfBackend(HFTokenizer.from_file(str(path)))
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
        return Tokenizer(path) if path.is_file() else None

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
