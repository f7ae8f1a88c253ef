"""An ESP-IDF board's settings: its [idf] section with the [flash] one, parsed and checked when the
board loads, so that every later stage (the project writer, flash, the release) reads typed values.

The facts of ESP flash the board file is checked against (sectors, MMU pages, data subtypes) live
here too, below the compile stage's partition tables that use them as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ColibriError
from .flash import Flash, FlashImage

MMU_PAGE = 0x10000  # flash MMU page: the weights partition is mapped in pages of 64 KiB
SECTOR = 0x1000  # flash erase sector: every partition starts on one
DATA_SUBTYPES = {
    "ota": 0x00,
    "phy": 0x01,
    "nvs": 0x02,
    "coredump": 0x03,
    "nvs_keys": 0x04,
    "efuse": 0x05,
    "undefined": 0x06,
    "esphttpd": 0x80,
    "fat": 0x81,
    "spiffs": 0x82,
    "littlefs": 0x83,
}
FLASH_MODES = ("qio", "qout", "dio", "dout")
FLASH_FREQS = {"80m": "80M", "40m": "40M", "20m": "20M", "120m": "120M"}
# ESP32-P4 minimum-revision choices of ESP-IDF (CONFIG_ESP32P4_REV_MIN_<n>), by revision family.
REV_MIN_CHOICES = {False: (300, 301), True: (0, 1, 100)}  # key: builds for revisions < v3.0


@dataclass(frozen=True)
class IdfSettings:
    """The board file's [flash] and [idf] sections, checked."""

    chip: str
    chip_id: int
    flash_mode: str
    flash_freq: str
    flash_size: str
    flash_bytes: int
    supported_revisions: tuple[int, ...]  # chip revision majors
    min_revision: int  # MAJOR * 100 + MINOR
    images: dict[str, FlashImage]
    target: str
    min_version: str
    project_dir: str
    project_name: str
    weights_partition: str
    weights_subtype: str
    nvs_offset: int
    nvs_size: int
    ota_slots: tuple[int, ...]  # app slot offsets (ota_0, ota_1, ...), each the app image's size; () = factory app
    uart_num: int
    uart_baud: int
    uart_rx_buffer: int
    idle_hello_ms: int
    cpu_mhz: int
    sdkconfig: dict[str, bool | int | str]

    @property
    def weights_subtype_value(self) -> int:
        name = self.weights_subtype
        return DATA_SUBTYPES[name] if name in DATA_SUBTYPES else int(name, 16)

    @property
    def rev_less_v3(self) -> bool:
        return max(self.supported_revisions) < 3


def _flash_bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)MB", size)
    if not m or int(m.group(1)) not in (1, 2, 4, 8, 16, 32, 64, 128):
        raise ValueError(f"flash size {size!r} is not one of 1MB, 2MB, 4MB, ... 128MB")
    return int(m.group(1)) << 20


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def parse_idf(section: object, flash: Flash | None, path: Path) -> IdfSettings:
    """The [idf] section (with [flash]) as typed values; a malformed one is a ColibriError naming the
    board file and the field."""
    try:
        if not isinstance(section, dict):
            raise TypeError("[idf] must be a table")
        if flash is None:
            raise ValueError("an [idf] board needs a [flash] section")
        images = {image.name: image for image in flash.images}
        for needed in ("bootloader", "partition-table", "app", "weights"):
            if needed not in images:
                raise ValueError(f"[[flash.images]] has no entry named {needed!r}")
        for needed in ("app", "weights"):
            if images[needed].size is None:
                raise ValueError(f"[[flash.images]] entry {needed!r} needs a size (its partition's)")
        revisions = flash.supported_revisions
        if not revisions:
            raise ValueError("supported_revisions is empty")
        if flash.mode not in FLASH_MODES:
            raise ValueError(f"flash mode {flash.mode!r} is not one of {', '.join(FLASH_MODES)}")
        if flash.frequency not in FLASH_FREQS:
            raise ValueError(f"flash frequency {flash.frequency!r} is not one of {', '.join(FLASH_FREQS)}")
        if flash.min_revision is None:
            raise ValueError("[flash] has no min_revision")
        subtype = section["weights_subtype"]
        if isinstance(subtype, str) and subtype not in DATA_SUBTYPES:
            raise ValueError(f"weights_subtype {subtype!r} is not a data subtype name")
        extra = section.get("sdkconfig", {})
        for key, value in extra.items():
            if not re.fullmatch(r"[A-Z0-9_]+", key) or not isinstance(value, (bool, int, str)):
                raise ValueError(f"[idf.sdkconfig] {key} = {value!r} is not a Kconfig name and value")
        settings = IdfSettings(
            chip=flash.chip,
            chip_id=flash.chip_id,
            flash_mode=flash.mode,
            flash_freq=flash.frequency,
            flash_size=flash.size,
            flash_bytes=_flash_bytes(flash.size),
            supported_revisions=revisions,
            min_revision=flash.min_revision,
            images=images,
            target=str(section["target"]),
            min_version=str(section["min_version"]),
            project_dir=str(section["project_dir"]),
            project_name=str(section["project_name"]),
            weights_partition=str(section["weights_partition"]),
            weights_subtype=subtype if isinstance(subtype, str) else f"0x{_positive_int(subtype, 'subtype'):02x}",
            nvs_offset=_positive_int(section["nvs_offset"], "nvs_offset"),
            nvs_size=_positive_int(section["nvs_size"], "nvs_size"),
            ota_slots=tuple(_positive_int(o, "ota_slots entry") for o in section.get("ota_slots", [])),
            uart_num=_positive_int(section["uart_num"], "uart_num"),
            uart_baud=_positive_int(section["uart_baud"], "uart_baud"),
            uart_rx_buffer=_positive_int(section["uart_rx_buffer"], "uart_rx_buffer"),
            idle_hello_ms=_positive_int(section["idle_hello_ms"], "idle_hello_ms"),
            cpu_mhz=_positive_int(section["cpu_mhz"], "cpu_mhz"),
            sdkconfig=dict(extra),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ColibriError(f"{path.name}: malformed [flash]/[idf] section ({e})") from None
    _check_settings(path, settings)
    return settings


def _check_settings(path: Path, s: IdfSettings) -> None:
    def bad(msg: str) -> None:
        raise ColibriError(f"{path.name}: {msg}")

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.project_name):
        bad(f"project_name {s.project_name!r} must be a C/CMake identifier")
    if not re.fullmatch(r"[A-Za-z0-9_]{1,16}", s.weights_partition):
        bad(f"weights_partition {s.weights_partition!r} must be 1-16 letters, digits or '_'")
    if s.uart_num != 0:
        bad("uart_num must be 0: requests and results share UART0 with the console")
    if s.uart_rx_buffer <= 128:
        bad("uart_rx_buffer must be larger than the UART's 128-byte FIFO")
    if s.images["partition-table"].offset % SECTOR or s.images["partition-table"].offset < 0x8000:
        bad("the partition table must start on a 4 KiB sector at 0x8000 or above")
    if s.images["app"].offset % MMU_PAGE or s.images["weights"].offset % MMU_PAGE:
        bad("the app and weights partitions must start on 64 KiB boundaries")
    if s.ota_slots:
        otadata = s.images.get("otadata")
        if len(s.ota_slots) < 2 or len(s.ota_slots) > 16:
            bad(f"ota_slots must list 2 to 16 app slots, not {len(s.ota_slots)}")
        if s.ota_slots[0] != s.images["app"].offset:
            bad(f"ota_slots starts at 0x{s.ota_slots[0]:x}, but flash writes the app at 0x{s.images['app'].offset:x}")
        if any(o % MMU_PAGE for o in s.ota_slots):
            bad("every app slot in ota_slots must start on a 64 KiB boundary")
        size, starts = s.images["app"].size or 0, sorted(s.ota_slots)
        if any(lo + size > hi for lo, hi in zip(starts, starts[1:])):
            bad(f"the app slots in ota_slots overlap: each holds the app image's 0x{size:x} bytes")
        if otadata is None or otadata.size != 2 * SECTOR or otadata.offset % SECTOR:
            bad(
                "A/B slots need an otadata image in [[flash.images]]: two 4 KiB sectors (size = 0x2000), sector-aligned"
            )
    mixed = {r < 3 for r in s.supported_revisions}
    if len(mixed) > 1:
        bad(
            "an ESP-IDF build supports ESP32-P4 revisions below v3.0 or from v3.0 on, not both: "
            f"supported_revisions {list(s.supported_revisions)} mixes them"
        )
    if s.min_revision // 100 not in s.supported_revisions or s.min_revision not in REV_MIN_CHOICES[s.rev_less_v3]:
        choices = ", ".join(f"{r // 100}.{r % 100}" for r in REV_MIN_CHOICES[s.rev_less_v3])
        bad(f"min_revision {s.min_revision} is not one ESP-IDF offers for these revisions (v{choices})")
    if s.cpu_mhz not in ((360,) if s.rev_less_v3 else (360, 400)):
        bad(f"cpu_mhz {s.cpu_mhz} is not available on ESP32-P4 revisions {list(s.supported_revisions)}")
