"""Run stage: start the firmware on a board, send it the request, read its frames back.

How a board is run comes from its board file (runner.kind); the frames are interpreted the same
way for every board by Session.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from ..errors import ColibriError
from .process import ProcessLink, explain_local, run_process
from .remote import Remote, check_remote_machine, explain_remote, remote_command, remote_prefix, run_remote
from .serial_link import SerialLink, Timeouts
from .session import RunRequest, RunResult, Session, request_frame
from ..boards import Board, EmulatedSystemRunner, ProcessRunner, SerialRunner


def default_timeout(request: RunRequest, weights_bytes: int) -> float:
    """Generous for this machine: 20 s to start plus time for every token at >= 20 MB/s of weights."""
    per_token = max(0.05, weights_bytes / 20e6)
    return 20.0 + per_token * (len(request.prompt) + request.steps)


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Emulator:
    """A system emulator (qemu-system) running the firmware, its UART on a local TCP socket that a
    SerialLink talks to as to a real board's port. The firmware serves requests until it is stopped."""

    def __init__(self, board: Board, program: Path, flash_image: Path):
        port = free_port()
        self.argv = [a.format(program=program, flash_image=flash_image, port=port) for a in board.runner.command]
        try:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL)
        except OSError as e:
            raise ColibriError(f"cannot start {self.argv[0]}: {e.strerror}") from None
        try:
            self.link = SerialLink.connect(f"socket://127.0.0.1:{port}", time.monotonic() + 20.0)
        except ColibriError:
            self.close()
            raise

    def explain(self, error: ColibriError, session: Session) -> ColibriError:
        """The emulator failing to start explains a silent link; a board's own error frame stands."""
        if not session.result.hello and self.proc.poll() is not None and self.proc.returncode != 0:
            err = self.proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
            if err:
                return ColibriError(f"{self.argv[0]} failed: {err[-1]}")
        return error

    def close(self) -> None:
        if getattr(self, "link", None):
            self.link.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()


def emulator_timeouts(request: RunRequest, timeout: float | None) -> Timeouts:
    if timeout is None:
        return Timeouts(boot=20.0, per_token=2.0, silence=60.0)
    return Timeouts(boot=timeout, per_token=timeout / max(1, len(request.prompt) + request.steps), silence=timeout)


def run_qemu_system(board: Board, program: Path, flash_image: Path, request: RunRequest, session: Session,
                    timeout: float | None) -> RunResult:
    """Start the emulator and talk to it like a real board; stop it once the run is done."""
    emulator = Emulator(board, program, flash_image)
    try:
        return emulator.link.run(request, session, emulator_timeouts(request, timeout))
    except ColibriError as e:
        raise emulator.explain(e, session) from None
    finally:
        emulator.close()


def local_prefix() -> list[str]:
    """COLIBRI_FIRMWARE_PREFIX: a command a local Linux-board firmware is started under (split like a
    shell would), e.g. tools/in-memory-cgroup NAME to run it alone in a memory cgroup."""
    import shlex

    return shlex.split(os.environ.get("COLIBRI_FIRMWARE_PREFIX", ""))


def run_on_board(board: Board, program: Path, weights: Path, request: RunRequest, expected_model: str,
                 on_token=None, logits_out: Path | None = None, timeout: float | None = None,
                 flash_image: Path | None = None, port: str | None = None, reset: bool = False,
                 check_hello=None, remote: Remote | None = None,
                 progress: Callable[[str], None] | None = None) -> RunResult:
    """Run `request` on the firmware built for `board`: here, or on the Linux board `remote` reached
    over SSH (progress hears about copies to it); check_hello: see Session."""
    session = Session(expected_model, on_token, check_hello)
    if request.threads > 1 and board.parallel == "none":
        raise ColibriError(f"board {board.name} runs single-threaded (--threads {request.threads} is for Linux boards)")
    if request.probe_bandwidth_mib is not None and not board.runner.linux_program:
        raise ColibriError(f"board {board.name} cannot measure its read bandwidth (only Linux boards can)")
    if request.firmware_options() and not board.runner.linux_program:
        raise ColibriError(f"board {board.name} keeps its weights in flash: a memory budget and storage probes are "
                           f"for Linux boards")
    if remote is not None:
        if not board.runner.linux_program:
            raise ColibriError(f"--remote is for Linux boards (host, linux-aarch64); {board.name} is not one")
        if logits_out is not None:
            raise ColibriError("raw logits are stored only by a local run, not over --remote")
        if timeout is None:
            # The board may be slower than this machine; connecting takes a few seconds more.
            timeout = 10 + default_timeout(request, weights.stat().st_size) * (4 if remote_prefix(board) else 2)
        return run_remote(remote, board, program, weights, request, session, timeout, progress)
    if isinstance(board.runner, ProcessRunner):
        argv = [*local_prefix(), *(board.runner.emulator if board.runner.needs_emulator() else ()), str(program), "--weights",
                str(weights), *request.firmware_options()]
        if logits_out is not None:
            argv += ["--logits-out", str(logits_out)]
        if timeout is None:
            timeout = default_timeout(request, weights.stat().st_size) * (4 if board.runner.needs_emulator() else 1)
        return run_process(argv, request_frame(request), session, timeout)
    if logits_out is not None:
        raise ColibriError(f"board {board.name} cannot store raw logits (only Linux boards can)")
    if isinstance(board.runner, EmulatedSystemRunner):
        return run_qemu_system(board, program, flash_image or weights, request, session, timeout)
    if isinstance(board.runner, SerialRunner):
        if not port:
            raise ColibriError(f"board {board.name} is a real board: give its serial port with --port")
        link = SerialLink.open(port, reset=reset)
        try:
            return link.run(request, session, Timeouts() if timeout is None else
                            Timeouts(boot=timeout, per_token=timeout / max(1, len(request.prompt) + request.steps),
                                     silence=timeout))
        finally:
            link.close()
    raise ColibriError(f"board {board.name} cannot be run from here (runner {board.runner.kind!r})")


class Conversation:
    """One firmware kept serving across requests, so that a chat continues in its KV cache: each turn
    sends a request (start = the positions the firmware holds) and reads that request's frames. A
    Linux firmware reads request frames from stdin until it ends (here or over SSH); an MCU (an
    emulator or a board on a serial port) serves them until it is reset."""

    def __init__(self, board: Board, weights_bytes: int, expected_model: str, check_hello=None,
                 remote: Remote | None = None, process: ProcessLink | None = None,
                 emulator: Emulator | None = None, serial: SerialLink | None = None):
        self.board, self.weights_bytes = board, weights_bytes
        self.expected_model, self.check_hello, self.remote = expected_model, check_hello, remote
        self.process, self.emulator, self.serial = process, emulator, serial
        self.turns = 0

    def turn(self, request: RunRequest, on_token=None, timeout: float | None = None) -> RunResult:
        session = Session(self.expected_model, on_token, self.check_hello)
        if self.process is not None:
            if timeout is None:
                slow = self.board.runner.needs_emulator() or self.remote is not None
                timeout = default_timeout(request, self.weights_bytes) * (4 if slow else 1)
            self.process.send(request_frame(request, seq=self.turns))
            result = self.process.read_until_done(session, timeout)
            if self.remote is not None and self.turns == 0:
                check_remote_machine(self.remote, self.board, result.hello)
        else:
            link = self.emulator.link if self.emulator is not None else self.serial
            timeouts = emulator_timeouts(request, timeout) if self.emulator is not None or timeout is not None \
                else Timeouts()
            try:
                result = link.run(request, session, timeouts, resume=self.turns > 0)
            except ColibriError as e:
                raise (self.emulator.explain(e, session) if self.emulator is not None else e) from None
        self.turns += 1
        return result

    def close(self) -> None:
        for part in (self.process, self.emulator, self.serial):
            if part is not None:
                part.close()

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_conversation(board: Board, program: Path, weights: Path, expected_model: str, check_hello=None,
                      remote: Remote | None = None, progress: Callable[[str], None] | None = None,
                      flash_image: Path | None = None, port: str | None = None,
                      reset: bool = False, options: list[str] = ()) -> Conversation:
    """Start (or reach) the firmware for a conversation (see Conversation); `options`: a Linux
    firmware's command-line options (RunRequest.firmware_options: a memory budget)."""
    size = weights.stat().st_size
    common = dict(expected_model=expected_model, check_hello=check_hello)
    if options and not board.runner.linux_program:
        raise ColibriError(f"board {board.name} keeps its weights in flash: a memory budget is for Linux boards")
    if remote is not None:
        if not board.runner.linux_program:
            raise ColibriError(f"--remote is for Linux boards (host, linux-aarch64); {board.name} is not one")
        argv, _ = remote_command(remote, board, program, weights, list(options), progress)
        return Conversation(board, size, remote=remote, process=ProcessLink(argv, explain_remote(remote)), **common)
    if isinstance(board.runner, ProcessRunner):
        argv = [*local_prefix(), *(board.runner.emulator if board.runner.needs_emulator() else ()), str(program), "--weights",
                str(weights), *options]
        return Conversation(board, size, process=ProcessLink(argv, explain_local), **common)
    if isinstance(board.runner, EmulatedSystemRunner):
        return Conversation(board, size, emulator=Emulator(board, program, flash_image or weights), **common)
    if isinstance(board.runner, SerialRunner):
        if not port:
            raise ColibriError(f"board {board.name} is a real board: give its serial port with --port")
        return Conversation(board, size, serial=SerialLink.open(port, reset=reset), **common)
    raise ColibriError(f"board {board.name} cannot be run from here (runner {board.runner.kind!r})")
