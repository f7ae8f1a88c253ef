"""Boards as data: targets/<name>.toml, one declarative file per board, read into a typed Board
(or a board file of one's own, given by its path: `--board path/to/board.toml`). A board file may
extend another board and say only what differs (below the fields).

Common fields (every board):
  extends, unset (optional): the board of targets/ this one starts from, and what of it not to take
              (below)
  name, description, isa, bsp (firmware_src/bsp/<bsp>), kernels (runtime/kernels/<k>.c),
  default_ctx, program (linked file name)
  prefill_batch (optional, default 1): prompt tokens per forward pass; their activations all
              live in the scratch arena, so MCU boards keep it small
  speculate_tokens (optional, default 0): the most tokens one pass of exact speculative decoding
              feeds (the sampled one and drafted ones), at most prefill_batch; each costs a
              vocabulary of logits in scratch, so MCU boards leave it at 0 (off)
  speculate_pass_cost (with speculate_tokens): what a forward pass of 1, 2, ... speculate_tokens
              tokens costs on the board relative to a pass of one (1.0 first, never falling): a
              draft is as long as makes the most expected tokens per cost (app/speculate.c)
  [toolchain] cc, apt (Debian packages providing it), cflags, ldflags, libs, linker_script (optional)
  [toolchain.sysroot] (optional) a Debian root of the board's architecture the build compiles and
              links against, made once by the setup with mmdebstrap: arch, packages, include and
              lib (folders inside it): Sysroot in boards/board.py
  [runner]    kind: "process" (a Linux program; `emulator` prefixes it when this machine's ISA
              differs), "qemu-system" (`command` with {program} {flash_image} {uart_fd}),
              "serial" (a real board on a serial port) or "none" (build only): boards/runners.py;
              weights: "file" | "mapped" (read in place at the base of the region holding
              weights) | "embedded" (linked into the program) | "partition" (an ESP-IDF data partition);
              "mpi" (the process as several ranks of one model, started by `launcher`, default
              ["mpirun"], with --hosts / --hostfile: docs/several-boards.md);
              remote_prefix (process boards, optional): what the program is started under on a
              board reached over SSH (--remote); real boards leave it empty, the tests put
              qemu-aarch64 there to run linux-aarch64 through an sshd on this x86 machine
  [[memory]]  name, kind (sram | psram | flash | dram), base, size (0 = no fixed budget), holds
              (which of code, weights, expanded_weights, kv_cache, scratch, rope_tables live
              there; a board naming a region for expanded_weights gets q4_0 matrices expanded to
              int8 there at load whenever they fit)
  kv_type     (optional, default "f16") how the KV cache holds keys and values when --kv-type is not
              given: "f32", "f16" (binary16) or "q8_0" (docs/numerics.md, "KV cache")
  parallel    (optional, default "none") runtime/parallel/<name>.c: "pthread" on Linux boards
  code_reserve (optional) bytes set aside for code, constants and stack when checking a plan's fit
              before anything is compiled
  memory_budget (optional, Linux boards, default 0) the default --memory-budget in bytes: the RAM the
              firmware may use, its routed experts paged through a pool of slots read from the
              image file (compile/cache_plan.py); 0 = unlimited, experts used from the mapped image;
              or a string as --memory-budget takes it ("6G", "auto", "auto-256M")
  budget_reserve (optional, Linux boards, default 0) bytes a budget sets aside besides the plan's
              arenas and resident weights: code, C library, stacks, the I/O thread (compiled into
              the firmware, which sizes its slots from the same numbers)
  [flash]     (boards flashed with esptool) chip, chip_id, mode, frequency, size, baud,
              supported_revisions, min_revision, load_window, app_image, flash_image, and
              [[flash.images]] (offset, file, optional name and size): what goes where in flash
  [idf]       (ESP-IDF boards) the project's settings, parsed and checked by boards/esp_idf.py
  [selftest]  (optional) the self-test built into the firmware (app/selftest.c): boot (default
              false; MCU boards) runs it at every boot, before the first request; prompt_tokens and
              steps (default 4 each) size the golden greedy decode the build embeds
  [predict]   (optional) the board's timing model (boards/predict.py); `predicts` (optional) names
              the board whose speed bench predicts from this one's exact instruction counts

Every field that reaches a command, a path or C source has a grammar (BOARD_FIELDS below, the table
docs/boards.md shows), checked before the board is built from its fields.

A board file may start from another board of targets/ (`extends = "esp32p4"`) and say only what
differs:
  - the parent is a board of targets/, named as --board names it (not a path), so a board file kept
    elsewhere may extend one of the repository's too; the parent may extend another in turn, but
    never back to a board already in the chain;
  - the board's own tables merge into the parent's key by key, at every depth; any other value
    (a string, a number, a list, an array of tables such as [[memory]] or [[flash.images]])
    replaces the parent's whole;
  - `unset = ["flash", "toolchain.linker_script"]` removes what the parent has and this board must
    not take (TOML has no empty value); each dotted key must be one the parent has;
  - `name` is the board's own: a board that extends another must set it.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ColibriError
from ..files import REPO, load_toml
from ..sizes import AutoBudget, parse_budget
from .board import CATEGORIES, DEFAULT_KV_TYPE, KV_TYPES, Board, MemoryRegion, SelftestSettings, Sysroot
from .esp_idf import parse_idf
from .flash import Flash, FlashImage
from .predict import parse_predict
from .runners import Runner, runner_from_section

TARGETS_DIR = REPO / "targets"


def available_boards() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def read_board_file(path: Path) -> dict:
    """The board file's table as if it were written whole: what it extends merged in."""
    return _resolve(path, ())[0]


def _resolve(path: Path, chain: tuple[Path, ...]) -> tuple[dict, tuple[Path, ...]]:
    """The merged table and the files it came from; chain: the files that extend this one."""
    try:
        data = load_toml(path, path.name)
    except tomllib.TOMLDecodeError as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
    parent = data.pop("extends", None)
    unset = data.pop("unset", None)
    if parent is None:
        if unset is not None:
            raise ColibriError(f"{path.name}: unset is for a board that extends another")
        return data, (path,)
    if not isinstance(parent, str) or parent not in available_boards():
        raise ColibriError(
            f"{path.name}: extends {parent!r}, which is not a board of targets/ "
            f"(available: {', '.join(available_boards())})"
        )
    if "name" not in data:
        raise ColibriError(f"{path.name}: a board that extends {parent} must set its own name")
    parent_path = TARGETS_DIR / f"{parent}.toml"
    if parent_path.resolve() in {p.resolve() for p in (*chain, path)}:
        loop = " -> ".join(p.stem for p in (*chain, path, parent_path))
        raise ColibriError(f"{path.name}: extends loops: {loop}")
    base, files = _resolve(parent_path, (*chain, path))
    for key in _dotted_keys(unset, path):
        _remove(base, key, parent, path)
    return _merged(base, data), (path, *files)


def _dotted_keys(unset: object, path: Path) -> list[str]:
    if unset is None:
        return []
    if not isinstance(unset, list) or not all(isinstance(k, str) for k in unset):
        raise ColibriError(f"{path.name}: unset must list dotted keys, got {unset!r}")
    return unset


def _remove(data: dict, key: str, parent: str, path: Path) -> None:
    *tables, last = key.split(".")
    table: object = data
    for name in tables:
        table = table.get(name) if isinstance(table, dict) else None
    if not isinstance(table, dict) or last not in table:
        raise ColibriError(f"{path.name}: unset names {key}, which {parent} does not have")
    del table[last]


def _merged(base: dict, own: dict) -> dict:
    """base with own on top: tables merged key by key, every other value replaced."""
    merged = dict(base)
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_board(name: str) -> Board:
    """A board by its name (targets/<name>.toml), or by the path of a board file of one's own (a
    name ending in .toml: a variant kept outside the repository; the paths in it, such as a linker
    script, are still the repository's)."""
    if name.endswith(".toml"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise ColibriError(f"no board file {name}")
    else:
        path = TARGETS_DIR / f"{name}.toml"
        if not path.is_file():
            raise ColibriError(f"unknown board {name!r} (available: {', '.join(available_boards())})")
    return board_from_data(read_board_file(path), path)


def board_files(board: Board) -> tuple[Path, ...]:
    """The files a loaded board was read from: its own, then each board it extends."""
    return _resolve(board.path, ())[1]


def board_reference(board: Board) -> str:
    """What load_board takes to load this board again (the build's SCons run does): its name, or
    its file's path when that is not targets/<name>.toml."""
    return board.name if board.path == TARGETS_DIR / f"{board.name}.toml" else str(board.path)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _size(data: dict, key: str, runner: Runner) -> int:
    """A byte count >= 0; a non-zero one only on boards whose weights are a file (Linux boards)."""
    value = _int(data.get(key, 0))
    if value < 0:
        raise ValueError(f"{key} must be >= 0, got {value}")
    if value and not runner.takes_memory_budget:
        raise ValueError(f"{key} is for Linux boards (runner kind 'process'), not runner {runner.kind!r}")
    return value


def _budget(data: dict, runner: Runner) -> int | AutoBudget:
    """memory_budget: a byte count, or a string as --memory-budget takes it (a size, auto, auto-MARGIN)."""
    value = data.get("memory_budget", 0)
    if not isinstance(value, str):
        return _size(data, "memory_budget", runner)
    if not runner.takes_memory_budget:
        raise ValueError(f"memory_budget is for Linux boards (runner kind 'process'), not runner {runner.kind!r}")
    return parse_budget(value)


def _flash(section: dict | None) -> Flash | None:
    if section is None:
        return None
    images = tuple(
        FlashImage(_int(i["offset"]), str(i["file"]), str(i.get("name", "")), _int(i["size"]) if "size" in i else None)
        for i in section.get("images", ())
    )
    window = section.get("load_window")
    return Flash(
        chip=str(section["chip"]),
        chip_id=_int(section["chip_id"]),
        mode=str(section["mode"]),
        frequency=str(section["frequency"]),
        size=str(section["size"]),
        baud=_int(section.get("baud", 460800)),
        supported_revisions=tuple(_int(r) for r in section["supported_revisions"]),
        images=images,
        min_revision=_int(section["min_revision"]) if "min_revision" in section else None,
        load_window=(_int(window[0]), _int(window[1])) if window is not None else None,
        app_image=section.get("app_image"),
        flash_image=section.get("flash_image"),
    )


def sysroot_from_section(section: dict | None) -> Sysroot | None:
    """[toolchain.sysroot] (its values' grammar already checked: BOARD_FIELDS); raises ValueError
    naming a missing or unknown key."""
    if section is None:
        return None
    unknown = set(section) - {"arch", "packages", "include", "lib"}
    if unknown:
        raise ValueError(f"[toolchain.sysroot] has unknown keys {sorted(unknown)}")
    if not section.get("packages"):
        raise ValueError("[toolchain.sysroot] must list its Debian packages")
    return Sysroot(
        str(section["arch"]),
        tuple(section["packages"]),
        tuple(section.get("include", ())),
        tuple(section.get("lib", ())),
    )


def _kv_type(data: dict, path: Path) -> str:
    kv_type = data.get("kv_type", DEFAULT_KV_TYPE)
    if kv_type not in KV_TYPES:
        raise ColibriError(f"{path.name}: kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
    return kv_type


def _selftest(section: dict | None, runner: Runner) -> SelftestSettings:
    if section is None:
        return SelftestSettings()
    unknown = set(section) - {"boot", "prompt_tokens", "steps"}
    if unknown:
        raise ValueError(f"[selftest] has unknown keys {sorted(unknown)}")
    boot = section.get("boot", False)
    if not isinstance(boot, bool):
        raise ValueError(f"[selftest] boot must be true or false, got {boot!r}")
    if boot and runner.takes_memory_budget:
        raise ValueError(
            "[selftest] boot is for MCU boards: a Linux firmware is a process, asked with a selftest request"
        )
    settings = SelftestSettings(boot, _int(section.get("prompt_tokens", 4)), _int(section.get("steps", 4)))
    if not (1 <= settings.prompt_tokens <= 64 and 1 <= settings.steps <= 64):
        raise ValueError("[selftest] prompt_tokens and steps must be between 1 and 64")
    return settings


def _pass_cost(data: dict, tokens: int) -> tuple[float, ...]:
    """speculate_pass_cost: one relative cost per token count of a pass of up to `tokens`."""
    costs = data.get("speculate_pass_cost")
    if tokens < 2:
        if costs is not None:
            raise ValueError("speculate_pass_cost is for boards with speculate_tokens of 2 or more")
        return ()
    if not isinstance(costs, list) or len(costs) != tokens:
        raise ValueError(f"speculate_pass_cost must list {tokens} costs, one per token count of a pass, got {costs!r}")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) for c in costs):
        raise ValueError(f"speculate_pass_cost must hold finite numbers, got {costs!r}")
    if costs[0] != 1 or any(b < a for a, b in zip(costs, costs[1:])):
        raise ValueError(f"speculate_pass_cost must start at 1.0 (a pass of one token) and never fall, got {costs!r}")
    return tuple(float(c) for c in costs)


def board_from_data(data: dict, path: Path) -> Board:
    """A Board from a parsed board file (load_board reads targets/<name>.toml into this): every
    field that reaches a command, a path or C checked against its grammar first (BOARD_FIELDS)."""
    check_board_fields(data, path)
    try:
        tc, section = data["toolchain"], data["runner"]
        memory = tuple(
            MemoryRegion(m["name"], m["kind"], _int(m.get("base", 0)), _int(m["size"]), tuple(m["holds"]))
            for m in data["memory"]
        )
        for region in memory:
            unknown = set(region.holds) - set(CATEGORIES)
            if unknown:
                raise ValueError(f"region {region.name} holds unknown categories {sorted(unknown)}")
        sysroot = sysroot_from_section(tc.get("sysroot"))
        runner = runner_from_section(section, data["isa"], sysroot.path() if sysroot else None)
        flash = _flash(data.get("flash"))
        predicts = data.get("predicts")
        if predicts is not None and not isinstance(predicts, str):
            raise ValueError(f"predicts must be a board's name, got {predicts!r}")
        speculate_tokens = _int(data.get("speculate_tokens", 0))
        board = Board(
            name=data["name"],
            description=data["description"],
            isa=data["isa"],
            bsp=data["bsp"],
            kernels=tuple(data["kernels"]),
            default_ctx=_int(data["default_ctx"]),
            program=data["program"],
            cc=tc["cc"],
            apt_packages=tuple(tc.get("apt", ())),
            cflags=tuple(tc["cflags"]),
            ldflags=tuple(tc["ldflags"]),
            libs=tuple(tc["libs"]),
            linker_script=tc.get("linker_script"),
            sysroot=sysroot,
            runner=runner,
            weights=section["weights"],
            memory=memory,
            path=path,
            prefill_batch=_int(data.get("prefill_batch", 1)),
            speculate_tokens=speculate_tokens,
            speculate_pass_cost=_pass_cost(data, speculate_tokens),
            parallel=str(data.get("parallel", "none")),
            code_reserve=_int(data.get("code_reserve", 0)),
            memory_budget=_budget(data, runner),
            budget_reserve=_size(data, "budget_reserve", runner),
            flash=flash,
            predict=parse_predict(data["predict"]) if "predict" in data else None,
            predicts=predicts,
            kv_type=_kv_type(data, path),
            selftest=_selftest(data.get("selftest"), runner),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
    if "idf" in data:
        # Parsed last, with its own messages (the field and the rule), on a board otherwise well formed.
        board = replace(board, idf=parse_idf(data["idf"], flash, path))
    return board


# ---- What a board file may hold ----
#
# Field by field: one row per field that reaches a shell, a compiler's
# command line, a path or C source, each with its grammar and the reason for it. A board file (or a
# colibri.toml naming one) is data: a value outside its grammar is refused when the board loads, with
# one line made from the row, before anything runs or is generated. docs/boards.md shows this table.
#
# The grammars are narrow on purpose. The compiler is started without a shell, and still a flag must
# be one argument of plain characters (no whitespace, quotes, `$`, backticks, `;`, `|`, `&`, `<`,
# `>`, parentheses, braces, brackets, `*`, `?`, `~`, `#`, `!`, `\`): SCons substitutes `$` itself,
# and a flag that reached a shell anywhere must mean the same there. A name that becomes a path is one
# path component; a path is relative, made of such components, never `..`. A name pasted into C is a
# C identifier, a kind one of a fixed list; free text (description) reaches C only escaped.

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
    BoardField("toolchain.sysroot.arch", PLAIN_NAME, "it is mmdebstrap's --arch and names the sysroot's folder"),
    BoardField("toolchain.sysroot.packages[]", DEBIAN_PACKAGE, "each is an argument of mmdebstrap --include"),
    BoardField("toolchain.sysroot.include[]", RELATIVE_PATH, "each is a folder inside the sysroot, an -I flag"),
    BoardField("toolchain.sysroot.lib[]", RELATIVE_PATH, "each is a folder inside the sysroot, an -L flag"),
    BoardField("runner.weights", _one_of(WEIGHT_PLACES), "it names a macro of board_def.h"),
    BoardField("runner.emulator[]", ARGUMENT, "each is one argument of the command the firmware runs under"),
    BoardField("runner.launcher[]", ARGUMENT, "each is one argument of the command that starts the ranks"),
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
