"""GGUF metadata (+ which tensors exist) -> ModelSpec, every field checked: typed accessors over
llama.cpp's keys (`{arch}.block_count`, ...) that fail with the key's name, RoPE and its scalings,
sliding windows, special tokens, MoE, Qwen3.5's Gated DeltaNet and Gemma 4's settings.

Floats in the metadata are float32; each is read back as the shortest decimal that rounds to
the same float32 (1e-05, not 9.99999974738e-06), which is what the checkpoint's config said.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ...errors import ColibriError
from ..family_facts import (
    Family,
    check_experts_per_token,
    check_kv_sharing,
    gemma_embed_scale,
    moe_beside_dense,
    router_fields,
)
from ..llama4 import gguf_chunked_layers, interleaved_moe
from ..spec import ModelSpec, RopeSpec
from .archs import arch_of
from .file import GgufFile
from .granite import gguf_granite_hybrid
from .latent import gguf_latent
from .names import GEMMA4_ROPE_FREQS, LAYER_NAME
from .rope_freqs import ROPE_FREQS, llama3_rope
from .tensors import rows_f32

# The most routed experts a layer may have (the largest published MoE models have 512; 4,096 leaves
# room and keeps every per-expert table small).
MAX_EXPERTS = 4096


ROPE_SCALINGS = ("none", "linear", "yarn")


# llama.cpp's end-of-generation tokens by their text, for files whose eos_token_id is something else.
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>")


class _Meta:
    """Typed accessors over the metadata that fail with the key's name."""

    def __init__(self, gguf: GgufFile, arch: str):
        self.gguf, self.arch, self.where = gguf, arch, gguf.path.name

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.gguf.metadata

    def _get(self, key, default, full: bool = False):
        name = key if full else f"{self.arch}.{key}"
        value = self.gguf.metadata.get(name, default)
        return name, value

    def int(self, key: str, default=None, minimum: int = 1, full: bool = False) -> int:
        name, value = self._get(key, default, full)
        if value is None:
            raise ColibriError(f"{self.where}: missing metadata {name!r}")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ColibriError(f"{self.where}: metadata {name!r} must be an integer, got {_show(value)}")
        if value < minimum:
            raise ColibriError(f"{self.where}: metadata {name!r} must be at least {minimum}, got {value}")
        return int(value)

    def float(self, key: str, default=None) -> float:
        name, value = self._get(key, default)
        if value is None:
            raise ColibriError(f"{self.where}: missing metadata {name!r}")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ColibriError(f"{self.where}: metadata {name!r} must be a finite number, got {_show(value)}")
        if self.gguf.value_types.get(name) == "FLOAT32":
            return float(str(np.float32(value)))  # the decimal the converter was given
        return float(value)

    def str(self, key: str, default=None, full: bool = False) -> str | None:
        name, value = self._get(key, default, full)
        if value is not None and not isinstance(value, str):
            raise ColibriError(f"{self.where}: metadata {name!r} must be a string, got {_show(value)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        name, value = self._get(key, default)
        if not isinstance(value, bool):
            raise ColibriError(f"{self.where}: metadata {name!r} must be true or false, got {_show(value)}")
        return value


def _show(value) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _yarn(meta: _Meta, theta: float, truncate: bool, latent: bool = False) -> RopeSpec:
    """YaRN from llama.cpp's keys, the attention factor resolved as transformers does when the file
    has none (0.1 ln(factor) + 1). deepseek2's log multiplier is latent attention's (its softmax
    scale: gguf/latent.py), its mscale and mscale_all_dim equal (every DeepSeek config's): factor 1."""
    factor = meta.float("rope.scaling.factor")
    if factor <= 0:
        raise ColibriError(f"{meta.where}: rope scaling factor must be positive, got {factor}")
    log_mul = meta.has("rope.scaling.yarn_log_multiplier")
    if log_mul and not latent:
        raise ColibriError(f"{meta.where}: yarn rope with a log multiplier (mscale) is not supported")
    beta_fast = meta.float("rope.scaling.yarn_beta_fast", 32.0)
    beta_slow = meta.float("rope.scaling.yarn_beta_slow", 1.0)
    if not (beta_fast > 0 and beta_slow > 0):
        raise ColibriError(f"{meta.where}: yarn rope beta_fast and beta_slow must be positive")
    if meta.has("rope.scaling.yarn_attn_factor"):
        attention = meta.float("rope.scaling.yarn_attn_factor")
    elif log_mul:
        attention = 1.0
    else:
        attention = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    if attention <= 0:
        raise ColibriError(f"{meta.where}: yarn attention factor must be positive, got {attention}")
    return RopeSpec(
        theta=theta,
        scaling="yarn",
        factor=factor,
        original_max_position_embeddings=meta.int("rope.scaling.original_context_length"),
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
        attention_factor=attention,
    )


def _rope(meta: _Meta, theta_default: float, yarn_truncate: bool = True, latent: bool = False) -> RopeSpec:
    theta = meta.float("rope.freq_base", theta_default)
    if theta <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.rope.freq_base' must be positive")
    if ROPE_FREQS in meta.gguf.tensors:  # llama3 scaling, its parameters read back from the divisors
        heads_width = meta.int("embedding_length") // max(1, meta.int("attention.head_count"))
        dims = meta.int("rope.dimension_count", meta.int("attention.key_length", heads_width))
        info = meta.gguf.tensors[ROPE_FREQS]
        return llama3_rope(info.shape, lambda: rows_f32(meta.gguf.path, info, weights=False), theta, dims, meta.where)
    kind = meta.str("rope.scaling.type", "none")
    if kind not in ROPE_SCALINGS:
        raise ColibriError(f"{meta.where}: unsupported rope scaling {kind!r} (supported: {', '.join(ROPE_SCALINGS)})")
    if kind == "yarn":
        return _yarn(meta, theta, yarn_truncate, latent)
    factor = meta.float("rope.scaling.factor", 0.0) if kind == "linear" else 0.0
    if kind == "none" and meta.has("rope.scale_linear"):
        factor = meta.float("rope.scale_linear")  # older files
    if factor and factor != 1.0:
        if factor <= 0:
            raise ColibriError(f"{meta.where}: rope scaling factor must be positive, got {factor}")
        return RopeSpec(theta=theta, scaling="linear", factor=factor)
    if kind == "linear" and not factor:
        raise ColibriError(f"{meta.where}: linear rope scaling without '{meta.arch}.rope.scaling.factor'")
    return RopeSpec(theta=theta)


def _windows(meta: _Meta, n_layers: int, default_pattern: int) -> tuple[int, ...]:
    """Per layer: its window, or 0. default_pattern: llama.cpp's pattern for the architecture (Gemma 3
    6: every sixth layer global; gpt-oss 2: odd layers global; 0: every layer slides)."""
    if not meta.has("attention.sliding_window"):
        return (0,) * n_layers
    window = meta.int("attention.sliding_window", minimum=0)
    if window == 0:
        return (0,) * n_layers
    if not default_pattern:
        return (window,) * n_layers  # (Mistral-style: every layer)
    pattern = meta.gguf.metadata.get(f"{meta.arch}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, (np.ndarray, list)):
        if not (isinstance(pattern, np.ndarray) and pattern.dtype == np.bool_) or len(pattern) != n_layers:
            raise ColibriError(
                f"{meta.where}: {meta.arch}.attention.sliding_window_pattern must be one boolean per layer "
                f"({n_layers}), got {len(pattern)} values"
            )
        return tuple(window if sliding else 0 for sliding in pattern.tolist())
    pattern = meta.int("attention.sliding_window_pattern", default_pattern)
    return tuple(0 if (i + 1) % pattern == 0 else window for i in range(n_layers))


def _token_ids(meta: _Meta, vocab: int) -> tuple[int | None, tuple[int, ...]]:
    data = meta.gguf.metadata
    bos = meta.int("tokenizer.ggml.bos_token_id", None, 0, full=True) if "tokenizer.ggml.bos_token_id" in data else None
    eos = [
        meta.int(f"tokenizer.ggml.{k}_token_id", None, 0, full=True)
        for k in ("eos", "eot", "eom")
        if f"tokenizer.ggml.{k}_token_id" in data
    ]
    tokens, types = data.get("tokenizer.ggml.tokens"), data.get("tokenizer.ggml.token_type")
    if isinstance(tokens, list) and len(tokens) < vocab:
        # A GGUF vocabulary lists one token per row (converters pad it with [PAD] tokens): ids past
        # its end would be generated and decode to nothing.
        raise ColibriError(
            f"{meta.where}: the vocabulary (tokenizer.ggml.tokens) has {len(tokens)} tokens but the model "
            f"has {vocab} rows: ids {len(tokens)}..{vocab - 1} would have no text (give the file its full vocabulary)"
        )
    if isinstance(tokens, list) and isinstance(types, np.ndarray) and len(types) == len(tokens):
        # Like llama.cpp: control tokens that end a turn stop generation too.
        eos += [
            i for i, (text, kind) in enumerate(zip(tokens, types.tolist())) if kind == 3 and text in END_OF_TURN_TEXTS
        ]
    eos = tuple(dict.fromkeys(eos))
    for t in ([bos] if bos is not None else []) + list(eos):
        if t >= vocab:
            raise ColibriError(f"{meta.where}: special token id {t} is outside the vocabulary ({vocab})")
    return bos, eos


def _file_fields(gguf: GgufFile, meta: _Meta, family: Family) -> dict:
    """The ModelSpec fields every architecture reads the same way: its names, the vocabulary and
    its special tokens, the norms' epsilon, the context length, whether the output is tied."""
    tensors = gguf.tensors
    vocab = meta.int("vocab_size", tensors["token_embd.weight"].shape[0])
    eps = meta.float("attention.layer_norm_rms_epsilon", family.norms.gguf_eps)
    if not 0 < eps < 1:
        raise ColibriError(f"{meta.where}: layer_norm_rms_epsilon must be between 0 and 1")
    bos, eos = _token_ids(meta, vocab)
    return dict(
        name=gguf.path.stem,
        architecture=family.hf_architectures[0],
        family=family.name,
        vocab_size=vocab,
        rms_norm_eps=eps,
        max_position_embeddings=meta.int("context_length", 2048),
        tie_embeddings="output.weight" not in tensors,
        bos_token_id=bos,
        eos_token_ids=eos,
    )


def parse_metadata(gguf: GgufFile) -> ModelSpec:
    """GGUF metadata (+ which tensors exist) -> ModelSpec, with every field checked."""
    arch, family = arch_of(gguf)
    meta = _Meta(gguf, arch)
    attention = family.attention
    tensors = gguf.tensors
    if "token_embd.weight" not in tensors:
        raise ColibriError(f"{meta.where}: no token_embd.weight tensor")

    hidden = meta.int("embedding_length")
    n_layers = meta.int("block_count")
    # block_count counts the multi-token-prediction layers too (nextn_predict_layers, after the others)
    mtp_layers = meta.int("nextn_predict_layers", 0, minimum=0) if family.moe and family.moe.mtp_key else 0
    if mtp_layers >= n_layers:
        raise ColibriError(f"{meta.where}: nextn_predict_layers {mtp_layers} leaves none of the {n_layers} blocks")
    n_layers -= mtp_layers
    layers_present = 1 + max((int(m.group(1)) for m in map(LAYER_NAME.fullmatch, tensors) if m), default=-1)
    if n_layers > layers_present:  # said before any per-layer table is made (a count of 2^32 - 1 would be)
        raise ColibriError(f"{meta.where}: block_count {n_layers} but the file has tensors for {layers_present} layers")
    n_heads = meta.int("attention.head_count")
    if family.gemma4_layers:
        return _gemma4(gguf, meta, family, hidden, n_layers, n_heads)
    n_kv, short_conv = _short_conv(meta, n_layers) if family.short_conv else (None, {})
    if family.mamba2:  # (Granite 4.0 hybrid: a layer without KV heads is a Mamba-2 layer)
        n_kv, kv_absent = _kv_heads_per_layer(meta, n_layers)
    n_kv = n_kv or meta.int("attention.head_count_kv", n_heads)
    rope = _rope(meta, family.default_theta, family.gguf_yarn_truncate, family.latent is not None)
    latent = gguf_latent(meta, hidden, n_heads, rope.factor) if family.latent else {}
    if latent:  # (key_length and head_count_kv describe llama.cpp's absorbed form: the latent's fields say)
        n_kv, head_dim = latent.pop("n_kv_heads"), latent.pop("head_dim")
    elif meta.has("attention.key_length"):
        head_dim = meta.int("attention.key_length")
        if meta.int("attention.value_length", head_dim) != head_dim:
            raise ColibriError(f"{meta.where}: attention key and value lengths differ (not supported)")
    else:
        if hidden % n_heads:
            raise ColibriError(f"{meta.where}: embedding_length {hidden} is not divisible by head_count {n_heads}")
        head_dim = hidden // n_heads
    if n_heads % n_kv:
        raise ColibriError(f"{meta.where}: head_count {n_heads} is not divisible by head_count_kv {n_kv}")
    if head_dim % 2:
        raise ColibriError(f"{meta.where}: head dimension {head_dim} must be even for rotary embeddings")
    rope_dim = head_dim if latent else meta.int("rope.dimension_count", head_dim)
    if attention.partial_rotary and (rope_dim > head_dim or rope_dim % 2):
        raise ColibriError(f"{meta.where}: rope.dimension_count {rope_dim} must be even and at most {head_dim}")
    if not attention.partial_rotary and rope_dim != head_dim:
        raise ColibriError(
            f"{meta.where}: partial rotary embeddings (rope.dimension_count "
            f"{meta.int('rope.dimension_count')} of {head_dim}) are not supported"
        )
    file_fields = _file_fields(gguf, meta, family)

    def present(part: str) -> bool:
        return f"blk.0.{part}" in tensors

    qkv_bias = present("attn_q.bias")
    if attention.qkv_bias == "always" and not qkv_bias:
        raise ColibriError(f"{meta.where}: missing tensor 'blk.0.attn_q.bias' ({arch} has q/k/v biases)")
    moe = {}
    if family.moe and not family.granite_multipliers:
        routing = family.moe
        n_experts = meta.int("expert_count")
        if n_experts > MAX_EXPERTS:
            raise ColibriError(f"{meta.where}: expert_count {n_experts} exceeds {MAX_EXPERTS:,} (the most supported)")
        top_k = meta.int("expert_used_count")
        check_experts_per_token(meta.where, "expert_used_count", top_k, n_experts)
        ff = meta.int("feed_forward_length", meta.gguf.metadata.get(f"{arch}.expert_feed_forward_length"))
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=meta.int("expert_feed_forward_length", ff),
            # (Qwen3.5 always renormalises, as transformers does, whatever the file says.)
            norm_topk_prob=(
                routing.renormalise == "always"
                if routing.gguf_renormalise_default is None
                else meta.bool("expert_weights_norm", routing.gguf_renormalise_default)
            ),
            shared_expert_intermediate_size=(
                meta.int("expert_shared_feed_forward_length", 0, minimum=0) if routing.shared_expert else 0
            ),
            moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layers)),
            **router_fields(meta.where, "expert_used_count", top_k, routing),
            router_bias=present("ffn_gate_inp.bias"),
            expert_biases=present("ffn_gate_exps.bias"),
        )
        if routing.placement == "first_k_dense":
            moe.update(_deepseek_routing(meta, family, n_experts, top_k, moe["expert_intermediate_size"], mtp_layers))
        elif routing.placement == "interleave":
            moe.update(interleaved_moe(routing, moe["expert_intermediate_size"]))
        intermediate = ff
    else:
        intermediate = meta.int("feed_forward_length")
    chunks = None
    if attention.gguf_chunking:  # Llama 4: what llama.cpp fixes (model/llama4.py)
        window = meta.int("attention.sliding_window", minimum=0) if meta.has("attention.sliding_window") else None
        chunks = gguf_chunked_layers(
            attention.gguf_chunking, attention.nope_period, window, n_layers, moe.get("n_experts", 0)
        )

    spec = ModelSpec(
        **file_fields,
        hidden_size=hidden,
        intermediate_size=intermediate,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rope=rope,
        qkv_bias=qkv_bias,
        o_bias=present("attn_output.bias"),
        mlp_bias=present("ffn_gate.bias") or present("ffn_up.bias"),
        layer_windows=chunks.windows() if chunks else _windows(meta, n_layers, attention.window_period),
        **(_row_settings(meta, family, hidden, head_dim) | latent),
        **moe,
        **(_hybrid_linear(meta, n_layers, head_dim, rope_dim) if family.deltanet else {}),
        **short_conv,
        **(
            dict(rope_dim=0 if rope_dim == head_dim else rope_dim)
            if attention.partial_rotary and not family.deltanet
            else {}
        ),
        **(chunks.fields() if chunks else {}),
    )
    return replace(spec, **gguf_granite_hybrid(meta, spec, kv_absent)) if family.mamba2 else spec


def _deepseek_routing(meta: _Meta, family: Family, n_experts: int, top_k: int, expert_ff: int, mtp_layers: int) -> dict:
    """The DeepSeek line's routing from llama.cpp's keys: the gating function (as the row's router),
    the groups, the weights' scale, the shared experts (expert_shared_count of the experts' width,
    ungated); the layers with a router are the MoE layers (leading_dense_block_count before them)."""
    routing = family.moe
    assert routing is not None  # (a row with placement first_k_dense)
    gating = meta.int("expert_gating_func", 2 if routing.router == "sigmoid" else 1)
    if gating != (2 if routing.router == "sigmoid" else 1):
        raise ColibriError(
            f"{meta.where}: metadata '{meta.arch}.expert_gating_func' {gating} is not this architecture's "
            f"{'sigmoid (2)' if routing.router == 'sigmoid' else 'softmax (1)'}"
        )
    n_group = meta.int("expert_group_count", 1)
    groups, used = routing.route_groups(
        meta.where,
        n_experts,
        top_k,
        n_group,
        meta.int("expert_group_used_count", n_group),
        ("expert_group_count", "expert_group_used_count", "expert_used_count"),
    )
    scaling = meta.float("expert_weights_scale", 1.0) if routing.routed_scaling else 1.0
    if scaling <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.expert_weights_scale' must be positive, got {scaling}")
    shared = meta.int("expert_shared_count", 0, minimum=0)
    return dict(
        shared_expert_intermediate_size=expert_ff * shared,
        ungated_shared_expert=shared > 0,
        router_choice_bias=any(name.endswith(".exp_probs_b.bias") for name in meta.gguf.tensors),
        expert_groups=groups,
        expert_groups_used=used,
        routed_scaling=scaling,
        router_norm_eps=routing.norm_eps,
        mtp_layers=mtp_layers,
    )


def _row_settings(meta: _Meta, family: Family, hidden: int, head_dim: int) -> dict:
    """The spec's fields the family's row decides, with the keys llama.cpp writes for them."""
    attention, ffn = family.attention, family.ffn
    attn_scale = 0.0  # 1/sqrt(head_dim)
    if attention.score_scale == "one":
        attn_scale = 1.0
    elif attention.score_scale == "query_pre_attn_scalar":
        attn_scale = meta.float("attention.scale") if meta.has("attention.scale") else float(head_dim) ** -0.5
    return dict(
        # (GLM-4.x MoE: where the file has the norms)
        qk_norm=attention.qk_norm or (attention.qk_norm_flag and "blk.0.attn_q_norm.weight" in meta.gguf.tensors),
        activation=ffn.activation,
        embed_scale=gemma_embed_scale(hidden) if family.embed_scale == "sqrt_hidden" else 1.0,
        attn_scale=attn_scale,
        post_norms=family.norms.sandwich,
        rope_local=RopeSpec(theta=meta.float("rope.freq_base_swa", 10000.0)) if attention.local_rope else None,
        final_softcap=meta.float("final_logit_softcapping", 0.0) if family.logit_softcap else 0.0,
        attn_sinks=attention.sinks,
        qk_norm_whole=attention.qk_norm_whole,
        layer_norm=family.norms.layer_norm,
        lm_head_bias=family.lm_head_bias and "output.bias" in meta.gguf.tensors,
        **(dict(swiglu_alpha=ffn.swiglu[0], swiglu_limit=ffn.swiglu[1]) if ffn.swiglu else {}),
    )


def _per_layer_ints(meta: _Meta, key: str, n_layers: int) -> tuple[int, ...]:
    """A key llama.cpp writes as one integer or as one per layer."""
    name, value = meta._get(key, None)
    if isinstance(value, np.ndarray) and value.ndim == 1 and len(value) == n_layers and value.dtype.kind in "iu":
        if (value < 1).any():
            raise ColibriError(f"{meta.where}: metadata {name!r} must be at least 1 for every layer")
        return tuple(int(v) for v in value)
    return (meta.int(key),) * n_layers


def _gemma4(gguf: GgufFile, meta: _Meta, family: Family, hidden: int, n_layers: int, n_heads: int) -> ModelSpec:
    """llama.cpp's gemma4 keys: the sliding layers' head width (key_length_swa) and the global ones'
    (key_length), KV heads per layer, the sliding pattern, the per-layer inputs' width, the global
    layers' proportional RoPE (rope_freqs: the pairs that rotate), the MoE block (expert_count)."""
    tensors = gguf.tensors
    head_dim = meta.int("attention.key_length_swa")
    global_head_dim = meta.int("attention.key_length")
    for key, width in (("attention.value_length_swa", head_dim), ("attention.value_length", global_head_dim)):
        if meta.int(key, width) != width:
            raise ColibriError(f"{meta.where}: attention key and value lengths differ (not supported)")
    if head_dim % 2 or global_head_dim % 2:
        raise ColibriError(f"{meta.where}: head dimensions {head_dim} and {global_head_dim} must be even")
    for key, width in (("rope.dimension_count_swa", head_dim), ("rope.dimension_count", global_head_dim)):
        if meta.int(key, width) != width:
            raise ColibriError(f"{meta.where}: metadata '{meta.arch}.{key}' must be the head width {width}")
    windows = _windows(meta, n_layers, family.attention.window_period)
    kv = _per_layer_ints(meta, "attention.head_count_kv", n_layers)
    sliding_kv = {k for k, w in zip(kv, windows) if w} or {kv[0]}
    global_kv = {k for k, w in zip(kv, windows) if not w} or {kv[0]}
    if len(sliding_kv) > 1 or len(global_kv) > 1:
        raise ColibriError(f"{meta.where}: every sliding (and every global) layer must have the same KV heads")
    n_kv, n_global_kv = sliding_kv.pop(), global_kv.pop()
    if n_heads % n_kv or n_heads % n_global_kv:
        raise ColibriError(f"{meta.where}: head_count {n_heads} is not divisible by the layers' KV heads")
    file_fields = _file_fields(gguf, meta, family)
    theta = meta.float("rope.freq_base", family.default_theta)
    if theta <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.rope.freq_base' must be positive")
    rope = RopeSpec(theta=theta)
    if GEMMA4_ROPE_FREQS in tensors:
        freqs = tensors[GEMMA4_ROPE_FREQS]
        values = rows_f32(gguf.path, freqs, weights=False).reshape(-1)
        rotated = int(np.count_nonzero(values == 1.0))
        if len(values) != global_head_dim // 2 or not (
            (values[:rotated] == 1.0).all() and (values[rotated:] >= 1e30).all()
        ):
            raise ColibriError(
                f"{meta.where}: tensor {GEMMA4_ROPE_FREQS!r} must hold {global_head_dim // 2} factors: 1 for each "
                f"rotated pair, then 1e30 for the others"
            )
        rope = RopeSpec(theta=theta, scaling="proportional", rotated_fraction=2 * rotated / global_head_dim)
    globals_ = [i for i, w in enumerate(windows) if not w]
    shared = meta.int("attention.shared_kv_layers", 0, minimum=0)
    first = check_kv_sharing(meta.where, "attention.shared_kv_layers", shared, windows, lambda sliding: "of its kind")
    # feed_forward_length, one or per layer: the KV-sharing layers' twice the others' with double_wide_mlp.
    ffs = _per_layer_ints(meta, "feed_forward_length", n_layers)
    intermediate = ffs[0]
    double_wide = shared > 0 and ffs[-1] == 2 * intermediate
    if any(f != intermediate * (2 if double_wide and i >= first else 1) for i, f in enumerate(ffs)):
        raise ColibriError(
            f"{meta.where}: metadata '{meta.arch}.feed_forward_length' must be one width, or twice it on the "
            f"KV-sharing layers only"
        )
    moe = {}
    if meta.has("expert_count"):
        n_experts, top_k = meta.int("expert_count"), meta.int("expert_used_count")
        check_experts_per_token(meta.where, "expert_used_count", top_k, n_experts)
        moe = moe_beside_dense(family.moe, n_experts, top_k, meta.int("expert_feed_forward_length"), n_layers)
    return ModelSpec(
        **file_fields,
        hidden_size=hidden,
        intermediate_size=intermediate,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rope=rope,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        layer_windows=windows,
        **_row_settings(meta, family, hidden, head_dim),
        **moe,
        global_head_dim=0 if global_head_dim == head_dim else global_head_dim,
        global_kv_heads=0 if n_global_kv == n_kv else n_global_kv,
        # (a global layer without attn_v: its values are its keys)
        k_eq_v=bool(globals_) and f"blk.{globals_[0]}.attn_v.weight" not in tensors,
        v_norm=True,
        ple_dim=meta.int("embedding_length_per_layer_input", 0, minimum=0),
        layer_scalars=True,
        kv_shared_layers=shared,
        double_wide_mlp=double_wide,
    )


def _hybrid_linear(meta: _Meta, n_layers: int, head_dim: int, rope_dim: int) -> dict:
    """Qwen3.5's Gated DeltaNet settings from llama.cpp's ssm.* keys; a layer with an ssm_a
    tensor is a DeltaNet layer, the others gated full attention."""
    k_heads = meta.int("ssm.group_count")
    v_heads = meta.int("ssm.time_step_rank")
    inner = meta.int("ssm.inner_size")
    if v_heads % k_heads or inner % v_heads:
        raise ColibriError(
            f"{meta.where}: ssm.time_step_rank {v_heads} must be a multiple of ssm.group_count {k_heads}, "
            f"and ssm.inner_size {inner} of it"
        )
    linear = tuple(f"blk.{i}.ssm_a" in meta.gguf.tensors for i in range(n_layers))
    if meta.has("full_attention_interval"):  # llama.cpp's schedule: every interval-th layer full attention
        interval = meta.int("full_attention_interval")
        if tuple((i + 1) % interval != 0 for i in range(n_layers)) != linear:
            full = [i for i, is_linear in enumerate(linear) if not is_linear]
            raise ColibriError(
                f"{meta.where}: full_attention_interval {interval} does not match the layers the tensors make "
                f"full attention ({full})"
            )
    if all(linear):
        raise ColibriError(
            f"{meta.where}: every layer is a DeltaNet layer (at least one full-attention layer is supported)"
        )
    return dict(
        linear_layers=linear,
        linear_k_heads=k_heads,
        linear_v_heads=v_heads,
        linear_k_dim=meta.int("ssm.state_size"),
        linear_v_dim=inner // v_heads,
        linear_conv_kernel=meta.int("ssm.conv_kernel"),
        attn_output_gate=True,
        rope_dim=0 if rope_dim == head_dim else rope_dim,
    )


def _short_conv(meta: _Meta, n_layers: int) -> tuple[int, dict]:
    """LFM2's layer kinds as llama.cpp writes them: head_count_kv per layer, 0 for a convolution
    layer (every attention layer the same), and the convolution's taps (shortconv.l_cache)."""
    n_kv, kv_absent = _kv_heads_per_layer(meta, n_layers)
    return n_kv, dict(short_conv_layers=kv_absent, short_conv_kernel=meta.int("shortconv.l_cache"))


def _kv_heads_per_layer(meta: _Meta, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """head_count_kv per layer, 0 for a layer without attention (every attention layer the same):
    the attention layers' KV heads, and per layer whether it has none."""
    name, value = meta._get("attention.head_count_kv", None)
    if not (isinstance(value, np.ndarray) and value.ndim == 1 and len(value) == n_layers and value.dtype.kind in "iu"):
        raise ColibriError(f"{meta.where}: metadata {name!r} must give each of the {n_layers} layers its KV heads")
    heads = {int(v) for v in value if v}
    if len(heads) != 1:
        raise ColibriError(f"{meta.where}: metadata {name!r} must give every attention layer the same KV heads")
    return heads.pop(), tuple(int(v) == 0 for v in value)
