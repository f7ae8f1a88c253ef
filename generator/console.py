"""What a command says to the person at the terminal: progress and warnings on stderr, the text
of a decode as it arrives, the user's chat messages. On the ground floor, so every stage may use it.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Protocol

from .errors import ColibriError
from .files import PROMPT_BYTES, checked_text, utf8_text


def counted(n: int, noun: str) -> str:
    """'1 token', '2 tokens': a count and its noun, plural when it is not one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"colibri: warning: {message}", file=sys.stderr, flush=True)


class Decoder(Protocol):
    """What TextStream needs of a tokenizer (model.tokenizer.Tokenizer is one)."""

    def decode(self, ids: list[int]) -> str: ...
    def unsettled(self, text: str) -> int: ...


class TextStream:
    """Prints the prompt and then the generated text as tokens arrive (decoding the whole suffix
    each time keeps multi-token characters and spacing right). Nothing is printed before the
    first token, and end_line() closes a started line, so an error never follows half a line."""

    def __init__(self, tokenizer: Decoder | None, enabled: bool, echo: str | None = None):
        self.tokenizer, self.enabled, self.echo = tokenizer, enabled, echo
        self.ids: list[int] = []
        self.shown = ""
        self.open = False

    def _print(self, text: str) -> None:
        if text:
            print(text, end="", flush=True)
            self.open = True

    def __call__(self, step: int, token: int) -> None:
        self.ids.append(token)
        if not self.enabled:
            return
        if len(self.ids) == 1 and self.echo and self.tokenizer is not None:
            self._print(self.echo)
        if self.tokenizer is None:
            self._print(f"{token} ")
            return
        text = self.tokenizer.decode(self.ids)
        self._show(text[: len(text) - self.tokenizer.unsettled(text)])

    def _show(self, text: str) -> None:
        if text.startswith(self.shown):
            self._print(text[len(self.shown) :])
            self.shown = text

    def end_line(self) -> None:
        if self.enabled and self.tokenizer is not None and self.ids:
            self._show(self.tokenizer.decode(self.ids))  # what a later token could have changed
        if self.open:
            print(flush=True)
            self.open = False


def user_messages(interactive: bool) -> Iterator[str]:
    """The user's messages: prompted for on a terminal, else one per line of standard input (UTF-8,
    a line within files.PROMPT_BYTES)."""
    for number in itertools.count(1):
        where = f"standard input, line {number}"
        if interactive:
            try:
                line = checked_text(input("you> "), where)
            except EOFError:
                print(file=sys.stderr)
                return
        else:
            raw = sys.stdin.buffer.readline(PROMPT_BYTES + 1)
            if not raw:
                return
            if len(raw) > PROMPT_BYTES:
                raise ColibriError(f"{where}: longer than the limit of {PROMPT_BYTES:,} bytes")
            line = utf8_text(raw, where).removesuffix("\n")
        if line.strip():
            yield line
