"""The KV cache's types: how a key or value is rounded once, when it is written (the C twin is
runtime/attention.c's kv_store, with kernel_float_to_half in kernels/kernels.h), and what reading
it back gives (exact: kernel_widen_f16, kernel_widen_q8_0). docs/numerics.md, "KV cache"."""

from __future__ import annotations

import numpy as np

from ..boards import DEFAULT_KV_TYPE, KV_TYPES
from ..errors import ColibriError
from ..model.spec import ModelSpec
from .ops import f32, round_even
from .quantize import QK, _magnitudes

__all__ = ["DEFAULT_KV_TYPE", "KV_TYPES", "check_kv_type", "kv_arena_bytes", "kv_round", "to_half_saturating"]

HALF_MAX = np.float32(65504.0)  # the largest binary16
VALUE_BYTES = {"f32": 4, "f16": 2, "q8_0": 1}
SCALE_BYTES = 2  # a q8_0 block's binary16 scale


def check_kv_type(spec: ModelSpec, kv_type: str) -> None:
    """Refuse a KV type the model cannot take, in one line."""
    if kv_type not in KV_TYPES:
        raise ColibriError(f"unknown KV cache type {kv_type!r} (supported: {', '.join(KV_TYPES)})")
    widths = sorted({spec.layer_head_dim(i) for i in range(spec.n_layers)} | {spec.head_dim})
    if spec.kv_lora_rank:  # latent attention caches one row: the latent and the RoPE key
        widths = [spec.layer_kv_dim(0)]
    odd = [w for w in widths if w % QK]
    if kv_type == "q8_0" and odd and spec.kv_lora_rank:
        raise ColibriError(
            f"--kv-type q8_0 needs whole blocks of {QK} values per cached row; {spec.name}'s latent and RoPE key "
            f"are {odd[0]} wide (kv_lora_rank + qk_rope_head_dim): use --kv-type f16 or f32"
        )
    if kv_type == "q8_0" and odd:
        raise ColibriError(
            f"--kv-type q8_0 needs a head width that is a multiple of {QK} (blocks of {QK} values per head); "
            f"{spec.name} has head_dim {odd[0]}: use --kv-type f16 or f32"
        )


def kv_arena_bytes(values: int, kv_type: str) -> int:
    """Bytes of the K (or V) arena holding `values` values: the values, and for q8_0 the binary16
    scale of every 32 of them."""
    return values * VALUE_BYTES[kv_type] + (values // QK * SCALE_BYTES if kv_type == "q8_0" else 0)


def to_half_saturating(x: np.ndarray) -> np.ndarray:
    """float32 -> binary16, nearest with ties to even, |x| >= 65504 saturating to +-65504 (a finite
    value never becomes an infinity); kernel_float_to_half."""
    with np.errstate(invalid="ignore"):
        return np.clip(f32(x), -HALF_MAX, HALF_MAX).astype(np.float16)


def quantize_kv_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A key or value row (..., n), n whole blocks of 32 -> int8 quants and binary16 scales: the
    weights' q8_0 rule (d = binary16(max|x| / 127), q = clip(round_half_even(x * (1/d)), -127, 127),
    0 where d is 0), with d saturating at 65504 instead of being refused."""
    x = f32(x)
    blocks = np.ascontiguousarray(x).reshape(*x.shape[:-1], x.shape[-1] // QK, QK)
    amax = np.max(_magnitudes(blocks), axis=-1).view(np.float32)
    d = to_half_saturating((amax / np.float32(127.0)).astype(np.float32))
    wide = d.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(wide != 0, np.float32(1.0) / wide, np.float32(0.0)).astype(np.float32)
    q = round_even(blocks * inv[..., None])
    q = np.clip(q, -127, 127).astype(np.int8).reshape(x.shape)
    return q, d


def kv_round(x: np.ndarray, kv_type: str) -> np.ndarray:
    """What the cache gives back for keys or values x (float32, rows of the head's width): the value
    rounded once to the cache's type, then widened to float32 exactly."""
    x = f32(x)
    if kv_type == "f32":
        return x.copy()
    if kv_type == "f16":
        return to_half_saturating(x).astype(np.float32)
    q, d = quantize_kv_q8_0(x)
    n = x.shape[-1]
    return (q.reshape(*x.shape[:-1], n // QK, QK).astype(np.float32) * d.astype(np.float32)[..., None]).reshape(x.shape)
