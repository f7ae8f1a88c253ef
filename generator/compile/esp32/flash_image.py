"""ESP flash images for bare-metal boards, through esptool's Python API (esptool 5.x):
ELF -> app image (elf2image) -> merged flash image, then checked: esptool must parse the image for
the right chip, and pyelftools must find every loaded segment inside the board's load window."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from elftools.elf.elffile import ELFFile

from ...boards import Board
from ...errors import ColibriError


def _quiet(fn, *args, **kwargs):
    """esptool prints progress on stdout: keep it for error messages, not for the build log."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return fn(*args, **kwargs)
    except Exception as e:  # esptool raises FatalError and plain exceptions
        raise ColibriError(f"esptool: {e}") from None


def make_app_image(board: Board, elf: Path, out: Path) -> None:
    from esptool.cmds import elf2image

    flash = board.flash
    majors = flash.supported_revisions
    # The ROM refuses to boot an image outside [min, max]: vMAJOR.MINOR is stored as MAJOR * 100 + MINOR.
    _quiet(
        elf2image,
        str(elf),
        flash.chip,
        output=str(out),
        flash_mode=flash.mode,
        flash_freq=flash.frequency,
        flash_size=flash.size,
        min_rev_full=min(majors) * 100,
        max_rev_full=max(majors) * 100 + 99,
    )


def merge_flash_image(board: Board, images: list[tuple[int, Path]], out: Path) -> None:
    from esptool.cmds import merge_bin

    _quiet(merge_bin, [(offset, str(path)) for offset, path in images], board.flash.chip, output=str(out))


def load_segments(elf: Path) -> list[tuple[int, int]]:
    """(address, memory size) of every loadable segment."""
    with open(elf, "rb") as f:
        return [
            (seg["p_vaddr"], seg["p_memsz"])
            for seg in ELFFile(f).iter_segments()
            if seg["p_type"] == "PT_LOAD" and seg["p_memsz"] > 0
        ]


def check_segments(board: Board, elf: Path) -> None:
    lo, hi = board.flash.load_window
    for addr, size in load_segments(elf):
        if addr < lo or addr + size > hi:
            raise ColibriError(
                f"segment at 0x{addr:08x} (+{size:,} B) leaves the load window "
                f"0x{lo:08x}-0x{hi:08x} of board {board.name}"
            )


def check_app_image(board: Board, image: Path) -> str:
    """Parse the image with esptool; returns its summary. Fails unless it is for this chip."""
    from esptool.bin_image import LoadFirmwareImage

    flash = board.flash
    try:
        parsed = LoadFirmwareImage(flash.chip, str(image))
    except Exception as e:
        raise ColibriError(f"esptool cannot parse {image.name}: {e}") from None
    chip_id = getattr(parsed, "chip_id", None)
    if chip_id != flash.chip_id:
        raise ColibriError(f"{image.name} has chip id {chip_id}, board {board.name} needs {flash.chip_id}")
    from esptool.cmds import image_info

    return _quiet_capture(image_info, str(image), chip=flash.chip)


def _quiet_capture(fn, *args, **kwargs) -> str:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            fn(*args, **kwargs)
    except Exception as e:
        raise ColibriError(f"esptool: {e}") from None
    return out.getvalue()
