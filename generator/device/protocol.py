"""The framed result protocol, host side (firmware_src/app/protocol.h is the other side).

    @CLB <seq> <kind> <key>=<value> ... *<crc32>\\n

FrameReader takes bytes in arbitrary pieces (split reads), keeps whatever is not a frame as log
lines (ROM banners, boot logs), rejects frames whose CRC does not match, and notices a reset
(a hello frame with sequence number 0 after other frames).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote

from ..errors import ColibriError

START = b"@CLB "
KINDS = (
    "hello",
    "bandwidth",
    "storage",
    "score",
    "token",
    "stats",
    "experts",
    "selftest",
    "checkpoint",
    "done",
    "error",
    "request",
    "ack",
)
_F32_BITS = re.compile(r"[0-9a-f]{8}", re.ASCII)
MAX_LINE = 4096  # longer than any frame the firmware can send (its line buffer is 2048 bytes)
_FRAME = re.compile(rb"@CLB (\d+) ([a-z]+)((?: [a-z_]+=[^ ]*)*) \*([0-9a-f]{8})\r?$")
_SAFE = re.compile(r"[^\x21-\x7e]|[%*=]")
_INTEGER = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_INTEGER_LIST = re.compile(r"[0-9]{1,20}(?:,[0-9]{1,20})*", re.ASCII)


@dataclass(frozen=True)
class Frame:
    seq: int
    kind: str
    fields: dict[str, str]

    def int(self, key: str, minimum: int | None = None) -> int:
        """An integer field, strictly: ASCII digits with an optional minus sign, no more (Python's
        int() would also take "1_0" and non-ASCII digits); a missing or malformed one is an error."""
        value = self.fields.get(key)
        if value is None:
            raise ColibriError(f"malformed {self.kind} frame from the board: no {key!r} field")
        if not _INTEGER.fullmatch(value):
            raise ColibriError(f"malformed {self.kind} frame from the board: {key}={value[:24]!r} is not an integer")
        number = int(value)
        if minimum is not None and number < minimum:
            raise ColibriError(f"malformed {self.kind} frame from the board: {key}={number} is below {minimum}")
        return number

    def f32(self, key: str):
        """A float32 sent as the 8 hex digits of its IEEE-754 bits (proto_f32), as a np.float32."""
        import numpy as np

        value = self.fields.get(key)
        if value is None or not _F32_BITS.fullmatch(value):
            raise ColibriError(f"malformed {self.kind} frame from the board: {key} is not a float32's 8 hex digits")
        return np.frombuffer(bytes.fromhex(value)[::-1], dtype="<f4")[0]

    def f32_list(self, key: str) -> list[str]:
        """A comma-separated list of float32s as proto_f32_list sends them (8 hex digits each), strictly."""
        value = self.fields.get(key, "")
        items = value.split(",")
        if not all(_F32_BITS.fullmatch(v) for v in items):
            raise ColibriError(f"malformed {self.kind} frame from the board: {key} is not a list of float32s")
        return items

    def int_list(self, key: str) -> list[int]:
        """A comma-separated list of non-negative integers, strictly."""
        value = self.fields.get(key)
        if value is None or not _INTEGER_LIST.fullmatch(value):
            raise ColibriError(f"malformed {self.kind} frame from the board: {key} is not a list of counts")
        return [int(v) for v in value.split(",")]


def _escape(value: str) -> str:
    return _SAFE.sub(lambda m: "".join(f"%{b:02x}" for b in m.group(0).encode()), value)


def encode_frame(seq: int, kind: str, fields: dict[str, object]) -> bytes:
    body = f"@CLB {seq} {kind}" + "".join(f" {k}={_escape(str(v))}" for k, v in fields.items())
    crc = zlib.crc32(body.encode())
    return f"{body} *{crc:08x}\n".encode()


def f32_bits(value: float) -> str:
    """The 8 hex digits of a float32's IEEE-754 bits, as request frames carry floats."""
    import struct

    return struct.pack(">f", value).hex()


def encode_request(
    seq: int,
    prompt: list[int],
    steps: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int,
    stop_at_eos: bool,
    digests: bool = True,
    threads: int = 1,
    probe_mib: int | None = None,
    start: int = 0,
    score_from: int | None = None,
    decode_from: int | None = None,
    speculate: int = 0,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = 64,
    trace: int | None = None,
) -> bytes:
    """The request frame every board reads (firmware_src/app/request.c): an MCU after its hello on
    its UART, a Linux firmware on its stdin."""
    return encode_frame(
        seq,
        "request",
        {
            "prompt": ",".join(str(t) for t in prompt),
            "steps": steps,
            "temperature": f32_bits(temperature),
            "top_k": top_k,
            "top_p": f32_bits(top_p),
            "min_p": f32_bits(min_p),
            "seed": seed,
            "eos": int(stop_at_eos),
            **({} if digests else {"digests": 0}),
            **({} if threads == 1 else {"threads": threads}),
            **({} if probe_mib is None else {"probe_mib": probe_mib}),
            **({} if start == 0 else {"start": start}),
            **({} if score_from is None else {"score_from": score_from}),
            **({} if decode_from is None else {"decode_from": decode_from}),
            **({} if not speculate else {"speculate": speculate}),
            **({} if trace is None else {"trace": trace}),  # protocol 7: that step's checkpoint frames
            # The repetition penalty's two values, sent when it is on (1.0 is off, the firmware's default).
            **(
                {}
                if f32_bits(repeat_penalty) == f32_bits(1.0)
                else {"repeat_penalty": f32_bits(repeat_penalty), "repeat_last_n": repeat_last_n}
            ),
        },
    )


def parse_frame(line: bytes) -> Frame | None:
    """A Frame if `line` holds a well-formed frame with a matching CRC, else None. A frame ends its
    line, and no value can hold "@CLB " (spaces are escaped), so the last start marker is the one:
    a frame cut short by a reset and followed by the new hello on the same line loses only itself."""
    start = line.rfind(START)
    if start < 0:
        return None
    m = _FRAME.match(line, start)
    if not m:
        return None
    body = line[start : m.start(4) - 2]
    if zlib.crc32(body) != int(m.group(4), 16):
        return None
    kind = m.group(2).decode()
    if kind not in KINDS:
        return None
    fields = {}
    for item in m.group(3).decode().split():
        key, _, value = item.partition("=")
        fields[key] = unquote(value)
    return Frame(int(m.group(1)), kind, fields)


@dataclass
class FrameReader:
    frames: list[Frame] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    rejected: int = 0  # lines that started a frame but failed to parse or match their CRC
    resets: int = 0
    _buffer: bytearray = field(default_factory=bytearray)
    _next_seq: int = 0

    def feed(self, data: bytes) -> list[Frame]:
        """Consume bytes; return the complete, valid frames they finished."""
        self._buffer += data
        out = []
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                if len(self._buffer) > MAX_LINE:
                    # A runaway line (output without newlines): no frame is that long, so all but
                    # the last MAX_LINE bytes go to the log as one entry and the buffer stays bounded.
                    cut = len(self._buffer) - MAX_LINE
                    self.log.append(
                        self._buffer[: min(cut, MAX_LINE)].decode("utf-8", "replace")
                        + (f"… ({cut - MAX_LINE} more bytes)" if cut > MAX_LINE else "")
                    )
                    del self._buffer[:cut]
                break
            line = bytes(self._buffer[:nl])
            del self._buffer[: nl + 1]
            frame = parse_frame(line)
            if frame is None:
                if START in line:
                    self.rejected += 1
                self.log.append(line.decode("utf-8", "replace").rstrip("\r"))
                continue
            if frame.kind == "hello" and frame.seq == 0 and self._next_seq > 0:
                self.resets += 1
            self._next_seq = frame.seq + 1
            self.frames.append(frame)
            out.append(frame)
        return out
