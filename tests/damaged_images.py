"""A table of damaged weight images, shared by the loader tests on every build of the loader. Every
field is reached through the format's own table (generator/compile/image_format.py), as the loader does."""

import struct
import zlib

from generator.compile.image import read_header
from generator.compile.image_format import ALIGN, DIR_ENTRY, DIR_ENTRY_BYTES, HEADER, HEADER_BYTES, TRAILER_BYTES


def fix_crc(blob: bytearray) -> bytes:
    """The trailer's CRC-32 recomputed over the header and directory (every byte before the data)."""
    data_offset = min(HEADER["data_offset"].read(blob), len(blob) - TRAILER_BYTES)
    struct.pack_into("<I", blob, len(blob) - TRAILER_BYTES, zlib.crc32(blob[:data_offset]))
    return bytes(blob)


def patched(blob, offset, fmt, value, crc=True):
    b = bytearray(blob)
    struct.pack_into(fmt, b, offset, value)
    return fix_crc(b) if crc else bytes(b)


def header(blob, field: str, value, crc=True):
    """The image with one header field set to `value` (CRC recomputed unless crc=False)."""
    f = HEADER[field]
    return patched(blob, f.offset, "<" + f.code, value, crc)


def dir_field(blob, index: int, field: str, value):
    """The image with one field of directory entry `index` set to `value` (CRC recomputed)."""
    f = DIR_ENTRY[field]
    return patched(blob, read_header(blob).dir_offset + DIR_ENTRY_BYTES * index + f.offset, "<" + f.code, value)


def tensor_edited(blob, index: int, at: int, fix_directory: bool) -> bytes:
    """The image with byte `at` of tensor `index` flipped; with fix_directory, the tensor's CRC-32 in
    the directory and the trailer's CRC recomputed to match (a forgery, not an accident)."""
    h = read_header(blob)
    b = bytearray(blob)
    _, _, _, offset, nbytes, _ = entry(blob, index)
    start = h.data_offset + offset
    b[start + at] ^= 0x10
    if fix_directory:
        crc_at = h.dir_offset + DIR_ENTRY_BYTES * index + DIR_ENTRY["crc32"].offset
        struct.pack_into("<I", b, crc_at, zlib.crc32(b[start : start + -(-nbytes // ALIGN) * ALIGN]))
        return fix_crc(b)
    return bytes(b)


def cases(blob, other_model, f32_image):
    size = len(blob)
    h = read_header(blob)
    first_entry = h.dir_offset
    last = h.tensor_count - 1
    return {
        "truncated_header": (blob[: HEADER_BYTES - 28], 2),
        "truncated_body": (blob[: size // 2], 2),
        "bad_magic": (b"X" + blob[1:], 3),
        "version_2": (header(blob, "version", 2), 4),
        "version_4": (header(blob, "version", 4), 4),
        "header_size": (header(blob, "header_bytes", 64), 5),
        "dir_entry_size": (header(blob, "dir_entry_bytes", DIR_ENTRY_BYTES - 1), 5),
        "length_field_smaller": (header(blob, "image_bytes", size - 64), 6),
        "trailing_bytes": (blob + bytes(64), 6),
        "flipped_bit_first_tensor": (tensor_edited(blob, 0, 1, fix_directory=False), 17),
        "flipped_bit_last_tensor": (tensor_edited(blob, last, entry(blob, last)[4] - 1, fix_directory=False), 17),
        "tensor_count_zero": (header(blob, "tensor_count", 0), 8),
        "tensor_count_max": (header(blob, "tensor_count", 2**32 - 1), 8),
        "dir_offset_past_end": (header(blob, "dir_offset", size), 9),
        "dir_offset_overflow": (header(blob, "dir_offset", 2**64 - 8), 15),
        "data_offset_past_end": (header(blob, "data_offset", 2**64 - 64), 10),
        "data_bytes_overflow": (header(blob, "data_bytes", 2**64 - 64), 15),
        "data_past_end": (header(blob, "data_bytes", size), 10),
        "data_misaligned": (header(header(blob, "data_offset", h.data_offset + 4), "data_bytes", h.data_bytes - 4), 11),
        "quant_field": (header(blob, "quant", 0), 12),
        "f32_image_of_same_model": (f32_image, 12),
        "other_model": (other_model, 13),
        "model_hash_edited": (
            patched(blob, HEADER["model_hash"].offset, "<B", blob[HEADER["model_hash"].offset] ^ 0xFF),
            13,
        ),
        # Well formed, claims the right model hash, every CRC recomputed: only the identity tells.
        "data_edited_crcs_fixed": (tensor_edited(blob, 0, 1, fix_directory=True), 16),
        "dir_crc_edited_crc_fixed": (dir_field(blob, 0, "crc32", entry(blob, 0)[5] ^ 1), 16),
        "dir_name_changed": (patched(blob, first_entry + DIR_ENTRY["name"].offset, "<B", ord("X")), 14),
        "dir_dtype_unknown": (dir_field(blob, 0, "dtype", 9), 14),
        "dir_rows_changed": (dir_field(blob, 0, "rows", 1), 14),
        "dir_offset_changed": (dir_field(blob, 0, "offset", 64), 14),
        "dir_size_changed": (dir_field(blob, 0, "bytes", 2**63), 14),
        # 32-bit traps: values whose low 32 bits are right (a 32-bit size_t would accept them).
        "dir_size_overflow_32": (dir_field(blob, 0, "bytes", entry(blob, 0)[4] + 2**32), 14),
        "data_bytes_overflow_32": (header(blob, "data_bytes", h.data_bytes + 2**32), 10),
        # Past 2^32: images of tens of GB are normal, so nothing may be cut to 32 bits on the way.
        "dir_offset_past_2_32": (dir_field(blob, last, "offset", entry(blob, last)[3] + 2**32), 14),
        "dir_size_past_2_32": (dir_field(blob, last, "bytes", 2**32 + 64), 14),
        "image_bytes_past_2_32": (header(blob, "image_bytes", size + 2**32), 2),
        "data_offset_past_2_32": (header(blob, "data_offset", h.data_offset + 2**32), 10),
        "dir_offset_overlaps_previous": (dir_field(blob, 1, "offset", entry(blob, 0)[3]), 14),
        "dir_offset_out_of_range": (dir_field(blob, 0, "offset", h.data_bytes), 14),
        # A flipped bit in each region, CRC left as it was.
        "flipped_header_bit": (flip(blob, HEADER["model_hash"].offset + 4), 7),
        "flipped_directory_bit": (flip(blob, first_entry + DIR_ENTRY["rows"].offset + 2), 7),
        "flipped_crc_bit": (flip(blob, size - TRAILER_BYTES), 7),
        "end_magic_damaged": (flip(blob, size - 2), 2),
    }


def flip(blob: bytes, offset: int, bit: int = 2) -> bytes:
    b = bytearray(blob)
    b[offset] ^= 1 << bit
    return bytes(b)


def entry(blob: bytes, index: int) -> tuple:
    """(name, dtype, rows, offset, bytes, crc32) of directory entry `index`."""
    start = read_header(blob).dir_offset + DIR_ENTRY_BYTES * index
    e = {name: f.read(blob, start) for name, f in DIR_ENTRY.items()}
    return e["name"].rstrip(b"\0").decode(), e["dtype"], e["rows"], e["offset"], e["bytes"], e["crc32"]


def routed_expert_cases(blob) -> dict:
    """Damage only a routed expert's bytes can show: a board that checks every tensor at open (MCUs)
    refuses it there; a mapped image (Linux boards) opens, and the expert is refused when first
    brought in. Both with the loader's tensor checksum code (17)."""
    h = read_header(blob)
    names = [entry(blob, i)[0] for i in range(h.tensor_count)]
    experts = [i for i, n in enumerate(names) if ".experts." in n]
    first, last = experts[0], experts[-1]
    return {
        "flipped_bit_first_expert": (tensor_edited(blob, first, 5, fix_directory=False), 17),
        "flipped_bit_last_expert_padding": (
            tensor_edited(blob, last, -(-entry(blob, last)[4] // ALIGN) * ALIGN - 1, fix_directory=False),
            17,
        ),
        # A routed matrix's directory entry (named and placed from its layer's row of
        # colibri_expert_groups): refused at open, as any other entry.
        "routed_dir_name_changed": (
            patched(blob, h.dir_offset + DIR_ENTRY_BYTES * last + DIR_ENTRY["name"].offset, "<B", ord("L")),
            14,
        ),
        "routed_dir_offset_past_2_32": (dir_field(blob, last, "offset", entry(blob, last)[3] + 2**32), 14),
        "routed_dir_rows_changed": (dir_field(blob, first, "rows", entry(blob, first)[2] + 1), 14),
    }
