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
        with np.errstate(divide="ignore", invalid="ignore"):  # low == high: no pair is blended (transformers')
            smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
            smoothed = (1.0 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    elif rope.scaling == "yarn":
        inv = _yarn_inverse_frequencies(rope, head_dim)
    elif rope.scaling == "proportional":  # as transformers 5.24's _compute_proportional_rope_parameters
        rotated = int(rope.rotated_fraction * head_dim // 2)
        inv = np.where(np.arange(half) < rotated, inv, 0.0) / rope.factor
    return inv


def _yarn_inverse_frequencies(rope: RopeSpec, head_dim: int) -> np.ndarray:
    """YaRN as transformers 5.24's _compute_yarn_parameters: frequencies above the fast boundary
    kept (extrapolated), below the slow one divided by factor (interpolated), a linear ramp between."""
    half = head_dim // 2
    base = rope.theta
    original = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = np.array([base ** (2.0 * i / head_dim) for i in range(half)], dtype=np.float64)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    ramp = np.clip((np.arange(half, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_weight = 1.0 - ramp
    return interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight


def tables(rope: RopeSpec, head_dim: int, n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, each (n_ctx, head_dim/2) float32, for positions 0..n_ctx-1."""
    angles = np.outer(np.arange(n_ctx, dtype=np.float64), inverse_frequencies(rope, head_dim))
    # YaRN scales cos and sin by its attention factor (1 for every other scaling).
    scale = rope.attention_factor if rope.scaling == "yarn" else 1.0
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)
