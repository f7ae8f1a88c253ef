"""ESP-IDF's OTA data partition (otadata), read and written exactly as its bootloader and
esp_ota_ops do, so that `colibri ota` can pick the inactive app slot and select the new app.

otadata is two 4 KiB flash sectors, each starting with one esp_ota_select_entry_t (32 bytes,
little-endian): ota_seq (u32), seq_label (20 bytes), ota_state (u32), crc (u32), where crc =
esp_rom_crc32_le(UINT32_MAX, &ota_seq, 4) (bootloader_common_ota_select_crc) — zlib's CRC-32
continued from 0xFFFFFFFF. An entry is valid when its seq is not 0xFFFFFFFF, its state is neither
INVALID nor ABORTED and its crc matches; the valid entry with the highest seq selects app slot
(seq - 1) % slots; with none valid the bootloader starts slot 0. The same rules, in C for the
firmware, are firmware_src/app/ota_state.c; tests hold the two to the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, replace

SECTOR = 0x1000
ENTRY = struct.Struct("<I20sII")  # ota_seq, seq_label, ota_state, crc
OTADATA_BYTES = 2 * SECTOR
BLANK_SEQ = 0xFFFFFFFF

# esp_ota_img_states_t
NEW, PENDING_VERIFY, VALID, INVALID, ABORTED = 0, 1, 2, 3, 4
UNDEFINED = 0xFFFFFFFF
STATE_NAMES = {
    NEW: "new",
    PENDING_VERIFY: "pending-verify",
    VALID: "valid",
    INVALID: "invalid",
    ABORTED: "aborted",
    UNDEFINED: "undefined",
}


def ota_crc(seq: int) -> int:
    """bootloader_common_ota_select_crc: esp_rom_crc32_le(UINT32_MAX, &seq, 4)."""
    return zlib.crc32(struct.pack("<I", seq), 0xFFFFFFFF)


@dataclass(frozen=True)
class OtaEntry:
    seq: int = BLANK_SEQ
    label: bytes = b"\xff" * 20
    state: int = UNDEFINED
    crc: int = 0xFFFFFFFF

    @property
    def valid(self) -> bool:
        return self.seq != BLANK_SEQ and self.state not in (INVALID, ABORTED) and self.crc == ota_crc(self.seq)

    def slot(self, slots: int) -> int:
        return (self.seq - 1) % slots

    def sector(self) -> bytes:
        """The entry's flash sector as ESP-IDF writes it: erased, then the entry at its start."""
        return ENTRY.pack(self.seq, self.label, self.state, self.crc).ljust(SECTOR, b"\xff")

    def describe(self) -> str:
        if self.seq == BLANK_SEQ:
            return "blank"
        crc = "" if self.crc == ota_crc(self.seq) else ", bad crc"
        return f"seq {self.seq}, {STATE_NAMES.get(self.state, f'state {self.state:#x}')}{crc}"


def _stamped(entry: OtaEntry, seq: int | None = None, state: int | None = None) -> OtaEntry:
    """The entry with a new seq and/or state, and the crc of its seq (as ESP-IDF rewrites one)."""
    seq = entry.seq if seq is None else seq
    return replace(entry, seq=seq, state=entry.state if state is None else state, crc=ota_crc(seq))


@dataclass(frozen=True)
class OtaData:
    """The two entries of an otadata partition."""

    entries: tuple[OtaEntry, OtaEntry]

    @classmethod
    def parse(cls, data: bytes) -> OtaData:
        if len(data) < OTADATA_BYTES:
            raise ValueError(f"otadata is {OTADATA_BYTES} bytes, got {len(data)}")
        return cls(tuple(OtaEntry(*ENTRY.unpack_from(data, i * SECTOR)) for i in range(2)))  # type: ignore[arg-type]

    @classmethod
    def blank(cls) -> OtaData:
        return cls((OtaEntry(), OtaEntry()))

    def to_bytes(self) -> bytes:
        return b"".join(e.sector() for e in self.entries)

    def active(self) -> int | None:
        """bootloader_common_get_active_otadata: the valid entry with the highest seq."""
        valid = [i for i, e in enumerate(self.entries) if e.valid]
        if not valid:
            return None
        return max(valid, key=lambda i: (self.entries[i].seq, -i))

    def selected_slot(self, slots: int) -> int | None:
        i = self.active()
        return None if i is None else self.entries[i].slot(slots)

    def boot(self, slots: int) -> tuple[int, OtaData]:
        """What the second-stage bootloader (CONFIG_BOOTLOADER_APP_ROLLBACK_ENABLE) does at reset:
        PENDING_VERIFY entries become ABORTED, the active entry picks the slot (slot 0 when none is
        valid), a NEW one becomes PENDING_VERIFY. Returns (slot booted, otadata afterwards)."""
        entries = [_stamped(e, state=ABORTED) if e.state == PENDING_VERIFY else e for e in self.entries]
        after = OtaData((entries[0], entries[1]))
        i = after.active()
        if i is None:
            return 0, after
        if entries[i].state == NEW:
            entries[i] = _stamped(entries[i], state=PENDING_VERIFY)
        after = OtaData((entries[0], entries[1]))
        return entries[i].slot(slots), after

    def select(self, slot: int, slots: int) -> tuple[int, OtaData]:
        """esp_ota_set_boot_partition(slot) with rollback enabled (esp_rewrite_ota_data): the entry
        that is not active gets the smallest seq, not below the active one's, that selects `slot`,
        and state NEW. Returns (index of the entry written, otadata afterwards)."""
        if not 0 <= slot < slots:
            raise ValueError(f"slot {slot} is not one of {slots}")
        active = self.active()
        if active is None:
            index, seq = 0, slot + 1
        else:
            index, current, first = active ^ 1, self.entries[active].seq, (slot + 1) % slots
            i = 0
            while current > first + i * slots:
                i += 1
            seq = first + i * slots
        entries = list(self.entries)
        entries[index] = _stamped(entries[index], seq=seq, state=NEW)
        return index, OtaData((entries[0], entries[1]))

    def slot_state(self, slot: int, slots: int) -> int:
        """esp_ota_get_state_partition for a slot: the state of the crc-valid entry selecting it."""
        best = None
        for e in self.entries:
            if e.seq != BLANK_SEQ and e.crc == ota_crc(e.seq) and e.slot(slots) == slot:
                if best is None or e.seq > best.seq:
                    best = e
        return UNDEFINED if best is None else best.state
