"""Quantize stage: blocks of 32 values along the input dimension, one scale each.

A weight block's scale (and a q4_1 block's minimum) is an IEEE binary16 value, as in GGUF's Q8_0,
Q4_0 and Q4_1 blocks: 2 bytes where a float32 would take 4 (q8_0 1.0625 bytes per weight, not
1.125). binary16 widens to float32 exactly, and every product below widens first, so the arithmetic
is the float32 arithmetic of docs/numerics.md. Activation blocks are quantized at run time and keep
float32 scales.

q8_0: int8 quants. quantize_q8_0 quantizes activations as the runtime does (kernel_quantize_q8_0 in
firmware_src/runtime/kernels/scalar.c), so dot products are integer; quantize_weights_q8_0 is the
same rule with the scale rounded to binary16 before the quants are made.
q4_0 (weights only): 4-bit quants q in 0..15 standing for q - 8, two per byte. A q4_0 weight is
the int8 value q - 8 times its scale, so a q4_0 product is the q8_0 product of those int8 values:
the same integer block sums, the same float terms, the same bits, whether the firmware reads the
nibbles directly or expands them to int8 when it loads the image.
q4_1 (weights only; GGUF Q4_1): 4-bit quants q in 0..15, packed as q4_0's, standing for d * q + m
with a binary16 scale d and a binary16 minimum m per block. A product adds, per block, the integer
product with the scale and the activations' integer block sum with the minimum (matvec_q4_1).
"""

from __future__ import annotations

import numpy as np

from ..errors import ColibriError
from .blocks import BY_GGUF, FORMATS
from .ops import F32, f32, round_even, tree_sum

QK = 32  # values per q8_0 block
BLOCK_TYPES = ("f32", "q8_0", "q4_0", "q4_1")  # what a tensor in the image is
INTEGER_QUANTS = ("q8_0", "q4_0", "q4_1")  # quants, then binary16 scales (and q4_1 minimums), in the image
# GGUF block types the image holds verbatim, row after row (numerics/blocks.py): only --quant gguf
# makes them, from a file that holds them.
KEPT_BLOCK_TYPES = tuple(FORMATS)
# Matrices with integer quants: their matmul inputs are quantized to q8_0.
Q8_INPUT_TYPES = INTEGER_QUANTS + KEPT_BLOCK_TYPES
# The quantizations a model is built with: one block type for every matrix, or "gguf", a GGUF
# file's own blocks (gguf_block_type).
GGUF = "gguf"
QUANTS = (*BLOCK_TYPES, GGUF)

# GGUF block types this project holds exactly: the same values, bit for bit. Q8_0, Q4_0 and Q4_1 as
# the image's own q8_0, q4_0 and q4_1 (their binary16 scales and minimums are what the image stores);
# the K-types, Q5_0, Q5_1 and the IQ4 types as their blocks verbatim (KEPT_BLOCK_TYPES).
GGUF_EXACT = {
    "F32": "f32",
    "F16": "f32",
    "BF16": "f32",
    "Q8_0": "q8_0",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    **BY_GGUF,
}
# Other block types are dequantized and quantized again: to q8_0 from five bits per weight up, to
# q4_1 below (the kept type nearest in size).
GGUF_WIDE = ("F64", "Q8_1", "Q8_K")


def gguf_block_type(ggml_type: str) -> tuple[str, bool]:
    """The block type a GGUF tensor of `ggml_type` is kept as under --quant gguf, and whether its
    values stay exactly what the file holds."""
    if ggml_type in GGUF_EXACT:
        return GGUF_EXACT[ggml_type], True
    return ("q8_0" if ggml_type in GGUF_WIDE else "q4_1"), False


def _magnitudes(blocks: np.ndarray) -> np.ndarray:
    """|x| of float32 values as int32, ordered as |x| is (the bits without the sign bit: for
    non-negative floats integer order is float order). Maxima and argmaxima over them are those of
    np.abs(x), bit for bit (both zeros compare equal, as +0 and -0 do), at about twice the speed."""
    return blocks.view(np.int32) & np.int32(0x7FFFFFFF)


F16 = np.float16
HALF = "<f2"  # how the image stores weight block scales and minimums: little-endian binary16
SCALE_BYTES = 2  # bytes of one weight block's scale (or q4_1 minimum) in the image


def to_half(values: np.ndarray, what: str, quant: str) -> np.ndarray:
    """float32 -> binary16, rounded to nearest even; a value beyond binary16's range (|v| > 65504
    after rounding) is an error, never an infinity in the image."""
    wide = np.asarray(values, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = wide.astype(F16)
    if not np.all(np.isfinite(h)):
        if not np.all(np.isfinite(wide)):
            raise ColibriError(f"{quant} cannot hold these weights: a block {what} is infinite or NaN")
        worst = float(np.max(np.abs(wide)))
        raise ColibriError(
            f"{quant} cannot hold these weights: a block {what} of {worst:.6g} is beyond the "
            f"binary16 range of block scales (65504); use --quant f32"
        )
    return h


def widen(h: np.ndarray) -> np.ndarray:
    """binary16 (or float32) scales -> float32, exactly."""
    return np.asarray(h).astype(np.float32)


def _blocks(x: np.ndarray, quant: str) -> np.ndarray:
    """(..., n) values -> (..., n/32, 32) float32 blocks; rows must be whole blocks."""
    x = f32(x)
    n = x.shape[-1]
    if n % QK:
        raise ColibriError(f"{quant} needs rows whose length is a multiple of {QK}, got {n} (use --quant f32)")
    return np.ascontiguousarray(x).reshape(*x.shape[:-1], n // QK, QK)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d in float32 per block, 0 where d is 0 (an all-zero block's quants stay 0)."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)


def _q8_0_quants(blocks: np.ndarray, d: np.ndarray) -> np.ndarray:
    q = round_even(blocks * _inverse(d)[..., None])
    return np.clip(q, -127, 127, out=q).astype(np.int8).reshape(*blocks.shape[:-2], -1)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Activations: (..., n) float32 -> int8 quants (..., n) and float32 scales (..., n/32).

    d = max|x| / 127; q = round_half_even(x * (1 / d)), or 0 when the block is all zero.
    """
    blocks = _blocks(x, "q8_0")
    amax = np.max(_magnitudes(blocks), axis=-1).view(np.float32)  # max |x| per block
    d = (amax / F32(127.0)).astype(np.float32)
    return _q8_0_quants(blocks, d), d


def quantize_weights_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights: (..., n) float32 -> int8 quants (..., n) and binary16 scales (..., n/32).

    d = binary16(max|x| / 127); q = clip(round_half_even(x * (1 / d)), -127, 127), or 0 when d is 0
    (the clip holds the largest value when rounding d down made it step past 127).
    """
    blocks = _blocks(x, "q8_0")
    amax = np.max(_magnitudes(blocks), axis=-1).view(np.float32)
    d = to_half((amax / F32(127.0)).astype(np.float32), "scale", "q8_0")
    return _q8_0_quants(blocks, widen(d)), d


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Quants 0..15 (..., n) -> bytes (..., n/2): byte j of a block of 32 holds quant j in its low
    nibble and quant j + 16 in its high nibble (q4_0 and q4_1, as GGUF's Q4_0 and Q4_1)."""
    blocks = q.astype(np.uint8).reshape(*q.shape[:-1], q.shape[-1] // QK, QK)
    packed = blocks[..., : QK // 2] | (blocks[..., QK // 2 :] << 4)
    return packed.reshape(*q.shape[:-1], q.shape[-1] // 2)


def keep_blocks(
    quants: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, block_type: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A GGUF tensor's own Q8_0/Q4_0/Q4_1 block fields (model/gguf/tensors.QuantBlocks.fields: the
    quant bytes, binary16 scales, binary16 Q4_1 minimums or None) as `block_type` holds them, value
    for value: the same arrays, since the image packs its quants as the file does (Q8_0's int8; Q4_0's
    nibbles standing for q - 8; Q4_1's for d * q + m) and stores the same binary16 numbers. What
    quantizing would refuse is refused: a scale or minimum that is infinite or NaN."""
    if block_type not in INTEGER_QUANTS or quants.size != scales.size * (QK if block_type == "q8_0" else QK // 2):
        raise ValueError(f"{quants.size} quant bytes for {scales.size} blocks are not {block_type} blocks")
    _finite_halves(scales, "scale", block_type)
    if block_type == "q4_1":
        _finite_halves(offsets, "minimum", block_type)
        return quants, scales, offsets
    return quants, scales, None


def _finite_halves(values: np.ndarray, what: str, block_type: str) -> None:
    """binary16 values with every exponent bit set are the infinities and NaNs."""
    if np.any((values.view(np.uint16) & np.uint16(0x7C00)) == np.uint16(0x7C00)):
        raise ColibriError(f"{block_type} cannot hold these weights: a block {what} is infinite or NaN")


def quantize_q4_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., n) float32 -> packed uint8 (..., n/2) and binary16 scales (..., n/32).

    Per block, m is the value of largest magnitude (the first on ties) and d = binary16(m / -8), so
    m maps to quant 0 (-8) and the block spans -8..7; q = clip(round_half_even(x * (1 / d)) + 8, 0, 15).
    Byte j of a block holds quant j in its low nibble and quant j + 16 in its high nibble.
    """
    blocks = _blocks(x, "q4_0")
    m = np.take_along_axis(blocks, np.argmax(_magnitudes(blocks), axis=-1)[..., None], axis=-1)[..., 0]
    d = to_half((m / F32(-8.0)).astype(np.float32), "scale", "q4_0")
    q = np.clip(round_even(blocks * _inverse(widen(d))[..., None]) + 8, 0, 15).astype(np.uint8)
    return pack_nibbles(q.reshape(*blocks.shape[:-2], -1)), d


def unpack_q4_0(packed: np.ndarray) -> np.ndarray:
    """Packed q4_0 quants (..., n/2) -> the int8 values q - 8 (..., n) they stand for."""
    half = packed.shape[-1]
    blocks = packed.reshape(*packed.shape[:-1], half // (QK // 2), QK // 2)
    q = np.concatenate([blocks & 0x0F, blocks >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return q.reshape(*packed.shape[:-1], half * 2)


def quantize_q4_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(..., n) float32 -> packed uint8 (..., n/2), binary16 scales and binary16 minimums (..., n/32).

    Per block, m = the block's minimum rounded down to binary16 (so that no value lies below it) and
    d = binary16((max - m) / 15), so quant 0 is the minimum and quant 15 (nearly) the maximum;
    q = clip(round_half_even((x - m) * (1 / d)), 0, 15), each operation in float32. A block whose d
    rounds to 0 keeps every quant 0: all its values become m, within 15 * 2^-25 of what they were.
    Byte j of a block holds quant j in its low nibble and quant j + 16 in its high nibble (as q4_0
    and GGUF's Q4_1).
    """
    blocks = _blocks(x, "q4_1")
    if not np.all(np.isfinite(blocks)):
        raise ColibriError("q4_1 needs finite weights (a weight is infinite or NaN)")
    low = np.min(blocks, axis=-1)
    m = to_half(low, "minimum", "q4_1")
    above = widen(m) > low
    m[above] = np.nextafter(m[above], F16(-np.inf))
    m = to_half(widen(m), "minimum", "q4_1")  # a step down past -65504 is out of range too
    wide_m = widen(m)
    with np.errstate(over="ignore"):
        span = ((np.max(blocks, axis=-1) - wide_m) / F32(15.0)).astype(np.float32)
    d = to_half(span, "scale", "q4_1")
    q = np.clip(round_even((blocks - wide_m[..., None]) * _inverse(widen(d))[..., None]), 0, 15).astype(np.uint8)
    return pack_nibbles(q.reshape(*blocks.shape[:-2], -1)), d, m


def unpack_q4_1(packed: np.ndarray) -> np.ndarray:
    """Packed q4_1 quants (..., n/2) -> the quants 0..15 (..., n), as uint8."""
    half = packed.shape[-1]
    blocks = packed.reshape(*packed.shape[:-1], half // (QK // 2), QK // 2)
    q = np.concatenate([blocks & 0x0F, blocks >> 4], axis=-1).astype(np.uint8)
    return q.reshape(*packed.shape[:-1], half * 2)


def dequantize_q4_1(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Quants 0..15 (..., n) -> (float)q * d + m per value: a product, then a sum, in float32."""
    n = q.shape[-1]
    blocks = q.reshape(*q.shape[:-1], n // QK, QK).astype(np.float32)
    return (blocks * widen(d)[..., None] + widen(m)[..., None]).reshape(q.shape).astype(np.float32)


def matvec_q4_1(wq: np.ndarray, wd: np.ndarray, wm: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = tree_sum over blocks b of float(isum_rb) * (wd_rb * xd_b) + float(xsum_b) * (wm_rb * xd_b);
    isum (quants 0..15 times activation quants) and xsum (the activation block's quants) are exact int32."""
    rows, n = wq.shape
    nb = n // QK
    xb = xq.reshape(nb, QK).astype(np.int32)
    isum = np.einsum("rbk,bk->rb", wq.reshape(rows, nb, QK).astype(np.int32), xb, dtype=np.int32)
    xsum = xb.sum(axis=-1, dtype=np.int32)
    wd, wm, xd = widen(wd), widen(wm), widen(xd)
    terms = isum.astype(np.float32) * (wd * xd[None, :]) + xsum.astype(np.float32)[None, :] * (wm * xd[None, :])
    return tree_sum(terms)


def dequantize_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = q.shape[-1]
    blocks = q.reshape(*q.shape[:-1], n // QK, QK).astype(np.float32)
    return (blocks * widen(d)[..., None]).reshape(q.shape).astype(np.float32)


def matvec_q8_0(wq: np.ndarray, wd: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = tree_sum over blocks b of float(isum_rb) * (wd_rb * xd_b); isum is exact int32; wd
    binary16 (or float32) scales, widened first."""
    rows, n = wq.shape
    nb = n // QK
    isum = np.einsum(
        "rbk,bk->rb", wq.reshape(rows, nb, QK).astype(np.int32), xq.reshape(nb, QK).astype(np.int32), dtype=np.int32
    )
    terms = isum.astype(np.float32) * (widen(wd) * widen(xd)[None, :])
    return tree_sum(terms)
