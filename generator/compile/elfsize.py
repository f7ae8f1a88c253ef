"""Read the linked firmware with pyelftools: where the bytes went, to check the plan against."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ..errors import ColibriError
from ..files import REPO

ARENA_SYMBOLS = (
    "colibri_scratch",
    "colibri_key_cache",
    "colibri_value_cache",
    "colibri_key_scales",
    "colibri_value_scales",
    "colibri_rope_cos",
    "colibri_rope_sin",
    "colibri_tensor_table",
    "colibri_expert_groups",
    "colibri_expanded",
    "colibri_linear_state",
)


@dataclass
class ElfSizes:
    code: int = 0  # executable sections
    rodata: int = 0  # read-only data (RoPE tables included)
    data: int = 0  # initialised writable data
    bss: int = 0  # zero-initialised (the arenas)
    symbols: dict[str, int] = field(default_factory=dict)  # size of each ARENA_SYMBOLS symbol
    sections: dict[str, int] = field(default_factory=dict)
    # The self-test's own cost (app/selftest.c, the golden vectors of selftest_data.c): bytes of
    # "code", "rodata" (golden vectors, its kernel table) and "ram" (its fixed input, its results).
    selftest: dict[str, int] = field(default_factory=dict)
    # The data bytes beside the arenas, by who holds them (data_owners): "thread_local" (sections
    # every thread gets its own copy of), "colibri" (the firmware's own objects: locals of its
    # source files and globals named colibri_*, the arenas and RoPE tables left out) and
    # "c_library" (every other object: the C library's, the compiler's run-time, start-up code's).
    data_owners: dict[str, int] = field(default_factory=dict)


# Counted in rows of their own (report.category_bytes), not among the data beside them.
OWN_ROW_SYMBOLS = frozenset(ARENA_SYMBOLS) - {"colibri_tensor_table", "colibri_expert_groups"}
FIRMWARE_PREFIX = "colibri_"


@cache
def firmware_files() -> frozenset[str]:
    """The firmware's own source files: hand-written (firmware_src/) and generated (templates/*.c.j2)."""
    hand_written = [p.name for p in (REPO / "firmware_src").rglob("*.c")]
    return frozenset(hand_written + [p.name[: -len(".j2")] for p in (REPO / "templates").rglob("*.c.j2")])


def _data_owners(elf: ELFFile, symtab: SymbolTableSection) -> dict[str, int]:
    thread_local, data_sections = 0, set()
    for index in range(elf.num_sections()):
        section = elf.get_section(index)
        flags = section["sh_flags"]
        if not flags & SH_FLAGS.SHF_ALLOC or flags & SH_FLAGS.SHF_EXECINSTR:
            continue
        if flags & SH_FLAGS.SHF_TLS:
            thread_local += section["sh_size"]
        else:
            data_sections.add(index)
    owners = {"thread_local": thread_local, "colibri": 0, "c_library": 0}
    in_firmware_file = False
    for sym in symtab.iter_symbols():
        kind = sym["st_info"]["type"]
        if kind == "STT_FILE":
            in_firmware_file = sym.name.rsplit("/", 1)[-1] in firmware_files()
            continue
        if kind != "STT_OBJECT" or sym["st_shndx"] not in data_sections or sym.name in OWN_ROW_SYMBOLS:
            continue
        local = sym["st_info"]["bind"] == "STB_LOCAL"
        ours = in_firmware_file if local else sym.name.startswith(FIRMWARE_PREFIX)
        owners["colibri" if ours else "c_library"] += sym["st_size"]
    return owners


SELFTEST_FILES = ("selftest.c", "selftest_data.c")  # the objects whose local symbols are the self-test's
SELFTEST_PREFIX = "colibri_selftest"  # its global symbols


def _selftest_bytes(elf: ELFFile, symtab: SymbolTableSection) -> dict[str, int]:
    kinds = {}
    for section_index in range(elf.num_sections()):
        section = elf.get_section(section_index)
        flags = section["sh_flags"]
        kinds[section_index] = (
            "code"
            if flags & SH_FLAGS.SHF_EXECINSTR
            else "ram"
            if section["sh_type"] == "SHT_NOBITS" or flags & SH_FLAGS.SHF_WRITE
            else "rodata"
        )
    out = {"code": 0, "rodata": 0, "ram": 0}
    in_selftest_file = False
    for sym in symtab.iter_symbols():
        kind = sym["st_info"]["type"]
        if kind == "STT_FILE":
            in_selftest_file = sym.name.rsplit("/", 1)[-1] in SELFTEST_FILES
            continue
        ours = sym.name.startswith(SELFTEST_PREFIX) or (in_selftest_file and sym["st_info"]["bind"] == "STB_LOCAL")
        if ours and kind in ("STT_FUNC", "STT_OBJECT") and isinstance(sym["st_shndx"], int):
            out[kinds.get(sym["st_shndx"], "rodata")] += sym["st_size"]
    return out


def read_elf(path: Path) -> ElfSizes:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ColibriError(f"cannot read firmware {path}: {e.strerror} (run build first)") from None
    sizes = ElfSizes()
    with f:
        elf = ELFFile(f)
        for section in elf.iter_sections():
            flags = section["sh_flags"]
            if not flags & SH_FLAGS.SHF_ALLOC or section["sh_size"] == 0:
                continue
            size = section["sh_size"]
            sizes.sections[section.name] = size
            if flags & SH_FLAGS.SHF_EXECINSTR:
                sizes.code += size
            elif section["sh_type"] == "SHT_NOBITS":
                sizes.bss += size
            elif flags & SH_FLAGS.SHF_WRITE:
                sizes.data += size
            else:
                sizes.rodata += size
        symtab = elf.get_section_by_name(".symtab")
        if isinstance(symtab, SymbolTableSection):
            for sym in symtab.iter_symbols():
                if sym.name in ARENA_SYMBOLS:
                    sizes.symbols[sym.name] = sym["st_size"]
            sizes.selftest = _selftest_bytes(elf, symtab)
            sizes.data_owners = _data_owners(elf, symtab)
    return sizes
