"""The ways a board's firmware runs, one class each, from the board file's [runner] section:

  process      a Linux program, natively or under a user-mode emulator (qemu-aarch64), here or on
               a board reached over SSH
  mpi          the same program as several ranks of one model, started by MPI's own launcher
               (Open MPI's mpirun) on this machine or on the hosts it is given
  qemu-system  an emulated MCU (qemu-system-riscv32), its UART on a local socket
  serial       a real board on a serial port
  none         build only: nothing here can run it

Each says what it can do (the option table, the release, bench and the links ask it, never its
kind's name). How a link to it is opened is the device stage's (device/links.py).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class Runner:
    """What every way of running a board answers; the defaults are a board nothing here runs."""

    kind: ClassVar[str]  # the board file's [runner] kind
    # Runs on this machine with no hardware attached (a release verifies the firmware it ships).
    runs_here: ClassVar[bool] = False
    # The firmware is a Linux program: an executable file, started with a command line.
    linux_program: ClassVar[bool] = False
    # Reached over SSH on a real board (--remote).
    takes_remote: ClassVar[bool] = False
    # Weights in a file the firmware may page through a RAM budget (--memory-budget, storage probes).
    takes_memory_budget: ClassVar[bool] = False
    # The firmware can measure the memory's read bandwidth before decoding.
    probes_bandwidth: ClassVar[bool] = False
    # The firmware can write every step's raw logits to a file (--logits-out).
    stores_raw_logits: ClassVar[bool] = False
    # Its threads take turns on the cores of the machine it runs on (a thread count above them is slow).
    runs_threads: ClassVar[bool] = False
    # A real board on a serial port: runs, flashing and monitors need the port (--port).
    needs_port: ClassVar[bool] = False
    # Runs as several ranks of one model (--hosts, --hostfile); its C: runtime/ranks/<ranks>.c.
    runs_ranks: ClassVar[bool] = False
    ranks: ClassVar[str] = "none"

    def needs_emulator(self) -> bool:
        """Whether this machine runs the firmware under a user-mode emulator (a foreign ISA)."""
        return False

    def emulated_by(self) -> str | None:
        """The emulator the firmware runs under on this machine, if it does: its speed is then the
        emulator's, not the board's."""
        return None

    def emulators(self) -> tuple[str, ...]:
        """Every emulator program this runner may start, on this machine or another."""
        return ()

    def counts_instructions_exactly(self) -> bool:
        """Whether runs report exact retired instructions (qemu with -icount): a deterministic
        count, the same on every run."""
        return False

    def how_it_runs(self) -> str:
        """How `run`, `verify` and `bench` run the firmware on this machine."""
        return "not from here (build only)"

    def tools(self) -> list[str]:
        """Programs besides the compiler that must be on PATH to run the firmware here."""
        return []


@dataclass(frozen=True)
class ProcessRunner(Runner):
    """A Linux program: natively, under `emulator` when this machine's ISA is not `isa`, or on a
    board reached over SSH under `remote_prefix` (empty on real boards; qemu-aarch64 in tests).
    "{sysroot}" in `emulator` is the board's sysroot (Sysroot, boards/board.py): where a dynamically linked
    program's libraries are (`qemu-aarch64 -L {sysroot}`)."""

    isa: str
    emulator: tuple[str, ...] = ()
    remote_prefix: tuple[str, ...] = ()
    sysroot: Path | None = None

    kind: ClassVar[str] = "process"
    runs_here: ClassVar[bool] = True
    linux_program: ClassVar[bool] = True
    takes_remote: ClassVar[bool] = True
    takes_memory_budget: ClassVar[bool] = True
    probes_bandwidth: ClassVar[bool] = True
    stores_raw_logits: ClassVar[bool] = True
    runs_threads: ClassVar[bool] = True

    def needs_emulator(self) -> bool:
        return bool(self.emulator) and platform.machine() != self.isa

    def emulated_by(self) -> str | None:
        return self.emulator[0] if self.needs_emulator() else None

    def emulators(self) -> tuple[str, ...]:
        return self.emulator[:1]

    def how_it_runs(self) -> str:
        emulator = self.emulated_by()
        return (
            f"under {emulator} (user-mode emulation of {self.isa} on this {platform.machine()} machine)"
            if emulator
            else "natively, as a process"
        )

    def tools(self) -> list[str]:
        return [self.emulator[0]] if self.needs_emulator() else []

    def program_prefix(self) -> list[str]:
        """What the program itself is started under here: its emulator where this machine needs one."""
        if not self.needs_emulator():
            return []
        return [a.replace("{sysroot}", str(self.sysroot or "")) for a in self.emulator]

    def start_prefix(self, hosts: Sequence[str] = ()) -> list[str]:
        """The command line before the program's own: here, its emulator where one is needed."""
        return self.program_prefix()


def running_as_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class MpiRunner(ProcessRunner):
    """The Linux program as several ranks of one model (runtime/ranks/mpi.c), started by `launcher`
    (Open MPI's mpirun) with mpirun's own host syntax: `hosts` are its arguments (--host H:S,... or
    --hostfile F), one rank on this machine when none are given. Rank 0 alone talks the link."""

    launcher: tuple[str, ...] = ("mpirun",)

    kind: ClassVar[str] = "mpi"
    runs_ranks: ClassVar[bool] = True
    ranks: ClassVar[str] = "mpi"
    takes_remote: ClassVar[bool] = False  # the hosts are mpirun's (--hosts), not one board's SSH
    probes_bandwidth: ClassVar[bool] = False  # every rank would probe the same memory
    stores_raw_logits: ClassVar[bool] = False  # rank 0's file only: not wired yet

    def how_it_runs(self) -> str:
        return f"as MPI ranks started by {self.launcher[0]} ({super().how_it_runs()} each)"

    def tools(self) -> list[str]:
        return [self.launcher[0], *super().tools()]

    def launcher_prefix(self, hosts: Sequence[str] = ()) -> list[str]:
        """mpirun and its options, before the ranks' programs (each under program_prefix)."""
        # As root, Open MPI refuses to start without being told; more ranks than cores (--hosts
        # localhost:4 on two) need --oversubscribe, else it refuses that too. A rank waiting in a
        # collective yields its core: spinning, 4 ranks on 2 cores took 90 s for what takes 1.6 s.
        root = ["--allow-run-as-root"] if running_as_root() else []
        where = list(hosts) if hosts else ["--host", "localhost:1"]
        waiting = ["--mca", "mpi_yield_when_idle", "1"]
        return [*self.launcher, *root, "--oversubscribe", *waiting, *where]

    def start_prefix(self, hosts: Sequence[str] = ()) -> list[str]:
        return [*self.launcher_prefix(hosts), *self.program_prefix()]


@dataclass(frozen=True)
class EmulatedSystemRunner(Runner):
    """An emulated MCU: `command` (with {program}, {flash_image} and {uart_fd} filled in) starts the
    system emulator, whose UART is a local TCP socket the host talks to as to a serial port; {uart_fd}
    is that socket, already listening, inherited by the emulator."""

    command: tuple[str, ...] = ()

    kind: ClassVar[str] = "qemu-system"
    runs_here: ClassVar[bool] = True

    def emulated_by(self) -> str | None:
        return self.command[0] if self.command else None

    def emulators(self) -> tuple[str, ...]:
        return self.command[:1]

    def counts_instructions_exactly(self) -> bool:
        return "-icount" in self.command

    def how_it_runs(self) -> str:
        return f"under {self.emulated_by()} (an emulated MCU; exact instruction counts)"

    def tools(self) -> list[str]:
        return [self.command[0]] if self.command else []


@dataclass(frozen=True)
class SerialRunner(Runner):
    """A real board on a serial port: requests and frames over its UART."""

    kind: ClassVar[str] = "serial"
    needs_port: ClassVar[bool] = True

    def how_it_runs(self) -> str:
        return "on the real board, over its serial port (--port)"


@dataclass(frozen=True)
class BuildOnlyRunner(Runner):
    """A board this machine only builds for."""

    kind: ClassVar[str] = "none"


RUNNER_KINDS: dict[str, type[Runner]] = {
    r.kind: r for r in (ProcessRunner, MpiRunner, EmulatedSystemRunner, SerialRunner, BuildOnlyRunner)
}


def runner_from_section(section: dict, isa: str, sysroot: Path | None = None) -> Runner:
    """The [runner] section's kind with its fields (sysroot: where the toolchain's is, which the
    emulator may name); raises ValueError naming a wrong one."""
    kind = section["kind"]
    if kind not in RUNNER_KINDS:
        raise ValueError(f"runner kind {kind!r} is not one of {', '.join(RUNNER_KINDS)}")
    emulator = _strings(section, "emulator")
    if sysroot is None and any("{sysroot}" in a for a in emulator):
        raise ValueError("[runner] emulator names {sysroot}, but the board has no [toolchain.sysroot]")
    if kind == "process":
        return ProcessRunner(isa, emulator, _strings(section, "remote_prefix"), sysroot)
    if kind == "mpi":
        return MpiRunner(
            isa,
            emulator,
            _strings(section, "remote_prefix"),
            sysroot,
            launcher=_strings(section, "launcher") or MpiRunner.launcher,
        )
    if kind == "qemu-system":
        return EmulatedSystemRunner(command=_strings(section, "command"))
    return RUNNER_KINDS[kind]()


def _strings(section: dict, key: str) -> tuple[str, ...]:
    value = section.get(key, ())
    if isinstance(value, str) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"[runner] {key} must be a list of strings, got {value!r}")
    return tuple(value)
