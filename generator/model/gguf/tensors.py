"""GGUF tensor data -> float32 with llama.cpp's dequantization formulas, the exact block
fields of Q8_0, Q4_0, Q4_1 and Q4_K tensors, and the blocks of every type kept verbatim.

Data is mapped with np.memmap (never read whole). Every formula is ggml's `dequantize_row_*`,
evaluated in float32 in the same order (one rounding per C operation, no fused multiply-add):
  Q8_0  y = d * q                    q int8
  Q4_0  y = d * (q - 8)              q the low nibbles (values 0..15), then the high nibbles (16..31)
  Q4_1  y = d * q + m
  Q5_0  y = d * (q - 16)             q five bits: a nibble and one bit of qh
  Q5_1  y = d * q + m
  Q4_K  y = (d * sc) * q - (dmin * m) per sub-block of 32, 6-bit sc and m packed in 12 bytes
  Q5_K  as Q4_K with a fifth bit from qh
  Q6_K  y = (d * sc) * (q - 32)      8-bit signed sc per 16 values
Other block types the gguf package can dequantize (Q2_K, Q3_K, the IQ types, ...) go through
gguf.quants.dequantize.

QuantBlocks keeps a tensor of an EXACT_TYPES type exactly: its blocks' bytes as the file holds them
(`block_bytes`, what the image stores of the types kept verbatim: numerics/blocks.py), and for the
FIELD_TYPES read as fields (`fields`, for copying them into an image) or as blocks of 32 values:
value = scale * q (+ offset), each product and sum rounded to float32. Scales and offsets are
exact in float32: an fp16 number, or for Q4_K an fp16 number times a 6-bit integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ...errors import ColibriError
from ..file_reads import check_weights, read_exactly
from .file import GgufFile, GgufTensorInfo

BLOCK = 32
# Block types whose blocks are kept as the file holds them (the image's q8_0, q4_0 and q4_1, or the
# blocks verbatim: numerics/blocks.py's types); FIELD_TYPES are also read as fields (_fields).
FIELD_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K")
EXACT_TYPES = FIELD_TYPES + ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4")
PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


# ggml's block_q8_0, block_q4_0 and block_q4_1 as records: a binary16 scale d, Q4_1's binary16
# minimum m, then the quants (Q8_0 32 int8; Q4_0 and Q4_1 16 bytes, quant j in the low nibble of
# byte j and quant j + 16 in its high nibble). Copying one field of every record is one pass.
KEPT_RECORDS = {
    "Q8_0": np.dtype([("d", "<f2"), ("q", "V32")]),
    "Q4_0": np.dtype([("d", "<f2"), ("q", "V16")]),
    "Q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("q", "V16")]),
}


@dataclass(frozen=True)
class QuantBlocks:
    """One tensor's quantized blocks of 32 along its last axis, kept exactly: the file's bytes."""

    ggml_type: str  # "Q8_0" | "Q4_0" | "Q4_1" | "Q4_K"
    raw: np.ndarray  # uint8, shape[:-1] + (file blocks per row, block bytes); a Q4_K block is 256 values

    @property
    def shape(self) -> tuple[int, ...]:
        block, _ = GGML_QUANT_SIZES[GGMLQuantizationType[self.ggml_type]]
        return self.raw.shape[:-2] + (self.raw.shape[-2] * block,)

    @cached_property
    def _decoded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        q, scale, offset = _fields(self.ggml_type, self.raw.reshape(-1, self.raw.shape[-1]))
        blocks_shape = self.shape[:-1] + (self.shape[-1] // BLOCK,)
        return (
            q.reshape(self.shape),
            scale.reshape(blocks_shape),
            None if offset is None else offset.reshape(blocks_shape),
        )

    @property
    def quants(self) -> np.ndarray:
        """int8, the tensor's shape: Q8_0 -128..127, Q4_0 -8..7, Q4_1 and Q4_K 0..15."""
        return self._decoded[0]

    @property
    def scales(self) -> np.ndarray:
        """float32, shape[:-1] + (shape[-1] // 32,)."""
        return self._decoded[1]

    @property
    def offsets(self) -> np.ndarray | None:
        """float32 like scales, added after the product (Q4_1: m, Q4_K: -dmin*m)."""
        return self._decoded[2]

    def fields(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A Q8_0/Q4_0/Q4_1 tensor's fields as the file holds them, over its blocks in order: the
        quant bytes (uint8), the binary16 scales and the binary16 minimums (Q4_1) or None."""
        records = np.ascontiguousarray(self.raw).reshape(-1).view(KEPT_RECORDS[self.ggml_type])
        quants = records["q"].copy().view(np.uint8)
        minimums = records["m"].copy() if self.ggml_type == "Q4_1" else None
        return quants, records["d"].copy(), minimums

    def dequantize(self) -> np.ndarray:
        q = self.quants.reshape(*self.scales.shape, BLOCK).astype(np.float32)
        y = self.scales[..., None] * q
        if self.offsets is not None:
            y = y + self.offsets[..., None]
        return y.reshape(self.shape)

    def block_bytes(self) -> np.ndarray:
        """The blocks' bytes as the file holds them, row after row (uint8, one dimension)."""
        return np.ascontiguousarray(self.raw).reshape(-1)

    def take(self, index) -> "QuantBlocks":
        """The blocks of rows (or experts) `index` along the first axis."""
        return QuantBlocks(self.ggml_type, self.raw[index])


def _raw_rows(path: Path, info: GgufTensorInfo, rows: np.ndarray | None = None) -> np.ndarray:
    """The bytes of the tensor's rows (along its last axis; all of them when `rows` is None), as
    (blocks, block_bytes) uint8: consecutive rows read with one pread, others copied from the
    mapped file, so only the rows asked for are read."""
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[info.ggml_type]]
    n_blocks = info.n_values // block
    if n_blocks == 0:
        return np.zeros((0, block_bytes), np.uint8)
    per_row = info.shape[-1] // block
    if rows is not None and _consecutive(rows):
        first = int(rows[0]) if len(rows) else 0
        raw = _read(path, info, info.begin + first * per_row * block_bytes, len(rows) * per_row * block_bytes)
        return raw.reshape(-1, block_bytes)
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=info.begin, shape=(n_blocks * block_bytes,))
    except (OSError, ValueError) as e:
        raise ColibriError(f"{Path(path).name}: cannot map tensor {info.name!r}: {e}") from None
    if rows is None:
        return raw.reshape(n_blocks, block_bytes)
    return raw.reshape(-1, per_row, block_bytes)[rows].reshape(-1, block_bytes)


def _consecutive(rows: np.ndarray) -> bool:
    return len(rows) == 0 or (rows[-1] - rows[0] == len(rows) - 1 and bool(np.all(np.diff(rows) == 1)))


def _read(path: Path, info: GgufTensorInfo, start: int, nbytes: int) -> np.ndarray:
    """`nbytes` of the file from `start` into a new array (file_reads.read_exactly)."""
    where = Path(path).name
    return read_exactly(
        path,
        start,
        nbytes,
        f"{where}: tensor {info.name!r} runs past the end of the file (truncated while it was read?)",
        f"{where}: cannot read tensor {info.name!r}",
    )


def _f16(raw: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(raw[:, start : start + 2]).view("<f2")[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block -> 32 values: the low nibbles first, then the high ones (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for the 8 sub-blocks: 12 bytes -> 6-bit (sc, m) each."""
    s = scales.astype(np.uint8)
    sc = np.empty((len(s), 8), np.uint8)
    m = np.empty((len(s), 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    m[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    m[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, m


def _fields(ggml_type: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(quants per value, scale per 32, offset per 32 or None), flattened over blocks of 32."""
    n = len(raw)
    if ggml_type == "Q8_0":
        return raw[:, 2:34].view(np.int8).reshape(-1), _f16(raw, 0), None
    if ggml_type == "Q4_0":
        return (_nibbles(raw[:, 2:18]).astype(np.int8) - 8).reshape(-1), _f16(raw, 0), None
    if ggml_type == "Q4_1":
        return _nibbles(raw[:, 4:20]).astype(np.int8).reshape(-1), _f16(raw, 0), _f16(raw, 2)
    if ggml_type == "Q4_K":
        d, dmin = _f16(raw, 0), _f16(raw, 2)
        sc, m = _k_scales(raw[:, 4:16])
        qs = raw[:, 16:144].reshape(n, 4, 32)  # 4 pairs of sub-blocks: low nibbles, then high
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.int8)
        scale = d[:, None] * sc.astype(np.float32)  # exact: 11-bit mantissa times 6 bits
        offset = -(dmin[:, None] * m.astype(np.float32))
        return q.reshape(-1), scale.reshape(-1), offset.reshape(-1)
    raise AssertionError(ggml_type)


def tensor_blocks(gguf: GgufFile, info: GgufTensorInfo) -> QuantBlocks | None:
    """The exact blocks of a Q8_0/Q4_0/Q4_1/Q4_K tensor (None for other types)."""
    if info.ggml_type not in EXACT_TYPES:
        return None
    return QuantBlocks(info.ggml_type, _per_row(_raw_rows(gguf.path, info), info.shape[:-1]))


def rows_blocks(path: Path, info: GgufTensorInfo, rows: np.ndarray) -> QuantBlocks:
    """The exact blocks of rows `rows` (indices along the tensor's last axis' rows) of a
    Q8_0/Q4_0/Q4_1/Q4_K tensor: quants (len(rows), cols), scales and offsets (len(rows), cols / 32)."""
    return QuantBlocks(info.ggml_type, _per_row(_raw_rows(path, info, rows), (len(rows),)))


def _per_row(raw: np.ndarray, rows_shape: tuple[int, ...]) -> np.ndarray:
    """(blocks, block bytes) -> rows_shape + (blocks per row, block bytes)."""
    return raw.reshape(*rows_shape, -1, raw.shape[-1])


@cache
def readable(ggml_type: str) -> bool:
    """Can this build read a tensor of this type (kept, plain, or dequantized)? A type in ggml's
    table that the gguf package cannot decode either (Q8_1, Q8_K) is not."""
    if ggml_type in PLAIN or ggml_type in EXACT_TYPES or ggml_type in ("BF16", "I8", "I16", "I32", "I64"):
        return True
    _, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    try:
        _dequantize(ggml_type, np.zeros((1, block_bytes), np.uint8))
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def _dequantize(ggml_type: str, raw: np.ndarray) -> np.ndarray:
    n = len(raw)
    if ggml_type in FIELD_TYPES:
        q, scale, offset = _fields(ggml_type, raw)
        y = scale[:, None] * q.reshape(-1, BLOCK).astype(np.float32)
        return y if offset is None else y + offset[:, None]
    if ggml_type in ("Q5_0", "Q5_1"):
        base = 4 if ggml_type == "Q5_1" else 2
        qh = np.ascontiguousarray(raw[:, base : base + 4]).view("<u4")[:, 0]
        high = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = (_nibbles(raw[:, base + 4 : base + 20]) | high).astype(np.float32)
        if ggml_type == "Q5_0":
            return _f16(raw, 0)[:, None] * (q - np.float32(16))
        return _f16(raw, 0)[:, None] * q + _f16(raw, 2)[:, None]
    if ggml_type == "Q5_K":
        d, dmin = _f16(raw, 0), _f16(raw, 2)
        sc, m = _k_scales(raw[:, 4:16])
        qh = raw[:, 16:48]  # bit 2j (low nibbles) and 2j+1 (high nibbles) of pair j
        ql = raw[:, 48:176].reshape(n, 4, 32)
        bits = (qh[:, None, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)) & 1
        q = np.stack([ql & 0x0F, ql >> 4], axis=2) + (bits << 4)
        q = q.reshape(n, 8, 32).astype(np.float32)
        return (
            (d[:, None] * sc.astype(np.float32))[..., None] * q - (dmin[:, None] * m.astype(np.float32))[..., None]
        ).reshape(n, -1)
    if ggml_type == "Q6_K":
        ql = raw[:, 0:128].reshape(n, 2, 64)
        qh = raw[:, 128:192].reshape(n, 2, 32)
        sc = raw[:, 192:208].view(np.int8).reshape(n, 2, 8).astype(np.float32)
        d = _f16(raw, 208)
        q = np.empty((n, 2, 4, 32), np.int16)  # per half: 4 runs of 32 values
        q[:, :, 0] = (ql[:, :, :32] & 0x0F) | (((qh >> 0) & 3) << 4)
        q[:, :, 1] = (ql[:, :, 32:] & 0x0F) | (((qh >> 2) & 3) << 4)
        q[:, :, 2] = (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4)
        q[:, :, 3] = (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)
        q = (q - 32).astype(np.float32).reshape(n, 2, 4, 2, 16)  # 16 values share a scale
        scale = (d[:, None, None] * sc).reshape(n, 2, 4, 2)  # scale index: run * 2 + (l >= 16)
        return (scale[..., None] * q).reshape(n, -1)
    from gguf.quants import dequantize  # the other block types, as the gguf package reads them

    return dequantize(np.asarray(raw), GGMLQuantizationType[ggml_type]).astype(np.float32).reshape(n, -1)


def tensor_f32(gguf: GgufFile, info: GgufTensorInfo) -> np.ndarray:
    """One tensor as float32 in NumPy order (its shape `info.shape`); NaN or Inf is refused."""
    return rows_f32(gguf.path, info).reshape(info.shape)


def rows_f32(path: Path, info: GgufTensorInfo, rows: np.ndarray | None = None, weights: bool = True) -> np.ndarray:
    """Rows `rows` of a tensor (all of them when None) as float32 (rows, cols); NaN or Inf is
    refused, and with `weights` a value beyond the weight limit (file_reads.check_weights). A
    tensor that is no weight (Gemma 4's rope_freqs: 1e30 marks a pair that does not rotate) is
    read with weights=False."""
    raw = _raw_rows(path, info, rows)
    t = info.ggml_type
    if t in PLAIN:
        values = raw.reshape(-1).view(PLAIN[t]).astype(np.float32)
    elif t == "BF16":
        values = (raw.reshape(-1).view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif t in ("I8", "I16", "I32", "I64"):
        raise ColibriError(f"{Path(path).name}: tensor {info.name!r} holds integers ({t}), not weights")
    else:
        try:
            values = _dequantize(t, raw)
        except (NotImplementedError, KeyError, ValueError) as e:
            raise ColibriError(f"{Path(path).name}: tensor {info.name!r}: cannot dequantize {t} ({e})") from None
    values = np.asarray(values, dtype=np.float32).reshape(-1, info.shape[-1])
    if weights:
        check_weights(Path(path).name, info.name, values)
    elif not np.isfinite(values).all():
        raise ColibriError(f"{Path(path).name}: tensor {info.name!r} contains NaN or Inf")
    return values
