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
  [runner]    kind: "process" (a Linux program; `emulator` prefixes it when this machine's ISA
              differs), "qemu-system" (`command` with {program} {flash_image} {uart_fd}),
              "serial" (a real board on a serial port) or "none" (build only): boards/runners.py;
              weights: "file" | "mapped" (read in place at the base of the region holding
              weights) | "embedded" (linked into the program) | "partition" (an ESP-IDF data partition);
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
import tomllib
from dataclasses import replace
from pathlib import Path

from ..errors import ColibriError
from ..files import REPO, load_toml
from ..sizes import AutoBudget, parse_budget
from .board import CATEGORIES, DEFAULT_KV_TYPE, KV_TYPES, Board, MemoryRegion, SelftestSettings
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
    """A Board from a parsed board file (load_board reads targets/<name>.toml into this)."""
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
        runner = runner_from_section(section, data["isa"])
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
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
    if "idf" in data:
        # Parsed last, with its own messages (the field and the rule), on a board otherwise well formed.
        board = replace(board, idf=parse_idf(data["idf"], flash, path))
    return board
