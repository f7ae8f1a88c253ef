"""A Linux firmware behind a pipe: the request frame written to a process's stdin, the frames it
prints read back from its stdout through one FrameReader into the Session. The process is the
firmware itself, the firmware under an emulator, or `ssh` running it on a board
(device/remote.py): the reader loop is the same, only the explanation of an early end differs."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import Callable

from ..errors import ColibriError
from .protocol import FrameReader
from .session import RunResult, Session

STDERR_KEPT = 65536  # the tail of stderr kept for the error message (it is drained as it comes)

# Why a process ended before its done frame: (exit status, its stderr, tokens received) -> one line.
Explain = Callable[[int, str, int], str]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def explain_local(status: int, stderr: str, tokens: int) -> str:
    """A local firmware's early end: the signal that killed it, or its status and last stderr line."""
    if status < 0:
        return (f"the firmware was killed by signal {-status} ({signal_name(-status)}) after {tokens} tokens"
                + (" (out of memory?)" if -status == signal.SIGKILL else ""))
    lines = stderr.strip().splitlines()
    detail = f": {lines[-1]}" if lines else ""
    return f"the firmware exited with status {status} before finishing{detail}"


def run_process(argv: list[str], request: bytes, session: Session, timeout: float,
                explain: Explain = explain_local) -> RunResult:
    """Start `argv`, send it `request` on stdin, feed its stdout to `session` until the done frame.
    Raises ColibriError with `explain`'s line when it ends before that, or on the timeout."""
    reader = FrameReader()
    start = time.monotonic()
    deadline = start + timeout
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
    except OSError as e:
        raise ColibriError(f"cannot start {argv[0]}: {e.strerror}") from None
    stderr = bytearray()
    try:
        try:
            proc.stdin.write(request)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it exited before reading: its frames or its status say why
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        open_fds = [out, err]
        # stderr is drained alongside stdout: a chatty process (ssh's warnings, a loader's
        # complaints) must never block on a full pipe while its frames wait to be read.
        while not session.finished and out in open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ColibriError(f"no complete result from the firmware within {timeout:.0f} s "
                                   f"({len(session.result.tokens)} tokens received)")
            ready, _, _ = select.select(open_fds, [], [], min(left, 1.0))
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == err:
                    stderr += chunk
                    del stderr[:-STDERR_KEPT]
                else:
                    for frame in reader.feed(chunk):
                        session.handle(frame)
        if session.finished:
            try:
                proc.wait(timeout=10)  # let it flush and exit on its own
            except subprocess.TimeoutExpired:
                pass
        else:
            try:
                status = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
            if err in open_fds:
                stderr += proc.stderr.read()
            raise ColibriError(explain(status, stderr.decode("utf-8", "replace"), len(session.result.tokens)))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    session.result.log = reader.log
    session.result.wall_seconds = time.monotonic() - start
    return session.result
