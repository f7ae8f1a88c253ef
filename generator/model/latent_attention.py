"""Multi-head latent attention's facts both importers share (hf/latent.py, gguf/metadata.py): the
settings checked and resolved into the ModelSpec's fields, YaRN's softmax scale, and the order a
checkpoint's RoPE rows are read in. The block itself: family_blocks.LatentAttention; its numerics:
numerics/mla.py and runtime/mla.c (docs/numerics.md, "Latent attention")."""

from __future__ import annotations

import math

from ..errors import ColibriError


def check_latent(where: str, names: dict[str, str], hidden: int, values: dict[str, int]) -> None:
    """Refuse, in one line naming the file's key, a latent attention the runtime cannot take:
    values are kv_lora_rank, q_lora_rank (0: none), qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim; names maps each to the file's key."""
    rank = values["kv_lora_rank"]
    if rank < 1:
        raise ColibriError(f"{where}: {names['kv_lora_rank']} must be at least 1 for latent attention, got {rank}")
    if rank > hidden:
        raise ColibriError(
            f"{where}: {names['kv_lora_rank']} {rank} is wider than the hidden size {hidden} "
            f"(a latent compresses the keys and values, it cannot be wider than what it compresses)"
        )
    if values["q_lora_rank"] > hidden:
        raise ColibriError(
            f"{where}: {names['q_lora_rank']} {values['q_lora_rank']} is wider than the hidden size {hidden}"
        )
    rope = values["qk_rope_head_dim"]
    if rope < 2 or rope % 2:
        raise ColibriError(f"{where}: {names['qk_rope_head_dim']} must be a positive even number, got {rope}")
    for key in ("qk_nope_head_dim", "v_head_dim"):
        if values[key] < 1:
            raise ColibriError(f"{where}: {names[key]} must be at least 1, got {values[key]}")


def latent_fields(values: dict[str, int], n_heads: int, score_scale: float) -> dict:
    """The ModelSpec's fields of a latent attention (check_latent's values): a query head is the
    non-rotated and the rotated parts side by side (head_dim), every query head its own "KV head"
    as far as the config's counts go (the cache holds one row for all: spec.layer_kv_dim)."""
    return dict(
        head_dim=values["qk_nope_head_dim"] + values["qk_rope_head_dim"],
        n_kv_heads=n_heads,
        rope_dim=values["qk_rope_head_dim"],
        kv_lora_rank=values["kv_lora_rank"],
        q_lora_rank=values["q_lora_rank"],
        qk_nope_head_dim=values["qk_nope_head_dim"],
        v_head_dim=values["v_head_dim"],
        attn_scale=score_scale,
    )


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude correction, 0.1 m ln(factor) + 1 (1 for factor <= 1), as DeepSeek defines it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def latent_score_scale(head_dim: int, factor: float, mscale_all_dim: float) -> float:
    """The softmax scale: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times mscale(factor,
    mscale_all_dim) squared where YaRN scales the RoPE and names mscale_all_dim (transformers'
    yarn_apply_mscale, llama.cpp's deepseek2 kq_scale)."""
    scale = head_dim**-0.5
    if mscale_all_dim:
        m = yarn_mscale(factor, mscale_all_dim)
        scale = scale * m * m
    return scale


def deinterleaved(width: int) -> list[int]:
    """The order rotate-half RoPE reads rows stored as interleaved pairs (x0, x1), (x2, x3), ...:
    the even rows, then the odd ones (a pair's two halves `width / 2` apart, as the tables rotate)."""
    return [*range(0, width, 2), *range(1, width, 2)]


def rope_row_order(period: int, rope: int, blocks: int, interleaved: bool) -> list[int]:
    """The rows of a matrix of `blocks` blocks of `period` rows whose last `rope` rows rotate (a
    query head, or the latent's projection), in the order the runtime takes them."""
    tail = deinterleaved(rope) if interleaved else list(range(rope))
    within = [*range(period - rope), *(period - rope + i for i in tail)]
    return [b * period + i for b in range(blocks) for i in within]
