"""Quantize stage: blocks of 32 values along the input dimension, one float32 scale each.

q8_0: int8 quants. The same function quantizes weights here and activations in the runtime
(kernel_quantize_q8_0 in firmware_src/runtime/kernels/scalar.c), so dot products are integer.
q4_0 (weights only): 4-bit quants q in 0..15 standing for q - 8, two per byte. A q4_0 weight is
the int8 value q - 8 times its scale, so a q4_0 product is the q8_0 product of those int8 values:
the same integer block sums, the same float terms, the same bits, whether the firmware reads the
nibbles directly or expands them to int8 when it loads the image.
"""

from __future__ import annotations

import numpy as np

from ..errors import ColibriError
from .ops import F32, f32, round_even, tree_sum

QK = 32  # values per q8_0 block
QUANTS = ("f32", "q8_0", "q4_0")
INTEGER_QUANTS = ("q8_0", "q4_0")  # matrices with integer quants: matmul inputs are quantized to q8_0


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., n) float32 -> int8 quants (..., n) and float32 scales (..., n/32).

    d = max|x| / 127; q = round_half_even(x * (1 / d)), or 0 when the block is all zero.
    """
    x = f32(x)
    n = x.shape[-1]
    if n % QK:
        raise ColibriError(f"q8_0 needs rows whose length is a multiple of {QK}, got {n} (use --quant f32)")
    blocks = x.reshape(*x.shape[:-1], n // QK, QK)
    amax = np.max(np.abs(blocks), axis=-1)
    d = (amax / F32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)
    q = round_even(blocks * inv[..., None])
    q = np.clip(q, -127, 127).astype(np.int8)
    return q.reshape(x.shape), d


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
    blocks = x.reshape(*x.shape[:-1], n // QK, QK)
    m = np.take_along_axis(blocks, np.argmax(np.abs(blocks), axis=-1)[..., None], axis=-1)[..., 0]
    d = (m / F32(-8.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(np.float32)
    q = np.clip(round_even(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
    packed = q[..., :QK // 2] | (q[..., QK // 2:] << 4)
    return packed.reshape(*x.shape[:-1], n // 2), d


def unpack_q4_0(packed: np.ndarray) -> np.ndarray:
    """Packed q4_0 quants (..., n/2) -> the int8 values q - 8 (..., n) they stand for."""
    half = packed.shape[-1]
    blocks = packed.reshape(*packed.shape[:-1], half // (QK // 2), QK // 2)
    q = np.concatenate([blocks & 0x0F, blocks >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return q.reshape(*packed.shape[:-1], half * 2)


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
