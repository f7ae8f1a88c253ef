"""GGUF block types kept as the file holds them: Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K,
IQ4_NL, IQ4_XS and MXFP4. The image stores their blocks verbatim, row after row (a row is whole
blocks), and every product and embedding reads them through one decoding, here and in the C
runtime (firmware_src/runtime/kernels/kernels.h, kernel_*_unpack):

Each 32-value block b of a row decodes to 32 small integers q (the quant minus its offset, or
the IQ4 or MXFP4 table's value) and, per group of 32 or 16 values, a float32 scale s and (for
the affine types) a float32 offset o, each computed exactly from the file's fields: a binary16
widened, times an integer of at most 8 bits (11 + 8 significant bits fit float32's 24, and a
subnormal binary16 times such an integer stays a multiple of 2^-24 far inside float32's normal
range), so no value is rounded; MXFP4's s is its e8m0 exponent byte as a power of two (ggml's
GGML_E8M0_TO_FP32_HALF: 2^(e - 128), subnormal for e = 0 and 1), also exact. A value is s * q,
or s * q + o, one float32 rounding each (ggml's dequantize_row_* order: for the K-types
s * q - mn, which is s * q + (-mn) exactly). A product with q8_0
activations (x_qs, x_d) reduces block b to one float32 term, which goes into the reduction tree
of every quantized row (tree_sum), docs/numerics.md:

  group 32            term = (float)isum * (s * x_d)
  group 32 + offset   term = (float)isum * (s * x_d) + (float)xsum * (o * x_d)      (q4_1's)
  group 16            term = (float)isum_a * (s_a * x_d) + (float)isum_b * (s_b * x_d)
  group 16 + offset   term = ((A + B) + C) + D, A and B as above, C = (float)xsum_a * (o_a * x_d),
                      D the same for the second half

isum (xsum) the exact int32 sums of q * x_qs (x_qs) over the block or its half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.file_reads import E8M0_FIRST_CHECKED, within_limit
from .ops import tree_sum

QK = 32
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# MXFP4's e2m1 values doubled (ggml's kvalues_mxfp4), hence the half in its scale: value = k * 2^(e - 128).
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
# The e8m0 byte that is NaN in the OCP MX spec (ggml's decoding, which ignores NaN, would read 2^127).
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class BlockFormat:
    ggml_type: str  # the GGUF type name
    values: int  # values per block: 32, or 256 for a superblock
    nbytes: int  # bytes per block
    group: int  # values sharing one scale: 32 or 16
    affine: bool  # value = s * q + o (else s * q)
    halves: tuple[int, ...]  # byte offsets of the block's binary16 fields (d, and dmin or m); MXFP4 none


# The dtype names the image and the firmware use, each a GGUF type (ggml-common.h's block_*).
FORMATS = {
    "q5_0": BlockFormat("Q5_0", 32, 22, 32, False, (0,)),
    "q5_1": BlockFormat("Q5_1", 32, 24, 32, True, (0, 2)),
    "q4_k": BlockFormat("Q4_K", 256, 144, 32, True, (0, 2)),
    "q5_k": BlockFormat("Q5_K", 256, 176, 32, True, (0, 2)),
    "q6_k": BlockFormat("Q6_K", 256, 210, 16, False, (208,)),
    "q3_k": BlockFormat("Q3_K", 256, 110, 16, False, (108,)),
    "q2_k": BlockFormat("Q2_K", 256, 84, 16, True, (80, 82)),
    "iq4_nl": BlockFormat("IQ4_NL", 32, 18, 32, False, (0,)),
    "iq4_xs": BlockFormat("IQ4_XS", 256, 136, 32, False, (0,)),
    "mxfp4": BlockFormat("MXFP4", 32, 17, 32, False, ()),
}
BY_GGUF = {f.ggml_type: name for name, f in FORMATS.items()}


def row_bytes(dtype: str, cols: int) -> int:
    f = FORMATS[dtype]
    return cols // f.values * f.nbytes


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    """The binary16 field at byte `at` of every block, widened to float32 (exact)."""
    return np.ascontiguousarray(raw[:, at : at + 2]).view("<f2")[:, 0].astype(np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """MXFP4's exponent bytes as float32 scales 2^(e - 128), exactly (ggml's GGML_E8M0_TO_FP32_HALF):
    the float32 bits (e - 1) << 23 for e >= 2, the subnormals 2^-128 and 2^-127 for e = 0 and 1."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for the 8 sub-blocks of a Q4_K/Q5_K superblock: (n, 8) sc and m."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), m.astype(np.float32)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes of 2-bit quants (Q2_K, Q3_K) -> (n, 256): value 128h + 32k + l is bits 2k..2k+1
    of byte 32h + l."""
    n = len(qs)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 256)


def decode(dtype: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Blocks (n, nbytes) uint8 -> q (n * values / 32, 32) int8, scales and offsets (None unless
    affine) float32 of shape (n * values / 32, 32 / group): one entry per group of `group` values."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n = len(raw)
    if dtype in ("q5_0", "q5_1"):
        base = 2 if dtype == "q5_0" else 4
        qh = np.ascontiguousarray(raw[:, base : base + 4]).view("<u4")[:, 0]
        high = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = (_nibbles32(raw[:, base + 4 : base + 20]) | high).astype(np.int8)
        if dtype == "q5_0":
            return q - np.int8(16), _half(raw, 0)[:, None], None
        return q, _half(raw, 0)[:, None], _half(raw, 2)[:, None]
    if dtype in ("q4_k", "q5_k"):
        d, dmin = _half(raw, 0), _half(raw, 2)
        sc, m = _k_scales(raw[:, 4:16])
        ql = raw[:, 16:144] if dtype == "q4_k" else raw[:, 48:176]
        ql = ql.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = (ql & 0x0F).reshape(n, 8, 32)  # sub-block 2c: low nibbles of chunk c; 2c + 1: high
        if dtype == "q5_k":
            bits = (raw[:, None, 16:48] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
            q = q | (bits << 4)  # sub-block j's fifth bit: bit j of qh[l]
        scale = d[:, None] * sc  # exact: 11 bits times 6
        offset = -(dmin[:, None] * m)
        return q.astype(np.int8).reshape(-1, 32), scale.reshape(-1, 1), offset.reshape(-1, 1)
    if dtype == "q6_k":
        ql = raw[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        ql = (ql & 0x0F).reshape(n, 2, 4, 32)  # runs k: ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high
        qh = raw[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        q = (ql | ((qh & 3) << 4)).astype(np.int8) - np.int8(32)
        scale = _half(raw, 208)[:, None] * raw[:, 192:208].view(np.int8).astype(np.float32)  # exact: 11 bits times 8
        return q.reshape(-1, 32), scale.reshape(-1, 2), None
    if dtype == "q3_k":
        low = _crumbs(raw[:, 32:96]).astype(np.int8)
        bits = (
            raw[:, None, 0:32] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        ) & 1  # value 32i + l: bit i of hmask[l]
        q = low - ((bits.reshape(n, 256) ^ 1) << 2).astype(np.int8)
        s = raw[:, 96:108]
        lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
        hi = ((s[:, None, 8:12] >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & 3).reshape(n, 16)
        sc = (lo | (hi << 4)).astype(np.float32) - np.float32(32)
        scale = _half(raw, 108)[:, None] * sc  # exact: 11 bits times 6
        return q.reshape(-1, 32), scale.reshape(-1, 2), None
    if dtype == "q2_k":
        q = _crumbs(raw[:, 16:80]).astype(np.int8)
        sc = raw[:, 0:16]
        scale = _half(raw, 80)[:, None] * (sc & 0x0F).astype(np.float32)  # exact: 11 bits times 4
        offset = -(_half(raw, 82)[:, None] * (sc >> 4).astype(np.float32))
        return q.reshape(-1, 32), scale.reshape(-1, 2), offset.reshape(-1, 2)
    if dtype == "iq4_nl":
        q = KVALUES_IQ4NL[_nibbles32(raw[:, 2:18])]
        return q, _half(raw, 0)[:, None], None
    if dtype == "iq4_xs":
        scales_h = np.ascontiguousarray(raw[:, 2:4]).view("<u2")[:, 0]
        ib = np.arange(8)
        ls_low = (raw[:, 4 + ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & 0x0F
        ls_high = ((scales_h[:, None] >> (2 * ib).astype(np.uint16)) & 3).astype(np.uint8)
        ls = (ls_low | (ls_high << 4)).astype(np.float32) - np.float32(32)
        scale = _half(raw, 0)[:, None] * ls  # exact: 11 bits times 6
        q = KVALUES_IQ4NL[_nibbles32(raw[:, 8:136].reshape(n * 8, 16))]
        return q, scale.reshape(-1, 1), None
    if dtype == "mxfp4":
        q = KVALUES_MXFP4[_nibbles32(raw[:, 1:17])]
        return q, e8m0_half(raw[:, 0])[:, None], None
    raise ValueError(f"not a kept GGUF block type: {dtype}")


def dequantize(dtype: str, raw: np.ndarray) -> np.ndarray:
    """Blocks (n, nbytes) -> their n * values float32 values, as ggml's dequantize_row_* computes
    them: s * q, or s * q + o, each operation rounded to float32."""
    q, scale, offset = decode(dtype, raw)
    groups = q.reshape(len(q), scale.shape[1], -1).astype(np.float32)
    y = scale[..., None] * groups
    if offset is not None:
        y = y + offset[..., None]
    return y.reshape(-1)


def rows_of(dtype: str, raw_rows: np.ndarray, cols: int) -> np.ndarray:
    """A matrix's bytes (rows, row_bytes) as (rows * blocks per row, nbytes) blocks."""
    return np.ascontiguousarray(raw_rows).reshape(-1, FORMATS[dtype].nbytes)


def block_terms(dtype: str, raw_rows: np.ndarray, cols: int, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """Every 32-value block's term (rows, cols / 32) of the product of a matrix's blocks with one
    q8_0 activation vector (xq int8 (cols,), xd float32 (cols / 32,)), per the table above."""
    rows = raw_rows.shape[0]
    nb = cols // QK
    q, scale, offset = decode(dtype, rows_of(dtype, raw_rows, cols))
    g = scale.shape[1]  # 1 (groups of 32) or 2 (of 16)
    qg = q.reshape(rows, nb, g, QK // g).astype(np.int32)
    xg = np.asarray(xq, np.int8).reshape(nb, g, QK // g).astype(np.int32)
    isum = np.einsum("rbgk,bgk->rbg", qg, xg, dtype=np.int32).astype(np.float32)
    xd = np.asarray(xd, np.float32)[None, :, None]
    scale = scale.reshape(rows, nb, g)
    products = isum * (scale * xd)
    terms = products[..., 0] if g == 1 else products[..., 0] + products[..., 1]
    if offset is not None:
        xsum = xg.sum(axis=-1, dtype=np.int32).astype(np.float32)[None]
        lifts = xsum * (offset.reshape(rows, nb, g) * xd)
        for k in range(g):
            terms = terms + lifts[..., k]
    return terms.astype(np.float32)


CHUNK_VALUES = 1 << 22  # a product decodes at most this many weights at a time: its memory stays bounded


def matvec(dtype: str, raw_rows: np.ndarray, cols: int, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = the reduction tree (tree_sum) over row r's block terms (rows taken a chunk at a time,
    each row's sum unchanged)."""
    step = max(1, CHUNK_VALUES // cols)
    parts = [tree_sum(block_terms(dtype, raw_rows[r : r + step], cols, xq, xd)) for r in range(0, len(raw_rows), step)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def bad_halves(dtype: str, raw: np.ndarray) -> bool:
    """Some block's d (or dmin, m) is a binary16 infinity or NaN (every exponent bit set)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, FORMATS[dtype].nbytes)
    for at in FORMATS[dtype].halves:
        if np.any((raw[:, at + 1] & 0x7C) == 0x7C):
            return True
    return False


def bad_exponents(dtype: str, raw: np.ndarray) -> bool:
    """Some MXFP4 block cannot be a block of finite values: its e8m0 byte is 0xFF (NaN in the OCP MX
    spec; ggml's decoding, which ignores NaN, would read 2^127), or its scale times one of its values
    overflows float32 (2^126 times +-4 and up, 2^125 times +-8 and up: bytes 0xFE and 0xFD) or
    passes the +-2^32 a weight may be (model/file_reads.py)."""
    if dtype != "mxfp4":
        return False
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, FORMATS[dtype].nbytes)
    if np.any(raw[:, 0] == E8M0_NAN):
        return True
    top = raw[raw[:, 0] >= E8M0_FIRST_CHECKED]
    with np.errstate(over="ignore"):
        return len(top) > 0 and not within_limit(dequantize(dtype, top))
