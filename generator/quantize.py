"""Quantize stage: q8_0 blocks (32 values along the input dimension, one float32 scale each).

The same function quantizes weights here and activations in the runtime
(kernel_quantize_q8_0 in firmware_src/runtime/kernels/scalar.c), so dot products are integer.
"""

from __future__ import annotations

import numpy as np

from .errors import ColibriError
from .numerics import F32, f32, round_even, seq_sum

QK = 32  # values per q8_0 block
QUANTS = ("f32", "q8_0")


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


def dequantize_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = q.shape[-1]
    blocks = q.reshape(*q.shape[:-1], n // QK, QK).astype(np.float32)
    return (blocks * d[..., None]).reshape(q.shape).astype(np.float32)


def matvec_q8_0(wq: np.ndarray, wd: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """out_r = sum over blocks b, in order, of float(isum_rb) * (wd_rb * xd_b); isum is exact int32."""
    rows, n = wq.shape
    nb = n // QK
    isum = np.einsum("rbk,bk->rb", wq.reshape(rows, nb, QK).astype(np.int32),
                     xq.reshape(nb, QK).astype(np.int32), dtype=np.int32)
    terms = isum.astype(np.float32) * (wd * xd[None, :])
    return seq_sum(terms, axis=1)
