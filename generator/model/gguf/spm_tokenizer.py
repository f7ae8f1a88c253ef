"""SentencePiece text <-> ids exactly as llama.cpp does it for a "llama" vocabulary (src/llama-vocab.cpp:
`tokenize` with parse_special, `tokenizer_st_partition`, `llm_tokenizer_spm_session`, `detokenize`).

Encode:
1. Cut the text at every special token (control, user-defined and unknown types): the longest
   token texts first, each one at all its occurrences, left to right (llama-tokenize's default,
   parse_special on); a token with the RSTRIP attribute (Phi-3's) drops the whitespace after it.
2. Each piece of plain text gets a leading space if add_space_prefix and it is the first piece or
   follows a special token; then every " " becomes "▁".
3. Start from its characters; repeatedly merge the adjacent pair whose join is a token of the best
   score (ties: the leftmost pair).
4. Each final piece is its token, or (a character no token spells) its UTF-8 bytes as byte tokens.
BOS first if add_bos, EOS last if add_eos, when the caller asks for the tokens the tokenizer adds.

Decode (llama.cpp's detokenize with remove_special = skip_special): a leading BOS (and a trailing
EOS) is dropped when the tokenizer adds them; normal tokens with "▁" as spaces, byte tokens as their
byte, user-defined tokens as spelled, control and unknown tokens only when not skipping them. With
add_space_prefix, one leading space of the first token is dropped, unless a BOS was dropped before it
(llama.cpp keeps it then), so decode(encode(s)) == s without BOS.
"""

from __future__ import annotations

import heapq

from ...errors import ColibriError
from .spm_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, SpmVocab

SPACE = "▁"
C_WHITESPACE = " \t\n\v\f\r"  # what C's isspace() accepts, which llama.cpp's RSTRIP drops


class SpmTokenizer:
    def __init__(self, vocab: SpmVocab):
        self.vocab = vocab
        self._ids = vocab.token_ids
        self._scores = vocab.scores

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        vocab = self.vocab
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ColibriError(f"the text is not valid Unicode (at character {e.start})") from None
        ids: list[int] = []
        if add_special and vocab.add_bos:
            if vocab.bos is None:
                raise ColibriError(f"{vocab.where}: tokenizer.ggml.add_bos_token without a BOS token id")
            ids.append(vocab.bos)
        after_special = True  # the start counts as following a special token
        for piece in self._partition(text):
            if isinstance(piece, int):
                ids.append(piece)
                after_special = True
                continue
            if vocab.add_space_prefix and after_special:
                piece = " " + piece
            self._merge(piece.replace(" ", SPACE), ids)
            after_special = False
        if add_special and vocab.add_eos:
            if vocab.eos is None:
                raise ColibriError(f"{vocab.where}: tokenizer.ggml.add_eos_token without an EOS token id")
            ids.append(vocab.eos)
        return ids

    def _partition(self, text: str) -> list[str | int]:
        """The text as plain pieces (str) and special tokens (int ids), llama.cpp's order of cutting."""
        if not text:
            return []
        pieces: list[str | int] = [text]
        for special, token in self.vocab.special:
            if special not in text:  # not in the text, so in none of its pieces
                continue
            swallows_space = token in self.vocab.rstrip
            cut: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or special not in piece:
                    cut.append(piece)
                    continue
                while piece:
                    at = piece.find(special)
                    if at < 0:
                        cut.append(piece)
                        break
                    if at:
                        cut.append(piece[:at])
                    cut.append(token)
                    piece = piece[at + len(special) :]
                    if swallows_space:
                        piece = piece.lstrip(C_WHITESPACE)
            pieces = cut
        return pieces

    def _merge(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize on one escaped piece: symbols are characters (spans of
        `text`), a merged symbol's length grows and the right one's drops to 0."""
        ids, scores = self._ids, self._scores
        n = len(text)
        if n == 0:
            return
        length = [1] * n
        prev = list(range(-1, n - 1))
        following = list(range(1, n + 1))
        following[-1] = -1
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, size): best score, then leftmost

        def try_pair(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            size = length[left] + length[right]
            token = ids.get(text[left : left + size])  # a symbol starts at its own index
            if token is not None:
                heapq.heappush(queue, (-scores[token], left, right, size))

        for i in range(1, n):
            try_pair(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # a side merged since this pair was queued
            length[left] = size
            length[right] = 0
            following[left] = following[right]
            if following[right] != -1:
                prev[following[right]] = left
            try_pair(prev[left], left)
            try_pair(left, following[left])

        i = 0
        while i != -1:
            symbol = text[i : i + length[i]]
            token = ids.get(symbol)
            if token is not None:
                out.append(token)
            else:  # only a single character can be unknown: every merge made a token
                out.extend(self._byte_token(b, symbol) for b in symbol.encode("utf-8"))
            i = following[i]

    def _byte_token(self, byte: int, character: str) -> int:
        token = self.vocab.byte_ids[byte]
        if token is None:
            raise ColibriError(
                f"{self.vocab.where}: cannot encode {character!r}: no token spells it and the vocabulary has no "
                f"byte token <0x{byte:02X}>"
            )
        return token

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        vocab = self.vocab
        ids = list(ids)
        bad = next((i for i in ids if not 0 <= i < vocab.size), None)
        if bad is not None:
            raise ColibriError(f"token id {bad} is outside the vocabulary ({vocab.size})")
        strip_space = vocab.add_space_prefix
        if skip_special and vocab.add_bos and ids[:1] == [vocab.bos]:
            ids = ids[1:]
            strip_space = False
        if skip_special and vocab.add_eos and ids[-1:] == [vocab.eos]:
            ids = ids[:-1]
        out = bytearray()
        for k, token in enumerate(ids):
            piece = self._piece(token, skip_special)
            if k == 0 and strip_space and piece.startswith(b" "):
                piece = piece[1:]
            out += piece
        return out.decode("utf-8", errors="replace")

    def _piece(self, token: int, skip_special: bool) -> bytes:
        kind, text = self.vocab.types[token], self.vocab.tokens[token]
        if kind in (CONTROL, UNKNOWN):
            return b"" if skip_special else text.encode()
        if kind == USER_DEFINED:
            return text.encode()
        if kind == NORMAL:
            return text.replace(SPACE, " ").encode()
        if kind == BYTE:
            return bytes([self.vocab.byte_values[token]])
        return b""  # unused and undefined tokens spell nothing, as in llama.cpp
