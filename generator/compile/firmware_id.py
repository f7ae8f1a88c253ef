"""A built firmware's own identity, as its hello frame reports it in `build=`: the GNU build-id
of the linked ELF, or for ESP-IDF boards the SHA-256 of the app ELF (esp_app_desc.app_elf_sha256).
`verify` compares the hello against these, and a release records them."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from ..boards import Board

NT_GNU_BUILD_ID = 3
# Bare-metal linker scripts that keep the note inside .rodata (so that esptool's elf2image, which
# drops NOTE sections, still puts it in the image) mark where it lies with this symbol.
NOTE_SYMBOL = "__colibri_build_id_note"


def _parse_note(data: bytes, little: bool) -> str | None:
    """The descriptor of a GNU build-id note at the start of `data`, in hex."""
    if len(data) < 16:
        return None
    namesz, descsz, kind = struct.unpack_from("<III" if little else ">III", data)
    name_end = 12 + ((namesz + 3) & ~3)
    if kind != NT_GNU_BUILD_ID or data[12 : 12 + namesz] != b"GNU\0" or not 0 < descsz <= len(data) - name_end:
        return None
    return data[name_end : name_end + descsz].hex()


def elf_build_id(elf: Path) -> str | None:
    """The GNU build-id of a linked firmware (a hash of its contents), if it has one: from a NOTE
    section, or from the note at NOTE_SYMBOL inside the section holding it."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection, SymbolTableSection

    try:
        with open(elf, "rb") as f:
            e = ELFFile(f)
            for section in e.iter_sections():
                if isinstance(section, NoteSection):
                    for note in section.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return note["n_desc"]
            symtab = e.get_section_by_name(".symtab")
            if not isinstance(symtab, SymbolTableSection):
                return None
            symbols = symtab.get_symbol_by_name(NOTE_SYMBOL) or []
            for symbol in symbols:
                address = symbol["st_value"]
                for section in e.iter_sections():
                    start = section["sh_addr"]
                    if section["sh_type"] == "SHT_PROGBITS" and start <= address < start + section["sh_size"]:
                        return _parse_note(section.data()[address - start :], e.little_endian)
    except Exception:  # not an ELF pyelftools understands: no build id to report
        return None
    return None


def firmware_build_id(board: Board, program: Path) -> str | None:
    """What the firmware built for `board` reports as `build=` in its hello frame (None when the
    program is not built here, e.g. an ESP-IDF project idf.py has not built)."""
    program = Path(program)
    if not program.is_file():
        return None
    if board.is_esp_idf:
        # ESP-IDF stores the SHA-256 of the app ELF in the image's app description.
        return hashlib.sha256(program.read_bytes()).hexdigest()
    return elf_build_id(program)
