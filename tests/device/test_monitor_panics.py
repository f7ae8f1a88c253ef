"""monitor decodes an ESP32-P4 panic with the build's ELF, as idf.py monitor does: every code
address of the panic's lines (MEPC, RA, the stack dump) comes out as function, file and line, by
Espressif's own decoder (esp-idf-panic-decoder) over the firmware this project built for the P4; and
the RISC-V panic's stack dump is unwound into a backtrace by gdb-multiarch through Espressif's gdbstub
for panics."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess

import pytest
from conftest import DEFAULT_MODEL
from elftools.elf.elffile import ELFFile
from esp_idf_panic_decoder.gdb_panic_server import parse_idf_riscv_panic_output
from test_serial_link import PtyBoard, hello

from generator.device import monitor as monitor_module
from generator.device.monitor import STACK_DUMP_MAX_BYTES, PanicDumpReader
from generator.device.serial_link import SerialLink


def functions(elf) -> dict[str, tuple[int, int]]:
    """The ELF's functions: name -> (address, size)."""
    with open(elf, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        return {
            s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s["st_info"]["type"] == "STT_FUNC"
        }


def riscv_panic(mepc: int, ra: int, sp: int, stack: list[int]) -> bytes:
    """A panic as ESP-IDF's RISC-V panic handler prints it (esp_system's panic_arch.c): the cause,
    one core's register dump four to a line, the stack memory eight words to a line, the ELF's SHA-256."""
    regs = {"MEPC": mepc, "RA": ra, "SP": sp, "GP": 0x4FF5A000, "TP": 0, "T0": 0x4FC0A9F0, "T1": 0xF, "T2": 0}
    regs |= {"S0/FP": sp + 0x50, "S1": 1, "A0": 0, "A1": sp + 0x60}
    regs |= {name: 0 for name in ("A2 A3 A4 A5 A6 A7 S2 S3 S4 S5 S6 S7 S8 S9 S10 S11 T3 T4 T5 T6").split()}
    regs |= {"MSTATUS": 0x1881, "MTVEC": 0x4FF00003, "MCAUSE": 0x5, "MTVAL": 0x0, "MHARTID": 0}
    items = [f"{name:<8}: 0x{value:08x}  " for name, value in regs.items()]
    dump = ["".join(items[i : i + 4]) for i in range(0, len(items), 4)]
    words = [
        f"{sp + 32 * i:08x}: " + " ".join(f"0x{w:08x}" for w in stack[8 * i : 8 * i + 8])
        for i in range(len(stack) // 8)
    ]
    lines = [
        "",
        "Guru Meditation Error: Core  0 panic'ed (Load access fault). Exception was unhandled.",
        "",
        "Core  0 register dump:",
        *dump,
        "",
        "Stack memory:",
        *words,
        "",
        "ELF file SHA256: 5d1a2ed8a1f0c3b9",
        "",
        "Rebooting...",
    ]
    return "\r\n".join(lines).encode() + b"\r\n"


def monitor_records(elf, log: bytes, monkeypatch, capsys, seconds: float = 1.5, text: bool = False) -> list:
    """What `monitor --elf ELF --json` shows of a board that says hello and then sends `log` (the
    output's lines with text=True)."""
    from generator.cli import main

    board = PtyBoard()
    original = SerialLink.open

    def open_then_start(*args, **kw):  # the board talks once the port is open (opening flushes)
        link = original(*args, **kw)
        board.start(lambda b: b.write(hello() + log, piece=40))
        return link

    monkeypatch.setattr(SerialLink, "open", staticmethod(open_then_start))
    json_option = [] if text else ["--json"]
    try:
        capsys.readouterr()
        assert main(["monitor", "--port", board.path, "--elf", str(elf), "--duration", str(seconds), *json_option]) == 0
    finally:
        board.close()
    out = capsys.readouterr().out.splitlines()
    return out if text else [json.loads(line) for line in out]


@functools.cache
def disassembly(elf) -> str:
    return subprocess.run(
        ["riscv64-unknown-elf-objdump", "-d", str(elf)], capture_output=True, text=True, check=True
    ).stdout


def return_address(elf, caller: str, callee: str) -> int:
    """The address after `caller`'s call of `callee` in the ELF's code (what that call leaves in RA)."""
    start, size = functions(elf)[caller]
    for m in re.finditer(r"^\s*([0-9a-f]+):\s+([0-9a-f]+)\s+jal\s+[0-9a-f]+ <(\w+)>", disassembly(elf), re.M):
        if m.group(3) == callee and start <= int(m.group(1), 16) < start + size:
            return int(m.group(1), 16) + len(m.group(2)) // 2
    raise LookupError(f"{caller} does not call {callee}")


def frame_rules(elf) -> list[tuple[int, int, list]]:
    """The ELF's call frame information: (start, end, the decoded rows) of each function."""
    with open(elf, "rb") as f:
        fdes = [e for e in ELFFile(f).get_dwarf_info().CFI_entries() if "initial_location" in e.header]
        return [
            (e["initial_location"], e["initial_location"] + e["address_range"], e.get_decoded().table) for e in fdes
        ]


def stack_of_calls(elf, chain: list[str], sp: int) -> tuple[int, list[int]]:
    """A stopped point in chain[0] and the stack words below SP that a call chain[-1] -> ... ->
    chain[0] leaves, as the ELF's call frame information says gdb finds them: each frame's return
    address in the slot its function saves RA to, at the offset from its canonical frame address
    (SP plus the frame's size); the outermost frame's return address 0."""
    rules = frame_rules(elf)

    def rule_at(pc: int) -> tuple[int, int]:  # (the frame's size, RA's offset from the frame's top)
        table = next(t for lo, hi, t in rules if lo <= pc < hi)
        row = [r for r in table if r["pc"] <= pc][-1]
        assert row["cfa"].reg == 2 and 1 in row, f"no frame on SP with RA saved at {pc:#x}"
        return row["cfa"].offset, row[1].arg

    start = functions(elf)[chain[0]][0]
    stopped = next(r["pc"] for lo, _, t in rules if lo == start for r in t if 1 in r)  # RA saved: past the prologue
    returns = [return_address(elf, caller, callee) for callee, caller in zip(chain, chain[1:])]
    words: dict[int, int] = {}
    frame_sp = sp
    for pc, return_to in zip([stopped, *returns], [*returns, 0]):
        size, ra_offset = rule_at(pc if pc == stopped else pc - 1)  # a return address is after its call
        words[(frame_sp + size + ra_offset - sp) // 4] = return_to
        frame_sp += size
    count = -(-max(256, (frame_sp - sp) // 4) // 8) * 8  # ESP-IDF dumps 1 KiB; this chain may need more
    return stopped, [words.get(i, 0xA5A5A5A5 if i % 5 == 3 else 0) for i in range(count)]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'searchString' deprecated")  # inside the decoder's own parser
def test_monitor_decodes_a_p4_panic_to_function_file_and_line(builder, monkeypatch, capsys):
    """Slow: it builds the esp32p4 firmware (its ELF is the one decoded; nothing else in the tests
    of this folder builds that board)."""
    _, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="esp32p4")
    elf = art.program
    assert elf.name == "firmware.elf"
    funcs = functions(elf)
    # The panic: stopped inside the forward pass, called from the decode loop; the self-test and main below on the stack.
    mepc = funcs["colibri_forward"][0] + 0x20
    ra = funcs["colibri_decode"][0] + 0x40
    below = [funcs["colibri_selftest"][0] + 0x30, funcs["main"][0] + 0x10]
    sp = 0x4FF9FE40
    stack = [0, 0, below[0], 0xA5A5A5A5, sp + 0x80, 0, 0, 0, 0x3F, below[1], 0, 0, 0, 0, 0, 0]
    panic = riscv_panic(mepc, ra, sp, stack)
    # Espressif's own parser of ESP-IDF's panic output reads it: registers and stack as written.
    parsed = parse_idf_riscv_panic_output(panic.decode())
    assert (parsed.regs["MEPC"], parsed.regs["RA"], parsed.stack_base_addr) == (mepc, ra, sp)

    records = monitor_records(elf, panic, monkeypatch, capsys)
    decoded = [r for r in records if r["type"] == "address"]
    assert [int(r["address"], 16) for r in decoded] == [mepc, ra, *below]
    for record, called in zip(decoded, ["colibri_forward", "colibri_decode", "colibri_selftest", "main"]):
        # innermost first: the function the address lies in is the last of an inlined chain
        outer = record["inlined_by"][-1] if record["inlined_by"] else record
        assert outer["function"] == called, record
        assert outer["file"].endswith(".c") and outer["line"].isdigit(), record
    # each decoded address follows the log line it is in
    mepc_line = next(i for i, r in enumerate(records) if r["type"] == "log" and r["text"].startswith("MEPC"))
    assert records[mepc_line + 1]["address"] == f"0x{mepc:08x}" and records[mepc_line + 2]["address"] == f"0x{ra:08x}"


def test_monitor_refuses_an_elf_that_is_not_one(tmp_path, capsys):
    from generator.cli import main

    image = tmp_path / "firmware.bin"
    image.write_bytes(b"\xe9\x03\x02\x20" + bytes(60))
    assert main(["monitor", "--port", "/dev/null", "--elf", str(image)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"colibri: error: --elf {image}: not an ELF file")


# The decode loop's calls on the firmware's serial path (colibri_serve -> colibri_serve_line -> colibri_decode ->
# colibri_forward), innermost first.
CALLS = ["colibri_forward", "colibri_decode", "colibri_serve_line", "colibri_serve"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'searchString' deprecated")  # inside the decoder's own parser
def test_monitor_unwinds_a_riscv_panics_stack_dump_into_a_backtrace(builder, monkeypatch, capsys):
    """Slow: the qemu-rv32 firmware the device tests share (same runtime as the P4's, rv32imafc) is its ELF."""
    if shutil.which("gdb-multiarch") is None:
        pytest.fail("gdb-multiarch is not installed (tests/apt-packages.txt: apt-get install gdb-multiarch)")
    _, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    elf = art.program
    sp = 0x8003E000
    mepc, stack = stack_of_calls(elf, CALLS, sp)
    panic = riscv_panic(mepc, return_address(elf, "colibri_decode", "colibri_forward"), sp, stack)
    assert parse_idf_riscv_panic_output(panic.decode()).stack_data == b"".join(w.to_bytes(4, "little") for w in stack)

    records = monitor_records(elf, panic, monkeypatch, capsys)
    backtraces = [r for r in records if r["type"] == "backtrace"]
    assert len(backtraces) == 1 and backtraces[0]["problem"] == "" and backtraces[0]["gdb"] == "gdb-multiarch"
    frames = backtraces[0]["frames"]
    assert frames[0]["address"] == f"0x{mepc:08x}"
    # every call of the chain, in order; between them only functions inlined into the next (decode's own helpers)
    named = [f["function"] for f in frames if f["function"] in CALLS]
    assert named == CALLS, frames
    for frame in frames[: len(frames) - 1]:  # the outermost: the 0 return address the dump ends with
        assert frame["file"].startswith("firmware_src/") and frame["line"].isdigit(), frame
    # the backtrace follows the stack dump, before the line that ended it
    last_stack_line = max(
        i for i, r in enumerate(records) if r["type"] == "log" and re.match(r"[0-9a-f]{8}: ", r["text"])
    )
    at = records.index(backtraces[0])
    assert at > last_stack_line and all(r["type"] == "address" for r in records[last_stack_line + 1 : at])

    shown = monitor_records(elf, panic, monkeypatch, capsys, seconds=1, text=True)
    head = shown.index("   backtrace (gdb-multiarch, from the stack dump):")
    assert re.fullmatch(rf"   #0 0x{mepc:08x} colibri_forward at firmware_src/runtime/\S+\.c:\d+", shown[head + 1])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'searchString' deprecated")
def test_without_gdb_monitor_says_what_to_install_and_still_decodes_the_addresses(builder, monkeypatch, capsys):
    """Slow: the shared qemu-rv32 firmware is its ELF."""
    _, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    elf = art.program
    mepc, stack = stack_of_calls(elf, CALLS[:2], 0x8003E000)
    monkeypatch.setattr(monitor_module, "GDB_PROGRAMS", ("no-such-gdb-here",))
    records = monitor_records(elf, riscv_panic(mepc, mepc, 0x8003E000, stack), monkeypatch, capsys)
    [backtrace] = [r for r in records if r["type"] == "backtrace"]
    assert backtrace["frames"] == [] and "sudo apt-get install gdb-multiarch" in backtrace["problem"]
    assert "\n" not in backtrace["problem"]
    assert [r["function"] for r in records if r["type"] == "address"][:1] == ["colibri_forward"]


def stack_lines(base: int, count: int) -> list[str]:
    return [f"{base + 32 * i:08x}: " + " ".join(f"0x{i:08x}" for _ in range(8)) for i in range(count)]


def test_a_stack_dump_is_read_only_as_esp_idf_writes_it_and_only_so_far():
    registers = [
        "Core  0 register dump:",
        "MEPC    : 0x4ff0a1b2  RA      : 0x4ff0a3c4  SP      : 0x4ff3ff10  GP      : 0x0",
    ]

    def read(lines: list[str]):
        reader = PanicDumpReader()
        got = [reader.add(line) for line in lines]
        return [p for p in got if p is not None], reader

    # a dump far longer than ESP-IDF's is cut at the bound
    long_dump = [*registers, "Stack memory:", *stack_lines(0x4FF3FF10, 4096), ""]
    [panic], _ = read(long_dump)
    assert len(panic.stack) == STACK_DUMP_MAX_BYTES and panic.stack_base == 0x4FF3FF10
    assert panic.registers["MEPC"] == 0x4FF0A1B2 and panic.registers["SP"] == 0x4FF3FF10
    # a line that does not continue the addresses ends the dump there
    gap = stack_lines(0x4FF3FF10, 2) + [f"{0x4FF3FF10 + 256:08x}: 0x00000001"]
    [panic], _ = read([*registers, "Stack memory:", *gap, ""])
    assert len(panic.stack) == 64
    # nothing but hexadecimal words is taken: a line with anything else ends the dump
    [panic], _ = read([*registers, "Stack memory:", *stack_lines(0x4FF3FF10, 1), "4ff3ff30: 0x1 $(reboot)"])
    assert len(panic.stack) == 32
    # registers without the stack pointer, or no stack: no panic to unwind
    assert read(["Core  0 register dump:", "MEPC    : 0x4ff0a1b2", "Stack memory:", *stack_lines(0, 1), ""])[0] == []
    assert read([*registers, "Stack memory:", ""])[0] == []
    # the log ends inside the dump: what arrived is the panic
    found, reader = read([*registers, "Stack memory:", *stack_lines(0x4FF3FF10, 3)])
    assert found == [] and len(reader.finish().stack) == 96
