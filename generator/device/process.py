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
        return f"the firmware was killed by signal {-status} ({signal_name(-status)}) after {tokens} tokens" + (
            " (out of memory?)" if -status == signal.SIGKILL else ""
        )
    lines = stderr.strip().splitlines()
    detail = f": {lines[-1]}" if lines else ""
    return f"the firmware exited with status {status} before finishing{detail}"


class ProcessLink:
    """A firmware process with its stdin kept open: request frames go in one by one (a conversation
    continues in the firmware's KV cache between them) and each request's frames are read back into
    its own Session until its done frame. One FrameReader for the process's whole output."""

    def __init__(self, argv: list[str], explain: Explain = explain_local):
        self.argv, self.explain = argv, explain
        self.reader = FrameReader()
        self.stderr = bytearray()
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
        except OSError as e:
            raise ColibriError(f"cannot start {argv[0]}: {e.strerror}") from None
        self.open_fds = [self.proc.stdout.fileno(), self.proc.stderr.fileno()]
        self.hello: dict[str, str] = {}

    def send(self, frame: bytes, last: bool = False) -> None:
        """Write a request frame; `last`: then close stdin, so the firmware exits after serving it."""
        try:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()
            if last:
                self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it exited before reading: its frames or its status say why

    def read_until_done(self, session: Session, timeout: float) -> RunResult:
        """Feed the process's frames to `session` until its done frame; raises ColibriError with the
        explanation of an early end, or on the timeout. The hello frame, sent once at start, is
        handed to every later session as if it had come again."""
        start = time.monotonic()
        deadline = start + timeout
        if self.hello and not session.result.hello:
            session.result.hello = dict(self.hello)
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        # stderr is drained alongside stdout: a chatty process (ssh's warnings, a loader's
        # complaints) must never block on a full pipe while its frames wait to be read.
        while not session.finished and out in self.open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ColibriError(
                    f"no complete result from the firmware within {timeout:.0f} s "
                    f"({len(session.result.tokens)} tokens received)"
                )
            ready, _, _ = select.select(self.open_fds, [], [], min(left, 1.0))
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.open_fds.remove(fd)
                elif fd == err:
                    self.stderr += chunk
                    del self.stderr[:-STDERR_KEPT]
                else:
                    for frame in self.reader.feed(chunk):
                        session.handle(frame)
        if not session.finished:
            try:
                status = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                status = self.proc.wait()
            if err in self.open_fds:
                self.stderr += self.proc.stderr.read()
            raise ColibriError(self.explain(status, self.stderr.decode("utf-8", "replace"), len(session.result.tokens)))
        self.hello = session.result.hello
        session.result.log = self.reader.log
        session.result.wall_seconds = time.monotonic() - start
        return session.result

    def close(self, wait: float = 10.0) -> None:
        """Close stdin, let the process exit on its own for up to `wait` seconds, then kill it."""
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def run_process(
    argv: list[str], request: bytes, session: Session, timeout: float, explain: Explain = explain_local
) -> RunResult:
    """Start `argv`, send it `request` on stdin, feed its stdout to `session` until the done frame.
    Raises ColibriError with `explain`'s line when it ends before that, or on the timeout."""
    link = ProcessLink(argv, explain)
    start = time.monotonic()
    try:
        link.send(request, last=True)
        result = link.read_until_done(session, timeout)
    except BaseException:
        link.close(wait=0)
        raise
    link.close()
    result.wall_seconds = time.monotonic() - start
    return result
