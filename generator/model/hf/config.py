"""config.json (+ generation_config.json) -> ModelSpec, every field checked: typed accessors that
fail with the key's name, RoPE and its scalings, sliding windows, MoE, Qwen3.5's Gated DeltaNet and
Gemma 4's settings."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ...errors import ColibriError
from ...files import CONFIG_BYTES, check_json_nesting, read_text_limited
from ..family_blocks import Attention, Moe
from ..family_facts import (
    FAMILIES,
    Family,
    check_experts_per_token,
    check_kv_sharing,
    gemma_embed_scale,
    moe_beside_dense,
    router_fields,
)
from ..llama4 import hf_chunked_layers, hf_interleaved_moe
from ..spec import ModelSpec, RopeSpec
from .families import (
    ARCHITECTURES,
    GELU_TANH,
    GEMMA4_DEFAULT_ROPE,
    GEMMA4_UNSUPPORTED,
    ROPE_TYPES,
    TEXT_CONFIG_ARCHITECTURES,
)
from .granite import hf_granite_hybrid
from .latent import hf_latent, routed_layer_types
from .safetensors_io import strict_json

# The most layers a config.json may declare, said before anything is made per layer (a count of
# 10^9 took minutes and ended in a MemoryError): 8 x the deepest published model (Llama 3.1 405B's
# 126 layers), so a configuration without weights can still be planned at any real depth.
MAX_LAYERS = 1024


def read_json(path: Path, limit: int = CONFIG_BYTES) -> dict:
    """A model's JSON file (config.json, generation_config.json, the shard index) as an object,
    read within `limit` bytes and files.MAX_NESTING deep."""
    text = read_text_limited(path, limit, str(path))
    check_json_nesting(text, path.name)
    try:
        data = strict_json(text)
    except ValueError as e:
        raise ColibriError(f"{path.name}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ColibriError(f"{path.name}: expected a JSON object at the top level")
    return data


class _Config:
    """Typed accessors over config.json that fail with the key's name."""

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where

    def int(self, key: str, default=None, minimum: int = 1, maximum: int | None = None) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise ColibriError(f"{self.where}: missing required integer {key!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ColibriError(f"{self.where}: {key!r} must be an integer, got {json.dumps(value)}")
        if value < minimum:
            raise ColibriError(f"{self.where}: {key!r} must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ColibriError(f"{self.where}: {key!r} is {value:,}, more than the limit of {maximum:,}")
        return value

    def float(self, key: str, default=None, data: dict | None = None) -> float:
        value = (self.data if data is None else data).get(key, default)
        if value is None:
            raise ColibriError(f"{self.where}: missing required number {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ColibriError(f"{self.where}: {key!r} must be a finite number, got {json.dumps(value)}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ColibriError(f"{self.where}: {key!r} must be true or false, got {json.dumps(value)}")
        return value


def _token_ids(value, where: str, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ColibriError(f"{where}: {key!r} must be a token id or a list of token ids, got {json.dumps(value)}")
    return tuple(values)


def _rope_from(cfg: _Config, params: dict, theta: float, max_pos: int) -> RopeSpec:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ColibriError(f"{cfg.where}: unsupported rope type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    if theta <= 0:
        raise ColibriError(f"{cfg.where}: 'rope_theta' must be positive")
    if kind == "default":
        return RopeSpec(theta=theta)
    if kind == "proportional":  # Gemma 4's global layers: the first fraction of the pairs rotate
        fraction = cfg.float("partial_rotary_factor", 1.0, params)
        factor = cfg.float("factor", 1.0, params)
        if not 0 < fraction <= 1 or factor <= 0:
            raise ColibriError(
                f"{cfg.where}: proportional rope needs 0 < partial_rotary_factor <= 1 and a positive factor"
            )
        return RopeSpec(theta=theta, scaling="proportional", factor=factor, rotated_fraction=fraction)
    factor = cfg.float("factor", None, params)
    if factor <= 0:
        raise ColibriError(f"{cfg.where}: rope 'factor' must be positive")
    if kind == "linear":
        return RopeSpec(theta=theta, scaling="linear", factor=factor)
    if kind == "yarn":
        return _yarn(cfg, params, theta, factor)
    low = cfg.float("low_freq_factor", None, params)
    high = cfg.float("high_freq_factor", None, params)
    if not 0 < low <= high:  # (equal in Llama 4 Scout's config: no blended band, a step at original)
        raise ColibriError(f"{cfg.where}: llama3 rope needs 0 < low_freq_factor <= high_freq_factor")
    original = params.get("original_max_position_embeddings", max_pos)
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ColibriError(f"{cfg.where}: 'original_max_position_embeddings' must be a positive integer")
    return RopeSpec(
        theta=theta,
        scaling="llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )


def _yarn(cfg: _Config, params: dict, theta: float, factor: float) -> RopeSpec:
    """YaRN's parameters as transformers 5.24 reads them; the attention factor resolved here
    (attention_factor, else from mscale and mscale_all_dim, else 0.1 ln(factor) + 1)."""
    original = params.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ColibriError(f"{cfg.where}: yarn rope needs a positive integer 'original_max_position_embeddings'")
    beta_fast = cfg.float("beta_fast", 32.0, params)
    beta_slow = cfg.float("beta_slow", 1.0, params)
    if not (beta_fast > 0 and beta_slow > 0):
        raise ColibriError(f"{cfg.where}: yarn rope 'beta_fast' and 'beta_slow' must be positive")
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ColibriError(f"{cfg.where}: yarn rope 'truncate' must be true or false, got {json.dumps(truncate)}")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if params.get("attention_factor") is not None:
        attention = cfg.float("attention_factor", None, params)
    elif params.get("mscale") and params.get("mscale_all_dim"):
        attention = mscale(factor, cfg.float("mscale", None, params)) / mscale(
            factor, cfg.float("mscale_all_dim", None, params)
        )
    else:
        attention = mscale(factor)
    if attention <= 0:
        raise ColibriError(f"{cfg.where}: yarn rope 'attention_factor' must be positive")
    return RopeSpec(
        theta=theta,
        scaling="yarn",
        factor=factor,
        original_max_position_embeddings=original,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
        attention_factor=attention,
    )


def _rope(cfg: _Config, max_pos: int, default_theta: float = 10000.0) -> RopeSpec:
    """RoPE of (global) attention layers: transformers 5 `rope_parameters`, or legacy keys."""
    data = cfg.data
    params = data.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]  # per layer type (Gemma 3)
    if isinstance(params, dict):
        return _rope_from(cfg, params, cfg.float("rope_theta", default_theta, params), max_pos)
    params = data.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ColibriError(f"{cfg.where}: 'rope_scaling' must be an object or null")
    return _rope_from(cfg, params, cfg.float("rope_theta", default_theta), max_pos)


def _rope_local(cfg: _Config, max_pos: int) -> RopeSpec:
    """RoPE of Gemma 3's sliding-window layers: their own base, never scaled."""
    params = cfg.data.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        local = params["sliding_attention"]
        return _rope_from(cfg, local, cfg.float("rope_theta", 10000.0, local), max_pos)
    return RopeSpec(theta=cfg.float("rope_local_base_freq", 10000.0))


def _layer_windows(cfg: _Config, family: Family, n_layers: int) -> tuple[int, ...]:
    data = cfg.data
    window = data.get("sliding_window")
    layer_types = data.get("layer_types")
    attention = family.attention
    if attention.windows == "chunked":  # Llama 4's chunks (model/llama4.py)
        return hf_chunked_layers(cfg, n_layers).windows()
    if attention.windows == "none" or (attention.window_flag and not cfg.bool("use_sliding_window", False)):
        return (0,) * n_layers  # (their configs may carry a sliding_window, even 0, that is not used)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ColibriError(f"{cfg.where}: 'sliding_window' must be a positive integer or null")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise ColibriError(f"{cfg.where}: 'layer_types' must list one type per layer ({n_layers})")
        out = []
        for t in layer_types:
            if t == "full_attention":
                out.append(0)
            elif t == "sliding_attention":
                if window is None:
                    raise ColibriError(f"{cfg.where}: sliding_attention layers need 'sliding_window'")
                out.append(window)
            else:
                raise ColibriError(
                    f"{cfg.where}: unsupported layer type {t!r} (supported: full_attention, sliding_attention)"
                )
        return tuple(out)
    if window is None:
        return (0,) * n_layers
    if attention.windows == "pattern":
        pattern = data.get("sliding_window_pattern", data.get("_sliding_window_pattern", attention.window_period))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ColibriError(f"{cfg.where}: 'sliding_window_pattern' must be a positive integer")
        return tuple(0 if (i + 1) % pattern == 0 else window for i in range(n_layers))
    if attention.windows == "every_layer":
        return (window,) * n_layers
    if attention.windows == "alternating":  # gpt-oss without layer_types: even layers slide, odd ones see all
        return tuple(0 if (i + 1) % attention.window_period == 0 else window for i in range(n_layers))
    first = cfg.int("max_window_layers", n_layers, minimum=0)
    return tuple(window if i >= first else 0 for i in range(n_layers))


def _softcap(cfg: _Config, key: str) -> float:
    value = cfg.data.get(key)
    if value is None:
        return 0.0
    cap = cfg.float(key)
    if cap <= 0:
        raise ColibriError(f"{cfg.where}: {key!r} must be positive or null")
    return cap


def _attn_scale(cfg: _Config, attention: Attention, head_dim: int) -> float:
    """The score scale the attention block names (0: 1/sqrt(head_dim))."""
    if attention.score_scale == "one":  # (Gemma 4 normalises queries and keys and scores them unscaled)
        return 1.0
    if attention.score_scale == "query_pre_attn_scalar":
        return cfg.float("query_pre_attn_scalar", head_dim) ** -0.5
    return 0.0


def _moe(cfg: _Config, moe: Moe, n_layers: int) -> dict:
    """Mixture-of-experts settings: which layers route, to how many experts, how big they are."""
    if moe.placement == "first_k_dense":
        return _deepseek_moe(cfg, moe, n_layers)
    if moe.placement == "interleave":
        return hf_interleaved_moe(cfg, moe, n_layers)
    key = "num_local_experts" if "num_local_experts" in cfg.data else "num_experts"
    n_experts = cfg.int(key)
    top_k = cfg.int("num_experts_per_tok")
    check_experts_per_token(cfg.where, "num_experts_per_tok", top_k, n_experts)
    if moe.placement == "every_layer":
        # Mixtral, gpt-oss: every layer routes; experts have intermediate_size.
        return dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=cfg.int("intermediate_size"),
            norm_topk_prob=moe.renormalise == "always"
            or (moe.renormalise == "config" and cfg.bool("norm_topk_prob", False)),
            moe_layers=(True,) * n_layers,
            **router_fields(
                cfg.where, "num_experts_per_tok", top_k, moe, cfg.float("router_jitter_noise", moe.sparsemixer_jitter)
            ),
            router_bias=moe.biases,
            expert_biases=moe.biases,
        )
    step = cfg.int("decoder_sparse_step", 1)
    dense = cfg.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ColibriError(f"{cfg.where}: 'mlp_only_layers' must be a list of layer indices")
    shared = cfg.int("shared_expert_intermediate_size", 0, minimum=0) if moe.shared_expert else 0
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=cfg.int("moe_intermediate_size"),
        # (Qwen3.5's router always renormalises its top k: its config.json has no norm_topk_prob.)
        norm_topk_prob=moe.renormalise == "always"
        or (moe.renormalise == "config" and cfg.bool("norm_topk_prob", False)),
        shared_expert_intermediate_size=shared,
        moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers)),
    )


def _deepseek_moe(cfg: _Config, moe: Moe, n_layers: int) -> dict:
    """The DeepSeek line's MoE (V2, V3, GLM-4.x MoE): n_routed_experts of moe_intermediate_size, the
    first first_k_dense_replace layers dense and then every moe_layer_freq-th routed, n_shared_experts
    as one ungated MLP, the group limits, the routed scaling; multi-token-prediction layers counted."""
    n_experts = cfg.int(moe.hf_keys.get("n_routed_experts", "n_routed_experts"))
    top_k = cfg.int("num_experts_per_tok")
    check_experts_per_token(cfg.where, "num_experts_per_tok", top_k, n_experts)
    first = cfg.int(moe.hf_keys.get("first_k_dense_replace", "first_k_dense_replace"), 0, minimum=0)
    freq = cfg.int("moe_layer_freq", 1)
    grouped = moe.groups == "always"
    if moe.groups == "topk_method":
        method = cfg.data.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ColibriError(
                f"{cfg.where}: unsupported topk_method {json.dumps(method)} (supported: greedy, group_limited_greedy)"
            )
        grouped = method == "group_limited_greedy"
    n_group = cfg.int("n_group", 1) if grouped and cfg.data.get("n_group") is not None else 1
    topk_group = cfg.int("topk_group", n_group) if n_group > 1 else 1
    groups, used = moe.route_groups(
        cfg.where, n_experts, top_k, n_group, topk_group, ("n_group", "topk_group", "num_experts_per_tok")
    )
    scaling = cfg.float("routed_scaling_factor", 1.0) if moe.routed_scaling else 1.0
    if scaling <= 0:
        raise ColibriError(f"{cfg.where}: 'routed_scaling_factor' must be positive, got {scaling}")
    fe = cfg.int("moe_intermediate_size")
    shared = cfg.int("n_shared_experts", 0, minimum=0)
    mtp_key = "num_mtp_layers" if "num_mtp_layers" in cfg.data else moe.mtp_key
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=fe,
        norm_topk_prob=moe.renormalise == "always"
        or (moe.renormalise == "config" and cfg.bool("norm_topk_prob", False)),
        shared_expert_intermediate_size=fe * shared,
        ungated_shared_expert=shared > 0,
        moe_layers=tuple(i >= first and i % freq == 0 for i in range(n_layers)),
        router=moe.router,
        router_choice_bias=moe.router == "sigmoid" and cfg.bool("use_expert_bias", True),
        router_norm_eps=moe.norm_eps,
        expert_groups=groups,
        expert_groups_used=used,
        routed_scaling=scaling,
        mtp_layers=cfg.int(mtp_key, 0, minimum=0, maximum=MAX_LAYERS) if mtp_key else 0,
    )


def _rotary_dim(cfg: _Config, head_dim: int, default: float) -> int:
    """The leading dims of a head RoPE rotates (partial_rotary_factor, in rope_parameters or at the
    top level; `default` where neither names it); 0: all of them."""
    data = cfg.data
    params = data.get("rope_parameters")
    factor = cfg.float("partial_rotary_factor", data.get("partial_rotary_factor", default), params or {})
    rope_dim = int(head_dim * factor)
    if not 0 < factor <= 1 or rope_dim < 2 or rope_dim % 2:
        raise ColibriError(
            f"{cfg.where}: partial_rotary_factor {factor} must rotate an even number of head_dim's {head_dim} dims"
        )
    return 0 if rope_dim == head_dim else rope_dim


def _hybrid_linear(cfg: _Config, family: Family, n_layers: int, head_dim: int) -> dict:
    """Qwen3.5's Gated DeltaNet settings: which layers are linear attention (layer_types, or every
    full_attention_interval-th layer full attention), the DeltaNet heads and convolution, the
    partial RoPE of its full-attention layers and their output gate."""
    data = cfg.data
    layer_types = data.get("layer_types")
    if layer_types is None:
        interval = cfg.int("full_attention_interval", 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    _check_layer_types(cfg, family, layer_types, n_layers)
    if "full_attention" not in layer_types:
        raise ColibriError(f"{cfg.where}: 'layer_types' has no full_attention layer (at least one is supported)")
    k_heads = cfg.int("linear_num_key_heads")
    v_heads = cfg.int("linear_num_value_heads")
    if v_heads % k_heads:
        raise ColibriError(
            f"{cfg.where}: linear_num_value_heads {v_heads} is not a multiple of linear_num_key_heads {k_heads}"
        )
    return dict(
        linear_layers=tuple(t == "linear_attention" for t in layer_types),
        linear_k_heads=k_heads,
        linear_v_heads=v_heads,
        linear_k_dim=cfg.int("linear_key_head_dim"),
        linear_v_dim=cfg.int("linear_value_head_dim"),
        linear_conv_kernel=cfg.int("linear_conv_kernel_dim"),
        attn_output_gate=True,
        rope_dim=_rotary_dim(cfg, head_dim, 1.0),
    )


def _check_layer_types(cfg: _Config, family: Family, layer_types, n_layers: int) -> None:
    """layer_types lists one of the family's layer kinds per layer."""
    kinds = tuple(family.layers)
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise ColibriError(f"{cfg.where}: 'layer_types' must list one type per layer ({n_layers})")
    for t in layer_types:
        if t not in kinds:
            raise ColibriError(f"{cfg.where}: unsupported layer type {json.dumps(t)} (supported: {', '.join(kinds)})")


def _short_conv(cfg: _Config, family: Family, n_layers: int) -> dict:
    """LFM2's layer kinds (layer_types, or full_attn_idxs: those attend, the others convolve) and
    its convolution's taps (conv_L_cache); the convolution without biases."""
    data = cfg.data
    layer_types = data.get("layer_types")
    if layer_types is None:
        full = data.get("full_attn_idxs")
        full = list(range(n_layers)) if full is None else full
        if not isinstance(full, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in full):
            raise ColibriError(f"{cfg.where}: 'full_attn_idxs' must be a list of layer indices")
        layer_types = ["full_attention" if i in full else "conv" for i in range(n_layers)]
    _check_layer_types(cfg, family, layer_types, n_layers)
    if cfg.bool("conv_bias", False):
        raise ColibriError(f"{cfg.where}: 'conv_bias' true (biases in the short convolution) is not supported")
    return dict(
        short_conv_layers=tuple(t == "conv" for t in layer_types),
        short_conv_kernel=cfg.int("conv_L_cache", 3),
    )


def _block_ffn_width(cfg: _Config) -> int:
    """LFM2's FFN width as Lfm2MLP makes it: intermediate_size (block_ff_dim); with
    block_auto_adjust_ff_dim 2/3 of it, and with a block_ffn_dim_multiplier that times it, rounded up
    to a multiple of block_multiple_of."""
    width = cfg.int("block_ff_dim" if "block_ff_dim" in cfg.data else "intermediate_size")
    if not cfg.bool("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    if cfg.data.get("block_ffn_dim_multiplier") is not None:  # (transformers rounds only then)
        width = int(cfg.float("block_ffn_dim_multiplier") * width)
        multiple = cfg.int("block_multiple_of", 256)
        width = multiple * ((width + multiple - 1) // multiple)
    if width < 1:
        raise ColibriError(f"{cfg.where}: the adjusted FFN width is {width} (block_ffn_dim_multiplier too small)")
    return width


# A layer's kind as config.json's layer_types names it, by whether it slides.
LAYER_TYPES = {True: "sliding_attention", False: "full_attention"}


def _gemma4(cfg: _Config, family: Family, n_layers: int, windows: tuple[int, ...], vocab: int) -> dict:
    """Gemma 4's settings beyond Gemma 3's: the global layers' head width and KV heads
    (per_layer_config as transformers saves it, or global_head_dim and num_global_key_value_heads),
    keys equal to values there, the per-layer inputs, the MoE block beside the dense FFN. Refuses
    what is not supported, by name."""
    data = cfg.data
    for key, (supported, what) in GEMMA4_UNSUPPORTED.items():
        if data.get(key, supported) != supported:
            raise ColibriError(f"{cfg.where}: {key!r} = {json.dumps(data[key])} ({what}) is not supported")
    k_eq_v = cfg.bool("attention_k_eq_v", False)
    head_dim = cfg.int("head_dim")
    per_layer = data.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, dict):
            raise ColibriError(f"{cfg.where}: 'per_layer_config' must be an object of layer overrides")
        overrides = set()
        for key, value in per_layer.items():
            if not (isinstance(key, str) and key.isdigit() and int(key) < n_layers) or not isinstance(value, dict):
                raise ColibriError(f"{cfg.where}: 'per_layer_config' key {json.dumps(key)} is not a layer index")
            if windows[int(key)] or set(value) - {"head_dim", "num_key_value_heads"}:
                raise ColibriError(
                    f"{cfg.where}: 'per_layer_config' supports head_dim and num_key_value_heads of full_attention "
                    f"layers only (layer {key})"
                )
            overrides.add(json.dumps(value, sort_keys=True))
        if len(overrides) > 1:
            raise ColibriError(f"{cfg.where}: 'per_layer_config' must give every full_attention layer the same shape")
        one = json.loads(overrides.pop()) if overrides else {}
        global_head_dim = _Config(one, f"{cfg.where} per_layer_config").int("head_dim", head_dim)
        global_kv = _Config(one, f"{cfg.where} per_layer_config").int("num_key_value_heads", 0, minimum=0)
    else:
        global_head_dim = cfg.int("global_head_dim", 512)
        global_kv = cfg.int("num_global_key_value_heads", 0, minimum=0) if k_eq_v else 0
    n_heads = cfg.int("num_attention_heads")
    if global_head_dim % 2:
        raise ColibriError(f"{cfg.where}: global head_dim {global_head_dim} must be even for rotary embeddings")
    if global_kv and n_heads % global_kv:
        raise ColibriError(
            f"{cfg.where}: num_attention_heads {n_heads} is not divisible by the global layers' {global_kv} KV heads"
        )
    ple = data.get("hidden_size_per_layer_input") or 0
    if ple:
        ple = cfg.int("hidden_size_per_layer_input")
        if cfg.int("vocab_size_per_layer_input", vocab) != vocab:
            raise ColibriError(f"{cfg.where}: 'vocab_size_per_layer_input' must equal vocab_size ({vocab})")
    moe = {}
    if cfg.bool("enable_moe_block", False):
        n_experts = cfg.int("num_experts")
        top_k = cfg.int("top_k_experts")
        check_experts_per_token(cfg.where, "top_k_experts", top_k, n_experts)
        moe = moe_beside_dense(family.moe, n_experts, top_k, cfg.int("moe_intermediate_size"), n_layers)
    shared = cfg.int("num_kv_shared_layers", 0, minimum=0)
    check_kv_sharing(cfg.where, "num_kv_shared_layers", shared, windows, lambda sliding: LAYER_TYPES[sliding])
    return dict(
        kv_shared_layers=shared,
        double_wide_mlp=cfg.bool("use_double_wide_mlp", False) and shared > 0,
        global_head_dim=0 if global_head_dim == head_dim else global_head_dim,
        global_kv_heads=0 if global_kv in (0, cfg.int("num_key_value_heads")) else global_kv,
        k_eq_v=k_eq_v,
        v_norm=True,
        ple_dim=ple,
        layer_scalars=True,
        **moe,
    )


def parse_config(data: dict, name: str, generation: dict | None = None) -> ModelSpec:
    """config.json (+ optional generation_config.json) -> ModelSpec, with every field checked."""
    cfg = _Config(data, "config.json")
    archs = data.get("architectures")
    supported = ", ".join(ARCHITECTURES)
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise ColibriError(f"config.json: 'architectures' must name one architecture (supported: {supported})")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ColibriError(f"unsupported architecture {arch!r} (supported: {supported})")
    family_name = ARCHITECTURES[arch]
    family = FAMILIES[family_name]
    attention = family.attention
    if arch in TEXT_CONFIG_ARCHITECTURES:
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise ColibriError(f"config.json: {arch} needs a 'text_config' object")
        cfg = _Config(text, "config.json text_config")
        data = text

    for key, (supported, what) in family.hf_unsupported.items():
        if data.get(key, supported) != supported:
            raise ColibriError(f"{cfg.where}: {key!r} = {json.dumps(data[key])} ({what}) is not supported for {arch}")
    hidden = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    n_kv = cfg.int("num_key_value_heads", n_heads)
    latent = {}
    if family.latent:  # (config.json's head_dim is then the RoPE key's width: the latent's fields say)
        latent = hf_latent(cfg, family.latent, hidden, n_heads)
        n_kv = latent.pop("n_kv_heads")
    head_dim = latent.pop("head_dim", None) or data.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise ColibriError(f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {n_heads}")
        head_dim = hidden // n_heads
    elif not latent:
        head_dim = cfg.int("head_dim")
    if n_heads % n_kv:
        raise ColibriError(f"config.json: num_attention_heads {n_heads} is not divisible by num_key_value_heads {n_kv}")
    if head_dim % 2:
        raise ColibriError(f"config.json: head_dim {head_dim} must be even for rotary embeddings")
    if family.ffn.activation == "gelu_tanh":
        act = data.get("hidden_activation", data.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in GELU_TANH:
            raise ColibriError(
                f"config.json: unsupported hidden_activation {act!r} for {arch} (supported: {', '.join(GELU_TANH)})"
            )
        activation = "gelu_tanh"
    else:
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ColibriError(f"config.json: unsupported hidden_act {act!r} for {arch} (supported: silu)")
        activation = "silu"
    swiglu = {}
    if family.ffn.swiglu:
        activation = "swiglu_clamped"
        alpha, limit = family.ffn.swiglu
        swiglu = dict(swiglu_alpha=cfg.float("swiglu_alpha", alpha), swiglu_limit=cfg.float("swiglu_limit", limit))
        if swiglu["swiglu_limit"] <= 0:
            raise ColibriError(f"config.json: 'swiglu_limit' must be positive, got {swiglu['swiglu_limit']}")
    if not attention.partial_rotary and data.get("partial_rotary_factor", 1.0) != 1.0:
        raise ColibriError("config.json: partial_rotary_factor other than 1.0 is not supported")
    n_layers = cfg.int("num_hidden_layers", maximum=MAX_LAYERS)
    max_pos = cfg.int("max_position_embeddings", 2048)
    eps_key = family.norms.hf_eps_key
    eps = cfg.float(eps_key, 1e-6)
    if not 0 < eps < 1:
        raise ColibriError(f"config.json: {eps_key!r} must be between 0 and 1")

    attention_bias = cfg.bool("attention_bias", False)
    qkv_bias = True if attention.qkv_bias == "always" else attention_bias
    o_bias = False if attention.o_bias == "never" else attention_bias
    mlp_bias = cfg.bool("mlp_bias", False) if family.ffn.mlp_bias else False

    bos = _token_ids(data.get("bos_token_id"), "config.json", "bos_token_id")
    eos = _token_ids(data.get("eos_token_id"), "config.json", "eos_token_id")
    if generation:
        if "bos_token_id" in generation:
            bos = _token_ids(generation["bos_token_id"], "generation_config.json", "bos_token_id") or bos
        if "eos_token_id" in generation:
            eos = _token_ids(generation["eos_token_id"], "generation_config.json", "eos_token_id") or eos
    vocab = cfg.int("vocab_size")
    for t in bos + eos:
        if t >= vocab:
            raise ColibriError(f"config.json: special token id {t} is outside the vocabulary ({vocab})")
    windows = _layer_windows(cfg, family, n_layers)
    gemma4 = _gemma4(cfg, family, n_layers, windows, vocab) if family.gemma4_layers else {}
    moe = (
        _moe(cfg, family.moe, n_layers)
        if family.moe and family.moe.placement != "beside_dense" and not family.granite_multipliers
        else {}
    )
    if family.moe and family.moe.layer_types_key:
        moe["moe_layers"] = routed_layer_types(cfg, family.moe.layer_types_key, n_layers)

    spec = ModelSpec(
        name=name,
        architecture=arch,
        family=family_name,
        vocab_size=vocab,
        hidden_size=hidden,
        # (Qwen3.5 has no dense FFN: every layer routes, and its config.json no intermediate_size.)
        intermediate_size=_block_ffn_width(cfg)
        if family.ffn.block_sizing
        else cfg.int(family.ffn.hf_width_key, data.get("moe_intermediate_size") if not family.ffn.dense else None),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope=(
            GEMMA4_DEFAULT_ROPE
            if family.gemma4_layers and data.get("rope_parameters") is None
            else _rope(cfg, max_pos, family.default_theta)
        ),
        max_position_embeddings=max_pos,
        tie_embeddings=cfg.bool("tie_word_embeddings", family.tie_embeddings),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=attention.qk_norm or (attention.qk_norm_flag and cfg.bool("use_qk_norm", False)),
        layer_windows=windows,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=eos,
        activation=activation,
        embed_scale=gemma_embed_scale(hidden) if family.embed_scale == "sqrt_hidden" else 1.0,
        attn_scale=latent.pop("attn_scale") if latent else _attn_scale(cfg, attention, head_dim),
        post_norms=family.norms.sandwich,
        rope_local=_rope_local(cfg, max_pos) if attention.local_rope else None,
        # (Gemma 3 configs may carry attn_logit_softcapping, but transformers' Gemma 3 never applies it.)
        # transformers applies final_logit_softcapping in Gemma3ForCausalLM, not in the multimodal class.
        final_softcap=_softcap(cfg, "final_logit_softcapping") if arch != "Gemma3ForConditionalGeneration" else 0.0,
        **moe,
        **gemma4,
        **(_hybrid_linear(cfg, family, n_layers, head_dim) if family.deltanet else {}),
        **(_short_conv(cfg, family, n_layers) if family.short_conv else {}),
        attn_sinks=attention.sinks,
        **swiglu,
        **latent,
        **(
            dict(rope_dim=_rotary_dim(cfg, head_dim, attention.rotary_fraction))
            if attention.partial_rotary and not family.deltanet
            else {}
        ),
        qk_norm_whole=attention.qk_norm_whole,
        layer_norm=family.norms.layer_norm,
        lm_head_bias=family.lm_head_bias and cfg.bool("lm_head_bias", False),
        **(hf_chunked_layers(cfg, n_layers).fields() if attention.windows == "chunked" else {}),
    )
    return (
        replace(spec, **hf_granite_hybrid(cfg, family, spec, _check_layer_types))
        if family.granite_multipliers
        else spec
    )
