"""Hugging Face model families as data: the architectures config.json may name, and what sets
each family apart (Family), which config.py consults where families differ."""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import RopeSpec

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text tower; the vision tower is ignored
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",  # its text tower; the vision tower is ignored
    "GptOssForCausalLM": "gpt_oss",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",  # its text tower; the vision and audio towers are ignored
}


# Multimodal classes whose config.json keeps the text tower's settings under text_config.
TEXT_CONFIG_ARCHITECTURES = (
    "Gemma3ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
)


@dataclass(frozen=True)
class Family:
    """What sets one model family apart, as data: parse_config reads every family the same way
    and consults this table where they differ."""

    qkv_bias: str  # "always" (Qwen2), or "attention_bias": config.json's attention_bias decides
    o_bias: str  # "never" (Qwen2), or "attention_bias"
    mlp_bias: bool  # config.json's mlp_bias applies (Llama)
    qk_norm: bool  # RMSNorm on each head's queries and keys (Qwen3, Gemma 3)
    windows: str  # sliding-window layers: "every_layer" (Mistral), "pattern" (Gemma 3's 5:1), or
    #               "max_window_layers" (the layers from max_window_layers on)
    window_flag: bool = False  # sliding windows apply only when use_sliding_window is true (Qwen)
    gemma: bool = False  # GeGLU, scaled embeddings, four norms per layer, query_pre_attn_scalar,
    #                      local RoPE, logit softcapping, tied embeddings by default, RoPE base 1e6
    moe: str | None = None  # "mixtral" (every layer routes, experts of intermediate_size), "qwen", or
    #                         "gpt_oss" (every layer routes: top-k then softmax, biases, fused experts)
    shared_expert: bool = False  # Qwen2-MoE's gated shared expert
    hybrid_linear: bool = False  # Qwen3.5: Gated DeltaNet layers beside gated full-attention layers
    #                              (layer_types), partial RoPE, norms scaling by (1 + w), top-k renormalised
    attn_sinks: bool = False  # gpt-oss: a learned sink logit per query head
    clamped_swiglu: bool = False  # gpt-oss: experts apply the clamped SwiGLU (swiglu_alpha, swiglu_limit)
    default_theta: float = 10000.0  # RoPE base when the config names none
    fused_experts: bool = False  # gpt-oss: a layer's experts in fused, interleaved tensors (fused_parts)
    gemma4: bool = False  # Gemma 4 (_gemma4): norms scaling by w (not 1 + w), score scale 1, per-layer

    #                       inputs, k_eq_v and wider global layers, the MoE block beside the dense FFN


FAMILIES = {
    "llama": Family("attention_bias", "attention_bias", True, False, "max_window_layers"),
    "mistral": Family("attention_bias", "attention_bias", False, False, "every_layer"),
    "qwen2": Family("always", "never", False, False, "max_window_layers", window_flag=True),
    "qwen3": Family("attention_bias", "attention_bias", False, True, "max_window_layers", window_flag=True),
    "gemma3": Family("attention_bias", "attention_bias", False, True, "pattern", gemma=True),
    "mixtral": Family("attention_bias", "attention_bias", False, False, "every_layer", moe="mixtral"),
    "qwen2_moe": Family(
        "always", "never", False, False, "max_window_layers", window_flag=True, moe="qwen", shared_expert=True
    ),
    "qwen3_moe": Family(
        "attention_bias", "attention_bias", False, True, "max_window_layers", window_flag=True, moe="qwen"
    ),
    "qwen3_5_moe": Family(
        "attention_bias",
        "attention_bias",
        False,
        True,
        "max_window_layers",
        window_flag=True,
        moe="qwen",
        shared_expert=True,
        hybrid_linear=True,
    ),
    "gpt_oss": Family(
        "attention_bias",
        "attention_bias",
        False,
        False,
        "alternating",
        moe="gpt_oss",
        attn_sinks=True,
        clamped_swiglu=True,
        default_theta=150000.0,
        fused_experts=True,
    ),
    "gemma4": Family("attention_bias", "attention_bias", False, True, "pattern", gemma=True, gemma4=True),
}


LINEAR_LAYER_TYPES = ("linear_attention", "full_attention")


GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


# Gemma4TextConfig's global-layer RoPE when config.json names none (its sliding layers': theta 1e4).
GEMMA4_DEFAULT_ROPE = RopeSpec(theta=1000000.0, scaling="proportional", rotated_fraction=0.25)


GEMMA4_UNSUPPORTED = {
    # key: (value that is supported, why)
    "use_bidirectional_attention": (None, "bidirectional attention"),
}
