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

A RISC-V panic prints no backtrace, only its registers and a "Stack memory:" dump: below the dump,
gdb (Debian's gdb-multiarch) unwinds it through the ELF's call frame information, reading the
registers and the dumped stack from Espressif's gdbstub for panics (esp-idf-panic-decoder's
gdb_panic_server, served on a localhost socket, so nothing of the log passes through a shell):

       backtrace (gdb-multiarch, from the stack dump):
       #0 0x4ff0a1b2 colibri_forward at firmware_src/runtime/model.c:412
       #1 0x4ff0b3c6 colibri_decode at firmware_src/app/decode.c:467

With json_lines, each of those is one JSON object per line instead ({"type": "log" | "frame" |
"rejected" | "lost" | "reset" | "model_mismatch" | "text" | "address" | "backtrace" | "start" |
"summary", "t":
seconds, ...}).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
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


# ---- a RISC-V panic's stack dump unwound by gdb ---------------------------------------------------

# The gdbs that unwind an rv32 stack, the first found on PATH taken: Debian's, then ESP-IDF's own.
GDB_PROGRAMS = ("gdb-multiarch", "riscv32-esp-elf-gdb")
# ESP-IDF dumps 1 KiB of stack; a longer dump is cut here (the log is not trusted to end it).
STACK_DUMP_MAX_BYTES = 16 * 1024
BACKTRACE_MAX_FRAMES = 64
GDB_TIMEOUT_S = 30.0

_REGISTER_DUMP = re.compile(r"^Core\s+(\d+) register dump:\s*$")
_REGISTER = re.compile(r"([A-Z][A-Z0-9]*(?:/FP)?)\s*:\s*0x([0-9a-fA-F]{1,8})\b")
_STACK_LINE = re.compile(r"^([0-9a-fA-F]{8}):((?:\s+0x[0-9a-fA-F]{8}){1,8})\s*$")
# A frame of gdb's `bt` (an inlined one has no address): "#0  0x800018ee in colibri_forward (w=..., n=...)
# at firmware_src/runtime/model.c:612"
_GDB_FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?(\S+) \(.*?\)(?: at (.+):(\d+))?$")


@dataclass(frozen=True)
class RiscvPanic:
    """What ESP-IDF's RISC-V panic handler printed: one core's registers and its stack from SP up."""

    registers: dict[str, int]
    stack_base: int
    stack: bytes


@dataclass(frozen=True)
class BacktraceFrame:
    index: int
    address: str  # "": the function the frame above was inlined into (gdb gives the address there)
    function: str
    file: str
    line: str

    def text(self) -> str:
        where = f" at {self.file}:{self.line}" if self.file else ""
        return f"#{self.index} {self.address + ' ' if self.address else ''}{self.function}{where}"


@dataclass(frozen=True)
class Backtrace:
    """The frames gdb unwound from a panic's stack dump, or why there are none."""

    frames: tuple[BacktraceFrame, ...] = ()
    problem: str = ""  # gdb missing or failed: one line saying so
    gdb: str = ""

    def lines(self) -> list[str]:
        if self.problem:
            return [f"!! {self.problem}"]
        return [f"backtrace ({self.gdb}, from the stack dump):"] + [f.text() for f in self.frames]

    def to_json(self) -> dict[str, object]:
        return {"frames": [vars(f) for f in self.frames], "problem": self.problem, "gdb": self.gdb}


class PanicDumpReader:
    """Picks a RISC-V panic's register dump and "Stack memory:" lines out of the log, line by line,
    each register and stack line checked against ESP-IDF's format (the stack's addresses contiguous,
    at most STACK_DUMP_MAX_BYTES): `add` returns the panic once the dump has ended."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.state = "idle"
        self.registers: dict[str, int] = {}
        self.stack_base = 0
        self.stack = bytearray()

    def add(self, line: str) -> RiscvPanic | None:
        line = line.strip()
        if _REGISTER_DUMP.match(line):  # a new panic starts (one left unfinished is dropped)
            self._reset()
            self.state = "registers"
            return None
        if self.state == "registers":
            if line == "Stack memory:":
                self.state = "stack"
            elif len(self.registers) < 64:
                self.registers.update((name, int(value, 16)) for name, value in _REGISTER.findall(line))
            return None
        if self.state == "stack":
            m = _STACK_LINE.match(line)
            base = int(m.group(1), 16) if m else 0
            if m and (not self.stack or base == self.stack_base + len(self.stack)):
                if not self.stack:
                    self.stack_base = base
                if len(self.stack) < STACK_DUMP_MAX_BYTES:
                    self.stack += b"".join(int(w, 16).to_bytes(4, "little") for w in m.group(2).split())
                return None
            return self.finish()
        return None

    def finish(self) -> RiscvPanic | None:
        """The panic read so far, if its dump holds SP, MEPC and some stack (the log ended after it)."""
        panic = None
        if self.state == "stack" and self.stack and {"MEPC", "SP"} <= self.registers.keys():
            stack = bytes(self.stack[:STACK_DUMP_MAX_BYTES])
            panic = RiscvPanic(dict(self.registers), self.stack_base, stack)
        self._reset()
        return panic


class _SocketStream:
    """The stream Espressif's GdbServer reads and writes (text, one character at a time) over a socket;
    gdb closing it ends the server."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def read(self, n: int) -> str:
        data = self.sock.recv(n)
        if not data:
            raise EOFError
        return data.decode("latin-1")

    def write(self, text: str) -> None:
        self.sock.sendall(text.encode("ascii"))

    def flush(self) -> None:
        pass


def _serve_panic(listener: socket.socket, panic: RiscvPanic) -> None:
    """Answer one gdb's remote protocol with the panic's registers and stack (Espressif's gdbstub)."""
    from esp_idf_panic_decoder.gdb_panic_server import GdbServer, PanicInfo

    try:
        conn, _ = listener.accept()
    except OSError:  # gdb never came (it failed first); the listener is closed by then
        return
    with conn:
        conn.settimeout(GDB_TIMEOUT_S)
        server = GdbServer(PanicInfo(0, panic.registers, panic.stack_base, panic.stack))
        server.in_stream = server.out_stream = _SocketStream(conn)
        try:
            server.run()
        except (SystemExit, EOFError, OSError):  # gdb killed the target (SystemExit), left or timed out
            pass


def unwind(panic: RiscvPanic, elf: Path, gdb: str) -> Backtrace:
    """The backtrace gdb finds in `panic`'s stack with `elf`'s call frame information."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(GDB_TIMEOUT_S)
    stub = threading.Thread(target=_serve_panic, args=(listener, panic), daemon=True)
    stub.start()
    argv = [
        gdb,
        "--batch",
        "-nx",
        "-iex",
        "set auto-load off",  # nothing of the ELF runs (its .debug_gdb_scripts)
        "-iex",
        "set pagination off",
        "-ex",
        "set print frame-arguments none",
        "-ex",
        f"target remote 127.0.0.1:{listener.getsockname()[1]}",
        "-ex",
        f"bt {BACKTRACE_MAX_FRAMES}",
        str(elf.resolve()),  # an absolute path: never read as an option
    ]
    name = Path(gdb).name
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=GDB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Backtrace(problem=f"{name} did not unwind the stack dump within {GDB_TIMEOUT_S:g} s", gdb=name)
    finally:
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the stub's accept when gdb never connected
        except OSError:
            pass
        listener.close()
        stub.join(timeout=5)
    frames = []
    for line in done.stdout.splitlines():
        m = _GDB_FRAME.match(line.strip())
        if m:
            index, address, function, path, number = m.groups()
            frames.append(BacktraceFrame(int(index), address or "", function, path or "", number or ""))
    if not frames:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        why = printable(said[-1])[:200] if said else f"exit status {done.returncode}"
        return Backtrace(problem=f"{name} could not unwind the stack dump: {why}", gdb=name)
    return Backtrace(tuple(frames), gdb=name)


class PanicDecoder:
    """The code addresses of log lines decoded with the build's ELF (esp-idf-panic-decoder); for a
    RISC-V ELF, a panic's stack dump unwound into a backtrace by gdb."""

    def __init__(self, elf: Path, compiler: str | None = None):
        from esp_idf_panic_decoder import PcAddressDecoder

        self.elf = elf
        self.decoder = PcAddressDecoder(toolchain_prefix(elf, compiler), str(elf))
        self.riscv = elf_machine(elf) == "EM_RISCV"
        self.gdb = next((path for path in map(shutil.which, GDB_PROGRAMS) if path), None)
        self.dump = PanicDumpReader()

    def decode(self, line: str) -> list[DecodedAddress]:
        """Each address of `line` in the ELF's code, in the order they appear (a log line with none: [])."""
        return [
            DecodedAddress(address, tuple((p.func, p.path, p.line) for p in places))
            for address, places in self.decoder.translate_addresses(line)
        ]

    def backtrace(self, line: str | None) -> Backtrace | None:
        """The backtrace of the RISC-V panic whose stack dump `line` ends (None: the log ended), else None."""
        if not self.riscv:
            return None
        panic = self.dump.add(line) if line is not None else self.dump.finish()
        if panic is None:
            return None
        if self.gdb is None:
            return Backtrace(
                problem="no gdb-multiarch on PATH, so the stack dump is not unwound into a backtrace "
                "(sudo apt-get install gdb-multiarch); its addresses are decoded above"
            )
        return unwind(panic, self.elf, self.gdb)


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


def _show_backtrace(show: _Output, backtrace: Backtrace | None) -> None:
    if backtrace is not None:
        show.emit("\n".join("   " + line for line in backtrace.lines()), "backtrace", **backtrace.to_json())


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
                    _show_backtrace(show, decoder.backtrace(item) if decoder is not None else None)
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
    try:
        _show_backtrace(show, decoder.backtrace(None) if decoder is not None else None)
    except KeyboardInterrupt:
        pass
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
