"""ESP flash partition tables: the partitions a project's partitions.csv lists, the rules
gen_esp32part.py enforces that matter here, and reading a partitions.csv back (flash checks the
images it writes against it)."""

from __future__ import annotations

from dataclasses import dataclass

from ...boards.esp_idf import MMU_PAGE, SECTOR  # ESP flash facts, beside the board file's checks
from ...errors import ColibriError


@dataclass(frozen=True)
class Partition:
    name: str
    type: str  # "app" | "data"
    subtype: str  # a name gen_esp32part.py knows, or 0xNN
    offset: int
    size: int
    flags: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size


def check_partitions(parts: list[Partition], table_offset: int, flash_bytes: int) -> None:
    """The rules gen_esp32part.py enforces that matter here, with this project's own messages."""
    otadata = [p for p in parts if p.type == "data" and p.subtype == "ota"]
    if len(otadata) > 1:
        raise ColibriError("the partition table has more than one otadata partition")
    if otadata and otadata[0].size != 2 * SECTOR:
        raise ColibriError(f"the otadata partition must be 0x2000 bytes (two sectors), not 0x{otadata[0].size:x}")
    names = [p.name for p in parts]
    if len(set(names)) != len(names) or any(len(n) > 16 for n in names):
        raise ColibriError(f"partition names must be unique and at most 16 characters: {', '.join(names)}")
    lo = table_offset + SECTOR  # the table takes one sector
    for p in sorted(parts, key=lambda p: p.offset):
        align = MMU_PAGE if p.type == "app" else SECTOR
        if p.offset % align or p.size % SECTOR or p.size == 0:
            raise ColibriError(f"partition {p.name} at 0x{p.offset:x} (+0x{p.size:x}) is not aligned")
        if p.offset < lo:
            raise ColibriError(f"partition {p.name} at 0x{p.offset:x} overlaps what comes before it (ends 0x{lo:x})")
        lo = p.end
    if lo > flash_bytes:
        raise ColibriError(f"the partitions end at 0x{lo:x}, beyond the {flash_bytes >> 20} MB flash")


def parse_partitions_csv(text: str) -> list[Partition]:
    """Read back a partitions.csv (name, type, subtype, offset, size[, flags]) with explicit offsets."""
    parts = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            raise ColibriError(f"partitions.csv line {n}: expected name, type, subtype, offset, size")
        try:
            offset, size = int(cols[3], 0), int(cols[4], 0)
        except ValueError:
            raise ColibriError(f"partitions.csv line {n}: offset and size must be numbers") from None
        parts.append(Partition(cols[0], cols[1], cols[2], offset, size, cols[5] if len(cols) > 5 else ""))
    return parts
