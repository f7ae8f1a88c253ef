"""Weight images: what the firmware loads (from a file on Linux, from flash on an MCU). Their
format, field by field, is image_format.py's table.

The model hash is SHA-256 over "colibri-image-v1\\0", the canonical ModelSpec JSON (without its
name), the quantization, the directory and the data: it names the weights, and the firmware
generated for them refuses any image with another hash.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from . import image_format as fmt
from ..errors import ColibriError
from .plan import Plan
from ..numerics.quantize import quantize_q4_0, quantize_q8_0


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
        directory += fmt.pack(fmt.DIR_ENTRY, fmt.DIR_ENTRY_BYTES, name=t.name.encode(),
                              dtype=fmt.DTYPE_CODES[t.dtype], rows=t.rows, cols=t.cols, reserved=0,
                              offset=t.offset, bytes=t.nbytes)
    model_hash = hashlib.sha256(b"colibri-image-v1\0" + spec_identity(plan) + plan.quant.encode()
                                + bytes(directory) + bytes(data)).digest()
    header = fmt.pack(fmt.HEADER, fmt.HEADER_BYTES, magic=fmt.MAGIC, version=fmt.FORMAT_VERSION,
                      header_bytes=fmt.HEADER_BYTES, tensor_count=len(plan.tensors),
                      dir_entry_bytes=fmt.DIR_ENTRY_BYTES, dir_offset=layout.dir_offset,
                      data_offset=layout.data_offset, data_bytes=layout.data_bytes,
                      image_bytes=layout.image_bytes, model_hash=model_hash, quant=fmt.DTYPE_CODES[plan.quant])
    out = bytearray(layout.image_bytes)
    out[:len(header)] = header
    out[layout.dir_offset:layout.dir_offset + len(directory)] = directory
    out[layout.data_offset:layout.data_offset + len(data)] = data
    crc_at = layout.image_bytes - fmt.TRAILER_BYTES
    out[crc_at:] = struct.pack("<I", zlib.crc32(out[:crc_at])) + fmt.END_MAGIC
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
    if len(blob) < fmt.HEADER_BYTES + fmt.TRAILER_BYTES:
        raise ColibriError(f"weight image is {len(blob)} bytes, too short to be one")
    h = fmt.unpack(fmt.HEADER, blob)
    if h["magic"] != fmt.MAGIC:
        raise ColibriError("not a Colibri weight image (bad magic)")
    if h["version"] != fmt.FORMAT_VERSION:
        raise ColibriError(f"weight image format version {h['version']} is not supported "
                           f"(expected {fmt.FORMAT_VERSION})")
    if h["image_bytes"] != len(blob):
        raise ColibriError(f"weight image says it is {h['image_bytes']} bytes but is {len(blob)}")
    crc_at = len(blob) - fmt.TRAILER_BYTES
    (crc,) = struct.unpack_from("<I", blob, crc_at)
    if blob[crc_at + 4:] != fmt.END_MAGIC or crc != zlib.crc32(blob[:crc_at]):
        raise ColibriError("weight image is corrupt (CRC-32 mismatch)")
    return ImageHeader(h["version"], h["tensor_count"], h["dir_offset"], h["data_offset"], h["data_bytes"],
                       h["image_bytes"], h["model_hash"], h["quant"])
