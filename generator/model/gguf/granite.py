"""llama.cpp's granitehybrid keys (Granite 4.0 hybrid): the Mamba-2 layers (ssm.*; a layer with no
KV heads is a Mamba-2 layer), the multipliers (embedding_scale, attention.scale, residual_scale,
logit_scale), RoPE only where rope.scaling.finetuned says (the converter writes it false for the
hybrids: no RoPE), the shared MLP (the whole FFN without experts, beside them with) and the experts;
the shapes llama.cpp stores a Mamba-2 layer's vectors in."""

from __future__ import annotations

from typing import Any

from ...errors import ColibriError
from ..family_facts import check_experts_per_token
from ..mamba2_block import mamba2_fields
from ..spec import ModelSpec, RopeSpec

# Attention without position embeddings: RoPE that rotates nothing (hf/granite.py says why).
NO_ROPE = dict(scaling="proportional", rotated_fraction=0.0)


def _positive(meta: Any, key: str, default: float) -> float:
    value = meta.float(key, default)
    if value <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.{key}' must be positive, got {value}")
    return value


def gguf_granite_hybrid(meta: Any, spec: ModelSpec, kv_absent: tuple[bool, ...]) -> dict:
    """The fields llama.cpp's granitehybrid keys set over the common ones `spec` holds; kv_absent:
    per layer, whether head_count_kv gives it no KV heads (a Mamba-2 layer)."""
    tensors, n_layers = meta.gguf.tensors, spec.n_layers
    mamba = mamba2_fields(
        meta.where,
        meta.int("ssm.inner_size"),
        meta.int("ssm.time_step_rank"),
        meta.int("ssm.group_count"),
        meta.int("ssm.state_size"),
        meta.int("ssm.conv_kernel"),
        ("ssm.time_step_rank", "ssm.group_count"),
    )
    shared = meta.int("expert_shared_feed_forward_length")
    n_experts = meta.int("expert_count", 0, minimum=0)
    moe: dict = dict(n_experts=0, experts_per_token=0, expert_intermediate_size=0, moe_layers=())
    if n_experts:
        top_k = meta.int("expert_used_count")
        check_experts_per_token(meta.where, "expert_used_count", top_k, n_experts)
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=meta.int("feed_forward_length"),
            moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layers)),
            router="topk_then_softmax",
            shared_expert_intermediate_size=shared,
            ungated_shared_expert=True,
        )
    rope = spec.rope if meta.bool("rope.scaling.finetuned", False) else RopeSpec(theta=spec.rope.theta, **NO_ROPE)  # type: ignore[arg-type]
    return dict(
        intermediate_size=shared,
        rope=rope,
        embed_scale=_positive(meta, "embedding_scale", 1.0),
        attn_scale=meta.float("attention.scale", 0.0),
        residual_scale=_positive(meta, "residual_scale", 1.0),
        logits_scaling=_positive(meta, "logit_scale", 1.0),
        mamba_layers=kv_absent,
        **mamba,
        **moe,
    )


def mamba2_file_shape(spec: ModelSpec, canonical: str) -> tuple[int, ...] | None:
    """The shape llama.cpp stores a Mamba-2 layer's vectors in (None: not one): the taps
    [channels, kernel], A and D [heads, 1], the norm [groups, inner / groups]."""
    part = canonical.rsplit(".", 1)[-1]
    if part == "ssm_conv":
        return (spec.mamba_conv_dim, spec.mamba_conv_kernel)
    if part in ("ssm_a", "ssm_d"):
        return (spec.mamba_heads, 1)
    if part == "ssm_norm":
        return (spec.mamba_groups, spec.mamba_inner // spec.mamba_groups)
    return None
