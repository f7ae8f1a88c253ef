"""`colibri monitor`: watch a board's serial output as a person reads it.

Every line that is not a frame is shown as log ("| " prefix, so the ROM boot banner and the
firmware's own prints are visible); every valid frame is shown decoded; corrupted frames (rejected
by their CRC), frames lost between sequence numbers and resets (a new hello with sequence number 0)
are called out and counted. Opening the port does not reset the board unless asked.

    | ESP-ROM:esp32p4-eco2-20240710
    [0] hello: board qemu-rv32, firmware 0.1.0, llama q8_0, ctx 64, vocab 2048, model 1a2b3c4d5e6f7081…
    [1] token: step 0, id 312, logits 9f8e7d6c5b4a3b2c…
    !! corrupted frame rejected (CRC or format): @CLB 2 token step=1 id=1' logits=…
    -- stopped after 2.0 s (duration): 9 frames, 1 rejected, 1 lost, 0 resets, 0 error frames

With the model's tokenizer (`monitor --model DIR`), token frames also show their text, and a
finished run its whole text:

    [1] token: step 0, id 312, logits 9f8e7d6c5b4a3b2c…, text " God"
    -- text:  God said, Let there be light

With the build's ELF (`monitor --elf FILE`, or `flash --monitor`), every code address in a log line
(an ESP32-P4 panic's MEPC and RA, its stack dump, a backtrace) is decoded below it to function, file
and line with Espressif's decoder (esp-idf-panic-decoder), as idf.py monitor does:

    | MEPC    : 0x4ff0a1b2  RA      : 0x4ff0a3c4  SP      : 0x4ff3ff10  GP      : 0x4ff0c000
       0x4ff0a1b2: colibri_forward at firmware_src/runtime/model.c:412

With json_lines, each of those is one JSON object per line instead ({"type": "log" | "frame" |
"rejected" | "lost" | "reset" | "model_mismatch" | "text" | "address" | "start" | "summary", "t":
seconds, ...}).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import ColibriError
from .protocol import Frame
from .serial_link import SerialLink
from .session import Selftest

_SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour codes (ESP-IDF logs use them): kept
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything else could drive the terminal: escaped


def printable(line: str) -> str:
    """A log line safe to print on a terminal: colour codes kept, other control bytes escaped."""
    parts = []
    pos = 0
    for m in _SGR.finditer(line):
        parts.append(_CONTROL.sub(lambda c: f"\\x{ord(c.group(0)):02x}", line[pos : m.start()]))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(_CONTROL.sub(lambda c: f"\\x{ord(c.group(0)):02x}", line[pos:]))
    return "".join(parts)


def _short(value: str, n: int = 16) -> str:
    return value[:n] + "…" if len(value) > n else value


def describe(frame: Frame) -> str:
    """One readable line for a frame."""
    f = frame.fields
    head = f"[{frame.seq}] "
    if frame.kind == "hello":
        parts = [f"board {f.get('board', '?')}", f"firmware {f.get('fw', '?')}"]
        if "arch" in f or "quant" in f:
            parts.append(f"{f.get('arch', '?')} {f.get('quant', '?')}")
        parts += [f"{k} {f[k]}" for k in ("ctx", "vocab", "machine", "cpu", "kernels", "proto") if k in f]
        parts.append(f"model {_short(f.get('model', '?'))}")
        return head + "hello: " + ", ".join(parts)
    if frame.kind == "token":
        return head + f"token: step {f.get('step', '?')}, id {f.get('id', '?')}, logits {_short(f.get('logits', '?'))}"
    if frame.kind == "done":
        return head + f"done: {f.get('tokens', '?')} tokens, reason {f.get('reason', '?')}"
    if frame.kind == "selftest":
        verdict = Selftest(f.get("result") == "pass", dict(f))
        return head + printable(verdict.line())
    if frame.kind == "error":
        return head + f"ERROR {f.get('code', '?')}: {printable(f.get('msg', ''))}"
    return head + f"{frame.kind}: " + " ".join(f"{k}={printable(v)}" for k, v in f.items())


# ---- code addresses in the log: the build's ELF, Espressif's decoder ----------------------------

# The binutils whose addr2line reads an ELF of each machine, the first found on PATH taken:
# Espressif's own RISC-V toolchain where ESP-IDF is installed, else Debian's (the boards' compiler).
ADDR2LINE_PREFIXES = {
    "EM_RISCV": ("riscv32-esp-elf-", "riscv64-unknown-elf-"),
    "EM_AARCH64": ("aarch64-linux-gnu-", ""),
    "EM_X86_64": ("",),
}


@dataclass(frozen=True)
class DecodedAddress:
    """One code address of a log line: where it is in the source (several places when inlined,
    innermost first)."""

    address: str
    places: tuple[tuple[str, str, str], ...]  # (function, file, line)

    def lines(self) -> list[str]:
        def place(func: str, path: str, line: str) -> str:
            return f"{func} at {path}" + (f":{line}" if line and line != "?" else "")

        first, *inlined = self.places
        return [f"{self.address}: {place(*first)}"] + [f"  (inlined by) {place(*p)}" for p in inlined]

    def to_json(self) -> dict[str, object]:
        return {
            "address": self.address,
            "function": self.places[0][0],
            "file": self.places[0][1],
            "line": self.places[0][2],
            "inlined_by": [{"function": f, "file": p, "line": n} for f, p, n in self.places[1:]],
        }


def elf_machine(elf: Path) -> str:
    """The ELF's machine (EM_RISCV, ...); a file that is not an ELF is refused."""
    try:
        with open(elf, "rb") as f:
            return str(ELFFile(f)["e_machine"])
    except FileNotFoundError:
        raise ColibriError(
            f"--elf {elf}: no such file (give the build's ELF: build/<board>/<model>/firmware.elf)"
        ) from None
    except (ELFError, OSError) as e:
        raise ColibriError(f"--elf {elf}: not an ELF file ({e}); give the firmware's ELF, not its .bin image") from None


def toolchain_prefix(elf: Path, compiler: str | None = None) -> str:
    """The binutils prefix whose addr2line reads `elf`: the board's compiler's own (riscv64-unknown-elf-gcc
    gives riscv64-unknown-elf-) when known, else the first of ADDR2LINE_PREFIXES found for its machine."""
    machine = elf_machine(elf)
    candidates: tuple[str, ...] = ()
    if compiler and compiler.endswith("gcc"):
        candidates = (compiler[: -len("gcc")],)
    candidates += ADDR2LINE_PREFIXES.get(machine, ())
    for prefix in candidates:
        if shutil.which(prefix + "addr2line"):
            return prefix
    wanted = " or ".join(p + "addr2line" for p in candidates) or f"an addr2line for {machine}"
    raise ColibriError(
        f"--elf {elf}: no {wanted} on PATH to decode its addresses "
        "(sudo apt-get install gcc-riscv64-unknown-elf for the ESP32-P4, or ESP-IDF's riscv32-esp-elf)"
    )


class PanicDecoder:
    """The code addresses of log lines decoded with the build's ELF (esp-idf-panic-decoder)."""

    def __init__(self, elf: Path, compiler: str | None = None):
        from esp_idf_panic_decoder import PcAddressDecoder

        self.elf = elf
        self.decoder = PcAddressDecoder(toolchain_prefix(elf, compiler), str(elf))

    def decode(self, line: str) -> list[DecodedAddress]:
        """Each address of `line` in the ELF's code, in the order they appear (a log line with none: [])."""
        return [
            DecodedAddress(address, tuple((p.func, p.path, p.line) for p in places))
            for address, places in self.decoder.translate_addresses(line)
        ]


class _Output:
    def __init__(self, out: TextIO, json_lines: bool, start: float):
        self.out, self.json_lines, self.start = out, json_lines, start

    def emit(self, shown: str, record_type: str, **data) -> None:
        if self.json_lines:
            record = {"type": record_type, "t": round(time.monotonic() - self.start, 3), **data}
            line = json.dumps(record, ensure_ascii=False)
        else:
            line = shown
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except BrokenPipeError:  # `colibri monitor | head`: the reader left
            raise KeyboardInterrupt from None


class _Text:
    """The text of a run's tokens as they arrive (decoding the whole run each time keeps
    multi-token characters and spacing right); a new hello starts a new run."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        piece = text[len(self.shown) :] if text.startswith(self.shown) else ""
        self.shown = text
        return piece

    def restart(self) -> None:
        self.ids, self.shown = [], ""


def monitor(
    url: str,
    baudrate: int = 115200,
    reset: bool = False,
    out: TextIO | None = None,
    duration: float | None = None,
    expected_model: str | None = None,
    json_lines: bool = False,
    tokenizer=None,
    decoder: PanicDecoder | None = None,
) -> int:
    """Print what the board on `url` sends until Ctrl-C or `duration` seconds; return the exit code:
    0, or 1 if an error frame arrived or a hello named another model than `expected_model` (the
    full hash or a prefix of it). With the model's `tokenizer` (model.tokenizer.Tokenizer), token
    frames show their text and a finished run its whole text. With a `decoder` (the build's ELF),
    the code addresses of log lines are decoded below them. A port that cannot be opened or fails
    (unplugged) raises ColibriError after the summary line."""
    text = _Text(tokenizer) if tokenizer is not None else None
    out = out if out is not None else sys.stdout
    expected = expected_model.lower() if expected_model else None
    link = SerialLink.open(url, baudrate, reset=reset)
    start = time.monotonic()
    show = _Output(out, json_lines, start)
    counts = {"frames": 0, "rejected": 0, "lost": 0, "resets": 0, "errors": 0, "model_mismatches": 0}
    next_seq = None
    why = "duration"
    failure: ColibriError | None = None
    show.emit(
        f"-- monitoring {url} at {baudrate} baud{' after resetting the board' if reset else ''}"
        f"{f' for {duration:g} s' if duration is not None else ''}; Ctrl-C to stop",
        "start",
        port=url,
        baudrate=baudrate,
        reset=reset,
        duration=duration,
    )
    try:
        while duration is None or time.monotonic() - start < duration:
            for kind, item in link.poll():
                if kind == "log":
                    show.emit("| " + printable(item), "log", text=item)
                    for decoded in decoder.decode(item) if decoder is not None else []:
                        shown = "\n".join("   " + printable(line) for line in decoded.lines())
                        show.emit(shown, "address", **decoded.to_json())
                    continue
                if kind == "rejected":
                    counts["rejected"] += 1
                    show.emit(
                        f"!! corrupted frame rejected (CRC or format): {printable(item)[:160]}", "rejected", text=item
                    )
                    continue
                frame: Frame = item
                if frame.kind == "hello" and frame.seq == 0 and next_seq is not None:
                    counts["resets"] += 1
                    show.emit("!! the board reset (a new hello with sequence number 0)", "reset")
                elif next_seq is not None and frame.seq != next_seq:
                    if frame.seq > next_seq:
                        counts["lost"] += frame.seq - next_seq
                        show.emit(
                            f"!! {frame.seq - next_seq} frame(s) lost before frame {frame.seq}",
                            "lost",
                            count=frame.seq - next_seq,
                            before_seq=frame.seq,
                        )
                    else:
                        show.emit(
                            f"!! frame sequence went back from {next_seq - 1} to {frame.seq}",
                            "lost",
                            count=0,
                            before_seq=frame.seq,
                        )
                next_seq = frame.seq + 1
                counts["frames"] += 1
                if text is not None and frame.kind == "hello":
                    text.restart()
                if text is not None and frame.kind == "token" and frame.fields.get("id", "").isdigit():
                    piece = text.add(int(frame.fields["id"]))
                    show.emit(
                        f"{describe(frame)}, text {json.dumps(piece, ensure_ascii=False)}",
                        "frame",
                        seq=frame.seq,
                        kind=frame.kind,
                        fields=frame.fields,
                        text=piece,
                    )
                else:
                    show.emit(describe(frame), "frame", seq=frame.seq, kind=frame.kind, fields=frame.fields)
                if text is not None and frame.kind == "done" and text.ids:
                    show.emit(f"-- text: {printable(text.shown)}", "text", text=text.shown, tokens=list(text.ids))
                if frame.kind == "error":
                    counts["errors"] += 1
                if frame.kind == "hello" and expected:
                    model = frame.fields.get("model", "").lower()
                    if not model.startswith(expected):
                        counts["model_mismatches"] += 1
                        show.emit(
                            f"!! this firmware is for model {_short(model) or '?'}, expected "
                            f"{_short(expected)} (flash the matching build)",
                            "model_mismatch",
                            model=model,
                            expected=expected,
                        )
            # A long session must not grow without bound: the events above are all we need.
            link.reader.frames.clear()
            link.reader.log.clear()
    except KeyboardInterrupt:
        why = "Ctrl-C"
    except ColibriError as e:
        why = "port failed"
        failure = e
    finally:
        link.close()
    code = 1 if counts["errors"] or counts["model_mismatches"] else 0
    elapsed = time.monotonic() - start
    parts = [
        f"{counts['frames']} frames",
        f"{counts['rejected']} rejected (corrupted)",
        f"{counts['lost']} lost",
        f"{counts['resets']} resets",
        f"{counts['errors']} error frames",
    ]
    if expected:
        parts.append(f"{counts['model_mismatches']} hello(s) for another model")
    try:
        show.emit(
            f"-- stopped after {elapsed:.1f} s ({why}): {', '.join(parts)}",
            "summary",
            reason=why,
            seconds=round(elapsed, 3),
            exit=2 if failure else code,
            **counts,
        )
    except KeyboardInterrupt:
        pass
    if failure is not None:
        raise failure
    return code
