"""Read the linked firmware with pyelftools: where the bytes went, to check the plan against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ..errors import ColibriError

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
    return sizes
