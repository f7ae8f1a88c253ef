"""Boards as data: targets/<name>.toml, one declarative file per board.

Common fields (every board):
  name, description, isa, bsp (firmware_src/bsp/<bsp>), kernels (runtime/kernels/<k>.c),
  default_ctx, program (linked file name)
  prefill_batch (optional, default 1): prompt tokens per forward pass; their activations all
              live in the scratch arena, so MCU boards keep it small
  attention_chains (optional, 1 or 4, default 1): attention scores computed side by side (each
              still its own sum in order): 4 for out-of-order cores, 1 for in-order MCUs
  [toolchain] cc, apt (Debian packages providing it), cflags, ldflags, libs, linker_script (optional)
  [runner]    kind: "process" (a Linux program; `emulator` prefixes it when this machine's ISA
              differs), "qemu-system" (`command` with {program} {flash_image} {port}),
              "serial" (a real board on a serial port) or "none" (build only);
              weights: "file" | "mapped" (read in place at the base of the region holding
              weights) | "embedded" (linked into the program) | "partition" (an ESP-IDF data partition)
  [[memory]]  name, kind (sram | psram | flash | dram), base, size (0 = no fixed budget), holds
              (which of code, weights, expanded_weights, kv_cache, scratch, rope_tables live
              there; a board naming a region for expanded_weights gets q4_0 matrices expanded to
              int8 there at load whenever they fit)
The whole file, board-specific sections ([flash], [idf], runner options) included, is kept in
Board.data for the modules that use them.
"""

from __future__ import annotations

import platform
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ColibriError
from ..files import REPO

TARGETS_DIR = REPO / "targets"
CATEGORIES = ("code", "weights", "expanded_weights", "kv_cache", "scratch", "rope_tables")


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    kind: str  # "dram" | "sram" | "psram" | "flash"
    base: int
    size: int  # bytes; 0 = no fixed budget
    holds: tuple[str, ...]


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    isa: str
    bsp: str
    kernels: tuple[str, ...]
    default_ctx: int
    program: str
    cc: str
    apt_packages: tuple[str, ...]
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    libs: tuple[str, ...]
    linker_script: str | None
    runner: str
    weights: str
    emulator: tuple[str, ...]
    command: tuple[str, ...]
    memory: tuple[MemoryRegion, ...]
    path: Path
    prefill_batch: int = 1
    attention_chains: int = 1
    data: dict = field(default_factory=dict, compare=False, hash=False)

    def region_holding(self, category: str) -> MemoryRegion | None:
        for region in self.memory:
            if category in region.holds:
                return region
        return None

    def needs_emulator(self) -> bool:
        """A Linux-process board whose ISA is not this machine's runs under its emulator."""
        return bool(self.emulator) and platform.machine() != self.isa

    def tools(self) -> list[str]:
        """Programs that must be on PATH to build and run for this board."""
        tools = [self.cc]
        if self.needs_emulator():
            tools.append(self.emulator[0])
        if self.runner == "qemu-system" and self.command:
            tools.append(self.command[0])
        return tools


def available_boards() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def _int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _chains(value) -> int:
    if _int(value) not in (1, 4):
        raise ValueError(f"attention_chains must be 1 or 4, got {value}")
    return value


def load_board(name: str) -> Board:
    path = TARGETS_DIR / f"{name}.toml"
    if not path.is_file():
        raise ColibriError(f"unknown board {name!r} (available: {', '.join(available_boards())})")
    try:
        data = tomllib.loads(path.read_text())
        tc, runner = data["toolchain"], data["runner"]
        memory = tuple(MemoryRegion(m["name"], m["kind"], _int(m.get("base", 0)), _int(m["size"]), tuple(m["holds"]))
                       for m in data["memory"])
        for region in memory:
            unknown = set(region.holds) - set(CATEGORIES)
            if unknown:
                raise ValueError(f"region {region.name} holds unknown categories {sorted(unknown)}")
        return Board(
            name=data["name"], description=data["description"], isa=data["isa"], bsp=data["bsp"],
            kernels=tuple(data["kernels"]), default_ctx=_int(data["default_ctx"]), program=data["program"],
            cc=tc["cc"], apt_packages=tuple(tc.get("apt", ())), cflags=tuple(tc["cflags"]),
            ldflags=tuple(tc["ldflags"]), libs=tuple(tc["libs"]), linker_script=tc.get("linker_script"),
            runner=runner["kind"], weights=runner["weights"], emulator=tuple(runner.get("emulator", ())),
            command=tuple(runner.get("command", ())), memory=memory, path=path,
            prefill_batch=_int(data.get("prefill_batch", 1)),
            attention_chains=_chains(data.get("attention_chains", 1)), data=data,
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
