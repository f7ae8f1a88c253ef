"""The serial side of the result protocol: real boards on a serial port and emulators on a local
socket are read through the same SerialLink (pyserial, `socket://` URLs included).

Opening a port does not reset the board unless asked (DTR and RTS are held released); whatever
the board prints that is not a frame (ROM boot banner, logs) is kept in the log; frames are CRC
checked by FrameReader; the wait scales with the tokens asked for, and silence ends in a clear error.

What `run` refuses rather than returning a wrong or partial answer:
  - no hello within `Timeouts.boot` (the message quotes the last line the board printed, if any);
  - a hello from firmware for another model (Session with expected_model), before anything is sent;
  - a reset during the run (a second hello), a lost or corrupted frame (a gap in the sequence
    numbers, a missing token step), a `done` whose token count disagrees with the tokens received;
  - no frame for `Timeouts.silence` seconds once the hello arrived (plus the prompt's prefill
    allowance before the first token), and no complete result within `Timeouts.total(request)`.
Every wait is bounded: reads block at most READ_SLICE seconds, a write at most 1 s plus twice the
time its bytes need at the baud rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import serial

from ..errors import ColibriError
from .ports import open_error
from .protocol import Frame, FrameReader
from .session import RunRequest, RunResult, Session, request_frame

READ_SLICE = 0.05  # longest single blocking read; every deadline is checked at least this often
ACK_BYTES = 64  # request bytes the board takes per acknowledgement (firmware_src/app/protocol.h PROTO_ACK_BYTES)


def _acknowledges(hello: Frame) -> bool:
    """Boards of protocol version 2 on acknowledge every ACK_BYTES of a request they read."""
    version = hello.fields.get("proto", "1")
    return version.isdigit() and int(version) >= 2


def _secs(value: float) -> str:
    return f"{value:g} s"


def _quote(line: str, limit: int = 80) -> str:
    return repr(line[:limit] + ("…" if len(line) > limit else ""))


@dataclass(frozen=True)
class Timeouts:
    """boot: until the hello frame; per_token: added per prompt token and step; silence: the
    longest quiet gap allowed once the board has started answering (before the first token it is
    extended by per_token for every prompt token: the prefill happens in that gap)."""

    boot: float = 10.0
    per_token: float = 2.0
    silence: float = 30.0

    def total(self, request: RunRequest) -> float:
        return self.boot + self.per_token * request.tokens_of_work()

    def first_token(self, request: RunRequest | None) -> float:
        """The longest gap allowed between the hello and the first token (load + prefill)."""
        return self.silence + (self.per_token * len(request.prompt) if request else 0.0)


class SerialLink:
    def __init__(self, port, where: str):
        self.port = port
        self.where = where
        self.reader = FrameReader()
        self.received = 0  # bytes read since opening (tells "silent" from "talking, but no frame")
        self.hello: Frame | None = None  # the board's hello, once a run has seen it
        self.next_seq: int | None = None  # the sequence number the board's next frame must carry

    @classmethod
    def open(cls, url: str, baudrate: int = 115200, reset: bool = False) -> "SerialLink":
        """Open a device path or pyserial URL without touching DTR/RTS (no reset) unless asked."""
        is_device = "://" not in url
        try:
            port = serial.serial_for_url(
                url, baudrate=baudrate, timeout=READ_SLICE, write_timeout=1.0, do_not_open=True
            )
            if hasattr(port, "dtr"):
                port.dtr = False  # released before opening: many boards wire DTR/RTS to EN/BOOT
                port.rts = False
            if is_device:
                port.exclusive = True  # a second reader (another monitor, ModemManager) steals bytes
            port.open()
        except (serial.SerialException, OSError, ValueError) as e:
            raise open_error(url, e) from None
        link = cls(port, url)
        if reset:
            try:
                link.reset_board()
            except ColibriError:
                link.close()
                raise
        return link

    @classmethod
    def connect(cls, url: str, deadline: float, baudrate: int = 115200) -> "SerialLink":
        """Open `url`, retrying until `deadline` (an emulator may not be listening yet)."""
        last = None
        while time.monotonic() < deadline:
            try:
                return cls.open(url, baudrate)
            except ColibriError as e:
                last = e
                time.sleep(0.05)
        raise last or ColibriError(f"cannot open {url}")

    def reset_board(self) -> None:
        """Pulse EN low through RTS (the usual USB-serial auto-reset wiring), BOOT left high.
        What the board printed before the reset is dropped, so an old hello cannot be mistaken
        for the new one."""
        try:
            self.port.dtr = False
            self.port.rts = True
            time.sleep(0.1)
            self.port.reset_input_buffer()
            self.port.rts = False
        except (serial.SerialException, OSError) as e:
            raise ColibriError(f"{self.where}: cannot reset the board through RTS: {e}") from None
        self.reader = FrameReader()

    def close(self) -> None:
        try:
            self.port.close()
        except (serial.SerialException, OSError):
            pass

    def send(self, data: bytes) -> None:
        # No flush(): on POSIX it is tcdrain(), which has no timeout. The bytes are in the driver's
        # queue once write() returns; write() itself is bounded by write_timeout.
        baudrate = getattr(self.port, "baudrate", 0) or 115200
        try:
            self.port.write_timeout = 1.0 + 2 * len(data) * 10 / baudrate
            self.port.write(data)
        except serial.SerialTimeoutException:
            raise ColibriError(
                f"{self.where}: write timed out: the port does not accept data "
                f"(flow control, or the board is not reading)"
            ) from None
        except (serial.SerialException, OSError) as e:
            raise ColibriError(f"{self.where}: write failed: {e}") from None

    def poll(self) -> list[tuple[str, object]]:
        """Read whatever has arrived (waiting at most READ_SLICE seconds) and return it in order as
        events: ("log", line) for a line that is not a frame, ("rejected", line) for a line that
        started a frame but failed its format or CRC check, ("frame", Frame) for a valid frame."""
        chunk = self._read()
        events: list[tuple[str, object]] = []
        pos = 0
        while pos < len(chunk):  # one line at a time, so log lines and frames keep their order
            nl = chunk.find(b"\n", pos)
            end = len(chunk) if nl < 0 else nl + 1
            n_log, n_rejected = len(self.reader.log), self.reader.rejected
            frames = self.reader.feed(chunk[pos:end])
            pos = end
            new_lines = self.reader.log[n_log:]
            for i, line in enumerate(new_lines):
                last = i == len(new_lines) - 1
                events.append(("rejected" if last and self.reader.rejected > n_rejected else "log", line))
            events.extend(("frame", f) for f in frames)
        return events

    def _read(self) -> bytes:
        # Ask only for what is waiting (or one byte, blocking up to the port timeout): a read that
        # spans a disconnect would lose the bytes before it (pyserial raises without returning them).
        try:
            waiting = self.port.in_waiting
            data = self.port.read(waiting if waiting > 1 else 1)
        except (serial.SerialException, OSError) as e:
            raise ColibriError(f"{self.where}: read failed ({e}); was the board unplugged or reset?") from None
        self.received += len(data)
        return data

    # ---- run ------------------------------------------------------------------------------

    def _last_line(self) -> str:
        """The last non-empty line the board printed that was not a frame."""
        for line in reversed(self.reader.log):
            if line.strip():
                return line.strip()
        return ""

    def _noise(self) -> str:
        parts = []
        if self.reader.rejected:
            parts.append(
                f"{self.reader.rejected} corrupted frame(s) rejected: check the cable, the baud rate and the ground"
            )
        return f" ({'; '.join(parts)})" if parts else ""

    def _no_hello(self, timeouts: Timeouts, stale: int) -> ColibriError:
        if self.received == 0:
            what = (
                "nothing at all was received; a board that booted before the port was opened has "
                "already sent its hello: reset it"
            )
        else:
            last = self._last_line()
            what = f"{self.received} bytes received"
            what += f", last line {_quote(last)}" if last else ", no complete line (wrong baud rate?)"
        if stale:
            what += f"; {stale} frame(s) of an earlier run seen (reset the board to start a new one)"
        return ColibriError(
            f"{self.where}: no hello frame from the board within {_secs(timeouts.boot)} "
            f"({what}){self._noise()}; check the port, the baud rate and that the firmware "
            f"is flashed"
        )

    def _send_first_piece(self, request: RunRequest, hello: Frame, seq: int) -> tuple[bytes, int]:
        """Send the request, or its first piece to a board that acknowledges each (its UART's small
        receive FIFO never overflows, however long the request); returns what is left and the
        bytes the next ack must report."""
        pending = request_frame(request, seq)
        piece = ACK_BYTES if _acknowledges(hello) else len(pending)
        self.send(pending[:piece])
        return pending[piece:], piece

    def run(
        self, request: RunRequest | None, session: Session, timeouts: Timeouts = Timeouts(), resume: bool = False
    ) -> RunResult:
        """Read frames until `done`; after the hello, send `request` (None: only listen).
        resume: the board said hello in an earlier run on this link and serves another request
        now (a conversation continued): the request goes out at once.

        Frames before the first hello belong to an earlier run and are ignored."""
        start = time.monotonic()
        total = timeouts.total(request) if request else None
        last_frame = start  # time of the last accepted frame (noise and logs are not progress)
        log_index = len(self.reader.log)  # index in reader.log of the next non-frame line
        log_at_last_frame = log_index
        sent = False
        pending = b""  # the part of the request not sent yet (boards that acknowledge its pieces)
        acked_target = 0  # request bytes sent so far: the next ack must say this many
        next_seq = None  # the sequence number the next frame must carry, once the hello is in
        stale = 0
        result = session.result
        if resume:
            if self.hello is None or self.next_seq is None or request is None:
                raise ColibriError(f"{self.where}: no earlier run on this link to continue")
            next_seq = self.next_seq
            result.hello = dict(self.hello.fields)
            pending, acked_target = self._send_first_piece(request, self.hello, self.next_seq)
            sent = True
        while not session.finished:
            now = time.monotonic()
            if next_seq is None:
                if now - start > timeouts.boot:
                    raise self._no_hello(timeouts, stale)
            else:
                allowed = timeouts.silence if result.tokens else timeouts.first_token(request)
                if now - last_frame > allowed:
                    raise self._silent(
                        request,
                        session,
                        now - last_frame,
                        allowed,
                        log_at_last_frame,
                        acked_target if pending else None,
                    )
            if total is not None and now - start > total:
                raise ColibriError(
                    f"{self.where}: no complete result within {_secs(total)} "
                    f"({len(result.tokens)} of {request.steps} tokens received){self._noise()}"
                )
            for kind, item in self.poll():
                if kind != "frame":
                    log_index += 1
                    continue
                frame = item
                if next_seq is None and frame.kind != "hello":
                    stale += 1
                    continue
                self._check_sequence(frame, next_seq, request, session)
                self._handle(session, frame, request, log_at_last_frame, log_index)
                next_seq = frame.seq + 1
                last_frame = time.monotonic()
                log_at_last_frame = log_index
                if frame.kind == "hello":
                    self.hello = frame
                if frame.kind == "hello" and request and not sent:
                    pending, acked_target = self._send_first_piece(request, frame, 0)
                    sent = True
                elif frame.kind == "ack":
                    got = frame.int("bytes", minimum=0)
                    if not pending or got != acked_target:
                        raise ColibriError(
                            f"{self.where}: the board acknowledged {got} bytes of the request "
                            f"when {acked_target} had been sent{self._noise()}"
                        )
                    self.send(pending[:ACK_BYTES])
                    acked_target, pending = acked_target + ACK_BYTES, pending[ACK_BYTES:]
                if session.finished:
                    self._check_done(frame, session)
                    break
        self.next_seq = next_seq
        result.log = list(self.reader.log)
        result.wall_seconds = time.monotonic() - start
        return result

    def _progress(self, request: RunRequest | None, session: Session) -> str:
        n = len(session.result.tokens)
        return f"{n} of {request.steps} tokens" if request else f"{n} tokens"

    def _printed_since(self, log_mark: int, log_end: int | None = None) -> str:
        since = [line.strip() for line in self.reader.log[log_mark:log_end] if line.strip()]
        return _quote(since[-1]) if since else ""

    def _silent(
        self, request, session, gap: float, allowed: float, log_mark: int, unacknowledged: int | None = None
    ) -> ColibriError:
        if unacknowledged is not None:
            what = (
                f"the board did not acknowledge the request's first {unacknowledged} bytes within "
                f"{_secs(allowed)} (the request is sent in acknowledged pieces)"
            )
        elif not session.result.tokens and request:
            what = (
                f"the board sent its hello but no token followed within {_secs(allowed)} "
                f"(it may not have received the request, or the prefill is slower than "
                f"{_secs(allowed)} allows)"
            )
        else:
            what = f"the board has been silent for {_secs(allowed)} after {self._progress(request, session)}"
        printed = self._printed_since(log_mark)
        if printed:
            what += f"; since its last frame it printed only non-frame lines, the last {printed}"
        return ColibriError(f"{self.where}: {what}{self._noise()}")

    def _check_sequence(self, frame: Frame, next_seq: int | None, request, session: Session) -> None:
        if next_seq is None or frame.seq == next_seq or (frame.kind == "hello" and frame.seq == 0):
            return  # a hello with sequence number 0 is a reset: the Session's to judge
        if frame.seq < next_seq:
            raise ColibriError(
                f"{self.where}: frame sequence went back from {next_seq - 1} to {frame.seq} "
                f"({frame.kind} frame) after {self._progress(request, session)}: the board "
                f"restarted or two programs write to the port{self._noise()}"
            )
        lost = frame.seq - next_seq
        what = f"{lost} frame(s) lost before frame {frame.seq} ({frame.kind}"
        if frame.kind == "token" and "step" in frame.fields:
            what += f" step {frame.fields['step']}, when step {len(session.result.tokens)} was expected"
        raise ColibriError(
            f"{self.where}: {what}) after {self._progress(request, session)}"
            f"{self._noise() or ' (bytes dropped on the line)'}; the result would be incomplete"
        )

    def _handle(self, session: Session, frame: Frame, request: RunRequest | None, log_mark: int, log_end: int) -> None:
        had_hello = bool(session.result.hello)
        try:
            session.handle(frame)
        except ColibriError as e:
            detail = ""
            if frame.kind == "hello" and had_hello:  # a reset
                detail = f" after {self._progress(request, session)}"
                printed = self._printed_since(log_mark, log_end)
                if printed:
                    detail += f"; before the new hello it printed {printed}"
            # The same exception, its message prefixed with the port: a caller may tell kinds of
            # refusal apart by type (verify.FirmwareMismatch is a verdict, not a link failure).
            e.args = (f"{self.where}: {e}{detail}{self._noise()}",)
            raise e from None

    def _check_done(self, frame: Frame, session: Session) -> None:
        claimed = frame.fields.get("tokens")
        got = len(session.result.tokens)
        if claimed is not None and claimed.isdigit() and int(claimed) != got:
            raise ColibriError(
                f"{self.where}: the board reports {claimed} tokens but {got} arrived"
                f"{self._noise()}; the result would be incomplete"
            )
