"""The serial side of the result protocol: real boards on a serial port and emulators on a local
socket are read through the same SerialLink (pyserial, `socket://` URLs included).

Opening a port does not reset the board unless asked (DTR and RTS are held released); whatever
the board prints that is not a frame (ROM boot banner, logs) is kept in the log; frames are CRC
checked by FrameReader; the wait scales with the tokens asked for, and silence ends in a clear error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import serial

from .errors import ColibriError
from .protocol import FrameReader, encode_request
from .runner import RunRequest, RunResult, Session


@dataclass(frozen=True)
class Timeouts:
    """boot: until the hello frame; per_token: added per prompt token and step; silence: the
    longest quiet gap allowed once the board has started answering."""

    boot: float = 10.0
    per_token: float = 2.0
    silence: float = 30.0

    def total(self, request: RunRequest) -> float:
        return self.boot + self.per_token * (len(request.prompt) + request.steps)


class SerialLink:
    def __init__(self, port, where: str):
        self.port = port
        self.where = where
        self.reader = FrameReader()

    @classmethod
    def open(cls, url: str, baudrate: int = 115200, reset: bool = False) -> "SerialLink":
        """Open a device path or pyserial URL without touching DTR/RTS (no reset) unless asked."""
        try:
            port = serial.serial_for_url(url, baudrate=baudrate, timeout=0.05, do_not_open=True)
            if hasattr(port, "dtr"):
                port.dtr = False  # released before opening: many boards wire DTR/RTS to EN/BOOT
                port.rts = False
            port.open()
        except (serial.SerialException, OSError, ValueError) as e:
            raise ColibriError(f"cannot open serial port {url}: {e}") from None
        link = cls(port, url)
        if reset:
            link.reset_board()
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
        """Pulse EN low through RTS (the usual USB-serial auto-reset wiring), BOOT left high."""
        self.port.dtr = False
        self.port.rts = True
        time.sleep(0.1)
        self.port.rts = False

    def close(self) -> None:
        try:
            self.port.close()
        except (serial.SerialException, OSError):
            pass

    def send(self, data: bytes) -> None:
        try:
            self.port.write(data)
            self.port.flush()
        except (serial.SerialException, OSError) as e:
            raise ColibriError(f"{self.where}: write failed: {e}") from None

    def _read(self) -> bytes:
        # Ask only for what is waiting (or one byte, blocking up to the port timeout): a read that
        # spans a disconnect would lose the bytes before it (pyserial raises without returning them).
        try:
            waiting = self.port.in_waiting
            return self.port.read(waiting if waiting > 1 else 1)
        except (serial.SerialException, OSError) as e:
            raise ColibriError(f"{self.where}: read failed ({e}); was the board unplugged or reset?") from None

    def run(self, request: RunRequest | None, session: Session, timeouts: Timeouts = Timeouts()) -> RunResult:
        """Read frames until `done`; after the hello, send `request` (None: only listen)."""
        start = time.monotonic()
        total = timeouts.total(request) if request else timeouts.boot
        last_data = start
        sent = False
        while not session.finished:
            now = time.monotonic()
            if not session.result.hello and now - start > timeouts.boot:
                hint = f" (it printed: {self.reader.log[-1][:60]!r})" if self.reader.log else ""
                raise ColibriError(f"{self.where}: no hello frame from the board within {timeouts.boot:.0f} s"
                                   f"{hint}; check the port, the baud rate and that the firmware is flashed")
            if session.result.hello and now - last_data > timeouts.silence:
                raise ColibriError(f"{self.where}: the board has been silent for {timeouts.silence:.0f} s "
                                   f"after {len(session.result.tokens)} tokens")
            if request and now - start > total:
                raise ColibriError(f"{self.where}: no complete result within {total:.0f} s "
                                   f"({len(session.result.tokens)} of {request.steps} tokens received)")
            chunk = self._read()
            if chunk:
                last_data = time.monotonic()
            for frame in self.reader.feed(chunk):
                session.handle(frame)
                if frame.kind == "hello" and request and not sent:
                    s = request.sampling.as_f32()
                    self.send(encode_request(0, request.prompt, request.steps, s.temperature, s.top_k, s.top_p,
                                             s.min_p, s.seed, request.stop_at_eos))
                    sent = True
        session.result.log = list(self.reader.log)
        session.result.wall_seconds = time.monotonic() - start
        return session.result
