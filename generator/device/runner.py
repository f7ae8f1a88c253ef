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
from .process import run_process
from .remote import Remote, remote_prefix, run_remote
from .serial_link import SerialLink, Timeouts
from .session import RunRequest, RunResult, Session, request_frame
from ..compile.targets import Board


def default_timeout(request: RunRequest, weights_bytes: int) -> float:
    """Generous for this machine: 20 s to start plus time for every token at >= 20 MB/s of weights."""
    per_token = max(0.05, weights_bytes / 20e6)
    return 20.0 + per_token * (len(request.prompt) + request.steps)


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_qemu_system(board: Board, program: Path, flash_image: Path, request: RunRequest, session: Session,
                    timeout: float | None) -> RunResult:
    """Start the emulator with its UART on a local TCP socket and talk to it like a real board."""
    port = free_port()
    argv = [a.format(program=program, flash_image=flash_image, port=port) for a in board.command]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise ColibriError(f"cannot start {argv[0]}: {e.strerror}") from None
    link = None
    try:
        link = SerialLink.connect(f"socket://127.0.0.1:{port}", time.monotonic() + 20.0)
        timeouts = Timeouts(boot=20.0, per_token=2.0, silence=60.0)
        if timeout is not None:
            timeouts = Timeouts(boot=timeout, per_token=timeout / max(1, len(request.prompt) + request.steps),
                                silence=timeout)
        result = link.run(request, session, timeouts)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if code not in (0, None):
            raise ColibriError(f"{argv[0]} exited with status {code} after the run")
        return result
    except ColibriError:
        # The emulator failing to start explains a silent link; a board's own error frame stands.
        if not session.result.hello and proc.poll() is not None and proc.returncode != 0:
            err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
            if err:
                raise ColibriError(f"{argv[0]} failed: {err[-1]}") from None
        raise
    finally:
        if link:
            link.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


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
    if request.probe_bandwidth_mib is not None and board.runner != "process":
        raise ColibriError(f"board {board.name} cannot measure its read bandwidth (only Linux boards can)")
    if request.firmware_options() and board.runner != "process":
        raise ColibriError(f"board {board.name} keeps its weights in flash: a memory budget and storage probes are "
                           f"for Linux boards")
    if remote is not None:
        if board.runner != "process":
            raise ColibriError(f"--remote is for Linux boards (host, linux-aarch64); {board.name} is not one")
        if logits_out is not None:
            raise ColibriError("raw logits are stored only by a local run, not over --remote")
        if timeout is None:
            # The board may be slower than this machine; connecting takes a few seconds more.
            timeout = 10 + default_timeout(request, weights.stat().st_size) * (4 if remote_prefix(board) else 2)
        return run_remote(remote, board, program, weights, request, session, timeout, progress)
    if board.runner == "process":
        argv = [*local_prefix(), *(board.emulator if board.needs_emulator() else ()), str(program), "--weights",
                str(weights), *request.firmware_options()]
        if logits_out is not None:
            argv += ["--logits-out", str(logits_out)]
        if timeout is None:
            timeout = default_timeout(request, weights.stat().st_size) * (4 if board.needs_emulator() else 1)
        return run_process(argv, request_frame(request), session, timeout)
    if logits_out is not None:
        raise ColibriError(f"board {board.name} cannot store raw logits (only Linux boards can)")
    if board.runner == "qemu-system":
        return run_qemu_system(board, program, flash_image or weights, request, session, timeout)
    if board.runner == "serial":
        if not port:
            raise ColibriError(f"board {board.name} is a real board: give its serial port with --port")
        link = SerialLink.open(port, reset=reset)
        try:
            return link.run(request, session, Timeouts() if timeout is None else
                            Timeouts(boot=timeout, per_token=timeout / max(1, len(request.prompt) + request.steps),
                                     silence=timeout))
        finally:
            link.close()
    raise ColibriError(f"board {board.name} cannot be run from here (runner {board.runner!r})")
