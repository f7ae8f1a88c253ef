"""The A/B update logic with rollback: firmware_src/app/ota_state.c (the firmware's half, run on
this machine and on qemu-rv32 against a simulated otadata partition by tests/c/ota_harness.c) and
generator/boards/otadata.py (the host's half, which `colibri ota` writes the board's otadata with)
follow ESP-IDF's bootloader and esp_ota_ops, and agree byte for byte."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from c_builds import gcc
from conftest import REPO, run_rv32_semihosted

from generator.boards import load_board
from generator.boards.otadata import (
    ABORTED,
    INVALID,
    NEW,
    PENDING_VERIFY,
    SECTOR,
    UNDEFINED,
    VALID,
    OtaData,
    OtaEntry,
    ota_crc,
)

APP, RUNTIME = REPO / "firmware_src" / "app", REPO / "firmware_src" / "runtime"
SOURCES = [REPO / "tests" / "c" / "ota_harness.c", APP / "ota_state.c", RUNTIME / "checksum.c"]
SLOTS = 2


@pytest.fixture(scope="module")
def host_output(tmp_path_factory) -> str:
    exe = gcc(tmp_path_factory.mktemp("ota") / "ota_harness", f"-I{APP}", *SOURCES, optimize="-O1")
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def rv32_output(tmp_path_factory) -> str:
    """The harness built with the qemu-rv32 board's compiler and flags (semihosting for its output),
    run bare metal on qemu-system-riscv32."""
    board = load_board("qemu-rv32")
    if shutil.which(board.cc) is None or shutil.which("qemu-system-riscv32") is None:
        pytest.skip("the qemu-rv32 toolchain is not installed (./colibri setup-toolchain --board qemu-rv32)")
    elf = tmp_path_factory.mktemp("ota-rv32") / "ota_harness.elf"
    return run_rv32_semihosted(SOURCES, elf, APP, timeout=120)


NAMES = {
    NEW: "new",
    PENDING_VERIFY: "pending",
    VALID: "valid",
    INVALID: "invalid",
    ABORTED: "aborted",
    UNDEFINED: "undefined",
}


def python_replay() -> str:
    """The harness's scenarios through generator/boards/otadata.py, in the harness's words."""
    out = [f"crc {s} {ota_crc(s):08x}" for s in (1, 2, 3, 0x12345678)]
    state = {"d": OtaData.blank(), "name": ""}

    def boot(step):
        slot, state["d"] = state["d"].boot(SLOTS)
        s = state["d"].slot_state(slot, SLOTS)
        out.append(f"{state['name']} {step} slot {slot} state {NAMES[s]}")
        return s

    def decide(step, s, selftest):
        d = state["d"]
        action = "keep" if s != PENDING_VERIFY else "confirm" if selftest == 0 else "roll-back"
        refused = ""
        if action != "keep":
            i = d.active()
            other = d.entries[i ^ 1]
            if action == "roll-back" and not other.valid:
                refused = " refused"
            else:
                entries = list(d.entries)
                new = VALID if action == "confirm" else INVALID
                entries[i] = OtaEntry(entries[i].seq, entries[i].label, new, ota_crc(entries[i].seq))
                state["d"] = OtaData((entries[0], entries[1]))
        out.append(f"{state['name']} {step} action {action}{refused}")

    def dump():
        raw = state["d"].to_bytes()
        out.append(f"{state['name']} otadata {raw[:32].hex()}{raw[SECTOR : SECTOR + 32].hex()}")

    def select(slot):
        state["d"] = state["d"].select(slot, SLOTS)[1]

    state["name"] = "blank"
    decide("boot", boot("boot"), 0)
    dump()
    state["name"] = "pass"
    select(1)
    dump()
    decide("first-boot", boot("first-boot"), 0)
    boot("next-boot")
    dump()
    state["name"] = "fail"
    select(0)
    decide("first-boot", boot("first-boot"), 103)
    boot("after-rollback")
    dump()
    state["name"] = "cut"
    select(0)
    boot("first-boot")
    boot("next-boot")
    dump()
    state["name"] = "first-fail"
    state["d"] = OtaData.blank()
    select(1)
    decide("first-boot", boot("first-boot"), 103)
    boot("restart")
    dump()
    out.append("done")
    return "\n".join(out) + "\n"


def test_the_entry_crc_is_esp_idfs():
    # ESP-IDF: crc = esp_rom_crc32_le(UINT32_MAX, &ota_seq, 4); otatool.py computes it as
    # binascii.crc32(seq, 0xFFFFFFFF). Arduino-ESP32's boot_app0.bin holds 0x4743989a for seq 1.
    assert ota_crc(1) == 0x4743989A
    assert ota_crc(2) == 0x55F63774


def test_a_new_app_confirms_itself_on_pass_rolls_back_on_fail_and_an_unconfirmed_one_is_aborted(host_output):
    lines = host_output.splitlines()
    assert "blank boot slot 0 state undefined" in lines and "blank boot action keep" in lines
    assert lines.index("pass first-boot slot 1 state pending") < lines.index("pass first-boot action confirm")
    assert "pass next-boot slot 1 state valid" in lines
    assert "fail first-boot slot 0 state pending" in lines and "fail first-boot action roll-back" in lines
    assert "fail after-rollback slot 1 state valid" in lines  # the old app again
    assert "cut first-boot slot 0 state pending" in lines and "cut next-boot slot 1 state valid" in lines
    # A serial-flashed board's first update has no entry to go back to: ESP-IDF refuses the
    # rollback, the app restarts, and the bootloader aborts the entry and starts the first slot.
    assert "first-fail first-boot action roll-back refused" in lines and "first-fail restart slot 0" in host_output
    assert lines[-1] == "done"


def test_the_firmwares_logic_and_the_hosts_agree_byte_for_byte(host_output):
    assert host_output == python_replay()


def test_the_same_logic_runs_on_qemu_rv32(rv32_output, host_output):
    assert host_output in rv32_output


def test_blank_and_spoiled_otadata_boot_the_first_slot():
    assert OtaData.blank().boot(SLOTS)[0] == 0 and OtaData.blank().active() is None
    _, d = OtaData.blank().select(1, SLOTS)
    raw = bytearray(d.to_bytes())
    raw[0] ^= 1  # a seq whose crc no longer matches: not valid
    assert OtaData.parse(bytes(raw)).boot(SLOTS)[0] == 0


def test_selecting_writes_the_entry_that_is_not_active_with_the_next_seq():
    d = OtaData.blank()
    index, d = d.select(1, SLOTS)
    assert index == 0 and d.entries[0].seq == 2 and d.entries[0].state == NEW
    index, d = d.select(0, SLOTS)
    assert index == 1 and d.entries[1].seq == 3 and d.selected_slot(SLOTS) == 0
    index, d = d.select(1, SLOTS)  # entry 0 again, seq 4: the active entry is never the one rewritten
    assert index == 0 and d.entries[0].seq == 4 and d.entries[1].seq == 3
    assert OtaData.parse(d.to_bytes()) == d and len(d.to_bytes()) == 2 * SECTOR
