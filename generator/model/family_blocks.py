"""The blocks a model family is made of (a row of generator/model/family_facts.py is these): the
token mixers (attention with its options, latent attention, gated DeltaNet, the gated short
convolution, Mamba-2), the FFN, the MoE block with its router, the norms. Each says what it is and
which facts of it a file gives; the importers resolve them into ModelSpec fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Union

from ..errors import ColibriError


@dataclass(frozen=True)
class Attention:
    """The attention mixer and its options."""

    qkv_bias: str = "config"  # "always" (Qwen2), or "config": config.json's attention_bias / the GGUF's tensors
    o_bias: str = "config"  # "never" (Qwen2), or "config"
    qk_norm: bool = False  # RMSNorm on each head's queries and keys
    # Which layers slide when config.json has no layer_types: "max_window_layers" (the layers from
    # max_window_layers on), "every_layer", "pattern" (every window_period-th layer global unless
    # sliding_window_pattern says otherwise), "alternating" (every window_period-th layer global) or
    # "none" (no layer slides: LFM2).
    windows: str = "max_window_layers"
    window_period: int = 0  # the pattern's period (llama.cpp's default too); 0: every layer slides
    window_flag: bool = False  # sliding windows apply only when use_sliding_window is true (Qwen)
    sinks: bool = False  # a learned sink logit per query head (gpt-oss)
    output_gate: bool = False  # the q projection also makes a per-head sigmoid gate of the output (Qwen3.5)
    partial_rotary: bool = False  # RoPE may rotate only the leading dims of a head (Qwen3.5)
    # The score scale: "head_dim" (1/sqrt(head_dim)), "query_pre_attn_scalar" (Gemma 3; GGUF
    # attention.scale), or "one" (Gemma 4: queries and keys normalised, scores unscaled), or
    # "attention_multiplier" (Granite: config.json's attention_multiplier; GGUF attention.scale).
    score_scale: str = "head_dim"
    local_rope: bool = False  # sliding-window layers have their own RoPE base, never scaled (Gemma)
    # GLM-4.x MoE: q/k RMSNorm only where config.json's use_qk_norm says (a GGUF's tensors say), and
    # the fraction of a head RoPE rotates when config.json names none (partial_rotary_factor).
    qk_norm_flag: bool = False
    rotary_fraction: float = 1.0
    # With qk_norm: one RMSNorm over all the heads' queries (n_heads x head_dim weights) and one over
    # all the keys (n_kv_heads x head_dim), before the split into heads (OLMoE), not one per head.
    qk_norm_whole: bool = False
    # Llama 4 (windows "chunked"): the RoPE layers attend within chunks of attention_chunk_size; the
    # no-RoPE layers (config.json's no_rope_layers; in a GGUF file every nope_period-th layer, as
    # llama.cpp fixes it) see every position, their queries temperature-tuned; the RoPE layers'
    # queries and keys L2-normalised where use_qk_norm says. gguf_chunking: the chunk, floor_scale
    # and attn_scale llama.cpp assumes (its files do not hold them). The checkpoint's q/k rows hold
    # RoPE's pairs interleaved (a complex rotation of adjacent values): de-interleaved at import.
    nope_period: int = 0
    gguf_chunking: tuple[int, int, float] | None = None


@dataclass(frozen=True)
class GatedDeltaNet:
    """Qwen3.5's linear-attention mixer: a short causal convolution over q, k and v, then the gated
    delta rule on a per-head key x value state. Its tensors in both formats."""

    hf_tensors: Mapping[str, str] = field(default_factory=dict)
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ShortConv:
    """LFM2's gated short convolution: in_proj makes B, C and x; B * x goes through a causal
    depthwise convolution of conv_L_cache taps (the layer's state: its last inputs); C times its
    output; out_proj. Its tensors in both formats."""

    hf_tensors: Mapping[str, str] = field(default_factory=dict)
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash): the queries directly or through
    a low-rank path with its RMSNorm; keys and values from one compressed latent per position (with
    its RMSNorm) and one shared RoPE key; decoded in the absorbed form over a cache of the latent and
    the RoPE key (model/latent_attention.py). rope_interleave: "config" (config.json's
    rope_interleave, true when absent) or "always" (V2's complex rotation of adjacent pairs): the
    pairs a checkpoint's RoPE rows hold, de-interleaved at import so the runtime's rotate-half RoPE
    applies."""

    rope_interleave: str = "config"


@dataclass(frozen=True)
class Mamba2:
    """Granite 4.0 hybrid's Mamba-2 mixer: in_proj makes z, xBC and dt; xBC through a causal
    depthwise convolution with a bias and SiLU (the layer's state: its last inputs); the selective
    state recurrence per head with A, D and dt's bias through softplus; RMSNorm per group of
    y * silu(z); out_proj (numerics/mamba2.py). Its tensors in both formats."""

    hf_tensors: Mapping[str, str] = field(default_factory=dict)
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)


Mixer = Union[Attention, GatedDeltaNet, ShortConv, Mamba2]


@dataclass(frozen=True)
class Ffn:
    """The gated FFN: its activation, its biases, whether a layer has a dense one at all."""

    activation: str = "silu"  # "silu" | "gelu_tanh" (Gemma: config.json's hidden_activation) | "swiglu_clamped"
    swiglu: tuple[float, float] | None = None  # (alpha, limit) of the clamped SwiGLU: the defaults config.json
    #                                            may override, llama.cpp's fixed values
    mlp_bias: bool = False  # config.json's mlp_bias applies (Llama; a GGUF's tensors say)
    dense: bool = True  # False: every layer routes, config.json has no intermediate_size (Qwen3.5)
    # LFM2: config.json's intermediate_size is adjusted by block_auto_adjust_ff_dim (2/3 of it, times
    # block_ffn_dim_multiplier, rounded up to block_multiple_of), as the model builds its FFN.
    block_sizing: bool = False
    # config.json's key of the dense FFN's width (Llama 4: intermediate_size_mlp)
    hf_width_key: str = "intermediate_size"


@dataclass(frozen=True)
class Moe:
    """The mixture-of-experts block."""

    # "every_layer" (experts of intermediate_size), "sparse_step" (decoder_sparse_step, mlp_only_layers,
    # moe_intermediate_size) or "beside_dense" (Gemma 4: beside the dense FFN, enable_moe_block).
    placement: str
    # or "topk_then_softmax" (gpt-oss: softmax over the k chosen), or "sparsemixer" (Phi-3.5-MoE: the
    # top 2, each weighted by a softmax over the logits near its own), or "topk_then_sigmoid" (Llama 4:
    # the top k logits, each weighted by its sigmoid)
    router: str = "softmax_then_topk"
    renormalise: str = "config"  # the top k's weights: "always", "never", or config.json's norm_topk_prob
    # llama.cpp's default when the file has no expert_weights_norm; None: the file's key is not read,
    # renormalise holds.
    gguf_renormalise_default: bool | None = None
    shared_expert: str | None = None  # "gated": an always-on expert behind a sigmoid gate (Qwen2-MoE)
    biases: bool = False  # the router and every expert have biases (gpt-oss)
    fused_experts: bool = False  # a layer's experts in fused, interleaved tensors (gpt-oss's HF layout)
    # The DeepSeek line (DeepSeekMoE, V2, V3, GLM-4.x MoE), with placement "first_k_dense" (the first
    # first_k_dense_replace layers dense, then every moe_layer_freq-th; n_routed_experts of
    # moe_intermediate_size) and shared_expert "ungated" (n_shared_experts x moe_intermediate_size
    # wide, always on, no gate). router "sigmoid": sigmoid scores, the correction bias
    # (e_score_correction_bias) added to choose only. groups: "never", "always" (n_group, topk_group:
    # V3, GLM) or "topk_method" (V2: group_limited_greedy). routed_scaling: routed_scaling_factor read.
    groups: str = "never"
    routed_scaling: bool = False
    mtp_key: str | None = None  # the key counting multi-token-prediction layers the checkpoint holds, left out
    # GLM-4.7-Flash: config.json lists "dense" or "sparse" per layer under this key (absent: a dense
    # first layer, sparse ones after it), instead of first_k_dense_replace.
    layer_types_key: str | None = None
    # The sparsemixer router's jitter (its mask's threshold is twice it) when the file does not say:
    # transformers' default, and a GGUF file's (llama.cpp writes no key for it).
    sparsemixer_jitter: float = 0.01
    # config.json's names for the first_k_dense placement's keys where they are not the DeepSeek
    # line's (LFM2-MoE: num_experts, num_dense_layers), and what the renormalisation adds to the sum
    # it divides by (LFM2-MoE: 1e-6).
    hf_keys: Mapping[str, str] = field(default_factory=dict)
    norm_eps: float = 0.0
    # Llama 4 (placement "interleave": every interleave_moe_layer_step-th layer, or config.json's
    # moe_layers; the shared expert "ungated" of the experts' width): the routing weight scales the
    # chosen expert's input, its output is added whole.
    scales_input: bool = False

    def route_groups(
        self, where: str, n_experts: int, top_k: int, n_group: int, topk_group: int, keys: tuple[str, str, str]
    ) -> tuple[int, int]:
        """The DeepSeek line's group limits, checked (keys: how the file names the group count, the groups
        used and the top k): (expert_groups, expert_groups_used), or (0, 0) where they limit nothing (one
        group, or every group used)."""
        group_key, used_key, top_k_key = keys
        if n_group <= 1:
            return 0, 0
        if n_experts % n_group:
            raise ColibriError(
                f"{where}: {group_key} {n_group} does not divide the {n_experts} experts into equal groups"
            )
        if not 1 <= topk_group <= n_group:
            raise ColibriError(f"{where}: {used_key} {topk_group} must be from 1 to {group_key} {n_group}")
        per_group = n_experts // n_group
        if self.router == "sigmoid" and per_group < 2:
            raise ColibriError(
                f"{where}: a group scores its two best experts, but {group_key} {n_group} leaves {per_group} a group"
            )
        if top_k > topk_group * per_group:
            raise ColibriError(
                f"{where}: {top_k_key} {top_k} exceeds the {topk_group * per_group} experts that {used_key} {topk_group} "
                f"groups of {per_group} hold"
            )
        return (0, 0) if topk_group == n_group else (n_group, topk_group)


@dataclass(frozen=True)
class Norms:
    plus_one: bool = False  # a Hugging Face checkpoint's RMSNorm scales by (1 + w), not w
    sandwich: bool = False  # the attention and FFN outputs normalised too, before the residual add
    gguf_eps: float = 1e-5  # llama.cpp's default layer_norm_rms_epsilon
    layer_norm: bool = False  # LayerNorm with a weight and a bias, not RMSNorm (Phi-3.5-MoE)
    hf_eps_key: str = "rms_norm_eps"  # config.json's key for it (LFM2: norm_eps)


ATTENTION_LAYERS = ("full_attention", "sliding_attention")


def attention_layers(attention: Attention) -> Mapping[str, Mixer]:
    return MappingProxyType({kind: attention for kind in ATTENTION_LAYERS})
