"""Flash stage: write a board's images over its serial port through esptool's Python API (esptool 5.x).

flash_plan() says what to write (the board file's [[flash.images]], relative to the build
directory); flash_images() connects, refuses a chip or chip revision the board (or an image) was
not built for, runs the flasher stub, writes every image at its offset, verifies it, and resets
the board. Whatever goes wrong (no port, a busy port, no answer, a bad write) ends in one
ColibriError line, and the port is closed in every case. probe_chip() only reads what the chip says
about itself (`devices --probe`), and board_problems() checks a board file's assumptions against it.
"""

from __future__ import annotations

import contextlib
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..boards import Board, Flash, FlashImage
from ..documents import JsonDocument, json_meta
from ..errors import ColibriError
from .ports import open_error

SECTOR = 0x1000  # flash erase sector: images start on one
ESP_IMAGE_MAGIC = 0xE9  # first byte of an ESP bootloader or app image
UNLIMITED_REV = 0xFFFF  # max_rev_full meaning "no upper bound"


@dataclass(frozen=True)
class Chip:
    """The chip a flash found: esptool's name for it, its revision (MAJOR * 100 + MINOR) and MAC."""

    name: str
    revision: int
    mac: str  # aa:bb:cc:dd:ee:ff

    @property
    def revision_text(self) -> str:
        return _rev(self.revision)


def _flash_section(board: Board) -> Flash:
    if board.flash is None or not board.flash.images:
        raise ColibriError(f"board {board.name} has nothing to flash (no [[flash.images]] in its board file)")
    return board.flash


def _rev(full: int) -> str:
    return f"v{full // 100}.{full % 100}"


def _flash_bytes(size: str) -> int | None:
    return int(size[:-2]) << 20 if isinstance(size, str) and size.endswith("MB") and size[:-2].isdigit() else None


def flash_plan(board: Board, build_dir: Path) -> list[tuple[int, Path]]:
    """(offset, file) for everything the board's flash holds, from [[flash.images]] (files relative
    to build_dir, the board's build directory), checked to exist; sorted by offset."""
    flash = _flash_section(board)
    build_dir = Path(build_dir)
    plan, missing = [], []
    for entry in sorted(flash.images, key=lambda e: e.offset):
        path = build_dir / entry.file
        plan.append((entry.offset, path))
        if not path.is_file():
            missing.append(path)
    idf = board.idf
    if missing:
        if idf is not None:
            project = build_dir / idf.project_dir
            raise ColibriError(
                f"build the ESP-IDF project first: {missing[0]} does not exist (run 'idf.py build' in {project})"
            )
        raise ColibriError(f"{missing[0]} does not exist: build first (./colibri build --board {board.name})")
    if idf is not None:
        _check_against_partition_table(board, flash, build_dir, build_dir / idf.project_dir)
    return plan


# flash --app-only / --model-only: which of a board's [[flash.images]] each writes.
PARTS = {"app": "everything but the weights", "model": "only the weights"}


def check_part(board: Board, only: str) -> FlashImage:
    """Refuse an `only` (see select_images) the board cannot write apart, before anything is
    built; the board's weights partition."""
    if only not in PARTS:
        raise ColibriError(f"only must be one of {', '.join(PARTS)}, not {only!r}")
    weights = _flash_section(board).image("weights")
    if weights is None:
        raise ColibriError(
            f"board {board.name} has no weights partition (its weights are linked into the app): "
            f"--{only}-only needs a board that keeps the model apart, such as esp32p4-idf"
        )
    return weights


def select_images(
    board: Board, plan: list[tuple[int, Path]], only: str | None
) -> tuple[list[tuple[int, Path]], list[str]]:
    """The part of flash_plan()'s images that `only` ("app": all but the weights partition,
    "model": the weights alone, None: all) writes, and a description of each image left alone."""
    if only is None:
        return plan, []
    weights = check_part(board, only)
    flash = _flash_section(board)
    kept, skipped = [], []
    for offset, path in plan:
        if (offset == weights.offset) == (only == "model"):
            kept.append((offset, path))
        else:
            name = next((i.name for i in flash.images if i.offset == offset), "") or path.name
            skipped.append(f"{name} at 0x{offset:x}")
    return kept, skipped


def _check_against_partition_table(board: Board, flash: Flash, build_dir: Path, project: Path) -> None:
    """The images must fit the partitions the project was built with (a stale project would not)."""
    from ..compile.esp32.partitions import parse_partitions_csv

    csv = project / "partitions.csv"
    if not csv.is_file():
        raise ColibriError(f"build the ESP-IDF project first: {csv} does not exist")
    parts = {p.name: p for p in parse_partitions_csv(csv.read_text())}
    idf = board.idf
    assert idf is not None
    wanted = {"app": "ota_0" if idf.ota_slots else "factory", "weights": idf.weights_partition}
    if idf.ota_slots:
        wanted["otadata"] = "otadata"
    for image_name, part_name in wanted.items():
        entry, part = flash.image(image_name), parts.get(part_name)
        if entry is None:
            continue
        if part is None or part.offset != entry.offset:
            raise ColibriError(
                f"{csv} puts partition {part_name} at "
                f"{'nowhere' if part is None else hex(part.offset)}, but board {board.name} "
                f"flashes {image_name} at 0x{entry.offset:x}: regenerate the project"
            )
        file_size = (build_dir / entry.file).stat().st_size
        if file_size > part.size:
            raise ColibriError(
                f"{entry.file} is {file_size:,} B but partition {part_name} has {part.size:,} B: regenerate the project"
            )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _image_revisions(data: bytes) -> tuple[int, int, int] | None:
    """(chip id, min_rev_full, max_rev_full) from an ESP image's extended header, None if not one."""
    if len(data) < 24 or data[0] != ESP_IMAGE_MAGIC:
        return None
    chip_id, _min_rev, min_full, max_full = struct.unpack_from("<HBHH", data, 12)
    return chip_id, min_full, max_full


def _chip_names() -> dict[int, str]:
    from esptool.targets import CHIP_DEFS

    return {getattr(cls, "IMAGE_CHIP_ID", None): cls.CHIP_NAME for cls in CHIP_DEFS.values()}


def _check_images(flash: Flash, images: list[tuple[int, Path]]) -> list[tuple[int, Path, bytes]]:
    if not images:
        raise ColibriError("nothing to flash (no images given)")
    out = []
    for offset, path in images:
        path = Path(path)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % SECTOR:
            raise ColibriError(
                f"cannot write {path.name} at {offset!r}: flash offsets must be multiples of 0x{SECTOR:x}"
            )
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ColibriError(f"cannot read {path}: {e.strerror}") from None
        if not data:
            raise ColibriError(f"{path} is empty")
        out.append((offset, path, data))
    out.sort(key=lambda item: item[0])
    for (a, pa, da), (b, pb, _) in zip(out, out[1:]):
        if a + len(da) > b:
            raise ColibriError(f"{pa.name} at 0x{a:x} ({len(da):,} B) overlaps {pb.name} at 0x{b:x}")
    size = _flash_bytes(flash.size)
    last_offset, last_path, last_data = out[-1]
    if size and last_offset + len(last_data) > size:
        raise ColibriError(
            f"{last_path.name} at 0x{last_offset:x} ({len(last_data):,} B) does not fit the board's {flash.size} flash"
        )
    return out


def _check_chip(board: Board, flash: Flash, esp, port: str, images: list[tuple[int, Path, bytes]]) -> None:
    from esptool.targets import CHIP_DEFS

    chip = flash.chip
    expected = CHIP_DEFS[chip].CHIP_NAME if chip in CHIP_DEFS else chip.upper()
    if esp.CHIP_NAME != expected:
        raise ColibriError(f"found {esp.CHIP_NAME} on {port}; board {board.name} needs an {expected}")
    revision = esp.get_chip_revision()  # MAJOR * 100 + MINOR
    majors = list(flash.supported_revisions)
    if majors and revision // 100 not in majors:
        supported = ", ".join(f"v{m}.x" for m in majors)
        raise ColibriError(
            f"the {expected} on {port} is revision {_rev(revision)}; board {board.name} supports revisions {supported}"
        )
    least = flash.min_revision
    if isinstance(least, int) and revision < least:
        raise ColibriError(
            f"the {expected} on {port} is revision {_rev(revision)}; board {board.name} needs {_rev(least)} or later"
        )
    names = _chip_names()
    for offset, path, data in images:
        header = _image_revisions(data)
        if header is None:
            continue
        chip_id, lo, hi = header
        expected_id = CHIP_DEFS[chip].IMAGE_CHIP_ID if chip in CHIP_DEFS else flash.chip_id
        if expected_id is not None and chip_id != expected_id:
            raise ColibriError(
                f"{path.name} is an image for {names.get(chip_id, f'chip id {chip_id}')}, "
                f"not {expected}: rebuild it for board {board.name}"
            )
        if revision < lo or (hi != UNLIMITED_REV and revision > hi):
            span = f"{_rev(lo)} or later" if hi == UNLIMITED_REV else f"{_rev(lo)} to {_rev(hi)}"
            raise ColibriError(
                f"{path.name} is built for {expected} revisions {span}, but the chip on {port} is "
                f"{_rev(revision)}: rebuild for this revision"
            )


def _open_port(port: str):
    import serial

    try:
        ser = serial.serial_for_url(port, exclusive=True, do_not_open=True)
        ser.open()
    except (serial.SerialException, OSError, ValueError) as e:
        raise open_error(port, e) from None
    return ser


@contextmanager
def esptool_link(port: str, failure: Callable[[str], str], also: tuple[type[Exception], ...] = ()) -> Iterator[tuple]:
    """One session with a chip through esptool: yields (the open port, esptool.cmds, ESPLoader).
    What esptool, the port or the OS raises (and the `also` exceptions) becomes one ColibriError
    line, failure(esptool's line), asked when it happens so it can name the stage reached; the port
    is closed in every case."""
    try:
        import serial
        from esptool import cmds
        from esptool.loader import ESPLoader
        from esptool.util import FatalError
    except ImportError:
        raise ColibriError("esptool is not installed (./colibri sets up its environment with it)") from None

    ser = _open_port(port)
    try:
        yield ser, cmds, ESPLoader
    except (FatalError, serial.SerialException, OSError, *also) as e:
        raise ColibriError(failure(_one_line(e))) from None
    finally:
        try:
            ser.close()
        except Exception:  # noqa: BLE001 - closing must not hide the real outcome
            pass


# esptool's ways of getting the chip into its bootloader before connecting (esptool --before):
# toggling DTR/RTS (default), the USB-Serial/JTAG's own reset, or none (the board is put in
# download mode by hand: hold BOOT, press RESET).
BEFORE_MODES = ("default-reset", "usb-reset", "no-reset", "no-reset-no-sync")


# What esptool says when an image's MD5 read back from the flash is not the file's: the line held,
# the flash did not keep the bytes.
READ_BACK_DIFFERS = ("MD5 of file does not match data in flash", "Verification failed", "written flash region is empty")


def _esptool_advice(text: str) -> str:
    """esptool's advice names its own flags; say what they are called here."""
    if "--before" in text or "--after" in text:
        return (
            " (colibri flash takes esptool's --before as --before, and --after no-reset as --no-reset; "
            "with neither reset, hold BOOT and press RESET to enter download mode)"
        )
    return ""


def flash_images(
    board: Board,
    port: str,
    images: list[tuple[int, Path]],
    baud: int = 460800,
    progress: Callable[[str], None] = print,
    reset: bool = True,
    before: str = "default-reset",
    found: Callable[[Chip], None] | None = None,
) -> Chip:
    """Write `images` ((offset, file) pairs, e.g. flash_plan()'s) to the board on `port`, verify
    each, then hard-reset the board (unless reset=False); returns the chip it found (and tells
    `found` as soon as it is known, before it is checked). `before`: how esptool puts the chip in
    its bootloader (BEFORE_MODES)."""
    if before not in BEFORE_MODES:
        raise ColibriError(f"--before must be one of {', '.join(BEFORE_MODES)}, not {before!r}")
    flash = _flash_section(board)
    checked = _check_images(flash, images)
    if not port:
        raise ColibriError(f"board {board.name} is flashed over a serial port: give it with --port (e.g. /dev/ttyUSB0)")
    writing = ""  # the image being written or verified, once a write began: the flash is then partly new

    def failure(text: str) -> str:
        if writing and any(words in text for words in READ_BACK_DIFFERS):
            partly = (
                f"; {writing} reads back different from its file: run flash again (a board that "
                "fails again has a bad flash chip or supply)"
            )
        elif writing:
            partly = (
                f"; cut while writing {writing}: the flash is partly written, run flash again "
                "(it writes and verifies every image)"
            )
        else:
            partly = ""
        return f"flashing board {board.name} on {port} failed: {text}{_esptool_advice(text)}{partly}"

    with esptool_link(port, failure) as (ser, cmds, ESPLoader):
        progress(f"connecting to the board on {port}")
        esp = cmds.detect_chip(ser, baud=ESPLoader.ESP_ROM_BAUD, connect_mode=before)
        chip = Chip(esp.CHIP_NAME, esp.get_chip_revision(), ":".join(f"{b:02x}" for b in esp.read_mac()))
        if found is not None:
            found(chip)
        _check_chip(board, flash, esp, port, checked)
        progress(f"found {chip.name} revision {chip.revision_text}, MAC {chip.mac}")
        esp = cmds.run_stub(esp)
        if baud > ESPLoader.ESP_ROM_BAUD:
            esp.change_baud(baud)
        cmds.attach_flash(esp)
        params = dict(flash_mode=flash.mode, flash_freq=flash.frequency, flash_size=flash.size)
        for i, (offset, path, data) in enumerate(checked, 1):
            progress(f"[{i}/{len(checked)}] writing {path.name} ({len(data):,} B) at 0x{offset:x}")
            writing = f"{path.name} at 0x{offset:x}, image {i} of {len(checked)}"
            cmds.write_flash(esp, [(offset, str(path))], compress=True, **params)
            cmds.verify_flash(esp, [(offset, str(path))], **params)
            progress(f"[{i}/{len(checked)}] {path.name} verified")
        writing = ""  # every image written and verified
        if reset:
            progress("resetting the board")
            cmds.reset_chip(esp, "hard-reset")
        return chip


# ---- devices --probe: what the chip says about itself, against a board file -------------------


@dataclass(frozen=True)
class ProbedChip(JsonDocument):
    """What esptool reads from a chip in its ROM loader: its name and revision (MAJOR * 100 + MINOR),
    the MAC, the flash size from the flash chip's JEDEC id (None: not recognised), its features
    (the embedded PSRAM among them on chips whose eFuses say it: not on the ESP32-P4)."""

    port: str
    name: str = field(metadata=json_meta(key="chip"))
    description: str
    revision: int = field(metadata=json_meta(convert=lambda full: _rev(full)))
    mac: str
    flash_size: str | None = field(metadata=json_meta(then=("psram",)))
    features: tuple[str, ...]

    @property
    def psram(self) -> str | None:
        return next((f for f in self.features if "PSRAM" in f), None)

    def line(self) -> str:
        flash = self.flash_size or "flash size not recognised"
        psram = self.psram or "PSRAM not reported by the chip"
        return f"{self.port}: {self.description}, MAC {self.mac}, {flash} flash, {psram}; {', '.join(self.features)}"


def probe_chip(port: str, before: str = "default-reset") -> ProbedChip:
    """Connect to the chip on `port` through esptool (`before`: how it enters its ROM loader) and read
    what it says about itself; nothing is written. A chip reset into its loader is reset again
    afterwards, so its firmware runs on; one entered without a reset is left in the loader."""
    if before not in BEFORE_MODES:
        raise ColibriError(f"--before must be one of {', '.join(BEFORE_MODES)}, not {before!r}")

    def failure(text: str) -> str:
        return f"probing {port} failed: {text}{_esptool_advice(text)}"

    # esptool's own notes go to stderr, beside progress: stdout is the probe's (its --json document)
    with esptool_link(port, failure) as (ser, cmds, ESPLoader), contextlib.redirect_stdout(sys.stderr):
        esp = cmds.detect_chip(ser, baud=ESPLoader.ESP_ROM_BAUD, connect_mode=before)
        chip = ProbedChip(
            port,
            esp.CHIP_NAME,
            esp.get_chip_description(),
            esp.get_chip_revision(),
            ":".join(f"{b:02x}" for b in esp.read_mac()),
            _flash_size_said(cmds, esp),
            tuple(esp.get_chip_features()),
        )
        if before in ("default-reset", "usb-reset"):
            cmds.reset_chip(esp, "hard-reset")
        return chip


def _flash_size_said(cmds, esp) -> str | None:
    """The flash size from the flash chip's JEDEC id, or None where it cannot be read (secure
    download mode, an id esptool does not know, a SPI command that does not complete)."""
    from esptool.util import FatalError

    try:
        return cmds.detect_flash_size(esp)
    except FatalError:
        return None


def board_problems(board: Board, chip: ProbedChip, builds: list[Path]) -> list[str]:
    """What of `board`'s file does not hold for `chip`, one line each: the chip, its revision (the
    L2MEM window a bare-metal image loads into is kept free only on some), the flash size the image
    headers say, the partition table's end, and the images of each build directory in `builds`."""
    from esptool.targets import CHIP_DEFS

    flash = board.flash
    if flash is None:
        return [f"{chip.port}: board {board.name} has no [flash] section: it is not flashed over a serial port"]
    at = f"{chip.port} ({board.name})"
    expected = CHIP_DEFS[flash.chip].CHIP_NAME if flash.chip in CHIP_DEFS else flash.chip.upper()
    if chip.name != expected:
        return [f"{at}: found {chip.name}; board {board.name} needs an {expected}"]
    problems = []
    majors = list(flash.supported_revisions)
    if majors and chip.revision // 100 not in majors:
        supported = ", ".join(f"v{m}.x" for m in majors)
        if flash.load_window:
            lo, hi = flash.load_window
            problems.append(
                f"{at}: revision {_rev(chip.revision)}: the image loads into L2MEM 0x{lo:x}-0x{hi:x}, which the ROM "
                f"leaves free on revisions {supported} only"
            )
        else:
            problems.append(f"{at}: revision {_rev(chip.revision)}; board {board.name} supports revisions {supported}")
    if isinstance(flash.min_revision, int) and chip.revision < flash.min_revision:
        problems.append(
            f"{at}: revision {_rev(chip.revision)}; board {board.name} needs {_rev(flash.min_revision)} or later"
        )
    chip_bytes = _flash_bytes(chip.flash_size or "")
    if chip_bytes is None:
        return problems
    board_bytes = _flash_bytes(flash.size)
    if board_bytes and board_bytes > chip_bytes:
        problems.append(
            f"{at}: the images' headers say a {flash.size} flash ([flash] size), the chip has {chip.flash_size}"
        )
    laid_out = [(i.offset + i.size, i.name or i.file) for i in flash.images if i.size]
    if laid_out:
        end, last = max(laid_out)
        if end > chip_bytes:
            problems.append(
                f"{at}: the partition table runs to 0x{end:x} (partition {last}), past the chip's {chip.flash_size} flash"
            )
    for build in builds:
        try:
            images = flash_plan(board, build)
        except ColibriError:
            continue  # not built (or an ESP-IDF project idf.py has not built here): nothing to weigh
        for offset, path in images:
            end = offset + path.stat().st_size
            if end > chip_bytes:
                problems.append(
                    f"{at}: {build}: {path.name} at 0x{offset:x} ({path.stat().st_size:,} B) ends at 0x{end:x}, "
                    f"past the chip's {chip.flash_size} flash"
                )
    return problems
