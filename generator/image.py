"""Weight image format v1: what the firmware loads (from a file on Linux, from flash on an MCU).

Layout (little-endian; offsets from the start of the image):
  header (128 bytes)
     0  magic "COLIBRIW"              8  u32 format version (1)     12 u32 header bytes (128)
    16  u32 tensor count             20  u32 directory entry bytes (96)
    24  u64 directory offset         32  u64 data offset (multiple of 64)
    40  u64 data bytes               48  u64 image bytes (everything, trailer included)
    56  u8[32] model hash            88  u32 quantization (0 f32, 1 q8_0, 2 q4_0)
    92  zeros to 128
  directory: one 96-byte entry per tensor, in plan order
     0  char[64] canonical name, NUL padded   64 u32 dtype (0 f32, 1 q8_0, 2 q4_0)
    68  u32 rows   72 u32 cols   76 u32 zero   80 u64 offset (from data offset)   88 u64 bytes
  data: each tensor at a 64-byte aligned offset; a q8_0 tensor is rows*cols int8 quants, zero
        padding to 64, then rows*cols/32 float32 scales; a q4_0 tensor is the same with rows*cols/2
        bytes of packed 4-bit quants (generator/quantize.py). Padding is zero.
  trailer: u32 CRC-32 (IEEE) of every byte before it, then "CEND".

The model hash is SHA-256 over "colibri-image-v1\\0", the canonical ModelSpec JSON (without its
name), the quantization, the directory and the data: it names the weights, and the firmware
generated for them refuses any image with another hash.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import asdict, dataclass

import json
import numpy as np

from .errors import ColibriError
from .plan import (DTYPE_CODES, IMAGE_DIR_ENTRY_BYTES, IMAGE_FORMAT_VERSION, IMAGE_HEADER_BYTES,
                   IMAGE_MAGIC, IMAGE_NAME_BYTES, IMAGE_TRAILER_BYTES, Plan)
from .quantize import quantize_q4_0, quantize_q8_0

END_MAGIC = b"CEND"
HEADER_STRUCT = struct.Struct("<8sIIIIQQQQ32sI")


@dataclass(frozen=True)
class WeightImage:
    data: bytes
    model_hash: bytes


def spec_identity(plan: Plan) -> bytes:
    spec = asdict(plan.spec)
    spec.pop("name")
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()


def build_image(plan: Plan, tensors: dict[str, np.ndarray], progress=None) -> WeightImage:
    """Quantize (where the plan says q8_0) and lay out every tensor; returns the image bytes."""
    layout = plan.image
    data = bytearray(layout.data_bytes)
    directory = bytearray()
    for i, t in enumerate(plan.tensors):
        if progress:
            progress(i + 1, len(plan.tensors), t.name)
        array = np.asarray(tensors[t.name], dtype=np.float32).reshape(t.rows, t.cols)
        if t.dtype in ("q8_0", "q4_0"):
            qs, d = quantize_q8_0(array) if t.dtype == "q8_0" else quantize_q4_0(array)
            data[t.offset:t.offset + qs.size] = qs.tobytes()
            scales = d.astype("<f4").tobytes()
            start = t.offset + t.scales_offset
            data[start:start + len(scales)] = scales
        else:
            raw = array.astype("<f4").tobytes()
            data[t.offset:t.offset + len(raw)] = raw
        directory += struct.pack(f"<{IMAGE_NAME_BYTES}sIIIIQQ", t.name.encode(), DTYPE_CODES[t.dtype],
                                 t.rows, t.cols, 0, t.offset, t.nbytes)
    model_hash = hashlib.sha256(b"colibri-image-v1\0" + spec_identity(plan) + plan.quant.encode()
                                + bytes(directory) + bytes(data)).digest()
    header = HEADER_STRUCT.pack(IMAGE_MAGIC, IMAGE_FORMAT_VERSION, IMAGE_HEADER_BYTES, len(plan.tensors),
                                IMAGE_DIR_ENTRY_BYTES, layout.dir_offset, layout.data_offset,
                                layout.data_bytes, layout.image_bytes, model_hash,
                                DTYPE_CODES[plan.quant])
    out = bytearray(layout.image_bytes)
    out[:len(header)] = header
    out[layout.dir_offset:layout.dir_offset + len(directory)] = directory
    out[layout.data_offset:layout.data_offset + len(data)] = data
    crc_at = layout.image_bytes - IMAGE_TRAILER_BYTES
    out[crc_at:] = struct.pack("<I", zlib.crc32(out[:crc_at])) + END_MAGIC
    return WeightImage(bytes(out), model_hash)


@dataclass(frozen=True)
class ImageHeader:
    version: int
    tensor_count: int
    dir_offset: int
    data_offset: int
    data_bytes: int
    image_bytes: int
    model_hash: bytes
    quant: int


def read_header(blob: bytes) -> ImageHeader:
    """Parse and check the header and trailer of an image (the C loader does the full check)."""
    if len(blob) < IMAGE_HEADER_BYTES + IMAGE_TRAILER_BYTES:
        raise ColibriError(f"weight image is {len(blob)} bytes, too short to be one")
    (magic, version, header_bytes, count, entry_bytes, dir_offset, data_offset, data_bytes,
     image_bytes, model_hash, quant) = HEADER_STRUCT.unpack_from(blob)
    if magic != IMAGE_MAGIC:
        raise ColibriError("not a Colibri weight image (bad magic)")
    if version != IMAGE_FORMAT_VERSION:
        raise ColibriError(f"weight image format version {version} is not supported (expected {IMAGE_FORMAT_VERSION})")
    if image_bytes != len(blob):
        raise ColibriError(f"weight image says it is {image_bytes} bytes but is {len(blob)}")
    crc_at = len(blob) - IMAGE_TRAILER_BYTES
    (crc,) = struct.unpack_from("<I", blob, crc_at)
    if blob[crc_at + 4:] != END_MAGIC or crc != zlib.crc32(blob[:crc_at]):
        raise ColibriError("weight image is corrupt (CRC-32 mismatch)")
    return ImageHeader(version, count, dir_offset, data_offset, data_bytes, image_bytes, model_hash, quant)
