"""A llama or llama4 file's rope_freqs tensor: llama3-style RoPE scaling, which llama.cpp's converter
(LlamaModel.generate_extra_tensors) writes as one divisor per rotated pair, with none of its
parameters in the metadata: 1 where the wavelength is under original / high_freq_factor, the factor
where it is over original / low_freq_factor, 1 / ((1 - smooth) / factor + smooth) between, smooth =
(original / wavelength - low) / (high - low). The parameters are read back from the divisors (only
original / low and high / low matter, so low is 1) and the divisors they give are computed again and
compared: a file whose divisors no llama3 scaling gives is refused."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...errors import ColibriError
from ..spec import RopeSpec

ROPE_FREQS = "rope_freqs.weight"
# The divisors are float32 in the file (the converter computes them from float32 frequencies).
TOLERANCE = 1e-5


def llama3_divisors(rope: RopeSpec, dims: int) -> np.ndarray:
    """What the converter writes for `rope` (scaling "llama3"): each rotated pair's divisor."""
    inv = 1.0 / rope.theta ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    wavelen = 2 * math.pi / inv
    original, low, high = rope.original_max_position_embeddings, rope.low_freq_factor, rope.high_freq_factor
    out = np.empty_like(wavelen)
    for i, w in enumerate(wavelen):
        if w < original / high:
            out[i] = 1.0
        elif w > original / low:
            out[i] = rope.factor
        else:
            smooth = (original / w - low) / (high - low)
            out[i] = 1.0 / ((1.0 - smooth) / rope.factor + smooth)
    return out


def _candidates(values: np.ndarray, wavelen: np.ndarray, theta: float, factor: float) -> list[RopeSpec]:
    """llama3 parameters the divisors may have come from (low_freq_factor 1): from two blended pairs
    original and high exactly; from one or none, original a power of two (every published one is)
    above the blended or the last unscaled pair's wavelength."""
    fast = np.isclose(values, 1.0, rtol=TOLERANCE, atol=0)
    slow = np.isclose(values, factor, rtol=TOLERANCE, atol=0)
    blended = np.flatnonzero(~fast & ~slow)
    # smooth of a blended pair, from its divisor: 1 / v = (1 - s) / factor + s.
    smooth = (1.0 / values[blended] - 1.0 / factor) / (1.0 - 1.0 / factor)

    def rope(original: float, high: float) -> RopeSpec:
        high = float(f"{high:.6g}")  # the config's own number, not its float32 echo
        return RopeSpec(theta, "llama3", factor, 1.0, high, round(original))

    if len(blended) >= 2:  # smooth = a / w - b with a = original / (high - 1), b = 1 / (high - 1)
        (i, j), (si, sj) = blended[[0, -1]], smooth[[0, -1]]
        a = (si - sj) / (1 / wavelen[i] - 1 / wavelen[j])
        b = a / wavelen[i] - si
        return [rope(a / b, 1 + 1 / b)] if b > 0 else []
    below = wavelen[blended[0]] if len(blended) else wavelen[np.flatnonzero(fast)[-1]] if fast.any() else 1.0
    out = []
    for original in (2 ** math.ceil(math.log2(below) + 1e-9), math.ceil(below)):
        if len(blended):  # smooth = (original / w - 1) / (high - 1)
            out.append(rope(original, 1 + (original / wavelen[blended[0]] - 1) / smooth[0]))
        else:  # a step: the slow pairs start past original (low = high = 1, as Llama 4 Scout's config)
            out.append(rope(original, 1.0))
    return out


def llama3_rope(
    shape: tuple[int, ...], read: Callable[[], np.ndarray], theta: float, dims: int, where: str
) -> RopeSpec:
    """The llama3 RopeSpec whose divisors are the tensor's (of `shape`, its values `read()` once the
    shape is right; `dims` rotated dimensions), or the plain RoPE where every divisor is 1; anything
    else refused in one line."""
    half = dims // 2
    refused = ColibriError(
        f"{where}: tensor {ROPE_FREQS!r} must hold {half} llama3 RoPE scaling divisors as llama.cpp writes "
        f"them (1 for the fast pairs, the factor for the slow ones, a blend between): these are not "
        f"what any llama3 rope_scaling gives"
    )
    if tuple(shape) != (half,):
        raise refused
    values = np.asarray(read(), dtype=np.float64).reshape(-1)
    if values.shape != (half,) or not np.isfinite(values).all() or (values < 1.0).any():
        raise refused
    factor = float(f"{values.max():.6g}")  # the config's own number, not its float32 echo
    if factor == 1.0:
        return RopeSpec(theta=theta)
    wavelen = 2 * math.pi * theta ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    for rope in _candidates(values, wavelen, theta, factor):
        if rope.original_max_position_embeddings >= 1 and rope.high_freq_factor >= 1.0:
            if np.allclose(llama3_divisors(rope, dims), values, rtol=TOLERANCE, atol=0):
                return rope
    raise refused
