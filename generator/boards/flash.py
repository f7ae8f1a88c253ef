"""A board's [flash] section: what esptool writes where, and how the ROM loader must see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlashImage:
    offset: int
    file: str  # relative to the build directory
    name: str = ""
    size: int | None = None  # the partition's size where the board gives one


@dataclass(frozen=True)
class Flash:
    """A board's [flash] section: what esptool writes and how the ROM loader must see it."""

    chip: str
    chip_id: int
    mode: str
    frequency: str
    size: str
    baud: int
    supported_revisions: tuple[int, ...]  # chip revision majors
    images: tuple[FlashImage, ...]
    min_revision: int | None = None  # MAJOR * 100 + MINOR
    load_window: tuple[int, int] | None = None  # where a bare-metal image's segments must load
    app_image: str | None = None  # elf2image output
    flash_image: str | None = None  # the merged image written at offset 0

    def image(self, name: str) -> FlashImage | None:
        return next((i for i in self.images if i.name == name), None)
