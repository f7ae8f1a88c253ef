"""A/B app update of an ESP-IDF board over its serial port (`colibri ota`), through esptool's
Python API, the way esp_ota_ops updates a running board: read otadata, write the new app into the
slot the bootloader is NOT starting, verify it (the flasher stub's MD5 of the flash against the
file), and only then write otadata selecting it (next seq, state NEW: the bootloader boots it
once as PENDING_VERIFY, and the app confirms itself or rolls back). otadata is written last and
one sector at a time, into the copy that is not active: a cut anywhere leaves a board that starts
an app that ran before.

write_update_file() writes, instead, the .bin an esp_https_ota server would serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..boards import Board
from ..boards.otadata import OTADATA_BYTES, SECTOR, STATE_NAMES, OtaData
from ..errors import ColibriError
from ..files import write_atomic
from .flash import BEFORE_MODES, _check_chip, _check_images, _esptool_advice, esptool_link


@dataclass(frozen=True)
class OtaUpdate:
    port: str
    running_slot: int  # what the bootloader started before the update
    slot: int  # the slot written and selected
    seq: int  # the otadata seq that selects it
    app_bytes: int


@dataclass(frozen=True)
class _Layout:
    otadata: int  # offset of the otadata partition
    slots: tuple[int, ...]  # app slot offsets
    slot_size: int
    weights: int  # offset of the weights partition


def _layout(board: Board) -> _Layout:
    idf = board.idf
    if idf is None or not idf.ota_slots:
        raise ColibriError(
            f"board {board.name} has no A/B app slots (ota_slots in its [idf] section): flash it instead"
        )
    images = idf.images
    return _Layout(images["otadata"].offset, idf.ota_slots, images["app"].size or 0, images["weights"].offset)


def _checked_app(board: Board, layout: _Layout, app: Path) -> bytes:
    assert board.flash is not None
    ((_, path, data),) = _check_images(board.flash, [(layout.slots[0], Path(app))])
    if data[0] != 0xE9:
        raise ColibriError(f"{path} is not an ESP app image (no 0xE9 magic): give the idf.py build's .bin")
    if len(data) > layout.slot_size:
        raise ColibriError(f"{path} is {len(data):,} B but each app slot holds {layout.slot_size:,} B")
    return data


def write_update_file(board: Board, app: Path, out: Path) -> int:
    """The app image as an esp_https_ota server serves it (the idf.py build's .bin, checked), at out."""
    data = _checked_app(board, _layout(board), app)
    write_atomic(Path(out), data)
    return len(data)


def _identity(weights: Path) -> bytes:
    """The weight image's header and directory: the bytes whose SHA-256 the app carries."""
    from ..compile.image import map_image, read_header

    blob = map_image(weights)
    return bytes(blob[: read_header(blob).data_offset])


def ota_update(
    board: Board,
    port: str,
    app: Path,
    baud: int = 460800,
    progress: Callable[[str], None] = print,
    reset: bool = True,
    before: str = "default-reset",
    weights: Path | None = None,
) -> OtaUpdate:
    """Write `app` into the inactive slot of the board on `port`, verify it, select it in otadata,
    read otadata back, and reset the board (unless reset=False) so the bootloader starts it.
    weights: the image the app was built for; the board's weights partition must begin with its
    header and directory (else the new app would refuse them, fail its self-test and roll back)."""
    if before not in BEFORE_MODES:
        raise ColibriError(f"--before must be one of {', '.join(BEFORE_MODES)}, not {before!r}")
    layout = _layout(board)
    data = _checked_app(board, layout, app)
    flash = board.flash
    assert flash is not None
    if not port:
        raise ColibriError(f"board {board.name} is updated over a serial port: give it with --port (e.g. /dev/ttyUSB0)")
    identity = _identity(weights) if weights is not None else None
    slots = len(layout.slots)
    params = dict(flash_mode=flash.mode, flash_freq=flash.frequency, flash_size=flash.size)
    stage = ""  # what a cut would have interrupted, once the board's flash is being changed

    def failure(text: str) -> str:
        cut = f"; cut while writing {stage}; run ota again" if stage else ""
        return f"updating board {board.name} on {port} failed: {text}{_esptool_advice(text)}{cut}"

    with esptool_link(port, failure, also=(ValueError,)) as (ser, cmds, ESPLoader):
        progress(f"connecting to the board on {port}")
        esp = cmds.detect_chip(ser, baud=ESPLoader.ESP_ROM_BAUD, connect_mode=before)
        _check_chip(board, flash, esp, port, [(layout.slots[0], Path(app), data)])
        esp = cmds.run_stub(esp)
        if baud > ESPLoader.ESP_ROM_BAUD:
            esp.change_baud(baud)
        cmds.attach_flash(esp)
        before_data = OtaData.parse(cmds.read_flash(esp, layout.otadata, OTADATA_BYTES))
        if identity is not None:
            at = layout.weights
            if cmds.read_flash(esp, at, len(identity)) != identity:
                raise ColibriError(
                    f"the weights partition of the board on {port} (0x{at:x}) does not hold the weight image "
                    "this app was built for: write it first with flash --model-only (the new app would "
                    "refuse it, fail its self-test and roll back)"
                )
            progress("the board's weights partition holds the image this app was built for")
        running, after_boot = before_data.boot(slots)  # what the bootloader would start now
        target = (running + 1) % slots
        entries = "; ".join(f"otadata[{i}] {e.describe()}" for i, e in enumerate(before_data.entries))
        progress(f"the board starts ota_{running} ({entries}): writing the app into ota_{target}")
        stage = f"the app into ota_{target}: the board still starts ota_{running} (otadata is unchanged)"
        offset = layout.slots[target]
        cmds.write_flash(esp, [(offset, str(app))], compress=True, **params)
        cmds.verify_flash(esp, [(offset, str(app))], **params)
        progress(f"ota_{target} written and verified ({len(data):,} B at 0x{offset:x}, MD5 matches)")
        index, selected = after_boot.select(target, slots)
        sector = selected.entries[index].sector()
        stage = f"otadata[{index}]: the board still starts ota_{running} (the other copy is untouched)"
        cmds.write_flash(esp, [(layout.otadata + index * SECTOR, sector)], compress=True, **params)
        read_back = OtaData.parse(cmds.read_flash(esp, layout.otadata, OTADATA_BYTES))
        if read_back.selected_slot(slots) != target or read_back.entries[index] != selected.entries[index]:
            raise ColibriError(
                f"updating board {board.name} on {port}: otadata reads back as "
                f"{read_back.entries[index].describe()}, not the selection of ota_{target}: run ota again"
            )
        stage = ""
        entry = selected.entries[index]
        progress(
            f"otadata[{index}] selects ota_{target} (seq {entry.seq}, {STATE_NAMES[entry.state]}): "
            "its first boot runs the self-test, then confirms it or goes back"
        )
        if reset:
            progress("resetting the board")
            cmds.reset_chip(esp, "hard-reset")
        return OtaUpdate(port, running, target, entry.seq, len(data))
