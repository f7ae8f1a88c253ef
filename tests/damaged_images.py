"""A table of damaged weight images, shared by the loader tests on every build of the loader."""

import struct
import zlib

from generator.image import read_header


def fix_crc(blob: bytearray) -> bytes:
    struct.pack_into("<I", blob, len(blob) - 8, zlib.crc32(blob[:-8]))
    return bytes(blob)


def patched(blob, offset, fmt, value, crc=True):
    b = bytearray(blob)
    struct.pack_into(fmt, b, offset, value)
    return fix_crc(b) if crc else bytes(b)


def cases(blob, other_model, f32_image):
    size = len(blob)
    flipped = bytearray(blob)
    flipped[size // 2] ^= 0x10
    dir_entry = 128  # first directory entry
    return {
        "truncated_header": (blob[:100], 2),
        "truncated_body": (blob[:size // 2], 2),
        "bad_magic": (b"XOLIBRIW" + blob[8:], 3),
        "version_2": (patched(blob, 8, "<I", 2), 4),
        "header_size": (patched(blob, 12, "<I", 64), 5),
        "dir_entry_size": (patched(blob, 20, "<I", 95), 5),
        "length_field_smaller": (patched(blob, 48, "<Q", size - 64), 6),
        "trailing_bytes": (blob + bytes(64), 6),
        "flipped_data_bit": (bytes(flipped), 7),
        "flipped_bit_crc_kept": (patched(blob, size - 100, "<B", blob[size - 100] ^ 1, crc=False), 7),
        "tensor_count_zero": (patched(blob, 16, "<I", 0), 8),
        "tensor_count_max": (patched(blob, 16, "<I", 2**32 - 1), 8),
        "dir_offset_past_end": (patched(blob, 24, "<Q", size), 9),
        "dir_offset_overflow": (patched(blob, 24, "<Q", 2**64 - 8), 15),
        "data_offset_overflow": (patched(blob, 32, "<Q", 2**64 - 64), 15),
        "data_past_end": (patched(blob, 40, "<Q", size), 10),
        "data_misaligned": (patched(patched(blob, 32, "<Q", read_header(blob).data_offset + 4), 40, "<Q",
                                    read_header(blob).data_bytes - 4), 11),
        "quant_field": (patched(blob, 88, "<I", 0), 12),
        "f32_image_of_same_model": (f32_image, 12),
        "other_model": (other_model, 13),
        "model_hash_edited": (patched(blob, 56, "<B", blob[56] ^ 0xFF), 13),
        # Well formed, claims the right model hash, CRC recomputed: only the image's SHA-256 tells.
        "data_edited_crc_fixed": (patched(blob, read_header(blob).data_offset + 1, "<B",
                                          blob[read_header(blob).data_offset + 1] ^ 1), 16),
        "dir_name_changed": (patched(blob, dir_entry, "<B", ord("X")), 14),
        "dir_dtype_unknown": (patched(blob, dir_entry + 64, "<I", 9), 14),
        "dir_rows_changed": (patched(blob, dir_entry + 68, "<I", 1), 14),
        "dir_offset_changed": (patched(blob, dir_entry + 80, "<Q", 64), 14),
        "dir_size_changed": (patched(blob, dir_entry + 88, "<Q", 2**63), 14),
        # 32-bit traps: values whose low 32 bits are right (a 32-bit size_t would accept them).
        "dir_size_overflow_32": (patched(blob, dir_entry + 88, "<Q", entry(blob, 0)[4] + 2**32), 14),
        "data_bytes_overflow_32": (patched(blob, 40, "<Q", read_header(blob).data_bytes + 2**32), 10),
        "dir_offset_overlaps_previous": (patched(blob, dir_entry + 96 + 80, "<Q", entry(blob, 0)[3]), 14),
        "dir_offset_out_of_range": (patched(blob, dir_entry + 80, "<Q", read_header(blob).data_bytes), 14),
        # A flipped bit in each region, CRC left as it was.
        "flipped_header_bit": (flip(blob, 60), 7),
        "flipped_directory_bit": (flip(blob, dir_entry + 70), 7),
        "flipped_crc_bit": (flip(blob, size - 8), 7),
        "end_magic_damaged": (flip(blob, size - 2), 2),
    }




def flip(blob: bytes, offset: int, bit: int = 2) -> bytes:
    b = bytearray(blob)
    b[offset] ^= 1 << bit
    return bytes(b)


def entry(blob: bytes, index: int) -> tuple:
    """(name, dtype, rows, offset, bytes) of directory entry `index`."""
    start = read_header(blob).dir_offset + 96 * index
    name = blob[start:start + 64].rstrip(b"\0").decode()
    dtype, rows, cols, _ = struct.unpack_from("<IIII", blob, start + 64)
    offset, nbytes = struct.unpack_from("<QQ", blob, start + 80)
    return name, dtype, rows, offset, nbytes
