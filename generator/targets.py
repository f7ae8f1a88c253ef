"""Boards as data: targets/<name>.toml, one declarative file per board."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import ColibriError

TARGETS_DIR = Path(__file__).resolve().parent.parent / "targets"


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    kind: str  # "dram" | "sram" | "psram" | "flash"
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
    runner: str
    weights: str
    memory: tuple[MemoryRegion, ...]
    path: Path


def available_boards() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def load_board(name: str) -> Board:
    path = TARGETS_DIR / f"{name}.toml"
    if not path.is_file():
        raise ColibriError(f"unknown board {name!r} (available: {', '.join(available_boards())})")
    try:
        data = tomllib.loads(path.read_text())
        tc, runner = data["toolchain"], data["runner"]
        return Board(
            name=data["name"], description=data["description"], isa=data["isa"], bsp=data["bsp"],
            kernels=tuple(data["kernels"]), default_ctx=int(data["default_ctx"]), program=data["program"],
            cc=tc["cc"], apt_packages=tuple(tc.get("apt", ())), cflags=tuple(tc["cflags"]), ldflags=tuple(tc["ldflags"]), libs=tuple(tc["libs"]),
            runner=runner["kind"], weights=runner["weights"],
            memory=tuple(MemoryRegion(m["name"], m["kind"], int(m["size"]), tuple(m["holds"]))
                         for m in data["memory"]),
            path=path,
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
