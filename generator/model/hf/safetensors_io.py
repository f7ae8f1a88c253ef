"""A strict reader for the safetensors format that hands tensors to NumPy as float32.

Written here rather than taken from the `safetensors` package because checkpoints are usually
bfloat16 (which NumPy cannot hold) and because every malformed file must end in one clear line.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ...files import check_json_nesting, optional_file
from ..file_reads import check_weights, read_exactly

MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U8": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # weights as numbers; U8 holds packed blocks (MXFP4)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset of the first byte, from the start of the file
    end: int


def _reject_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name):
    raise ValueError(f"{name} is not allowed")


def strict_json(text: str):
    """json.loads that refuses duplicate keys and NaN/Infinity (raises ValueError)."""
    return json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate the header of one safetensors file."""
    where = path.name
    optional_file(path, where)  # a named pipe or a device is refused, not read
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ColibriError(f"{where}: not a safetensors file (shorter than its 8-byte header length)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len < 2:
                raise ColibriError(f"{where}: safetensors header length {header_len} is too small")
            if header_len > MAX_HEADER_BYTES:
                raise ColibriError(f"{where}: safetensors header length {header_len} exceeds {MAX_HEADER_BYTES} bytes")
            if 8 + header_len > size:
                raise ColibriError(
                    f"{where}: safetensors header length {header_len} runs past the end of the file ({size} bytes)"
                )
            raw = f.read(header_len)
    except OSError as e:
        raise ColibriError(f"{where}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ColibriError(f"{where}: safetensors header is not UTF-8") from None
    check_json_nesting(raw, f"{where}: safetensors header")
    try:
        header = strict_json(text)
    except ValueError as e:
        raise ColibriError(f"{where}: safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ColibriError(f"{where}: safetensors header is not a JSON object")

    data_start = 8 + header_len
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ColibriError(f"{where}: tensor {name!r}: entry must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise ColibriError(
                f"{where}: tensor {name!r}: unsupported dtype {dtype!r} (supported: {', '.join(DTYPE_BYTES)})"
            )
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ColibriError(f"{where}: tensor {name!r}: shape must be a list of non-negative integers")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise ColibriError(f"{where}: tensor {name!r}: data_offsets must be two integers")
        begin, end = offsets
        if begin < 0 or end < begin:
            raise ColibriError(f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] end before they begin")
        count = 1
        for d in shape:
            count *= d  # Python integers cannot overflow; the size check below catches absurd shapes
        if count * DTYPE_BYTES[dtype] != end - begin:
            raise ColibriError(f"{where}: tensor {name!r}: {end - begin} bytes do not hold shape {shape} of {dtype}")
        if end > data_len:
            raise ColibriError(
                f"{where}: tensor {name!r}: data ends at byte {end}, past the {data_len} data bytes in the file"
            )
        tensors[name] = TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)

    # The data region must be covered exactly: no overlaps, no holes, nothing trailing.
    cursor = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        rel = info.begin - data_start
        if rel < cursor:
            raise ColibriError(f"{where}: tensor {info.name!r} overlaps the tensor before it")
        if rel > cursor:
            raise ColibriError(f"{where}: {rel - cursor} unused bytes before tensor {info.name!r}")
        cursor = info.end - data_start
    if cursor != data_len:
        raise ColibriError(f"{where}: {data_len - cursor} trailing bytes after the last tensor")
    return tensors


def rows_cols(info: TensorInfo) -> tuple[int, int]:
    """A tensor as a matrix: its last dimension is the row (a vector or scalar is one row)."""
    rows = 1
    for d in info.shape[:-1]:
        rows *= d
    return rows, (info.shape[-1] if info.shape else 1)


def read_rows(path: Path | str, info: TensorInfo, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of one tensor (a vector is one row) as float32, converted exactly (every
    supported dtype but F64 widens). Only those rows are read: the file is mapped for them alone and
    unmapped before returning, so reading a model tensor by tensor holds one piece at a time."""
    path = Path(path)
    if info.dtype not in FLOAT_DTYPES:
        raise ColibriError(f"{path.name}: tensor {info.name!r} holds bytes ({info.dtype}), not weights")
    rows, cols = rows_cols(info)
    if not 0 <= start <= stop <= rows:
        raise ValueError(f"rows [{start}, {stop}) of a tensor with {rows} rows")
    width = DTYPE_BYTES[info.dtype]
    begin = info.begin + start * cols * width
    count = (stop - start) * cols
    if count == 0:
        return np.zeros((stop - start, cols), dtype=np.float32)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if begin + count * width > size:
                raise ColibriError(
                    f"{path.name}: tensor {info.name!r}: the file ends at byte {size}, before its data "
                    f"(truncated or rewritten while it was being read?)"
                )
            raw = np.memmap(
                f,
                dtype={"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}[info.dtype],
                mode="r",
                offset=begin,
                shape=(count,),
            )
            if info.dtype == "BF16":
                arr = np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
            else:
                arr = raw.astype(np.float32)
            del raw  # unmapped here: the converted copy is all that stays
    except OSError as e:
        raise ColibriError(f"{path.name}: cannot read tensor {info.name!r}: {e.strerror or e}") from None
    arr = arr.reshape(stop - start, cols)
    check_weights(path.name, info.name, arr)
    return arr


def read_bytes(path: Path | str, info: TensorInfo, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a U8 tensor (packed blocks) as uint8 (rows, cols), read with one pread."""
    path = Path(path)
    rows, cols = rows_cols(info)
    if info.dtype != "U8" or not 0 <= start <= stop <= rows:
        raise ValueError(f"rows [{start}, {stop}) of a {info.dtype} tensor with {rows} rows")
    out = read_exactly(
        path,
        info.begin + start * cols,
        (stop - start) * cols,
        f"{path.name}: tensor {info.name!r}: the file ends before its data "
        f"(truncated or rewritten while it was being read?)",
        f"{path.name}: cannot read tensor {info.name!r}",
    )
    return out.reshape(stop - start, cols)


def load_f32(path: Path, info: TensorInfo) -> np.ndarray:
    """One whole tensor as float32, in its own shape."""
    return read_rows(path, info, 0, rows_cols(info)[0]).reshape(info.shape)
