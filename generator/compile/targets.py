"""Boards as data: targets/<name>.toml, one declarative file per board.

Common fields (every board):
  name, description, isa, bsp (firmware_src/bsp/<bsp>), kernels (runtime/kernels/<k>.c),
  default_ctx, program (linked file name)
  prefill_batch (optional, default 1): prompt tokens per forward pass; their activations all
              live in the scratch arena, so MCU boards keep it small
  [toolchain] cc, apt (Debian packages providing it), cflags, ldflags, libs, linker_script (optional)
  [runner]    kind: "process" (a Linux program; `emulator` prefixes it when this machine's ISA
              differs), "qemu-system" (`command` with {program} {flash_image} {port}),
              "serial" (a real board on a serial port) or "none" (build only);
              weights: "file" | "mapped" (read in place at the base of the region holding
              weights) | "embedded" (linked into the program) | "partition" (an ESP-IDF data partition);
              remote_prefix (process boards, optional): what the program is started under on a
              board reached over SSH (--remote); real boards leave it empty, the tests put
              qemu-aarch64 there to run linux-aarch64 through an sshd on this x86 machine
  [[memory]]  name, kind (sram | psram | flash | dram), base, size (0 = no fixed budget), holds
              (which of code, weights, expanded_weights, kv_cache, scratch, rope_tables live
              there; a board naming a region for expanded_weights gets q4_0 matrices expanded to
              int8 there at load whenever they fit)
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
  [idf]       (ESP-IDF boards) the project's settings, checked by compile/idf_project.py
Every section is read into typed fields here; Board.data keeps the parsed file as it was.
"""

from __future__ import annotations

import platform
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ColibriError
from ..files import REPO
from .sizes import parse_budget

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
class FlashImage:
    offset: int
    file: str  # relative to the build directory
    name: str = ""
    size: int | None = None  # the partition's size where the board gives one


@dataclass(frozen=True)
class Flash:
    """A board's [flash] section: what esptool writes and how the ROM loader must see it."""

    chip: str
    chip_id: int
    mode: str
    frequency: str
    size: str
    baud: int
    supported_revisions: tuple[int, ...]  # chip revision majors
    images: tuple[FlashImage, ...]
    min_revision: int | None = None  # MAJOR * 100 + MINOR
    load_window: tuple[int, int] | None = None  # where a bare-metal image's segments must load
    app_image: str | None = None  # elf2image output
    flash_image: str | None = None  # the merged image written at offset 0

    def image(self, name: str) -> FlashImage | None:
        return next((i for i in self.images if i.name == name), None)


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
    parallel: str = "none"  # runtime/parallel/<name>.c
    code_reserve: int = 0
    remote_prefix: tuple[str, ...] = ()  # the program runs under this on a board reached over SSH
    memory_budget: object = 0  # default --memory-budget (Linux boards): bytes (0: unlimited) or a cache_plan.AutoBudget
    budget_reserve: int = 0  # counted against a memory budget besides the plan (code, libc, stacks)
    flash: Flash | None = None
    idf: dict | None = None  # the [idf] section; compile/idf_project.py checks it (IdfSettings)
    data: dict = field(default_factory=dict, compare=False, hash=False)

    def region_holding(self, category: str) -> MemoryRegion | None:
        for region in self.memory:
            if category in region.holds:
                return region
        return None

    def needs_emulator(self) -> bool:
        """A Linux-process board whose ISA is not this machine's runs under its emulator."""
        return bool(self.emulator) and platform.machine() != self.isa

    def emulated_by(self) -> str | None:
        """The emulator this board's firmware runs under on this machine, if it does: its speed
        is then the emulator's, not the board's."""
        if self.runner == "process" and self.needs_emulator():
            return self.emulator[0]
        if self.runner == "qemu-system" and self.command:
            return self.command[0]
        return None

    def counts_instructions_exactly(self) -> bool:
        """Whether runs report exact retired instructions (qemu with -icount): a deterministic
        count, the same on every run."""
        return self.runner == "qemu-system" and "-icount" in self.command

    def how_it_runs(self) -> str:
        """How `run`, `verify` and `bench` run this board's firmware on this machine."""
        if self.runner == "process":
            emulator = self.emulated_by()
            return (f"under {emulator} (user-mode emulation of {self.isa} on this {platform.machine()} machine)"
                    if emulator else "natively, as a process")
        if self.runner == "qemu-system":
            return f"under {self.emulated_by()} (an emulated MCU; exact instruction counts)"
        if self.runner == "serial":
            return "on the real board, over its serial port (--port)"
        return "not from here (build only)"

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


def _size(data: dict, key: str, runner: str) -> int:
    """A byte count >= 0; a non-zero one only on boards that run as a Linux process."""
    value = _int(data.get(key, 0))
    if value < 0:
        raise ValueError(f"{key} must be >= 0, got {value}")
    if value and runner != "process":
        raise ValueError(f"{key} is for Linux boards (runner kind 'process'), not runner {runner!r}")
    return value


def _budget(data: dict, runner: str):
    """memory_budget: a byte count, or a string as --memory-budget takes it (a size, auto, auto-MARGIN)."""
    value = data.get("memory_budget", 0)
    if not isinstance(value, str):
        return _size(data, "memory_budget", runner)
    if runner != "process":
        raise ValueError(f"memory_budget is for Linux boards (runner kind 'process'), not runner {runner!r}")
    return parse_budget(value)


def _flash(section: dict | None) -> Flash | None:
    if section is None:
        return None
    images = tuple(FlashImage(_int(i["offset"]), str(i["file"]), str(i.get("name", "")),
                              _int(i["size"]) if "size" in i else None) for i in section.get("images", ()))
    window = section.get("load_window")
    return Flash(chip=str(section["chip"]), chip_id=_int(section["chip_id"]), mode=str(section["mode"]),
                 frequency=str(section["frequency"]), size=str(section["size"]), baud=_int(section.get("baud", 460800)),
                 supported_revisions=tuple(_int(r) for r in section["supported_revisions"]), images=images,
                 min_revision=_int(section["min_revision"]) if "min_revision" in section else None,
                 load_window=(_int(window[0]), _int(window[1])) if window is not None else None,
                 app_image=section.get("app_image"), flash_image=section.get("flash_image"))


def load_board(name: str) -> Board:
    path = TARGETS_DIR / f"{name}.toml"
    if not path.is_file():
        raise ColibriError(f"unknown board {name!r} (available: {', '.join(available_boards())})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None
    return board_from_data(data, path)


def board_from_data(data: dict, path: Path) -> Board:
    """A Board from a parsed board file (load_board reads targets/<name>.toml into this)."""
    try:
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
            parallel=str(data.get("parallel", "none")), code_reserve=_int(data.get("code_reserve", 0)),
            remote_prefix=tuple(str(a) for a in runner.get("remote_prefix", ())),
            memory_budget=_budget(data, runner["kind"]),
            budget_reserve=_size(data, "budget_reserve", runner["kind"]),
            flash=_flash(data.get("flash")), idf=data.get("idf"), data=data,
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ColibriError(f"{path.name}: malformed board file ({e})") from None


def firmware_sources(board: Board, repo: Path = REPO) -> list[Path]:
    """The hand-written C files a board's firmware is compiled from: the runtime, the board's kernel
    sets and parallel backend, the application and the BSP. (An ESP-IDF board's BSP is compiled by
    idf.py, which supplies its headers; the SConstruct compiles the rest as a check.)"""
    src = repo / "firmware_src"
    bsp = src / "bsp" / board.bsp
    kernels = [src / "runtime" / "kernels" / f"{k}.c" for k in board.kernels]
    for kernel in kernels:
        if not kernel.is_file():
            raise ColibriError(f"board {board.name}: kernel set {kernel.stem!r} has no "
                               f"firmware_src/runtime/kernels/{kernel.name}")
    if not (bsp / "main.c").is_file():
        raise ColibriError(f"board {board.name}: no BSP at firmware_src/bsp/{board.bsp}/main.c")
    sources = (sorted((src / "runtime").glob("*.c")) + kernels
               + [src / "runtime" / "parallel" / f"{board.parallel}.c"]
               + sorted((src / "app").glob("*.c")) + sorted(bsp.glob("*.c")) + sorted(bsp.glob("*.S")))
    if board.weights == "embedded":
        sources.append(src / "runtime" / "weights_embedded.S")  # the image linked into the program
    return sources
