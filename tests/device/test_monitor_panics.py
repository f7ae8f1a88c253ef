"""monitor decodes an ESP32-P4 panic with the build's ELF, as idf.py monitor does: every code
address of the panic's lines (MEPC, RA, the stack dump) comes out as function, file and line, by
Espressif's own decoder (esp-idf-panic-decoder) over the firmware this project built for the P4."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL
from elftools.elf.elffile import ELFFile
from esp_idf_panic_decoder.gdb_panic_server import parse_idf_riscv_panic_output
from test_serial_link import PtyBoard, hello

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


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'searchString' deprecated")  # inside the decoder's own parser
def test_monitor_decodes_a_p4_panic_to_function_file_and_line(builder, monkeypatch, capsys):
    """Slow: it builds the esp32p4 firmware (its ELF is the one decoded; nothing else in the tests
    of this folder builds that board)."""
    from generator.cli import main

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

    board = PtyBoard()
    original = SerialLink.open

    def open_then_start(*args, **kw):  # the board talks once the port is open (opening flushes)
        link = original(*args, **kw)
        board.start(lambda b: b.write(hello() + panic, piece=40))
        return link

    monkeypatch.setattr(SerialLink, "open", staticmethod(open_then_start))
    try:
        capsys.readouterr()
        assert main(["monitor", "--port", board.path, "--elf", str(elf), "--duration", "1.5", "--json"]) == 0
    finally:
        board.close()
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
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
