"""The weight image format (version 3), described once: every field of the header and of a
directory entry with its offset, size and meaning. The writer and reader (image.py), the plan's
layout, the generated C header image_format.h (the loader's offsets) and the damaged-image tests
all read this table; nothing else spells an offset.

Layout (little-endian; offsets from the start of the image):
  header       HEADER_BYTES, the fields of HEADER, zero to the end
  directory    one DIR_ENTRY_BYTES entry per tensor (the fields of DIR_ENTRY), in plan order
  data         each tensor at an ALIGN-byte aligned offset from the data region's start; a q8_0
               tensor is rows*cols int8 quants, zero padding to ALIGN, then rows*cols/32 binary16
               scales; a q4_0 tensor the same with rows*cols/2 bytes of packed 4-bit quants
               (quantize.py); a q4_1 tensor rows*cols/2 bytes of packed 4-bit quants, zero
               padding to ALIGN, rows*cols/32 binary16 scales d, then (right after them)
               rows*cols/32 binary16 minimums m; a kept GGUF type (q5_0 ... mxfp4) the file's
               blocks verbatim, row after row (numerics/blocks.py); padding is zero
  trailer      u32 CRC-32 (IEEE) of the header and directory (every byte before the data region),
               then END_MAGIC

Each tensor is checked against its own CRC-32 in the directory (since version 2), so a loader can
check the header and directory at start and each tensor the first time it is brought in: a board
that maps a 50 GB image starts without reading it. Version 3 stores block scales and minimums as
IEEE binary16 (version 2 had float32 ones). Older versions are refused with a message to regenerate
the image.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"COLIBRIW"
END_MAGIC = b"CEND"
FORMAT_VERSION = 3
ALIGN = 64  # the data region and every tensor in it
HEADER_BYTES = 128
DIR_ENTRY_BYTES = 96
NAME_BYTES = 64
TRAILER_BYTES = 8  # u32 CRC-32 of the header and directory, then END_MAGIC
# Element types of a tensor, as the directory stores them (and the firmware's ColibriMatrix).
DTYPE_CODES = {
    "f32": 0,
    "q8_0": 1,
    "q4_0": 2,
    "q4_1": 3,
    # GGUF blocks kept verbatim (numerics/blocks.py)
    "q5_0": 4,
    "q5_1": 5,
    "q4_k": 6,
    "q5_k": 7,
    "q6_k": 8,
    "q3_k": 9,
    "q2_k": 10,
    "iq4_nl": 11,
    "iq4_xs": 12,
    "mxfp4": 13,
}
# The model's quantization in the header: one block type for every matrix (its DTYPE_CODES value),
# or a GGUF file's own block types (--quant gguf), each tensor's then in its directory entry.
QUANT_CODES = {**DTYPE_CODES, "gguf": 16}


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    code: str  # struct code: "I" u32, "Q" u64, "Ns" N bytes
    doc: str

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)

    def read(self, blob, base: int = 0):
        (value,) = struct.unpack_from("<" + self.code, blob, base + self.offset)
        return value

    def write(self, blob: bytearray, value, base: int = 0) -> None:
        struct.pack_into("<" + self.code, blob, base + self.offset, value)


def _table(size: int, *fields: Field) -> dict[str, Field]:
    """Fields in order, each starting where the one before ends, all within `size` bytes."""
    end = 0
    for f in fields:
        assert f.offset == end, f"{f.name} at {f.offset}, expected {end}"
        end = f.offset + f.size
    assert end <= size
    return {f.name: f for f in fields}


HEADER = _table(
    HEADER_BYTES,
    Field("magic", 0, "8s", 'the bytes "COLIBRIW"'),
    Field("version", 8, "I", "format version"),
    Field("header_bytes", 12, "I", "bytes of this header"),
    Field("tensor_count", 16, "I", "directory entries"),
    Field("dir_entry_bytes", 20, "I", "bytes of one directory entry"),
    Field("dir_offset", 24, "Q", "where the directory starts"),
    Field("data_offset", 32, "Q", "where the data region starts (a multiple of ALIGN)"),
    Field("data_bytes", 40, "Q", "bytes of the data region"),
    Field("image_bytes", 48, "Q", "bytes of the whole image, trailer included"),
    Field("model_hash", 56, "32s", "SHA-256 naming the model and its weights (image.py)"),
    Field("quant", 88, "I", "the model's quantization, a QUANT_CODES value"),
    Field("rank", 92, "I", "a rank's image (compile/layout.py rank_image): which rank it is; else 0"),
    Field("ranks", 96, "I", "a rank's image: the rank count it was made for; 0 for a whole (single board) image"),
)

DIR_ENTRY = _table(
    DIR_ENTRY_BYTES,
    Field("name", 0, f"{NAME_BYTES}s", "canonical tensor name, NUL padded"),
    Field("dtype", 64, "I", "element type, a DTYPE_CODES value"),
    Field("rows", 68, "I", "rows (1 for a vector)"),
    Field("cols", 72, "I", "values per row"),
    Field(
        "crc32", 76, "I", "CRC-32 (IEEE) of the tensor's bytes and its zero padding up to the next multiple of ALIGN"
    ),
    Field("offset", 80, "Q", "where the tensor starts, from the data region's start"),
    Field("bytes", 88, "Q", "bytes of the tensor (quants, padding and scales)"),
)


def pack(table: dict[str, Field], size: int, **values) -> bytes:
    """A header or directory entry with the given fields (every field of the table), zero padded."""
    out = bytearray(size)
    for name, f in table.items():
        f.write(out, values[name])
    return bytes(out)


def unpack(table: dict[str, Field], blob, base: int = 0) -> dict:
    return {name: f.read(blob, base) for name, f in table.items()}
