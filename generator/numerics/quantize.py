"""Quantize stage: blocks of 32 values along the input dimension, one float32 scale each.

q8_0: int8 quants. The same function quantizes weights here and activations in the runtime
(kernel_quantize_q8_0 in firmware_src/runtime/kernels/scalar.c), so dot products are integer.
q4_0 (weights only): 4-bit quants q in 0..15 standing for q - 8, two per byte. A q4_0 weight is
the int8 value q - 8 times its scale, so a q4_0 product is the q8_0 product of those int8 values:
the same integer block sums, the same float terms, the same bits, whether the firmware reads the
nibbles directly or expands them to int8 when it loads the image.
q4_1 (weights only; GGUF Q4_1): 4-bit quants q in 0..15, packed as q4_0's, standing for d * q + m
with a float32 scale d and a float32 minimum m per block. A product adds, per block, the integer
product with the scale and the activations' integer block sum with the minimum (matvec_q4_1).
"""

from __future__ import annotations

import numpy as np

from ..errors import ColibriError
from .ops import F32, f32, round_even, tree_sum

QK = 32  # values per q8_0 block
BLOCK_TYPES = ("f32", "q8_0", "q4_0", "q4_1")  # what a tensor in the image is
INTEGER_QUANTS = ("q8_0", "q4_0", "q4_1")  # matrices with integer quants: matmul inputs are quantized to q8_0
# The quantizations a model is built with: one block type for every matrix, or "gguf", a GGUF
# file's own blocks (gguf_block_type).
GGUF = "gguf"
QUANTS = (*BLOCK_TYPES, GGUF)

# GGUF block types this project holds exactly: the same values, bit for bit (an fp16 scale or
# minimum is exact in float32; Q4_K's sub-block scale and minimum are an fp16 times a 6-bit integer,
# exact too), the nibbles repacked where their order differs.
GGUF_EXACT = {"F32": "f32", "F16": "f32", "BF16": "f32", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1",
              "Q4_K": "q4_1"}
# Other block types are dequantized and quantized again: to q8_0 from five bits per weight up, to
# q4_1 below (the kept type nearest in size).
GGUF_WIDE = ("F64", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_1", "Q8_K")


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


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., n) float32 -> int8 quants (..., n) and float32 scales (..., n/32).

    d = max|x| / 127; q = round_half_even(x * (1 / d)), or 0 when the block is all zero.
    """
    x = f32(x)
    n = x.shape[-1]
    if n % QK:
        raise ColibriError(f"q8_0 needs rows whose length is a multiple of {QK}, got {n} (use --quant f32)")
    blocks = np.ascontiguousarray(x).reshape(*x.shape[:-1], n // QK, QK)
    amax = np.max(_magnitudes(blocks), axis=-1).view(np.float32)  # max |x| per block
    d = (amax / F32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)
    q = round_even(blocks * inv[..., None])
    q = np.clip(q, -127, 127, out=q).astype(np.int8)
    return q.reshape(x.shape), d


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Quants 0..15 (..., n) -> bytes (..., n/2): byte j of a block of 32 holds quant j in its low
    nibble and quant j + 16 in its high nibble (q4_0 and q4_1, as GGUF's Q4_0 and Q4_1)."""
    blocks = q.astype(np.uint8).reshape(*q.shape[:-1], q.shape[-1] // QK, QK)
    packed = blocks[..., :QK // 2] | (blocks[..., QK // 2:] << 4)
    return packed.reshape(*q.shape[:-1], q.shape[-1] // 2)


def keep_blocks(quants: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, block_type: str
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A GGUF tensor's own blocks (quants per value: Q8_0 and Q4_0 int8, Q4_1 and Q4_K 0..15;
    float32 scales and offsets per 32) as this project's block type holds them, value for value:
    (int8 quants or packed nibbles, scales, minimums or None)."""
    scales = scales.astype(np.float32)
    if block_type == "q8_0":
        return quants.astype(np.int8), scales, None
    if block_type == "q4_0":
        return pack_nibbles(quants.astype(np.int16) + 8), scales, None
    if block_type == "q4_1":
        return pack_nibbles(quants), scales, offsets.astype(np.float32)
    raise ValueError(block_type)


def quantize_q4_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., n) float32 -> packed uint8 (..., n/2) and float32 scales (..., n/32).

    Per block, m is the value of largest magnitude (the first on ties) and d = m / -8, so m maps
    to quant 0 (-8) and the block spans -8..7; q = clip(round_half_even(x * (1 / d)) + 8, 0, 15).
    Byte j of a block holds quant j in its low nibble and quant j + 16 in its high nibble.
    """
    x = f32(x)
    n = x.shape[-1]
    if n % QK:
        raise ColibriError(f"q4_0 needs rows whose length is a multiple of {QK}, got {n} (use --quant f32)")
    blocks = np.ascontiguousarray(x).reshape(*x.shape[:-1], n // QK, QK)
    m = np.take_along_axis(blocks, np.argmax(_magnitudes(blocks), axis=-1)[..., None], axis=-1)[..., 0]
    d = (m / F32(-8.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)
    q = np.clip(round_even(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
    return pack_nibbles(q.reshape(x.shape)), d


def unpack_q4_0(packed: np.ndarray) -> np.ndarray:
    """Packed q4_0 quants (..., n/2) -> the int8 values q - 8 (..., n) they stand for."""
    half = packed.shape[-1]
    blocks = packed.reshape(*packed.shape[:-1], half // (QK // 2), QK // 2)
    q = np.concatenate([blocks & 0x0F, blocks >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return q.reshape(*packed.shape[:-1], half * 2)


def quantize_q4_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(..., n) float32 -> packed uint8 (..., n/2), float32 scales and float32 minimums (..., n/32).

    Per block, m = min and d = (max - min) / 15, so quant 0 is the minimum and quant 15 (nearly) the
    maximum; q = clip(round_half_even((x - m) * (1 / d)), 0, 15), each operation in float32. A block
    whose d is 0 or subnormal (1 / d would overflow) is stored with d = 0 and every quant 0: all its
    values become m, within 15 * 2^-126 of what they were. Byte j of a block holds quant j in its low
    nibble and quant j + 16 in its high nibble (as q4_0 and GGUF's Q4_1).
    """
    x = f32(x)
    n = x.shape[-1]
    if n % QK:
        raise ColibriError(f"q4_1 needs rows whose length is a multiple of {QK}, got {n} (use --quant f32)")
    if not np.all(np.isfinite(x)):
        raise ColibriError("q4_1 needs finite weights (a weight is infinite or NaN)")
    blocks = x.reshape(*x.shape[:-1], n // QK, QK)
    m = np.min(blocks, axis=-1)
    with np.errstate(over="ignore"):
        d = ((np.max(blocks, axis=-1) - m) / F32(15.0)).astype(np.float32)
    if not np.all(np.isfinite(d)):
        raise ColibriError("q4_1 cannot hold a block whose values span more than the float32 range")
    d = np.where(d >= np.finfo(np.float32).tiny, d, F32(0.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)
    q = np.clip(round_even((blocks - m[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    return pack_nibbles(q.reshape(x.shape)), d, m.astype(np.float32)


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
    return (blocks * d[..., None] + m[..., None]).reshape(q.shape).astype(np.float32)


def matvec_q4_1(wq: np.ndarray, wd: np.ndarray, wm: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = tree_sum over blocks b of float(isum_rb) * (wd_rb * xd_b) + float(xsum_b) * (wm_rb * xd_b);
    isum (quants 0..15 times activation quants) and xsum (the activation block's quants) are exact int32."""
    rows, n = wq.shape
    nb = n // QK
    xb = xq.reshape(nb, QK).astype(np.int32)
    isum = np.einsum("rbk,bk->rb", wq.reshape(rows, nb, QK).astype(np.int32), xb, dtype=np.int32)
    xsum = xb.sum(axis=-1, dtype=np.int32)
    terms = isum.astype(np.float32) * (wd * xd[None, :]) + xsum.astype(np.float32)[None, :] * (wm * xd[None, :])
    return tree_sum(terms)


def dequantize_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = q.shape[-1]
    blocks = q.reshape(*q.shape[:-1], n // QK, QK).astype(np.float32)
    return (blocks * d[..., None]).reshape(q.shape).astype(np.float32)


def matvec_q8_0(wq: np.ndarray, wd: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = tree_sum over blocks b of float(isum_rb) * (wd_rb * xd_b); isum is exact int32."""
    rows, n = wq.shape
    nb = n // QK
    isum = np.einsum("rbk,bk->rb", wq.reshape(rows, nb, QK).astype(np.int32),
                     xq.reshape(nb, QK).astype(np.int32), dtype=np.int32)
    terms = isum.astype(np.float32) * (wd * xd[None, :])
    return tree_sum(terms)
