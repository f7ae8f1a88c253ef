"""Weight images: what the firmware loads (from a file on Linux, from flash on an MCU). Their
format, field by field, is image_format.py's table.

The model hash is SHA-256 over "colibri-image-v2\\0", the canonical ModelSpec JSON (without its
name), the quantization, the data region and then the directory: it names the weights, and the
firmware generated for them refuses any image with another hash. The image's identity, which the
firmware carries and reports, is the SHA-256 of its header and directory (`identity_sha256`): they
hold the model hash and every tensor's CRC-32, so the identity names every byte without a board
reading the whole image to check it.
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
from ..numerics.quantize import quantize_q4_0, quantize_q4_1, quantize_q8_0


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
        if t.dtype == "q4_1":  # quants, scales, then minimums right after the scales
            qs, d, m = quantize_q4_1(array)
            data[t.offset:t.offset + qs.size] = qs.tobytes()
            scales = d.astype("<f4").tobytes() + m.astype("<f4").tobytes()
            start = t.offset + t.scales_offset
            data[start:start + len(scales)] = scales
        elif t.dtype in ("q8_0", "q4_0"):
            qs, d = quantize_q8_0(array) if t.dtype == "q8_0" else quantize_q4_0(array)
            data[t.offset:t.offset + qs.size] = qs.tobytes()
            scales = d.astype("<f4").tobytes()
            start = t.offset + t.scales_offset
            data[start:start + len(scales)] = scales
        else:
            raw = array.astype("<f4").tobytes()
            data[t.offset:t.offset + len(raw)] = raw
        directory += fmt.pack(fmt.DIR_ENTRY, fmt.DIR_ENTRY_BYTES, name=t.name.encode(),
                              dtype=fmt.DTYPE_CODES[t.dtype], rows=t.rows, cols=t.cols,
                              crc32=zlib.crc32(data[t.offset:t.offset + t.extent]),
                              offset=t.offset, bytes=t.nbytes)
    model_hash = hashlib.sha256(b"colibri-image-v2\0" + spec_identity(plan) + plan.quant.encode()
                                + bytes(data) + bytes(directory)).digest()
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
    out[crc_at:] = struct.pack("<I", zlib.crc32(out[:layout.data_offset])) + fmt.END_MAGIC
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


def read_header(blob) -> ImageHeader:
    """Parse and check the header and trailer of an image (bytes, or a np.memmap of the file): the
    C loader does the full check, each tensor against its CRC-32 included."""
    if len(blob) < fmt.HEADER_BYTES + fmt.TRAILER_BYTES:
        raise ColibriError(f"weight image is {len(blob)} bytes, too short to be one")
    h = fmt.unpack(fmt.HEADER, blob)
    if h["magic"] != fmt.MAGIC:
        raise ColibriError("not a Colibri weight image (bad magic)")
    if h["version"] != fmt.FORMAT_VERSION:
        raise ColibriError(f"weight image format version {h['version']} is not supported "
                           f"(expected {fmt.FORMAT_VERSION}): regenerate it with ./colibri build")
    if h["image_bytes"] != len(blob):
        raise ColibriError(f"weight image says it is {h['image_bytes']} bytes but is {len(blob)}")
    crc_at = len(blob) - fmt.TRAILER_BYTES
    (crc,) = struct.unpack_from("<I", blob, crc_at)
    data_offset = h["data_offset"]
    if bytes(blob[crc_at + 4:]) != fmt.END_MAGIC or not fmt.HEADER_BYTES <= data_offset <= crc_at \
            or crc != zlib.crc32(blob[:data_offset]):
        raise ColibriError("weight image is corrupt (CRC-32 of its header and directory mismatch)")
    return ImageHeader(h["version"], h["tensor_count"], h["dir_offset"], h["data_offset"], h["data_bytes"],
                       h["image_bytes"], h["model_hash"], h["quant"])


def identity_sha256(blob) -> bytes:
    """The image's identity (bytes, or a np.memmap of the file): SHA-256 of its header and
    directory, every byte before the data region, checked as read_header checks them."""
    return hashlib.sha256(bytes(blob[:read_header(blob).data_offset])).digest()


def map_image(path) -> np.memmap:
    """The image file mapped read-only: readers take what they need without copying the file."""
    return np.memmap(path, dtype=np.uint8, mode="r")
