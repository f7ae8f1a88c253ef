"""Where the repository is, writing files so that a failure never leaves half of one, and reading
the files a model or a user gives within their limits."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import ColibriError

REPO = Path(__file__).resolve().parent.parent
# The bundled model every command (and a bare `scons`) uses when none is named.
DEFAULT_MODEL = REPO / "models" / "kjv-tiny"


@contextmanager
def atomic_output(path: Path, mode: str = "wb"):
    """(file object, its temporary path) for writing `path`: a temporary file in the same directory,
    renamed onto `path` when the block ends, removed when it raises, so no partial file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f, tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write via a temporary file in the same directory, so a failure leaves no partial file."""
    with atomic_output(path) as (f, _):
        f.write(data.encode() if isinstance(data, str) else data)


def slug(text: str) -> str:
    """A name safe for a file or directory, from a model's name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"


# ---- reading a file that comes from a model or a user ------------------------------------------
#
# Every such file is read through here: a regular file (a FIFO or a device would block or never
# end), within a size limit checked before its first byte is read, and, for JSON and TOML, nested
# no deeper than MAX_NESTING (Python's parsers recurse, so a file nested 100,000 deep would end in
# a RecursionError). The limits, and why each is what it is, are docs/errors.md#file-limits.
MiB = 1 << 20
CONFIG_BYTES = 16 * MiB  # config.json, generation_config.json, tokenizer_config.json
SHARD_INDEX_BYTES = 64 * MiB  # model.safetensors.index.json
TEMPLATE_BYTES = 1 * MiB  # chat_template.jinja, --chat-template
PROMPT_BYTES = 4 * MiB  # --prompt, --prompt-file, chat's standard input
TEXT_BYTES = 64 * MiB  # eval --text, bench's texts
TOML_BYTES = 1 * MiB  # board files, colibri.toml
MAX_NESTING = 64  # JSON and TOML arrays and objects (tables) inside one another

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_unless_regular(mode: int, where: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise ColibriError(f"{where}: is {kind}, not a regular file (give a file)")


def _refuse_over(size: int, limit: int, where: str) -> None:
    if size > limit:
        raise ColibriError(f"{where}: {size:,} bytes exceed the limit of {limit:,}")


def optional_file(path: Path, where: str) -> bool:
    """Whether `path` is a regular file (False: nothing is there); anything else there (a named
    pipe, a device, a directory) is refused rather than skipped, since the build would read it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise ColibriError(f"{where}: cannot read ({e.strerror})") from None
    _refuse_unless_regular(mode, where)
    return True


def read_limited(path: Path, limit: int, where: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (ColibriError, one line, for
    anything else). Its kind and size are known before it is opened, and checked again on the open
    file, which is opened without blocking (a named pipe put in its place meanwhile is refused, not
    waited on) and read no further than the limit (a file that grows is refused too)."""
    try:
        _refuse_unless_regular(os.stat(path).st_mode, where)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ColibriError(f"{where}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        _refuse_unless_regular(st.st_mode, where)
        _refuse_over(st.st_size, limit, where)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise ColibriError(f"{where}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ColibriError(f"{where}: more than the limit of {limit:,} bytes: it grew while it was read")
    return data


def read_stream_limited(stream: BinaryIO, limit: int, where: str) -> bytes:
    """At most `limit` bytes of a stream (standard input), refused when there are more."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise ColibriError(f"{where}: more than the limit of {limit:,} bytes")
    return data


def utf8_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ColibriError(f"{where}: not UTF-8 text") from None


def checked_text(text: str, where: str) -> str:
    """Text from the command line or a terminal: Python decodes bytes that are not UTF-8 there into
    lone surrogates (surrogateescape), which no tokenizer takes; refused here in one line."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ColibriError(f"{where}: not UTF-8 text (from character {e.start:,}: bytes that are not UTF-8)") from None
    return text


def read_text_limited(path: Path, limit: int, where: str) -> str:
    """A regular file's UTF-8 text, at most `limit` bytes (read_limited)."""
    return utf8_text(read_limited(path, limit, where), where)


_NOT_QUOTE_OR_BRACKET = bytes(b for b in range(256) if b not in b'"[]{}')


def _json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in JSON text, counted without parsing it: escapes taken
    out (each backslash escapes the byte after it: pairs of backslashes first, then escaped
    quotes), then everything but quotes and brackets, then NumPy counts the brackets between
    strings. A 100 MB tokenizer.json takes a fraction of a second and a few bytes per bracket."""
    import numpy as np

    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_QUOTE_OR_BRACKET)
    marks = np.frombuffer(bare, np.uint8)
    quote = marks == ord('"')
    outside = (np.cumsum(quote, dtype=np.int32) & 1) == 0  # a bracket is no quote: its count is the one before it
    del quote
    step = (outside & ((marks == ord("[")) | (marks == ord("{")))).astype(np.int8)
    step -= outside & ((marks == ord("]")) | (marks == ord("}")))
    return int(np.cumsum(step, dtype=np.int32).max(initial=0))


def check_json_nesting(text: str | bytes, where: str) -> None:
    """Refuse JSON nested deeper than MAX_NESTING, before a parser recurses into it."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if _json_depth(data) > MAX_NESTING:
        raise ColibriError(f"{where}: JSON nested more than {MAX_NESTING} deep (the limit)")


# TOML's strings (multi-line and single-line, basic and literal) and comments, taken out before
# its brackets and dotted keys are counted.
_TOML_STRINGS = re.compile(
    "|".join((r'"""(?:\\.|[^\\])*?"""', r"'''[\s\S]*?'''", r'"(?:\\.|[^"\\\n])*"', r"'[^'\n]*'", r"#[^\n]*"))
)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# More dots than MAX_NESTING with no value, separator or bracket between them: a dotted key (a value
# has at most one dot, in a number).
_TOML_DOTTED = re.compile(r"(?:\.[^\n=,\[\]{}.]*){%d}" % (MAX_NESTING + 1))


def _toml_too_deep(text: str) -> bool:
    """Whether TOML text nests arrays, tables or dotted keys more than MAX_NESTING deep, told
    before tomllib reads it (it recurses into arrays, and a key 100,000 dots long takes it minutes
    and gigabytes)."""
    bare = _TOML_STRINGS.sub('""', text)
    depth = 0
    for c in _NOT_BRACKET.sub("", bare):
        depth += 1 if c in "[{" else -1
        if depth > MAX_NESTING:
            return True
    return _TOML_DOTTED.search(bare) is not None


def _toml_depth(data: object) -> int:
    """How deeply tables and arrays nest in a parsed TOML document (counted without recursing)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING:
                stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def load_toml(path: Path, where: str) -> dict:
    """A TOML file (a board file, colibri.toml) within TOML_BYTES and MAX_NESTING; tomllib's own
    error (TOMLDecodeError) is left to the caller, which knows what the file is for."""
    import tomllib

    text = read_text_limited(path, TOML_BYTES, where)
    too_deep = ColibriError(f"{where}: TOML nested more than {MAX_NESTING} deep (the limit)")
    if _toml_too_deep(text):
        raise too_deep
    data = tomllib.loads(text)
    if _toml_depth(data) > MAX_NESTING:  # tables in arrays in tables: each within the limit, not all together
        raise too_deep
    return data
