"""Run stage: start the firmware on a board, send it the request, read its frames back.

How a board is run comes from its board file (runner.kind); the frames are interpreted the same
way for every board by Session.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import ColibriError
from .protocol import Frame, FrameReader
from .sampling import SamplingParams
from .targets import Board


@dataclass(frozen=True)
class RunRequest:
    prompt: list[int]
    steps: int
    sampling: SamplingParams = SamplingParams()
    stop_at_eos: bool = True
    threads: int = 1
    digests: bool = True  # hash every step's logits (verify needs them; bench does not)
    # Measure the read bandwidth first, in the firmware, with the same threads (Linux boards; bench):
    # None: no probe; 0: a buffer twice the largest cache (at least 256 MiB); else its size in MiB.
    probe_bandwidth_mib: int | None = None


@dataclass
class RunResult:
    hello: dict[str, str] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    stats: dict[str, str] = field(default_factory=dict)
    bandwidth: dict[str, str] = field(default_factory=dict)  # read_bw (bytes/s), mib, threads, passes; if probed
    expert_counts: dict[int, list[int]] = field(default_factory=dict)  # MoE layer -> selections per expert
    token_us: list[int] = field(default_factory=list)  # per step: microseconds since the prompt was done
    stop_reason: str = ""
    log: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0


class Session:
    """Interprets one run's frames: hello, token..., stats, done; or an error frame."""

    def __init__(self, expected_model: str | None = None, on_token: Callable[[int, int], None] | None = None):
        self.result = RunResult()
        self.expected_model = expected_model
        self.on_token = on_token
        self.finished = False

    def handle(self, frame: Frame) -> None:
        r = self.result
        if frame.kind == "hello":
            if r.hello and frame.seq == 0:
                raise ColibriError("the board reset during the run (a second hello frame arrived)")
            r.hello = frame.fields
            if self.expected_model and frame.fields.get("model") != self.expected_model:
                raise ColibriError(f"the board runs firmware for model {frame.fields.get('model', '?')[:16]}…, "
                                   f"expected {self.expected_model[:16]}… (flash the matching build)")
        elif frame.kind == "error":
            msg = frame.fields.get("msg", "unknown error")
            raise ColibriError(f"firmware reported error {frame.fields.get('code', '?')}: {msg}")
        elif frame.kind == "token":
            step = frame.int("step")
            if step != len(r.tokens):
                raise ColibriError(f"token frame for step {step} arrived when step {len(r.tokens)} was expected")
            r.tokens.append(frame.int("id"))
            r.digests.append(frame.fields.get("logits", ""))
            if "us" in frame.fields:
                r.token_us.append(frame.int("us"))
            if self.on_token:
                self.on_token(step, r.tokens[-1])
        elif frame.kind == "stats":
            r.stats = frame.fields
        elif frame.kind == "bandwidth":
            r.bandwidth = frame.fields
        elif frame.kind == "experts":
            try:
                r.expert_counts[frame.int("layer")] = [int(c) for c in frame.fields["counts"].split(",")]
            except (KeyError, ValueError):
                raise ColibriError("malformed experts frame from the board") from None
        elif frame.kind == "done":
            if "tokens" in frame.fields and frame.int("tokens") != len(r.tokens):
                raise ColibriError(f"the board reports {frame.fields['tokens']} tokens but {len(r.tokens)} arrived")
            r.stop_reason = frame.fields.get("reason", "")
            self.finished = True


def check_fits_context(prompt: list[int], steps: int, n_ctx: int) -> None:
    if len(prompt) + steps - 1 > n_ctx:
        raise ColibriError(f"prompt ({len(prompt)} tokens) + {steps} steps need a context of "
                           f"{len(prompt) + steps - 1}, the firmware is built for {n_ctx} (use --ctx or fewer --steps)")


def f32_arg(value: float) -> str:
    """A float exactly as the firmware will hold it (hexadecimal float32)."""
    return float.hex(float(np.float32(value)))


def firmware_args(request: RunRequest) -> list[str]:
    s = request.sampling
    args = ["--prompt-ids", ",".join(str(t) for t in request.prompt), "--steps", str(request.steps),
            "--temperature", f32_arg(s.temperature), "--top-k", str(s.top_k), "--top-p", f32_arg(s.top_p),
            "--min-p", f32_arg(s.min_p), "--seed", str(s.seed)]
    if not request.stop_at_eos:
        args.append("--ignore-eos")
    if request.threads != 1:
        args += ["--threads", str(request.threads)]
    if not request.digests:
        args.append("--no-digests")
    if request.probe_bandwidth_mib is not None:
        args += ["--probe-bandwidth", str(request.probe_bandwidth_mib)]
    return args


def default_timeout(request: RunRequest, weights_bytes: int) -> float:
    """Generous for this machine: 20 s to start plus time for every token at >= 20 MB/s of weights."""
    per_token = max(0.05, weights_bytes / 20e6)
    return 20.0 + per_token * (len(request.prompt) + request.steps)


def run_process(argv: list[str], session: Session, timeout: float) -> RunResult:
    reader = FrameReader()
    start = time.monotonic()
    deadline = start + timeout
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise ColibriError(f"cannot start the firmware {argv[0]}: {e.strerror}") from None
    try:
        fd = proc.stdout.fileno()
        while not session.finished:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ColibriError(f"no complete result from the firmware within {timeout:.0f} s "
                                   f"({len(session.result.tokens)} tokens received)")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            for frame in reader.feed(chunk):
                session.handle(frame)
        if session.finished:
            try:
                proc.wait(timeout=10)  # let it flush and exit on its own
            except subprocess.TimeoutExpired:
                pass
        else:
            proc.wait(timeout=5)
            err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
            detail = f": {err[-1]}" if err else ""
            raise ColibriError(f"the firmware exited with status {proc.returncode} before finishing{detail}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    session.result.log = reader.log
    session.result.wall_seconds = time.monotonic() - start
    return session.result


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_qemu_system(board: Board, program: Path, flash_image: Path, request: RunRequest, session: Session,
                    timeout: float | None) -> RunResult:
    """Start the emulator with its UART on a local TCP socket and talk to it like a real board."""
    from .serial_link import SerialLink, Timeouts

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


def run_on_board(board: Board, program: Path, weights: Path, request: RunRequest, expected_model: str,
                 on_token=None, logits_out: Path | None = None, timeout: float | None = None,
                 flash_image: Path | None = None, port: str | None = None, reset: bool = False) -> RunResult:
    session = Session(expected_model, on_token)
    if request.threads > 1 and board.data.get("parallel", "none") == "none":
        raise ColibriError(f"board {board.name} runs single-threaded (--threads {request.threads} is for Linux boards)")
    if request.probe_bandwidth_mib is not None and board.runner != "process":
        raise ColibriError(f"board {board.name} cannot measure its read bandwidth (only Linux boards can)")
    if board.runner == "process":
        argv = [*(board.emulator if board.needs_emulator() else ()), str(program), "--weights", str(weights),
                *firmware_args(request)]
        if logits_out is not None:
            argv += ["--logits-out", str(logits_out)]
        if timeout is None:
            timeout = default_timeout(request, weights.stat().st_size) * (4 if board.needs_emulator() else 1)
        return run_process(argv, session, timeout)
    if logits_out is not None:
        raise ColibriError(f"board {board.name} cannot store raw logits (only Linux boards can)")
    if board.runner == "qemu-system":
        return run_qemu_system(board, program, flash_image or weights, request, session, timeout)
    if board.runner == "serial":
        from .serial_link import SerialLink, Timeouts

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
