"""A strict reader for GGUF files (versions 2 and 3): header, metadata, tensor directory.

Nothing in the file is trusted. Every count and length is checked against the bytes that are
left before anything is allocated for it, nested arrays are bounded in depth, tensor shapes,
types, offsets and alignment are checked (inside the file, aligned, not overlapping), so a broken
or hostile file ends in one ColibriError line. The 2024 GGUF parser advisories (huge counts,
string lengths past the end, shapes whose product overflows, offsets out of the file) are the
checklist. Tensor data is not read here: `GgufTensorInfo.begin/end` locate it for
tensors.py, which maps it with np.memmap.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ...errors import ColibriError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64, with the terminating zero
MAX_ARRAY_DEPTH = 4  # arrays of arrays: deeper nesting is refused, not recursed into
MAX_ARRAY_ITEMS = 1 << 24  # per array of strings or arrays (numbers are bounded by the file size)
_LENGTH = struct.Struct("<Q")  # a string's length

# GGUF value types: id -> (name, struct code or None for string/array).
VALUE_TYPES = {
    0: ("UINT8", "B"),
    1: ("INT8", "b"),
    2: ("UINT16", "H"),
    3: ("INT16", "h"),
    4: ("UINT32", "I"),
    5: ("INT32", "i"),
    6: ("FLOAT32", "f"),
    7: ("BOOL", "?"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "Q"),
    11: ("INT64", "q"),
    12: ("FLOAT64", "d"),
}
STRING, ARRAY, BOOL = 8, 9, 7
# The fewest bytes one value of a type takes (a string: its length; an array: type and count).
MIN_VALUE_BYTES = {
    t: (struct.calcsize("<" + code) if code else (8 if t == STRING else 12)) for t, (_, code) in VALUE_TYPES.items()
}
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dimension, type, offset


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    ggml_type: str  # "F32", "Q4_1", ... (the gguf package's GGMLQuantizationType names)
    shape: tuple[int, ...]  # NumPy order: GGUF's ne reversed (rows, cols), the last axis contiguous
    begin: int  # first byte of the data, from the start of the file
    end: int

    @property
    def n_values(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GgufFile:
    path: Path
    version: int
    metadata: dict  # key -> int | float | bool | str | np.ndarray (numbers) | list (strings, arrays)
    value_types: dict[str, str]  # key -> GGUF value type name ("UINT32", "ARRAY[STRING]", ...)
    tensors: dict[str, GgufTensorInfo]  # in the file's order
    alignment: int
    data_start: int
    size: int


class _Cursor:
    """Reads little-endian values from the mapped file, checking every length against the end."""

    def __init__(self, buf, size: int, where: str):
        self.buf, self.size, self.where, self.pos = buf, size, where, 0

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise ColibriError(
                f"{self.where}: truncated in {what} (needs {n} bytes at byte {self.pos}, the file has {self.size})"
            )

    def unpack(self, code: str, what: str):
        n = struct.calcsize("<" + code)
        self.need(n, what)
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("Q", what)
        if n > self.left():
            raise ColibriError(
                f"{self.where}: {what}: string length {n} runs past the end of the file "
                f"(byte {self.pos} of {self.size})"
            )
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ColibriError(f"{self.where}: {what} is not UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype not in VALUE_TYPES:
            raise ColibriError(f"{self.where}: {what}: unknown value type {vtype}")
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            return self.array(what, depth + 1)
        value = self.unpack(VALUE_TYPES[vtype][1], what)
        if vtype == BOOL:
            self._check_bool(self.buf[self.pos - 1], what)
        return value

    def _check_bool(self, byte: int, what: str) -> None:
        if byte > 1:
            raise ColibriError(f"{self.where}: {what}: boolean byte {byte} is neither 0 nor 1")

    def array(self, what: str, depth: int):
        if depth > MAX_ARRAY_DEPTH:
            raise ColibriError(f"{self.where}: {what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
        etype = self.unpack("I", what + " array type")
        if etype not in VALUE_TYPES:
            raise ColibriError(f"{self.where}: {what}: unknown array element type {etype}")
        count = self.unpack("Q", what + " array length")
        if count * MIN_VALUE_BYTES[etype] > self.left():
            raise ColibriError(
                f"{self.where}: {what}: array of {count} {VALUE_TYPES[etype][0]} values runs past "
                f"the end of the file ({self.left()} bytes left)"
            )
        code = VALUE_TYPES[etype][1]
        if code is not None:  # numbers (and booleans): one NumPy array, no Python object per item
            n = count * MIN_VALUE_BYTES[etype]
            items = np.frombuffer(self.buf, dtype=np.dtype("<" + code), count=count, offset=self.pos).copy()
            if etype == BOOL and count:
                self._check_bool(int(np.frombuffer(self.buf, np.uint8, count, self.pos).max()), what)
            self.pos += n
            return items
        if count > MAX_ARRAY_ITEMS:
            raise ColibriError(f"{self.where}: {what}: array of {count} items exceeds {MAX_ARRAY_ITEMS}")
        if etype == STRING:
            return self.strings(what, count)
        return [self.value(etype, f"{what}[{i}]", depth) for i in range(count)]

    def strings(self, what: str, count: int) -> list[str]:
        """An array's strings, with string()'s checks and messages but no call and no formatted
        name per item until one is wrong: a vocabulary is hundreds of thousands of them (2 million
        merges took 6.7 s to read that way, most of it naming each item)."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack_length = _LENGTH.unpack_from
        items: list[str] = []
        append = items.append
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{what}[{i}]")
            (n,) = unpack_length(buf, pos)
            pos += 8
            if n > size - pos:
                raise ColibriError(
                    f"{self.where}: {what}[{i}]: string length {n} runs past the end of the file (byte {pos} of {size})"
                )
            try:
                append(str(buf[pos : pos + n], "utf-8"))
            except UnicodeDecodeError:
                raise ColibriError(f"{self.where}: {what}[{i}] is not UTF-8") from None
            pos += n
        self.pos = pos
        return items


def _type_name(vtype: int, value) -> str:
    name = VALUE_TYPES[vtype][0]
    if vtype != ARRAY:
        return name
    if isinstance(value, np.ndarray):
        inner = next(
            VALUE_TYPES[t][0] for t, (_, c) in VALUE_TYPES.items() if c is not None and np.dtype("<" + c) == value.dtype
        )
    elif value and isinstance(value[0], str):
        inner = "STRING"
    elif value:
        inner = "ARRAY"
    else:
        inner = "STRING"  # an empty array of strings or arrays: the element type is not kept
    return f"ARRAY[{inner}]"


def read_gguf(path: Path | str) -> GgufFile:
    """Parse and validate a GGUF file's header, metadata and tensor directory."""
    path = Path(path)
    where = path.name
    try:
        size = path.stat().st_size
        if size < 4 + 4 + 8 + 8:
            raise ColibriError(f"{where}: not a GGUF file (truncated header: {size} bytes)")
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, size)
    except OSError as e:
        raise ColibriError(f"{where}: cannot read: {e.strerror}") from None


def _parse(path: Path, buf, size: int) -> GgufFile:
    where = path.name
    c = _Cursor(buf, size, where)
    if bytes(buf[:4]) != MAGIC:
        raise ColibriError(f"{where}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    c.pos = 4
    version = c.unpack("I", "the header")
    if version not in VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in VERSIONS:
            raise ColibriError(f"{where}: big-endian GGUF files are not supported")
        raise ColibriError(f"{where}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = c.unpack("Q", "the header")
    n_kv = c.unpack("Q", "the header")
    if n_kv * MIN_KV_BYTES > c.left():
        raise ColibriError(f"{where}: metadata count {n_kv} cannot fit in the file ({size} bytes)")
    if n_tensors * MIN_TENSOR_INFO_BYTES > c.left():
        raise ColibriError(f"{where}: tensor count {n_tensors} cannot fit in the file ({size} bytes)")

    metadata: dict = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        if key in metadata:
            raise ColibriError(f"{where}: duplicate metadata key {key!r}")
        vtype = c.unpack("I", f"metadata {key!r}")
        metadata[key] = c.value(vtype, f"metadata {key!r}")
        types[key] = _type_name(vtype, metadata[key])

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and types["general.alignment"] != "UINT32":
        raise ColibriError(f"{where}: general.alignment must be a UINT32, not {types['general.alignment']}")
    if alignment == 0 or alignment & (alignment - 1):
        raise ColibriError(f"{where}: general.alignment {alignment} is not a power of two")

    infos = []
    names = set()
    for i in range(n_tensors):
        name = c.string(f"tensor info {i} name")
        if len(name.encode()) > MAX_NAME_BYTES:
            raise ColibriError(f"{where}: tensor name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
        if name in names:
            raise ColibriError(f"{where}: duplicate tensor name {name!r}")
        names.add(name)
        n_dims = c.unpack("I", f"tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ColibriError(f"{where}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = [c.unpack("Q", f"tensor {name!r} shape") for _ in range(n_dims)]
        type_id = c.unpack("I", f"tensor {name!r}")
        offset = c.unpack("Q", f"tensor {name!r}")
        infos.append((name, ne, type_id, offset))

    data_start = -(-c.pos // alignment) * alignment
    tensors: dict[str, GgufTensorInfo] = {}
    for name, ne, type_id, offset in infos:
        tensors[name] = _tensor_info(where, name, ne, type_id, offset, alignment, data_start, size)
    previous = None
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if previous is not None and info.begin < previous.end:
            raise ColibriError(f"{where}: tensor {info.name!r} overlaps tensor {previous.name!r}")
        previous = info
    return GgufFile(path, version, metadata, types, tensors, alignment, data_start, size)


def _tensor_info(where, name, ne, type_id, offset, alignment, data_start, size) -> GgufTensorInfo:
    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise ColibriError(f"{where}: tensor {name!r} has unknown tensor type {type_id}") from None
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if any(d >= 2**63 for d in ne):
        raise ColibriError(f"{where}: tensor {name!r} has a dimension of 2^63 or more ({ne})")
    if ne[0] % block:
        raise ColibriError(
            f"{where}: tensor {name!r} ({ggml_type.name}) has rows of {ne[0]} values, not whole blocks of {block}"
        )
    count = 1
    for d in ne:
        count *= d  # exact (Python integers): an overflowing product is caught by the size check
    nbytes = count // block * block_bytes
    if offset % alignment:
        raise ColibriError(f"{where}: tensor {name!r} data offset {offset} is not aligned to {alignment} bytes")
    begin = data_start + offset
    if begin + nbytes > size:
        raise ColibriError(
            f"{where}: tensor {name!r} data ({nbytes} bytes at byte {begin}, shape {ne}) "
            f"runs past the end of the file ({size} bytes)"
        )
    return GgufTensorInfo(name, ggml_type.name, tuple(reversed(ne)), begin, begin + nbytes)
