"""Flashing through esptool's Python API, with esptool's chip-facing functions replaced by fakes
(no board here). The fakes check every call against the real esptool function's signature, so a
call esptool 5.x would reject fails here too. The serial port is a real pyserial loop:// port, so
"closed in every case" is checked on a real port object."""

from __future__ import annotations

import inspect
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import esptool.cmds
import pytest
import serial
from conftest import DEFAULT_MODEL, REPO
from esptool.bin_image import ELFSection, ESP32P4FirmwareImage, ESP32S3FirmwareImage
from esptool.util import FatalError

from generator.boards import load_board
from generator.compile.esp32.idf_project import write_project
from generator.compile.esp32.partitions import parse_partitions_csv
from generator.compile.pipeline import generate
from generator.device.flash import flash_images, flash_plan, select_images
from generator.errors import ColibriError
from generator.selftest import GOLDEN_FILE, write_golden

PORT = "loop://"
FAKED = ("detect_chip", "run_stub", "attach_flash", "write_flash", "verify_flash", "reset_chip")


@pytest.fixture(scope="module")
def board():
    return load_board("esp32p4-idf")


class FakeESP:
    def __init__(self, port, chip_name, revision):
        self._port = port
        self.CHIP_NAME = chip_name
        self.revision = revision
        self.IS_STUB = False
        self.bauds = []

    def get_chip_revision(self):
        return self.revision

    def read_mac(self):
        return (0x60, 0x55, 0x0F, 0x00, 0x00, 0x01)

    def change_baud(self, baud):
        self.bauds.append(baud)


@pytest.fixture
def fake(monkeypatch):
    """esptool.cmds with the functions that talk to a chip replaced; `fake.fail = (name, exc)` makes
    one of them raise."""
    state = SimpleNamespace(chip="ESP32-P4", revision=301, calls=[], fail=None, esp=None, port=None)

    def make(name):
        real = getattr(esptool.cmds, name)

        def fn(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)  # a call the real function accepts
            state.calls.append((name, args, kwargs))
            if name == "detect_chip":
                state.port = args[0]
                assert isinstance(state.port, serial.SerialBase) and state.port.is_open
            if state.fail and state.fail[0] == name:
                raise state.fail[1]
            if name == "detect_chip":
                state.esp = FakeESP(state.port, state.chip, state.revision)
                return state.esp
            if name == "run_stub":
                args[0].IS_STUB = True
                return args[0]
            return None

        return fn

    for name in FAKED:
        monkeypatch.setattr(esptool.cmds, name, make(name))
    state.names = lambda: [c[0] for c in state.calls]
    return state


def esp_image(path: Path, min_rev: int = 301, max_rev: int = 399, cls=ESP32P4FirmwareImage) -> Path:
    """A real ESP image (esptool's own writer), with the chip id and revision range in its header."""
    img = cls()
    img.entrypoint = 0x4FF00000
    img.min_rev_full, img.max_rev_full = min_rev, max_rev
    img.segments = [ELFSection(b".text", 0x4FF00000, b"\x13\x00\x00\x00" * 16, 0)]
    img.save(str(path))
    return path


@pytest.fixture
def images(tmp_path):
    boot = esp_image(tmp_path / "bootloader.bin")
    table = tmp_path / "partition-table.bin"
    table.write_bytes(b"\xaa\x50" + bytes(3070))
    app = esp_image(tmp_path / "colibri_fw.bin")
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"COLIBRIW" + bytes(5000))
    return [(0x2000, boot), (0x8000, table), (0x10000, app), (0x200000, weights)]


def test_images_are_written_at_their_offsets_verified_and_the_board_reset(board, fake, images):
    lines = []
    chip = flash_images(board, PORT, list(reversed(images)), baud=921600, progress=lines.append)
    assert (chip.name, chip.revision_text, chip.mac) == ("ESP32-P4", "v3.1", "60:55:0f:00:00:01")
    names = fake.names()
    assert names == ["detect_chip", "run_stub", "attach_flash"] + ["write_flash", "verify_flash"] * 4 + ["reset_chip"]
    writes = [c for c in fake.calls if c[0] == "write_flash"]
    verifies = [c for c in fake.calls if c[0] == "verify_flash"]
    expected = [(offset, str(path)) for offset, path in images]  # in offset order
    assert [c[1][1] for c in writes] == [[e] for e in expected]
    assert [c[1][1] for c in verifies] == [[e] for e in expected]
    for _, args, kwargs in writes + verifies:
        assert args[0] is fake.esp and args[0].IS_STUB
        assert (kwargs["flash_mode"], kwargs["flash_freq"], kwargs["flash_size"]) == ("dio", "80m", "16MB")
    assert all(kwargs["compress"] for _, _, kwargs in writes)
    assert fake.calls[-1][1:] == ((fake.esp, "hard-reset"), {})
    assert fake.esp.bauds == [921600]
    detect_kwargs = fake.calls[0][2]
    assert detect_kwargs["baud"] == 115200  # sync at the ROM's rate, then switch
    assert not fake.port.is_open
    for offset, path in images:  # progress per image
        assert any(path.name in ln and f"0x{offset:x}" in ln for ln in lines)
        assert any(path.name in ln and "verified" in ln for ln in lines)


def test_without_reset_the_board_stays_in_the_loader(board, fake, images):
    flash_images(board, PORT, images, progress=lambda _: None, reset=False)
    assert "reset_chip" not in fake.names() and not fake.port.is_open


def test_a_wrong_chip_is_refused_before_anything_is_written(board, fake, images):
    fake.chip = "ESP32-S3"
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    assert str(e.value) == "found ESP32-S3 on loop://; board esp32p4-idf needs an ESP32-P4"
    assert fake.names() == ["detect_chip"] and not fake.port.is_open


@pytest.mark.parametrize("revision, shown", [(100, "v1.0"), (103, "v1.3"), (0, "v0.0")])
def test_a_chip_revision_the_board_does_not_support_is_refused(board, fake, images, revision, shown):
    fake.revision = revision
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    assert f"revision {shown}" in str(e.value) and "supports revisions v3.x" in str(e.value)
    assert fake.names() == ["detect_chip"] and not fake.port.is_open


def test_a_chip_older_than_the_boards_minimum_revision_is_refused(board, fake, images):
    fake.revision = 300  # a v3.x chip, but the board (and ESP-IDF's build) wants v3.1 and later
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    assert str(e.value) == "the ESP32-P4 on loop:// is revision v3.0; board esp32p4-idf needs v3.1 or later"
    assert fake.names() == ["detect_chip"] and not fake.port.is_open


def test_a_chip_outside_an_images_revision_range_is_refused(board, fake, images, tmp_path):
    images[0] = (0x2000, esp_image(tmp_path / "bootloader.bin", min_rev=302, max_rev=399))
    images[2] = (0x10000, esp_image(tmp_path / "colibri_fw.bin", min_rev=301, max_rev=301))
    for revision, name, span in ((301, "bootloader.bin", "v3.2 to v3.99"), (303, "colibri_fw.bin", "v3.1 to v3.1")):
        fake.revision = revision
        with pytest.raises(ColibriError) as e:
            flash_images(board, PORT, images, progress=lambda _: None)
        msg = str(e.value)
        assert name in msg and span in msg and f"is v3.{revision % 100}" in msg and "rebuild" in msg
    assert "write_flash" not in fake.names() and not fake.port.is_open


def test_an_image_built_for_another_chip_is_refused(board, fake, images, tmp_path):
    images[2] = (0x10000, esp_image(tmp_path / "s3_app.bin", cls=ESP32S3FirmwareImage))
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    assert "s3_app.bin is an image for ESP32-S3, not ESP32-P4" in str(e.value)
    assert "write_flash" not in fake.names()


@pytest.mark.parametrize(
    "failing", ["detect_chip", "run_stub", "attach_flash", "write_flash", "verify_flash", "reset_chip"]
)
def test_esptool_errors_become_one_line_and_the_port_is_closed(board, fake, images, failing):
    fake.fail = (
        failing,
        FatalError(
            "Failed to connect to ESP32-P4: No serial data received.\n"
            "For troubleshooting steps visit: https://docs.espressif.com/"
        ),
    )
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    msg = str(e.value)
    assert msg.startswith("flashing board esp32p4-idf on loop:// failed: Failed to connect to ESP32-P4")
    assert "\n" not in msg and "troubleshooting" in msg
    assert fake.port is not None and not fake.port.is_open


def test_serial_errors_and_interrupts_also_close_the_port(board, fake, images):
    fake.fail = ("write_flash", serial.SerialException("device reports readiness to read but returned no data"))
    with pytest.raises(ColibriError, match="failed: device reports readiness"):
        flash_images(board, PORT, images, progress=lambda _: None)
    assert not fake.port.is_open
    fake.calls.clear()
    fake.fail = ("write_flash", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        flash_images(board, PORT, images, progress=lambda _: None)
    assert not fake.port.is_open


@pytest.mark.parametrize(
    "port, words",
    [
        ("", "give it with --port"),
        (None, "give it with --port"),
        ("/dev/ttyCOLIBRI_NO_SUCH_PORT", "cannot open serial port /dev/ttyCOLIBRI_NO_SUCH_PORT"),
    ],
)
def test_a_missing_port_is_a_clear_error(board, fake, images, port, words):
    with pytest.raises(ColibriError) as e:
        flash_images(board, port, images, progress=lambda _: None)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert fake.calls == []


def test_bad_image_lists_are_refused_before_connecting(board, fake, images, tmp_path):
    cases = [
        ([], "no images"),
        ([(0x2001, images[0][1])], "multiples of 0x1000"),
        ([(0x2000, tmp_path / "absent.bin")], "cannot read"),
        ([(0x2000, images[0][1]), (0x2000, images[2][1])], "overlaps"),
        ([(0xFFF000, images[3][1])], "does not fit the board's 16MB flash"),
    ]
    (tmp_path / "empty.bin").write_bytes(b"")
    cases.append(([(0x2000, tmp_path / "empty.bin")], "is empty"))
    for bad, words in cases:
        with pytest.raises(ColibriError, match=words):
            flash_images(board, PORT, bad, progress=lambda _: None)
    assert fake.calls == []


# ---- What to write: flash_plan ----


@pytest.fixture
def build_dir(board, tmp_path):
    """A build directory as `./colibri build` would leave it: generated/ and the ESP-IDF project in idf/."""
    gen = tmp_path / "generated"
    generated = generate(DEFAULT_MODEL, board, "q8_0", 64, gen)
    write_golden(generated.plan, gen / "weights.img", board, gen / GOLDEN_FILE)  # the SConstruct's GOLDEN step
    write_project(board, generated.plan, gen, tmp_path / "idf", REPO)
    return tmp_path


def idf_outputs(build: Path) -> None:
    """What `idf.py build` leaves in idf/build/."""
    out = build / "idf" / "build"
    (out / "bootloader").mkdir(parents=True)
    (out / "partition_table").mkdir()
    esp_image(out / "bootloader" / "bootloader.bin")
    (out / "partition_table" / "partition-table.bin").write_bytes(b"\xaa\x50" + bytes(3070))
    esp_image(out / "colibri_fw.bin")
    (out / "ota_data_initial.bin").write_bytes(b"\xff" * 0x2000)  # blank otadata: the bootloader starts ota_0


def test_flash_plan_without_the_idf_build_says_to_build_it(board, build_dir):
    with pytest.raises(ColibriError) as e:
        flash_plan(board, build_dir)
    assert str(e.value).startswith("build the ESP-IDF project first") and "idf.py build" in str(e.value)


def test_flash_plan_lists_the_idf_outputs_and_the_weights_at_their_partitions(board, build_dir):
    idf_outputs(build_dir)
    plan = flash_plan(board, build_dir)
    assert plan == [
        (0x2000, build_dir / "idf/build/bootloader/bootloader.bin"),
        (0x8000, build_dir / "idf/build/partition_table/partition-table.bin"),
        (0xD000, build_dir / "idf/build/ota_data_initial.bin"),
        (0x10000, build_dir / "idf/build/colibri_fw.bin"),
        (0x200000, build_dir / "idf/weights.bin"),
    ]
    parts = {p.name: p for p in parse_partitions_csv((build_dir / "idf/partitions.csv").read_text())}
    assert parts["otadata"].offset == plan[2][0] and parts["ota_0"].offset == plan[3][0]
    assert parts["weights"].offset == plan[4][0]
    assert plan[4][1].read_bytes() == (build_dir / "generated/weights.img").read_bytes()
    assert all(
        off == img.offset for (off, _), img in zip(plan, sorted(board.idf.images.values(), key=lambda i: i.offset))
    )


def test_flash_plan_refuses_a_project_whose_partitions_disagree_with_the_board(board, build_dir):
    idf_outputs(build_dir)
    csv = build_dir / "idf/partitions.csv"
    csv.write_text(csv.read_text().replace("0x200000", "0x300000"))
    with pytest.raises(ColibriError, match="puts partition weights at 0x300000.*regenerate"):
        flash_plan(board, build_dir)
    shrunk = re.sub(
        r"^(weights, data, undefined, 0x200000), 0x[0-9a-f]+, readonly$",
        r"\1, 0x1000, readonly",
        csv.read_text().replace("0x300000", "0x200000"),
        flags=re.M,
    )
    csv.write_text(shrunk)
    with pytest.raises(ColibriError, match="partition weights has 4,096 B"):
        flash_plan(board, build_dir)


def test_flash_plan_and_flash_images_work_together(board, build_dir, fake):
    idf_outputs(build_dir)
    flash_images(board, PORT, flash_plan(board, build_dir), progress=lambda _: None)
    assert [c[1][1][0][0] for c in fake.calls if c[0] == "write_flash"] == [0x2000, 0x8000, 0xD000, 0x10000, 0x200000]


def test_a_board_without_flash_images_has_nothing_to_flash(tmp_path):
    host = load_board("host")
    with pytest.raises(ColibriError, match="nothing to flash"):
        flash_plan(host, tmp_path)
    with pytest.raises(ColibriError, match="nothing to flash"):
        flash_images(host, PORT, [(0, tmp_path)], progress=lambda _: None)


def test_flash_plan_works_for_the_bare_metal_board_too(tmp_path):
    try:
        bare = load_board("esp32p4")
    except ColibriError:
        pytest.skip("no esp32p4 board file")
    with pytest.raises(ColibriError, match="build first"):
        flash_plan(bare, tmp_path)
    for entry in bare.flash.images:
        shutil.copy(esp_image(tmp_path / "img.bin", 100, 399), tmp_path / entry.file)
    assert [off for off, _ in flash_plan(bare, tmp_path)] == [e.offset for e in bare.flash.images]


def test_before_chooses_how_esptool_enters_the_bootloader_and_its_advice_names_our_flags(board, fake, images):
    flash_images(board, PORT, images, progress=lambda _: None, before="no-reset")
    assert fake.calls[0][2]["connect_mode"] == "no-reset"
    fake.calls.clear()
    fake.fail = ("detect_chip", FatalError("Failed to connect: set --before and --after to 'no-reset'"))
    with pytest.raises(ColibriError) as e:
        flash_images(board, PORT, images, progress=lambda _: None)
    assert "colibri flash takes esptool's --before as --before, and --after no-reset as --no-reset" in str(e.value)
    with pytest.raises(ColibriError, match="--before must be one of"):
        flash_images(board, PORT, images, progress=lambda _: None, before="sometimes")


# ---- A flash cut at every stage (issue 29 item 4) ------------------------------------------------
# The chip's flash is a bytearray that outlives a run; write_flash copies an image's bytes into it
# and, when cut, stops at a random byte with the error a pulled cable gives; verify_flash compares.
# The next flash must finish the job: every image in place and verified.

STAGES = ["detect_chip", "run_stub", "attach_flash", "write_flash", "verify_flash", "reset_chip"]


@pytest.fixture
def chip(fake, monkeypatch):
    """`fake` with a flash memory: chip.memory, and chip.cut = (stage, which call of it, 1 from)."""
    import random

    memory = bytearray(b"\xff" * 0x300000)
    state = SimpleNamespace(memory=memory, cut=None, counts={}, rng=random.Random(29))
    for name in STAGES:
        faked = getattr(esptool.cmds, name)

        def fn(*args, _name=name, _faked=faked, **kwargs):
            result = _faked(*args, **kwargs)  # the signature check and the call log
            state.counts[_name] = state.counts.get(_name, 0) + 1
            cut_here = state.cut == (_name, state.counts[_name])
            if _name == "write_flash":
                for offset, path in args[1]:
                    data = Path(path).read_bytes()
                    end = state.rng.randrange(1, len(data)) if cut_here else len(data)
                    memory[offset : offset + end] = data[:end]
            if cut_here:
                raise serial.SerialException("device reports readiness to read but returned no data")
            if _name == "verify_flash":
                for offset, path in args[1]:
                    data = Path(path).read_bytes()
                    if bytes(memory[offset : offset + len(data)]) != data:
                        raise FatalError(f"Verification failed at 0x{offset:x}")
            return result

        monkeypatch.setattr(esptool.cmds, name, fn)
    return state


@pytest.mark.parametrize(
    "stage, call",
    [(s, 1) for s in STAGES] + [("write_flash", 3), ("write_flash", 4), ("verify_flash", 4)],
)
def test_a_flash_cut_at_any_stage_is_finished_by_the_next_flash(board, chip, images, stage, call):
    chip.cut = (stage, call)
    with pytest.raises(ColibriError) as cut:
        flash_images(board, PORT, images, progress=lambda _: None)
    msg = str(cut.value)
    assert "\n" not in msg and "failed: device reports readiness to read" in msg, msg
    if stage in ("write_flash", "verify_flash"):
        name, offset = images[call - 1][1].name, images[call - 1][0]
        assert f"cut while writing {name} at 0x{offset:x}, image {call} of {len(images)}" in msg, msg
        assert "run flash again" in msg
        if stage == "write_flash":  # the image is half there: what verify would refuse
            assert chip.memory[offset : offset + images[call - 1][1].stat().st_size] != images[call - 1][1].read_bytes()
    else:
        assert "partly written" not in msg  # before any write, or after every image was verified
    # The next flash writes and verifies every image: the job is done.
    chip.cut, chip.counts = None, {}
    flash_images(board, PORT, images, progress=lambda _: None)
    assert chip.counts["verify_flash"] == len(images) and chip.counts["reset_chip"] == 1
    for offset, path in images:
        data = path.read_bytes()
        assert bytes(chip.memory[offset : offset + len(data)]) == data, path.name


# ---- flash --app-only / --model-only: the model in its own partition, written apart from the app ----


def written(fake) -> list[int]:
    return [c[1][1][0][0] for c in fake.calls if c[0] == "write_flash"]


def test_app_only_writes_everything_but_the_weights_and_says_what_it_leaves(board, build_dir, fake):
    idf_outputs(build_dir)
    images, skipped = select_images(board, flash_plan(board, build_dir), "app")
    flash_images(board, PORT, images, progress=lambda _: None)
    assert written(fake) == [0x2000, 0x8000, 0xD000, 0x10000]  # bootloader, table, blank otadata, ota_0
    assert skipped == ["weights at 0x200000"]


def test_model_only_writes_only_the_weights_partition(board, build_dir, fake):
    idf_outputs(build_dir)
    images, skipped = select_images(board, flash_plan(board, build_dir), "model")
    flash_images(board, PORT, images, progress=lambda _: None)
    assert written(fake) == [0x200000]
    assert images[0][1].read_bytes() == (build_dir / "generated/weights.img").read_bytes()
    assert skipped == ["bootloader at 0x2000", "partition-table at 0x8000", "otadata at 0xd000", "app at 0x10000"]


def test_a_board_whose_weights_are_in_its_app_has_neither():
    p4 = load_board("esp32p4")
    for only in ("app", "model"):
        with pytest.raises(ColibriError, match=f"no weights partition.*--{only}-only"):
            select_images(p4, [], only)
