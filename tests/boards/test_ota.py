"""`colibri ota` against a fake ESP32-P4 whose flash is a byte array: esptool's chip-facing
functions are replaced (each call checked against the real function's signature, as in
test_flash.py), and the fake writes, reads and verifies that array. A chip that stops answering
in the middle of a write leaves the bytes written so far, as a real cut does."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import esptool.cmds
import pytest
from esptool.util import FatalError
from test_flash import FakeESP, esp_image

from generator.boards import load_board
from generator.boards.otadata import NEW, OTADATA_BYTES, PENDING_VERIFY, SECTOR, VALID, OtaData, OtaEntry, ota_crc
from generator.device.ota import ota_update, write_update_file
from generator.errors import ColibriError

PORT = "loop://"
FLASH_BYTES = 16 << 20
FAKED = ("detect_chip", "run_stub", "attach_flash", "write_flash", "verify_flash", "read_flash", "reset_chip")


@pytest.fixture(scope="module")
def board():
    return load_board("esp32p4-idf")


def _bytes_of(data) -> bytes:
    return Path(data).read_bytes() if isinstance(data, str) else bytes(data)


@pytest.fixture
def chip(monkeypatch):
    """The fake board: `chip.flash` its flash (erased); `chip.cut_after = n` makes it stop answering
    after n more bytes have reached the flash."""
    state = SimpleNamespace(flash=bytearray(b"\xff" * FLASH_BYTES), calls=[], cut_after=None, written=[])

    def write(addr, data):
        if state.cut_after is not None and state.cut_after < len(data):
            state.flash[addr : addr + state.cut_after] = data[: state.cut_after]
            state.cut_after = 0
            raise FatalError("Timed out waiting for packet header")
        if state.cut_after is not None:
            state.cut_after -= len(data)
        erase_end = addr + (len(data) + SECTOR - 1) // SECTOR * SECTOR  # write_flash erases whole sectors
        state.flash[addr:erase_end] = b"\xff" * (erase_end - addr)
        state.flash[addr : addr + len(data)] = data
        state.written.append((addr, len(data)))

    def make(name):
        real = getattr(esptool.cmds, name)

        def fn(*args, **kwargs):
            bound = inspect.signature(real).bind(*args, **kwargs)
            state.calls.append(name)
            a = bound.arguments
            if name == "detect_chip":
                state.esp = FakeESP(args[0], "ESP32-P4", 301)
                return state.esp
            if name == "run_stub":
                return args[0]
            if name == "write_flash":
                for addr, data in a["addr_data"]:
                    write(addr, _bytes_of(data))
            if name == "verify_flash":
                for addr, data in a["addr_data"]:
                    blob = _bytes_of(data)
                    if bytes(state.flash[addr : addr + len(blob)]) != blob:
                        raise FatalError(f"Verification of 0x{addr:x} failed: MD5 differs")
            if name == "read_flash":
                return bytes(state.flash[a["address"] : a["address"] + a["size"]])
            return None

        return fn

    for name in FAKED:
        monkeypatch.setattr(esptool.cmds, name, make(name))
    return state


@pytest.fixture
def app(tmp_path) -> Path:
    return esp_image(tmp_path / "colibri_fw.bin")


def otadata_of(chip, board) -> OtaData:
    at = board.idf.images["otadata"].offset
    return OtaData.parse(bytes(chip.flash[at : at + OTADATA_BYTES]))


def test_an_update_writes_the_inactive_slot_then_selects_it_in_otadata_last(board, chip, app):
    lines = []
    done = ota_update(board, PORT, app, progress=lines.append)
    assert (done.running_slot, done.slot, done.seq) == (0, 1, 2)  # a serial-flashed board runs ota_0
    slot1, otadata = board.idf.ota_slots[1], board.idf.images["otadata"].offset
    assert chip.written == [(slot1, app.stat().st_size), (otadata, SECTOR)]  # the app, then one otadata sector
    assert bytes(chip.flash[slot1 : slot1 + app.stat().st_size]) == app.read_bytes()
    d = otadata_of(chip, board)
    assert d.entries[0] == OtaEntry(2, b"\xff" * 20, NEW, ota_crc(2)) and d.selected_slot(2) == 1
    assert chip.calls.index("verify_flash") < chip.calls.index("write_flash", chip.calls.index("verify_flash"))
    assert chip.calls[-1] == "reset_chip"
    assert any("starts ota_0" in ln and "writing the app into ota_1" in ln for ln in lines)
    assert any("verified" in ln and "MD5" in ln for ln in lines)


def test_updates_alternate_between_the_slots_and_never_rewrite_the_active_copy(board, chip, app):
    ota_update(board, PORT, app, progress=lambda _: None)
    # The board boots ota_1, which passes its self-test and confirms itself.
    slot, d = otadata_of(chip, board).boot(2)
    assert slot == 1 and d.entries[0].state == PENDING_VERIFY
    confirmed = OtaEntry(2, b"\xff" * 20, VALID, ota_crc(2))
    at = board.idf.images["otadata"].offset
    chip.flash[at : at + SECTOR] = confirmed.sector()
    chip.written.clear()
    done = ota_update(board, PORT, app, progress=lambda _: None)
    assert (done.running_slot, done.slot, done.seq) == (1, 0, 3)
    assert chip.written[-1] == (at + SECTOR, SECTOR)  # otadata[1]: entry 0 (the running app's) untouched
    assert otadata_of(chip, board).entries[0] == confirmed and otadata_of(chip, board).selected_slot(2) == 0


@pytest.mark.parametrize("cut_at", [0.0, 0.01, 0.5, 0.99])
def test_a_cut_while_writing_the_app_leaves_otadata_so_the_old_app_boots(board, chip, app, cut_at):
    before = otadata_of(chip, board)
    chip.cut_after = int(app.stat().st_size * cut_at)  # the first byte, the middle, the last
    with pytest.raises(ColibriError) as e:
        ota_update(board, PORT, app, progress=lambda _: None)
    msg = str(e.value)
    assert "Timed out" in msg and "cut while writing the app into ota_1" in msg and "still starts ota_0" in msg
    assert "\n" not in msg
    assert otadata_of(chip, board) == before and otadata_of(chip, board).boot(2)[0] == 0
    chip.cut_after = None
    assert ota_update(board, PORT, app, progress=lambda _: None).slot == 1  # running it again finishes the job


@pytest.mark.parametrize("cut_at", [0, 3, 31])
def test_a_cut_while_writing_otadata_spoils_only_the_copy_that_was_not_active(board, chip, app, cut_at):
    ota_update(board, PORT, app, progress=lambda _: None)  # ota_1 selected by otadata[0]...
    at = board.idf.images["otadata"].offset
    chip.flash[at : at + SECTOR] = OtaEntry(2, b"\xff" * 20, VALID, ota_crc(2)).sector()  # ...and confirmed
    size = app.stat().st_size
    chip.cut_after = size + cut_at  # the app into ota_0 goes through; otadata[1] is cut
    with pytest.raises(ColibriError, match=r"cut while writing otadata\[1\]: the board still starts ota_1"):
        ota_update(board, PORT, app, progress=lambda _: None)
    assert otadata_of(chip, board).boot(2)[0] == 1  # the app that ran before


def test_a_board_without_slots_and_an_app_too_big_for_one_are_refused(board, chip, app, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(app.read_bytes() + b"\0" * board.idf.images["app"].size)
    with pytest.raises(ColibriError, match="each app slot holds 983,040 B"):
        ota_update(board, PORT, big, progress=lambda _: None)
    not_an_app = tmp_path / "weights.bin"
    not_an_app.write_bytes(b"COLIBRIW" + bytes(100))
    with pytest.raises(ColibriError, match="not an ESP app image"):
        ota_update(board, PORT, not_an_app, progress=lambda _: None)
    with pytest.raises(ColibriError, match="no A/B app slots"):
        ota_update(load_board("esp32p4"), PORT, app, progress=lambda _: None)
    assert chip.calls == []  # refused before the port was opened


def test_the_update_file_is_the_checked_app_image(board, app, tmp_path):
    out = tmp_path / "served" / "colibri_fw.bin"
    assert write_update_file(board, app, out) == app.stat().st_size
    assert out.read_bytes() == app.read_bytes()


@pytest.mark.slow  # builds the default model's ESP-IDF project
def test_the_ota_command_updates_the_board_and_writes_the_served_file(chip, tmp_path, capsys):
    from test_flash import idf_outputs

    from generator import cli

    out = tmp_path / "p4"
    assert cli.main(["build", "--board", "esp32p4-idf", "--out", str(out)]) == 0
    idf_outputs(out)  # what idf.py build leaves (ESP-IDF is not installed here)
    capsys.readouterr()
    # The board's weights partition is blank: the new app would refuse it, so nothing is written.
    assert cli.main(["ota", "--board", "esp32p4-idf", "--out", str(out), "--port", PORT]) == 2
    assert "write it first with flash --model-only" in capsys.readouterr().err and chip.written == []
    weights = (out / "idf/weights.bin").read_bytes()
    chip.flash[0x200000 : 0x200000 + len(weights)] = weights  # flash --model-only
    assert cli.main(["ota", "--board", "esp32p4-idf", "--out", str(out), "--port", PORT, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["running_slot"], summary["slot"], summary["seq"]) == ("ota_0", "ota_1", 2)
    served = tmp_path / "colibri_fw.bin"
    calls = len(chip.calls)
    assert cli.main(["ota", "--board", "esp32p4-idf", "--out", str(out), "--file", str(served)]) == 0
    assert served.read_bytes() == (out / "idf/build/colibri_fw.bin").read_bytes()
    assert len(chip.calls) == calls  # no board touched
    assert "esp_https_ota" in capsys.readouterr().err
    assert cli.main(["ota", "--board", "host", "--out", str(tmp_path / "h"), "--port", PORT]) == 2
    assert not (tmp_path / "h").exists()  # refused before building
