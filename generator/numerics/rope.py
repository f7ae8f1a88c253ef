"""RoPE tables, computed once here (float64, rounded to float32) and shared by the C runtime
(as constants in the generated model_data.c) and the NumPy reference."""

from __future__ import annotations

import math

import numpy as np

from ..model.spec import RopeSpec


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> np.ndarray:
    half = head_dim // 2
    inv = np.array([1.0 / (rope.theta ** (2.0 * i / head_dim)) for i in range(half)], dtype=np.float64)
    if rope.scaling == "linear":
        inv = inv / rope.factor
    elif rope.scaling == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2.0 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1.0 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv


def tables(rope: RopeSpec, head_dim: int, n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, each (n_ctx, head_dim/2) float32, for positions 0..n_ctx-1."""
    angles = np.outer(np.arange(n_ctx, dtype=np.float64), inverse_frequencies(rope, head_dim))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
