"""The typed board: one targets/<name>.toml, every section read into typed fields when it loads
(boards/load.py), so no stage reads a board file's keys itself."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..sizes import AutoBudget
from .esp_idf import IdfSettings
from .flash import Flash
from .predict import TimingModel
from .runners import Runner

CATEGORIES = ("code", "weights", "expanded_weights", "kv_cache", "scratch", "rope_tables")
# How a KV cache may hold keys and values (docs/numerics.md, "KV cache"): float32, binary16 (the
# default), or q8_0 blocks of 32 values with a binary16 scale. --kv-type or a board's kv_type.
KV_TYPES = ("f32", "f16", "q8_0")
DEFAULT_KV_TYPE = "f16"


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    kind: str  # "dram" | "sram" | "psram" | "flash"
    base: int
    size: int  # bytes; 0 = no fixed budget
    holds: tuple[str, ...]


@dataclass(frozen=True)
class SelftestSettings:
    """The [selftest] section: the golden decode the build embeds (its prompt's length and its greedy
    steps) and whether the firmware runs the self-test at boot (MCU boards) as well as on a
    selftest request (every board)."""

    boot: bool = False
    prompt_tokens: int = 4
    steps: int = 4


# A board's sysroot: a Debian root of another architecture holding the libraries its firmware
# links against that this machine's cross toolchain lacks (arm64 Open MPI for linux-aarch64-mpi:
# Debian 12 cannot install it beside the amd64 one through multiarch).
#
# The board file's [toolchain.sysroot] says what it holds (arch, Debian packages) and which of its
# folders the build adds (include, lib); the setup makes it once with mmdebstrap
# (device/setup_toolchain.py) in $COLIBRI_SYSROOTS, else $XDG_CACHE_HOME/colibri/sysroots, else
# ~/.cache/colibri/sysroots, named by its architecture and a digest of its packages, so a board
# file asking for other packages gets a sysroot of its own. The build compiles and links with
# --sysroot and the runner's emulator finds the program's libraries there ("{sysroot}" in
# [runner] emulator: `qemu-aarch64 -L {sysroot}`).

# Written last into a sysroot mmdebstrap has made whole: a folder without it is not one.
MADE_STAMP = ".colibri-sysroot"


@dataclass(frozen=True)
class Sysroot:
    arch: str  # Debian's name of the architecture (arm64)
    packages: tuple[str, ...]  # Debian packages it holds, with what they depend on
    include: tuple[str, ...] = ()  # folders inside it added to the include path (-I)
    lib: tuple[str, ...] = ()  # folders inside it added to the library path (-L)

    def path(self) -> Path:
        """Where this machine keeps it (made or not)."""
        base = os.environ.get("COLIBRI_SYSROOTS")
        if base:
            root = Path(base).expanduser()
        else:
            root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "colibri" / "sysroots"
        digest = hashlib.sha256(" ".join(sorted(self.packages)).encode()).hexdigest()[:12]
        return root.resolve() / f"{self.arch}-{digest}"

    def is_made(self) -> bool:
        return (self.path() / MADE_STAMP).is_file()

    def compile_flags(self) -> list[str]:
        root = self.path()
        return [f"--sysroot={root}", *(f"-I{root / d}" for d in self.include)]

    def link_flags(self) -> list[str]:
        root = self.path()
        return [f"--sysroot={root}", *(f"-L{root / d}" for d in self.lib)]


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
    runner: Runner  # how the firmware runs and what that allows (boards/runners.py)
    weights: str  # "file" | "mapped" | "embedded" | "partition"
    memory: tuple[MemoryRegion, ...]
    path: Path
    prefill_batch: int = 1
    speculate_tokens: int = 0  # tokens a speculative verification pass may feed (0: no speculative decoding)
    # what a pass of 1, 2, ... speculate_tokens tokens costs relative to a pass of one (drafts' lengths)
    speculate_pass_cost: tuple[float, ...] = ()
    parallel: str = "none"  # runtime/parallel/<name>.c
    code_reserve: int = 0
    memory_budget: int | AutoBudget = 0  # default --memory-budget (Linux boards): bytes (0: unlimited) or auto
    budget_reserve: int = 0  # counted against a memory budget besides the plan (code, libc, stacks)
    flash: Flash | None = None
    idf: IdfSettings | None = None  # the [idf] section with [flash]: an ESP-IDF project
    predict: TimingModel | None = None  # the [predict] section: this board's timing model
    predicts: str | None = None  # the board whose speed bench predicts from this one's instruction counts
    kv_type: str = DEFAULT_KV_TYPE  # the KV cache's type when --kv-type is not given (KV_TYPES)
    selftest: SelftestSettings = field(default_factory=lambda: SelftestSettings())  # the [selftest] section
    sysroot: Sysroot | None = None  # [toolchain.sysroot]: the libraries the firmware links against (Sysroot)

    @property
    def is_esp_idf(self) -> bool:
        """An ESP-IDF project that idf.py builds (not a program this build links itself)."""
        return self.idf is not None

    @property
    def is_flashed(self) -> bool:
        """Written to flash with esptool (it has a [flash] section)."""
        return self.flash is not None

    def region_holding(self, category: str) -> MemoryRegion | None:
        for region in self.memory:
            if category in region.holds:
                return region
        return None

    def tools(self) -> list[str]:
        """Programs that must be on PATH to build and run for this board."""
        return [self.cc, *self.runner.tools()]
