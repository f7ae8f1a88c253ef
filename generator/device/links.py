"""Links to a board's firmware: open_link() for every way a board runs, a link with turn(request).

A run is one turn; a chat is several turns on one link kept open, the conversation continuing in
the firmware's KV cache. Each way a board runs (boards/runners.py) has its link here: a Linux
program (here, under its emulator, or over SSH), an emulated MCU (qemu-system, its UART on a local
socket) and a real board on a serial port; a build-only board has none, and open_link refuses it.
The frames are interpreted the same way on every link, by Session.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from ..boards import Board, EmulatedSystemRunner, MpiRunner, ProcessRunner, Runner, SerialRunner
from ..compile import image_format as fmt
from ..compile.image import map_image, read_header
from ..compile.layout import rank_image_name
from ..errors import ColibriError
from ..files import read_text_limited
from .hosts import HOSTFILE_BYTES, explain_ranks, hosts_for
from .process import Explain, ProcessLink, explain_local, run_process
from .remote import Remote, check_remote_machine, explain_remote, remote_command, remote_prefix, run_remote
from .serial_link import SerialLink, Timeouts
from .session import RunRequest, RunResult, Session, request_frame

OnToken = Callable[[int, int], None]
HelloCheck = Callable[[dict[str, str]], None]
Progress = Callable[[str], None]


def default_timeout(request: RunRequest, weights_bytes: int) -> float:
    """Generous for this machine: 20 s to start plus time for every token at >= 20 MB/s of weights."""
    per_token = max(0.05, weights_bytes / 20e6)
    return 20.0 + per_token * request.tokens_of_work()


def listening_socket() -> socket.socket:
    """A TCP socket on a free 127.0.0.1 port, already listening. It is handed to the emulator
    rather than its port number: a port looked up, closed and named to the emulator could be
    taken in between by another emulator, whose board would then answer this one's requests."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def local_prefix() -> list[str]:
    """COLIBRI_FIRMWARE_PREFIX: a command a local Linux-board firmware is started under (split like a
    shell would), e.g. tools/in-memory-cgroup NAME to run it alone in a memory cgroup."""
    return shlex.split(os.environ.get("COLIBRI_FIRMWARE_PREFIX", ""))


@dataclass(frozen=True)
class Firmware:
    """What a link runs: the built program and weight image, and what its hello frame must say."""

    program: Path
    weights: Path
    expected_model: str
    flash_image: Path | None = None  # an emulated MCU's flash contents (default: the weight image)
    check_hello: HelloCheck | None = None  # see Session
    rank_weights: tuple[Path, ...] = ()  # a build for several MPI ranks: each rank's image, rank 0 first

    def session(self, on_token: OnToken | None) -> Session:
        return Session(self.expected_model, on_token, self.check_hello)


@dataclass(frozen=True)
class LinkOptions:
    """How to reach the firmware: the Linux firmware's command line (`options`: a memory budget, from
    RunRequest.firmware_options; `logits_out`), a board over SSH, a serial port; `keep_open`: one
    firmware serves every turn (a chat), else each turn is a run of its own."""

    options: tuple[str, ...] = ()
    logits_out: Path | None = None
    remote: Remote | None = None
    progress: Progress | None = None
    port: str | None = None
    reset: bool = False
    keep_open: bool = False
    hosts: tuple[str, ...] = ()  # where MPI ranks run: mpirun's --host/--hostfile (device/hosts.py)


class Link:
    """An open way to the firmware: turn() sends one request and reads its frames back."""

    def turn(self, request: RunRequest, on_token: OnToken | None = None, timeout: float | None = None) -> RunResult:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class LinuxLink(Link):
    """A Linux firmware: here (natively or under its emulator) or on a board over SSH. Kept open, one
    process reads every turn's request frame from its stdin; else each turn starts the firmware,
    sends it the request, closes its stdin and reads until it exits."""

    def __init__(self, board: Board, firmware: Firmware, how: LinkOptions):
        self.board, self.firmware, self.how = board, firmware, how
        self.turns = 0
        self.process: ProcessLink | None = None
        if how.keep_open:
            if how.remote is not None:
                argv, _ = remote_command(
                    how.remote, board, firmware.program, firmware.weights, list(how.options), how.progress
                )
                self.process = ProcessLink(argv, explain_remote(how.remote))
            else:
                self.process = ProcessLink(self.local_argv(), self.explain())

    def weights_bytes(self) -> int:
        return self.firmware.weights.stat().st_size

    def explain(self) -> Explain:
        """How an early end is told: mpirun's ranks by rank and host, a process by its status."""
        return explain_rank_end if self.board.runner.runs_ranks else explain_local

    def local_argv(self) -> list[str]:
        runner = self.board.runner
        assert isinstance(runner, ProcessRunner)
        options = [*self.how.options]
        if self.how.logits_out is not None:
            options += ["--logits-out", str(self.how.logits_out)]
        images = self.firmware.rank_weights
        if runner.runs_ranks:
            check_rank_count(images, self.how.hosts)
        if not images:
            program = [str(self.firmware.program), "--weights", str(self.firmware.weights), *options]
            return [*local_prefix(), *runner.start_prefix(self.how.hosts), *program]
        check_rank_images(images, self.firmware.expected_model)
        assert isinstance(runner, MpiRunner)
        # One application context per rank (mpirun's A : B), each given its own image: rank r is the
        # r-th; each rank's program under its emulator where this machine needs one.
        under = runner.program_prefix()
        contexts = [
            ["-np", "1", *under, str(self.firmware.program), "--weights", str(image), *options] for image in images
        ]
        launcher = runner.launcher_prefix(self.how.hosts)
        return [*local_prefix(), *launcher, *[a for c in contexts for a in [*c, ":"]][:-1]]

    def turn(self, request: RunRequest, on_token: OnToken | None = None, timeout: float | None = None) -> RunResult:
        session = self.firmware.session(on_token)
        remote = self.how.remote
        if self.process is None:
            result = self._run(request, session, timeout)
        else:
            if timeout is None:
                slow = self.board.runner.needs_emulator() or remote is not None
                timeout = default_timeout(request, self.weights_bytes()) * (4 if slow else 1)
            self.process.send(request_frame(request, seq=self.turns))
            result = self.process.read_until_done(session, timeout)
            if remote is not None and self.turns == 0:
                check_remote_machine(remote, self.board, result.hello)
        self.turns += 1
        return result

    def _run(self, request: RunRequest, session: Session, timeout: float | None) -> RunResult:
        """One run of its own: the firmware exits after serving the request."""
        remote = self.how.remote
        if remote is not None:
            if timeout is None:
                # The board may be slower than this machine; connecting takes a few seconds more.
                timeout = 10 + default_timeout(request, self.weights_bytes()) * (4 if remote_prefix(self.board) else 2)
            return run_remote(
                remote,
                self.board,
                self.firmware.program,
                self.firmware.weights,
                request,
                session,
                timeout,
                self.how.progress,
            )
        if timeout is None:
            timeout = default_timeout(request, self.weights_bytes()) * (4 if self.board.runner.needs_emulator() else 1)
        return run_process(self.local_argv(), request_frame(request), session, timeout, self.explain())

    def close(self) -> None:
        if self.process is not None:
            self.process.close()


def emulator_timeouts(request: RunRequest, timeout: float | None) -> Timeouts:
    if timeout is None:
        return Timeouts(boot=20.0, per_token=2.0, silence=60.0)
    return Timeouts(boot=timeout, per_token=timeout / max(1, request.tokens_of_work()), silence=timeout)


def start_emulator(
    runner: EmulatedSystemRunner, program: Path, flash_image: Path, stderr: int = subprocess.DEVNULL
) -> tuple[subprocess.Popen, int]:
    """Start the system emulator with its UART listening on a local TCP port; returns the process
    and the port (the emulator boots once something connects to it)."""
    with listening_socket() as uart:
        argv = [a.format(program=program, flash_image=flash_image, uart_fd=uart.fileno()) for a in runner.command]
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL, pass_fds=(uart.fileno(),)
        )
        return proc, uart.getsockname()[1]


class Emulator:
    """A system emulator (qemu-system) running the firmware, its UART on a local TCP socket that a
    SerialLink talks to as to a real board's port. The firmware serves requests until it is stopped."""

    def __init__(self, board: Board, program: Path, flash_image: Path):
        runner = board.runner
        assert isinstance(runner, EmulatedSystemRunner)
        self.argv = list(runner.command)
        try:
            self.proc, port = start_emulator(runner, program, flash_image, stderr=subprocess.PIPE)
        except OSError as e:
            raise ColibriError(f"cannot start {self.argv[0]}: {e.strerror}") from None
        self.link: SerialLink | None = None
        try:
            self.link = SerialLink.connect(f"socket://127.0.0.1:{port}", time.monotonic() + 20.0)
        except ColibriError:
            self.close()
            raise

    def explain(self, error: ColibriError, session: Session) -> ColibriError:
        """The emulator failing to start explains a silent link; a board's own error frame stands."""
        if not session.result.hello and self.proc.poll() is not None and self.proc.returncode != 0:
            assert self.proc.stderr is not None
            err = self.proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
            if err:
                return ColibriError(f"{self.argv[0]} failed: {err[-1]}")
        return error

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()


class EmulatorLink(Link):
    """An emulated MCU, started when the link opens and stopped when it closes."""

    def __init__(self, board: Board, firmware: Firmware, how: LinkOptions):
        self.firmware = firmware
        self.emulator = Emulator(board, firmware.program, firmware.flash_image or firmware.weights)
        self.turns = 0

    def turn(self, request: RunRequest, on_token: OnToken | None = None, timeout: float | None = None) -> RunResult:
        session = self.firmware.session(on_token)
        assert self.emulator.link is not None
        try:
            result = self.emulator.link.run(
                request, session, emulator_timeouts(request, timeout), resume=self.turns > 0
            )
        except ColibriError as e:
            raise self.emulator.explain(e, session) from None
        self.turns += 1
        return result

    def close(self) -> None:
        self.emulator.close()


class SerialBoardLink(Link):
    """A real board on a serial port: it serves requests until it is reset."""

    def __init__(self, board: Board, firmware: Firmware, how: LinkOptions):
        if not how.port:
            raise ColibriError(f"board {board.name} is a real board: give its serial port with --port")
        self.firmware = firmware
        self.serial = SerialLink.open(how.port, reset=how.reset)
        self.turns = 0

    def turn(self, request: RunRequest, on_token: OnToken | None = None, timeout: float | None = None) -> RunResult:
        session = self.firmware.session(on_token)
        # Without a timeout, the link's own (a real board's boot and pace); with one, that bound.
        timeouts = Timeouts() if timeout is None else emulator_timeouts(request, timeout)
        result = self.serial.run(request, session, timeouts, resume=self.turns > 0)
        self.turns += 1
        return result

    def close(self) -> None:
        self.serial.close()


# How each way a board runs is reached (a build-only board is not: open_link refuses it).
LINKS: dict[type[Runner], Callable[[Board, Firmware, LinkOptions], Link]] = {
    ProcessRunner: LinuxLink,
    MpiRunner: LinuxLink,
    EmulatedSystemRunner: EmulatorLink,
    SerialRunner: SerialBoardLink,
}


def open_firmware(board: Board, firmware: Firmware, how: LinkOptions = LinkOptions()) -> Link:
    """Open the link to `firmware`, built for `board`, the way `how` says, refusing what the board
    cannot do; how.progress hears about copies to a board over SSH."""
    runner = board.runner
    if how.options and not runner.takes_memory_budget:
        raise ColibriError(f"board {board.name} keeps its weights in flash: a memory budget is for Linux boards")
    if how.remote is not None:
        if not runner.takes_remote:
            raise ColibriError(f"--remote is for Linux boards (host, linux-aarch64); {board.name} is not one")
        if how.logits_out is not None:
            raise ColibriError("raw logits are stored only by a local run, not over --remote")
    if how.logits_out is not None and not runner.stores_raw_logits:
        raise ColibriError(f"board {board.name} cannot store raw logits (only Linux boards can)")
    opener = LINKS.get(type(runner))
    if opener is None:
        raise ColibriError(f"board {board.name} cannot be run from here (runner {runner.kind!r})")
    return opener(board, firmware, how)


def open_link(
    board: Board,
    program: Path,
    weights: Path,
    expected_model: str,
    *,
    check_hello: HelloCheck | None = None,
    flash_image: Path | None = None,
    options: Sequence[str] = (),
    logits_out: Path | None = None,
    remote: Remote | None = None,
    progress: Progress | None = None,
    port: str | None = None,
    reset: bool = False,
    keep_open: bool = False,
    hosts: Sequence[str] = (),
) -> Link:
    """open_firmware() with the firmware and the link options given one by one (a script's or a
    test's way; job.py packs them once)."""
    firmware = Firmware(Path(program), Path(weights), expected_model, flash_image, check_hello)
    how = LinkOptions(tuple(options), logits_out, remote, progress, port, reset, keep_open, tuple(hosts))
    return open_firmware(board, firmware, how)


# ---- Each MPI rank's own weight image (compile/layout.py rank_image), before mpirun starts anything ----


# A rank's own one line before it ends every rank: which rank refused which image, and why
# (bsp/linux/main.c), or which rank on which host could not go on (an expert it could not read,
# runtime/ranks/mpi.c ranks_fail).
_RANK_REFUSED = re.compile(r"colibri: error: (rank \d+(?: on host \S+)?: .*)")


def explain_rank_end(status: int, stderr: str, tokens: int) -> str:
    """The ranks' early end: a rank's own line when it refused its image (naming the rank and the
    image) or could not go on (naming the rank, its host and why), else what mpirun said
    (device/hosts.py)."""
    found = _RANK_REFUSED.search(stderr)
    if found:
        return f"{found.group(1).strip()}; mpirun ended the other ranks"
    return explain_ranks(status, stderr, tokens)


def ranks_for(board: Board, hosts: str | None, hostfile: Path | None, inventory: Path | None) -> int:
    """The ranks --hosts, --hostfile or --inventory give a board that runs them; one for any other."""
    return slots_given(hosts_for(board, hosts, hostfile, inventory)) if board.runner.runs_ranks else 1


def slots_given(hosts: tuple[str, ...]) -> int:
    """The ranks mpirun's host arguments (device/hosts.py hosts_for, already checked) give: the sum
    of their slots, a host without slots= counting one; none: one rank here."""
    if "--host" in hosts:
        listed = hosts[hosts.index("--host") + 1]
        return sum(int(entry.partition(":")[2] or 1) for entry in listed.split(","))
    if "--hostfile" in hosts:
        path = Path(hosts[hosts.index("--hostfile") + 1])
        total = 0
        for line in read_text_limited(path, HOSTFILE_BYTES, f"hostfile {path}").splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                found = [w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")]
                total += int(found[0]) if found else 1
        return total
    return 1


def check_rank_count(images: tuple[Path, ...], hosts: tuple[str, ...]) -> None:
    """The hosts give as many ranks as the build made images for, or the run is refused."""
    given, made = slots_given(hosts), max(1, len(images))
    if given != made:
        raise ColibriError(
            f"the weight images were made for {made} rank{'s' if made > 1 else ''} and the hosts give {given}: "
            f"build for {given} (--ranks {given}), or give hosts whose slots add up to {made}"
        )


def check_rank_images(paths: tuple[Path, ...], model_hash: str) -> None:
    """Before any rank starts: image r is rank r's of len(paths), of this model (its hash), so a rank
    handed another rank's image, or another build's, is refused in one line naming both. (Each rank's
    firmware checks its image's identity too: this says it before mpirun starts anything.)"""
    for rank, path in enumerate(paths):
        try:
            blob = map_image(path)
            header = read_header(blob)
        except (OSError, ValueError) as e:
            raise ColibriError(
                f"rank {rank}: cannot read its weight image {path}: {getattr(e, 'strerror', None) or e}"
            ) from None
        except ColibriError as e:
            raise ColibriError(f"rank {rank}: weight image {path}: {e}") from None
        h = fmt.unpack(fmt.HEADER, blob)
        if header.model_hash.hex() != model_hash:
            raise ColibriError(
                f"rank {rank}: weight image {path} is another build's (model hash {header.model_hash.hex()[:12]}..., "
                f"this firmware's {model_hash[:12]}...): give each rank its image from this build"
            )
        if (h["rank"], h["ranks"]) != (rank, len(paths)):
            held = f"rank {h['rank']}'s of {h['ranks']}" if h["ranks"] else "a single board's (whole) image"
            raise ColibriError(
                f"rank {rank}: weight image {path} is {held}, not rank {rank}'s of {len(paths)}: "
                f"give rank {rank} {rank_image_name(rank)}"
            )
