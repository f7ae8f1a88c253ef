"""What a board file may hold, field by field: one row per field that reaches a shell, a compiler's
command line, a path or C source, each with its grammar and the reason for it. A board file (or a
colibri.toml naming one) is data: a value outside its grammar is refused when the board loads, with
one line made from the row, before anything runs or is generated. docs/boards.md shows this table.

The grammars are narrow on purpose. The compiler is started without a shell, and still a flag must
be one argument of plain characters (no whitespace, quotes, `$`, backticks, `;`, `|`, `&`, `<`,
`>`, parentheses, braces, brackets, `*`, `?`, `~`, `#`, `!`, `\\`): SCons substitutes `$` itself,
and a flag that reached a shell anywhere must mean the same there. A name that becomes a path is one
path component; a path is relative, made of such components, never `..`. A name pasted into C is a
C identifier, a kind one of a fixed list; free text (description) reaches C only escaped."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ColibriError
from .board import CATEGORIES

INT32_MAX = 2**31 - 1
UINT64_LIMIT = 2**64
MAX_TEXT = 200  # characters of a name, flag or path: the longest in targets/ is 45

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_FLAG = re.compile(r"-[A-Za-z0-9_+=,.:/@%^-]*")
_LIB = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+.-]*")
# Debian Policy 5.6.1: lower case letters, digits, + - . ; at least two characters, starting with a
# letter or digit (so never an option to apt-get).
_DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# gcc options that run or load another program, or write where the build did not say: a board file
# names its compiler (cc), not what the compiler starts.
_REFUSED_FLAGS = ("-o", "-wrapper", "-fplugin", "-B", "--output", "-save-temps", "-dumpdir", "-dumpbase")

REGION_KINDS = ("dram", "sram", "psram", "flash")
WEIGHT_PLACES = ("file", "mapped", "embedded", "partition")


@dataclass(frozen=True)
class Grammar:
    what: str  # what a value must be, as a phrase ("a plain name ([A-Za-z0-9_.+-] ...)")
    accepts: Callable[[object], bool]


def _text(pattern: re.Pattern) -> Callable[[object], bool]:
    return lambda v: isinstance(v, str) and len(v) <= MAX_TEXT and pattern.fullmatch(v) is not None


def _relative_path(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= MAX_TEXT
        and all(_PLAIN_NAME.fullmatch(part) and part not in (".", "..") for part in value.split("/"))
    )


def _one_of(choices: tuple[str, ...]) -> Grammar:
    return Grammar(f"one of {', '.join(choices)}", lambda v: v in choices)


def _integer(low: int, high: int) -> Grammar:
    return Grammar(
        f"an integer from {low:,} to {high:,}",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high,
    )


PLAIN_NAME = Grammar("a plain name (letters, digits, _ . + -, starting with a letter or digit)", _text(_PLAIN_NAME))
RELATIVE_PATH = Grammar("a relative path of plain names (no leading /, no ..)", _relative_path)
FLAG = Grammar(
    "one compiler argument starting with - (letters, digits, _ + = , . : / @ % ^ -; none of "
    + ", ".join(_REFUSED_FLAGS)
    + ")",
    lambda v: _text(_FLAG)(v) and not _refused_flag(str(v)),
)
LIB = Grammar("a library's plain name (letters, digits, _ + . -), as -l takes it", _text(_LIB))
DEBIAN_PACKAGE = Grammar("a Debian package name (a-z 0-9 + . -, at least two characters)", _text(_DEBIAN_PACKAGE))
C_IDENTIFIER = Grammar("a C identifier (letters, digits, _, not starting with a digit)", _text(_C_IDENTIFIER))
TEXT = Grammar(f"text of at most {MAX_TEXT} characters", lambda v: isinstance(v, str) and len(v) <= MAX_TEXT)
ARGUMENT = Grammar(
    "a program argument (text without NUL or line breaks)",
    lambda v: isinstance(v, str) and len(v) <= MAX_TEXT and not any(c in v for c in "\0\r\n"),
)


def _refused_flag(flag: str) -> bool:
    return flag.startswith(_REFUSED_FLAGS)


@dataclass(frozen=True)
class BoardField:
    key: str  # dotted; `[]` after a name: every element of that list (or array of tables)
    grammar: Grammar
    why: str  # what the value becomes


BOARD_FIELDS = (
    BoardField("name", PLAIN_NAME, "it names the build directory build/<name>/ and appears in generated C"),
    BoardField("description", TEXT, "it reaches generated C only inside an escaped comment"),
    BoardField("isa", PLAIN_NAME, "it is a C string in board_def.h and picks the emulator"),
    BoardField("bsp", PLAIN_NAME, "it is the folder firmware_src/bsp/<bsp>/"),
    BoardField("kernels[]", PLAIN_NAME, "each is firmware_src/runtime/kernels/<name>"),
    BoardField("parallel", PLAIN_NAME, "it is firmware_src/runtime/parallel/<name>.c"),
    BoardField("program", RELATIVE_PATH, "it is a file inside the build directory"),
    BoardField("predicts", PLAIN_NAME, "it names a board"),
    BoardField("default_ctx", _integer(1, INT32_MAX), "it becomes COLIBRI_N_CTX, a C int"),
    BoardField("prefill_batch", _integer(1, 65536), "it sizes per-token buffers (COLIBRI_PREFILL_BATCH, a C int)"),
    BoardField("speculate_tokens", _integer(0, 64), "each token costs a vocabulary of logits in scratch"),
    BoardField("code_reserve", _integer(0, UINT64_LIMIT - 1), "it is a byte count"),
    BoardField("toolchain.cc", PLAIN_NAME, "it is the compiler's program name, looked up on PATH"),
    BoardField("toolchain.apt[]", DEBIAN_PACKAGE, "each is an argument of apt-get install, run as root"),
    BoardField("toolchain.cflags[]", FLAG, "each is one argument of the compiler's command"),
    BoardField("toolchain.ldflags[]", FLAG, "each is one argument of the linker's command"),
    BoardField("toolchain.libs[]", LIB, "each becomes the linker argument -l<name>"),
    BoardField("toolchain.linker_script", RELATIVE_PATH, "it is a file of the repository"),
    BoardField("runner.weights", _one_of(WEIGHT_PLACES), "it names a macro of board_def.h"),
    BoardField("runner.emulator[]", ARGUMENT, "each is one argument of the command the firmware runs under"),
    BoardField("runner.remote_prefix[]", ARGUMENT, "each is one argument of the command run over SSH"),
    BoardField("runner.command[]", ARGUMENT, "each is one argument of the emulator's command"),
    BoardField("memory[].name", C_IDENTIFIER, "it names the region's macros in board_def.h"),
    BoardField("memory[].kind", _one_of(REGION_KINDS), "it is written into board_def.h"),
    BoardField("memory[].base", _integer(0, UINT64_LIMIT - 1), "it is an address, written into board_def.h"),
    BoardField("memory[].size", _integer(0, UINT64_LIMIT - 1), "it is a byte count (0: no fixed budget)"),
    BoardField("memory[].holds[]", _one_of(CATEGORIES), "each is a category of bytes the plan places"),
    BoardField("flash.app_image", RELATIVE_PATH, "it is written inside the build directory"),
    BoardField("flash.flash_image", RELATIVE_PATH, "it is written inside the build directory"),
    BoardField("flash.images[].file", RELATIVE_PATH, "it is read from inside the build directory"),
    BoardField("flash.images[].offset", _integer(0, 2**32 - 1), "it is a flash offset"),
    BoardField("flash.images[].size", _integer(0, 2**32 - 1), "it is a byte count in flash"),
    BoardField("idf.project_dir", RELATIVE_PATH, "the ESP-IDF project is written there, inside the build directory"),
)


def _shown(value: object) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _found(data: object, parts: list[str], where: str) -> Iterator[tuple[str, object]]:
    """(where, value) of every value the dotted key's parts reach in data; a list where `[]` says
    one, or a table where the key goes on, is reported as itself (the row then refuses it)."""
    if not parts:
        yield where, data
        return
    part, rest = parts[0], parts[1:]
    name, each = (part[:-2], True) if part.endswith("[]") else (part, False)
    if not isinstance(data, dict) or name not in data:
        return
    value, here = data[name], f"{where}.{name}" if where else name
    if not each:
        if rest and not isinstance(value, dict):
            raise ColibriError(f"{here} must be a table, got {_shown(value)}")
        yield from _found(value, rest, here)
        return
    if not isinstance(value, list):
        raise ColibriError(f"{here} must be a list, got {_shown(value)}")
    for i, item in enumerate(value):
        if rest and not isinstance(item, dict):
            raise ColibriError(f"{here}[{i}] must be a table, got {_shown(item)}")
        yield from _found(item, rest, f"{here}[{i}]")


def check_board_fields(data: dict, path: Path) -> None:
    """Every row of BOARD_FIELDS on a board file's merged table; the first value outside its row's
    grammar is a one-line ColibriError naming the file, the field, the value and why."""
    for row in BOARD_FIELDS:
        try:
            for where, value in _found(data, row.key.split("."), ""):
                if not row.grammar.accepts(value):
                    raise ColibriError(f"{where} = {_shown(value)} is not {row.grammar.what}: {row.why}")
        except ColibriError as e:
            raise ColibriError(f"{path.name}: {e}") from None
    _check_regions_fit(data, path)


def _check_regions_fit(data: dict, path: Path) -> None:
    """A region ends inside the ISA's address space (32 bits on rv32 boards, else 64)."""
    isa = data.get("isa", "")
    bits = 32 if isinstance(isa, str) and isa.startswith("rv32") else 64
    for i, region in enumerate(data.get("memory", ())):
        if not isinstance(region, dict):
            continue
        base, size = region.get("base", 0), region.get("size", 0)
        if isinstance(base, int) and isinstance(size, int) and base + size > 2**bits:
            raise ColibriError(
                f"{path.name}: memory[{i}] ({region.get('name')}) ends at 0x{base + size:x}, beyond the "
                f"{bits}-bit address space of isa {isa}: base + size must be at most 0x{2**bits:x}"
            )
