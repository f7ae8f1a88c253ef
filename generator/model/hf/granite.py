"""Granite 4.0 hybrid's config.json keys and fused tensors (GraniteMoeHybridForCausalLM): its
Mamba-2 layers, its multipliers, RoPE only where position_embedding_type says, the shared MLP (the
whole FFN of a dense model, beside the experts of a MoE one) and the experts, each in one fused
tensor of gate and up rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ...errors import ColibriError
from ..family_blocks import Mamba2
from ..family_facts import FAMILIES, Family, check_experts_per_token
from ..mamba2_block import mamba2_fields
from ..spec import ModelSpec, RopeSpec
from .safetensors_io import TensorInfo
from .views import HfFusedSlice, HfTensor

# RoPE that rotates nothing (every frequency 0: cos 1, sin 0, the rotation the identity, exactly):
# attention without position embeddings.
NO_ROPE = dict(scaling="proportional", rotated_fraction=0.0)


def _dt_limit(cfg: Any) -> tuple[float, float]:
    """time_step_limit: [low, high], high possibly infinite (transformers writes it as
    {"__float__": "Infinity"}): (low, high), high 0 for no limit."""
    limit = cfg.data.get("time_step_limit", [0.0, {"__float__": "Infinity"}])
    if limit is None:
        return 0.0, 0.0
    if not isinstance(limit, list) or len(limit) != 2:
        raise ColibriError(f"{cfg.where}: 'time_step_limit' must be [low, high], got {json.dumps(limit)}")
    low = cfg.float("low", data={"low": limit[0]})
    high = 0.0 if limit[1] == {"__float__": "Infinity"} else cfg.float("high", data={"high": limit[1]})
    if low < 0 or (high and high <= low):
        raise ColibriError(f"{cfg.where}: 'time_step_limit' {json.dumps(limit)} must be 0 <= low < high")
    return low, high


def _positive(cfg: Any, key: str) -> float:
    value = cfg.float(key, 1.0)
    if value <= 0:
        raise ColibriError(f"{cfg.where}: {key!r} must be positive, got {value}")
    return value


def hf_granite_hybrid(cfg: Any, family: Family, spec: ModelSpec, check_layer_types: Callable) -> dict:
    """The fields config.json's Granite keys set over the common ones `spec` holds (layer_types
    checked by config.py's check_layer_types)."""
    data, n_layers, hidden = cfg.data, spec.n_layers, spec.hidden_size
    layer_types = data.get("layer_types", ["mamba"] * n_layers)
    check_layer_types(cfg, family, layer_types, n_layers)
    for key, value in (("mamba_conv_bias", True), ("mamba_proj_bias", False)):
        if cfg.bool(key, value) != value:
            raise ColibriError(f"{cfg.where}: {key!r} {json.dumps(not value)} is not supported")
    inner = cfg.int("mamba_expand", 2) * hidden
    heads = cfg.int("mamba_n_heads", 128)
    mamba = mamba2_fields(
        cfg.where,
        inner,
        heads,
        cfg.int("mamba_n_groups", 1),
        cfg.int("mamba_d_state", 256),
        cfg.int("mamba_d_conv", 4),
        ("mamba_n_heads", "mamba_n_groups"),
    )
    head_dim = data.get("mamba_d_head", "auto")
    if head_dim != "auto" and cfg.int("mamba_d_head") * heads != inner:
        raise ColibriError(
            f"{cfg.where}: mamba_d_head {head_dim} x mamba_n_heads {heads} is not the inner width {inner}"
        )
    position = data.get("position_embedding_type")
    if position not in (None, "rope", "nope"):
        raise ColibriError(
            f"{cfg.where}: unsupported position_embedding_type {json.dumps(position)} (supported: rope, null)"
        )
    low, high = _dt_limit(cfg)
    shared = cfg.int("shared_intermediate_size", 1024)
    n_experts = cfg.int("num_local_experts", 8, minimum=0)
    moe: dict = dict(n_experts=0, experts_per_token=0, expert_intermediate_size=0, moe_layers=())
    if n_experts:
        top_k = cfg.int("num_experts_per_tok", 2)
        check_experts_per_token(cfg.where, "num_experts_per_tok", top_k, n_experts)
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=cfg.int("intermediate_size"),
            moe_layers=(True,) * n_layers,
            router="topk_then_softmax",
            shared_expert_intermediate_size=shared,
            ungated_shared_expert=True,
        )
    return dict(
        intermediate_size=shared,
        rope=spec.rope if position == "rope" else RopeSpec(theta=spec.rope.theta, **NO_ROPE),  # type: ignore[arg-type]
        embed_scale=_positive(cfg, "embedding_multiplier"),
        attn_scale=_positive(cfg, "attention_multiplier"),
        residual_scale=_positive(cfg, "residual_multiplier"),
        logits_scaling=_positive(cfg, "logits_scaling"),
        mamba_layers=tuple(isinstance(family.layers[t], Mamba2) for t in layer_types),
        mamba_dt_min=low,
        mamba_dt_max=high,
        **mamba,
        **moe,
    )


def _shape_checked(info: TensorInfo, shape: tuple[int, ...]) -> None:
    if info.shape != shape:
        raise ColibriError(f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(shape)}")


def granite_parts(hf_name: str, path: Path, info: TensorInfo, spec: ModelSpec) -> dict | None:
    """The canonical tensors of one of Granite's fused or transformed tensors, or None when hf_name
    is not one: the shared MLP's input_linear (gate rows, then up; the dense FFN's w_gate and w_up
    without experts, shared.* with them) and output_linear, the experts' stacked input_linear and
    output_linear, a Mamba-2 layer's conv1d taps (flat) and A_log (as A = -exp(A_log))."""
    if not FAMILIES[spec.family].mamba2 or not hf_name.startswith("model.layers."):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    p, d = f"layers.{index}.", spec.hidden_size
    shared = "shared." if spec.n_experts else ""
    s, n, fe = spec.intermediate_size, spec.n_experts, spec.expert_intermediate_size
    if part == "shared_mlp.input_linear.weight":
        _shape_checked(info, (2 * s, d))
        return {
            f"{p}{shared}w_gate": HfTensor(path, info, row_period=2 * s, row_first=0, row_count=s),
            f"{p}{shared}w_up": HfTensor(path, info, row_period=2 * s, row_first=s, row_count=s),
        }
    if part == "shared_mlp.output_linear.weight":
        _shape_checked(info, (d, s))
        return {f"{p}{shared}w_down": HfTensor(path, info)}
    if part == "block_sparse_moe.input_linear.weight" and n:
        _shape_checked(info, (n, 2 * fe, d))
        out = {}
        for e in range(n):
            out[f"{p}experts.{e}.w_gate"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=0)
            out[f"{p}experts.{e}.w_up"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=1)
        return out
    if part == "block_sparse_moe.output_linear.weight" and n:
        _shape_checked(info, (n, d, fe))
        return {f"{p}experts.{e}.w_down": HfFusedSlice(path, info, (d, fe), e, None, False) for e in range(n)}
    if not spec.is_mamba(int(index)):
        return None
    if part == "mamba.conv1d.weight":
        _shape_checked(info, (spec.mamba_conv_dim, 1, spec.mamba_conv_kernel))
        return {p + "ssm_conv": HfTensor(path, info, flat=True)}
    if part == "mamba.A_log":
        _shape_checked(info, (spec.mamba_heads,))
        return {p + "ssm_a": HfTensor(path, info, neg_exp=True)}
    return None
