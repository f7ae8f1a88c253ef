"""The family table: a model family is a row of blocks, read by both importers (hf/config.py,
gguf/metadata.py and their tensor names). Per family: the mixer of each layer kind, the FFN, the
MoE block, the norms, the multipliers, the default RoPE base, the Hugging Face classes and the GGUF
architecture that name it, and its tensor names in both formats where they differ from the common
ones. What hf/config.py reads from config.json and gguf/metadata.py from llama.cpp's metadata must
give the same ModelSpec, so a fact about a family is written once, here; so are the checks both
importers share (Gemma's embedding scale, Gemma 4's MoE block and KV sharing, a router's top-k),
each naming the key the file used.

Facts that only one format has are named for it (gguf_*: what llama.cpp's converter did to the
tensors, or the default it assumes when a key is absent); everything else holds for both.

Gemma 4's per-layer inputs, KV sharing, layer scalars and wider global layers are not blocks yet:
`gemma4_layers` marks the family whose importers still read them with their own code (_gemma4 in
hf/config.py and gguf/metadata.py). docs/models.md, "A family is a row", says how a family is added.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ColibriError
from .family_blocks import (
    Attention,
    Ffn,
    GatedDeltaNet,
    LatentAttention,
    Mamba2,
    Mixer,
    Moe,
    Norms,
    ShortConv,
    attention_layers,
)


@dataclass(frozen=True)
class Family:
    """One row: a family's blocks and names."""

    name: str  # the spec's family
    hf_architectures: tuple[str, ...]  # config.json's class names; the first is the one a GGUF's spec names
    gguf_architecture: str | None  # llama.cpp's general.architecture (None: written as another's)
    layers: Mapping[str, Mixer]  # the mixer of each layer kind, as config.json's layer_types names them
    ffn: Ffn = Ffn()
    moe: Moe | None = None
    norms: Norms = Norms()
    hf_text_towers: tuple[str, ...] = ()  # classes whose config.json keeps the text tower under text_config
    gguf_with_experts: bool = False  # the family a gguf_architecture file with experts is (Mixtral: llama)
    default_theta: float = 10000.0  # RoPE base when the file names none
    embed_scale: str | None = None  # "sqrt_hidden": embeddings times sqrt(hidden_size) (Gemma)
    tie_embeddings: bool = False  # when config.json does not say
    logit_softcap: bool = False  # final_logit_softcapping (GGUF: the key is read only for these)
    gguf_permuted_qk: bool = False  # llama.cpp's converter permuted the q/k rows
    gguf_yarn_truncate: bool = True  # YaRN's ramp ends rounded (the file does not say; gpt-oss: not)
    gemma4_layers: bool = False  # see the module's docstring
    # Tensor names beyond (or instead of) the common ones in hf/names.py and gguf/names.py; a mixer's
    # own (GatedDeltaNet's) come with it. hf_common_moe: the common MoE and expert names apply.
    hf_tensors: Mapping[str, str] = field(default_factory=dict)
    hf_global_tensors: Mapping[str, str] = field(default_factory=dict)
    hf_common_moe: bool = True
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)
    gguf_global_tensors: Mapping[str, str] = field(default_factory=dict)
    # config.json keys refused unless at the value given (key: (value supported, what it would do)).
    hf_unsupported: Mapping[str, tuple[object, str]] = field(default_factory=dict)
    lm_head_bias: bool = False  # the output matrix may have a bias (config.json's lm_head_bias; GGUF: output.bias)
    # Granite's multipliers (embedding, attention, residual, logits); RoPE where position_embedding_type says.
    granite_multipliers: bool = False

    @property
    def attention(self) -> Attention:
        """The attention mixer (every family has attention layers)."""
        return next(m for m in self.layers.values() if isinstance(m, Attention))

    @property
    def latent(self) -> LatentAttention | None:
        """The latent attention mixer, where the family's attention is one."""
        return self.attention if isinstance(self.attention, LatentAttention) else None

    @property
    def deltanet(self) -> GatedDeltaNet | None:
        return next((m for m in self.layers.values() if isinstance(m, GatedDeltaNet)), None)

    @property
    def short_conv(self) -> ShortConv | None:
        return next((m for m in self.layers.values() if isinstance(m, ShortConv)), None)

    @property
    def mamba2(self) -> Mamba2 | None:
        return next((m for m in self.layers.values() if isinstance(m, Mamba2)), None)

    @property
    def fused_experts(self) -> bool:
        return self.moe is not None and self.moe.fused_experts

    @property
    def hf_layer_tensors(self) -> Mapping[str, str]:
        """Per-layer parts of a Hugging Face checkpoint beyond the common ones."""
        return {
            **self.hf_tensors,
            **(self.deltanet.hf_tensors if self.deltanet else {}),
            **(self.short_conv.hf_tensors if self.short_conv else {}),
            **(self.mamba2.hf_tensors if self.mamba2 else {}),
        }

    @property
    def gguf_layer_tensors(self) -> Mapping[str, str]:
        """Per-layer parts of a GGUF file beyond (or instead of) the common ones."""
        return {
            **self.gguf_tensors,
            **(self.deltanet.gguf_tensors if self.deltanet else {}),
            **(self.short_conv.gguf_tensors if self.short_conv else {}),
            **(self.mamba2.gguf_tensors if self.mamba2 else {}),
        }


# Gemma's norms: post_attention_layernorm normalises the attention output (not the FFN input).
GEMMA_HF_NORMS = {
    "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffn_norm",
}


# Gemma 4's parts beyond Gemma 3's: the MoE block's norms, router and experts (stacked: hf/views.py's
# fused_parts), the per-layer inputs' gate, projection and norm, the layer scalar.
GEMMA4_HF_LAYER = {
    "post_feedforward_layernorm_1.weight": "post_dense_norm",
    "pre_feedforward_layernorm_2.weight": "moe_norm",
    "post_feedforward_layernorm_2.weight": "post_moe_norm",
    "router.proj.weight": "router",
    "router.scale": "router_norm",
    "router.per_expert_scale": "expert_scale",
    "per_layer_input_gate.weight": "ple_gate",
    "per_layer_projection.weight": "ple_proj",
    "post_per_layer_input_norm.weight": "ple_norm",
    "layer_scalar": "layer_scalar",
}


GEMMA4_HF_GLOBAL = {
    "model.embed_tokens_per_layer.weight": "ple_embed",
    "model.per_layer_model_projection.weight": "ple_model_proj",
    "model.per_layer_projection_norm.weight": "ple_proj_norm",
}


# llama.cpp's gemma4: the per-layer inputs, the layer scalar, the MoE block's norms, router scale and
# per-expert scales (its experts' gate and up in one stacked tensor: gguf/names.GEMMA4_GATE_UP).
GEMMA4_GGUF_GLOBAL = {
    "per_layer_token_embd.weight": "ple_embed",
    "per_layer_model_proj.weight": "ple_model_proj",
    "per_layer_proj_norm.weight": "ple_proj_norm",
}


GEMMA4_GGUF_LAYER = {
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate.weight": "ple_gate",
    "proj.weight": "ple_proj",
    "post_norm.weight": "ple_norm",
    "post_ffw_norm_1.weight": "post_dense_norm",
    "post_ffw_norm_2.weight": "post_moe_norm",
    "pre_ffw_norm_2.weight": "moe_norm",
    "ffn_gate_inp.scale": "router_norm",
    "ffn_down_exps.scale": "expert_scale",
}


GATED_DELTANET = GatedDeltaNet(
    hf_tensors={
        "linear_attn.in_proj_qkv.weight": "lin_qkv",
        "linear_attn.in_proj_z.weight": "lin_z",
        "linear_attn.in_proj_b.weight": "lin_b",
        "linear_attn.in_proj_a.weight": "lin_a",
        "linear_attn.conv1d.weight": "lin_conv",
        "linear_attn.dt_bias": "lin_dt_bias",
        "linear_attn.A_log": "lin_decay_scale",
        "linear_attn.norm.weight": "lin_norm",
        "linear_attn.out_proj.weight": "lin_out",
    },
    gguf_tensors={
        "attn_qkv.weight": "lin_qkv",
        "attn_gate.weight": "lin_z",
        "ssm_beta.weight": "lin_b",
        "ssm_alpha.weight": "lin_a",
        "ssm_conv1d.weight": "lin_conv",
        "ssm_dt.bias": "lin_dt_bias",
        "ssm_a": "lin_decay_scale",
        "ssm_norm.weight": "lin_norm",
        "ssm_out.weight": "lin_out",
    },
)


SHORT_CONV = ShortConv(
    hf_tensors={
        "conv.in_proj.weight": "conv_in",
        "conv.conv.weight": "conv_taps",
        "conv.out_proj.weight": "conv_out",
    },
    gguf_tensors={
        "shortconv.in_proj.weight": "conv_in",
        "shortconv.conv.weight": "conv_taps",
        "shortconv.out_proj.weight": "conv_out",
    },
)


# LFM2's names of the common parts: operator_norm before the mixer, feed_forward's w1/w3/w2, the
# attention's out_proj and q/k layernorms; its final norm is called embedding_norm (llama.cpp:
# token_embd_norm).
LFM2_HF_LAYER = {
    "operator_norm.weight": "attn_norm",
    "ffn_norm.weight": "ffn_norm",
    "feed_forward.w1.weight": "w_gate",
    "feed_forward.w3.weight": "w_up",
    "feed_forward.w2.weight": "w_down",
    "self_attn.out_proj.weight": "wo",
    "self_attn.q_layernorm.weight": "q_norm",
    "self_attn.k_layernorm.weight": "k_norm",
}


LFM2_LAYERS = MappingProxyType({"conv": SHORT_CONV, "full_attention": Attention(qk_norm=True, windows="none")})
LFM2_HF_GLOBAL = {"model.embedding_norm.weight": "final_norm"}
LFM2_GGUF_GLOBAL = {"token_embd_norm.weight": "final_norm"}


def lfm2_row(name: str, hf_architecture: str, gguf_architecture: str, **own: Any) -> Family:
    """A row of the LFM2 line: its convolution and attention layers, config.json's norm_eps, RoPE
    base 1e6, tied embeddings and the embedding norm as the final norm are the line's; `own`, the
    row's own fields."""
    return Family(
        name,
        (hf_architecture,),
        gguf_architecture,
        LFM2_LAYERS,
        norms=Norms(hf_eps_key="norm_eps"),
        default_theta=1000000.0,
        tie_embeddings=True,
        hf_global_tensors=LFM2_HF_GLOBAL,
        gguf_global_tensors=LFM2_GGUF_GLOBAL,
        **own,
    )


# llama.cpp names the FFN's input norm post_attention_norm in these families' files.
GGUF_FFN_NORM_AS_POST_ATTENTION = {"post_attention_norm.weight": "ffn_norm"}


# Multi-head latent attention's parts (kv_b_proj, both key and value up-projections, is cut into
# wk_b and wv_b at import: hf/latent.py; llama.cpp's older files hold it whole as attn_kv_b).
MLA_HF_LAYER = {
    "self_attn.q_a_proj.weight": "wq_a",
    "self_attn.q_a_layernorm.weight": "q_a_norm",
    "self_attn.q_b_proj.weight": "wq_b",
    "self_attn.kv_a_proj_with_mqa.weight": "wkv_a",
    "self_attn.kv_a_layernorm.weight": "kv_a_norm",
}
MLA_GGUF_LAYER = {
    "attn_q_a.weight": "wq_a",
    "attn_q_a_norm.weight": "q_a_norm",
    "attn_q_b.weight": "wq_b",
    "attn_kv_a_mqa.weight": "wkv_a",
    "attn_kv_a_norm.weight": "kv_a_norm",
    "attn_k_b.weight": "wk_b",
    "attn_v_b.weight": "wv_b",
}


QWEN2_ATTENTION = Attention(qkv_bias="always", o_bias="never", window_flag=True)
QWEN3_ATTENTION = Attention(qk_norm=True, window_flag=True)
GEMMA_ATTENTION = Attention(
    qk_norm=True, windows="pattern", window_period=6, score_scale="query_pre_attn_scalar", local_rope=True
)
GEMMA_NORMS = Norms(plus_one=True, sandwich=True, gguf_eps=1e-6)
GEMMA_FFN = Ffn(activation="gelu_tanh")


# The DeepSeek line's MoE block in both formats: the router's correction bias (V3, GLM-4.x MoE; the
# GGUF's exp_probs_b) and the always-on shared experts (one MLP, n_shared_experts wide).
DEEPSEEK_MOE_HF = {
    "mlp.gate.e_score_correction_bias": "router_choice_bias",
    "mlp.shared_experts.gate_proj.weight": "shared.w_gate",
    "mlp.shared_experts.up_proj.weight": "shared.w_up",
    "mlp.shared_experts.down_proj.weight": "shared.w_down",
}
DEEPSEEK_MOE_GGUF = {"exp_probs_b.bias": "router_choice_bias"}
# V3's routing (GLM-4.x MoE's too): sigmoid scores chosen with the correction bias, group limits,
# the top k renormalised where norm_topk_prob says, then scaled.
DEEPSEEK_V3_MOE = Moe(
    "first_k_dense",
    router="sigmoid",
    gguf_renormalise_default=True,
    shared_expert="ungated",
    groups="always",
    routed_scaling=True,
)


def latent_row(
    name: str, hf_architecture: str, gguf_architecture: str | None, latent: LatentAttention, **own: Any
) -> Family:
    """A row of multi-head latent attention with the DeepSeek line's MoE block: its layers all
    `latent`, the latent parts' and the MoE block's tensor names in both formats are the line's;
    `own`, the row's own fields."""
    return Family(
        name,
        (hf_architecture,),
        gguf_architecture,
        attention_layers(latent),
        hf_tensors={**MLA_HF_LAYER, **DEEPSEEK_MOE_HF},
        gguf_tensors={**MLA_GGUF_LAYER, **DEEPSEEK_MOE_GGUF},
        **own,
    )


# Granite 4.0 hybrid's Mamba-2 layers (the conv1d taps flat and A as -exp(A_log), as views of the
# checkpoint's: hf/granite.py) and its attention layers, under both names transformers gives them.
MAMBA2 = Mamba2(
    hf_tensors={
        "mamba.in_proj.weight": "ssm_in",
        "mamba.conv1d.bias": "ssm_conv_bias",
        "mamba.dt_bias": "ssm_dt_bias",
        "mamba.D": "ssm_d",
        "mamba.norm.weight": "ssm_norm",
        "mamba.out_proj.weight": "ssm_out",
    },
    gguf_tensors={
        "ssm_in.weight": "ssm_in",
        "ssm_conv1d.weight": "ssm_conv",
        "ssm_conv1d.bias": "ssm_conv_bias",
        "ssm_dt.bias": "ssm_dt_bias",
        "ssm_a": "ssm_a",
        "ssm_d": "ssm_d",
        "ssm_norm.weight": "ssm_norm",
        "ssm_out.weight": "ssm_out",
    },
)
GRANITE_ATTENTION = Attention(windows="none", score_scale="attention_multiplier")


# Llama 4: chunked attention on the RoPE layers, every fourth layer without RoPE (llama.cpp's fixed
# pattern), q/k L2 norm, temperature tuning; its FFN names (the experts fused: hf/llama4.py).
LLAMA4_ATTENTION = Attention(windows="chunked", nope_period=4, gguf_chunking=(8192, 8192, 0.1))
LLAMA4_HF_LAYER = {
    "feed_forward.gate_proj.weight": "w_gate",
    "feed_forward.up_proj.weight": "w_up",
    "feed_forward.down_proj.weight": "w_down",
    "feed_forward.router.weight": "router",
    "feed_forward.shared_expert.gate_proj.weight": "shared.w_gate",
    "feed_forward.shared_expert.up_proj.weight": "shared.w_up",
    "feed_forward.shared_expert.down_proj.weight": "shared.w_down",
}


FAMILY_ROWS = (
    Family(
        "llama",
        ("LlamaForCausalLM",),
        "llama",
        attention_layers(Attention()),
        ffn=Ffn(mlp_bias=True),
        gguf_permuted_qk=True,
    ),
    Family("mistral", ("MistralForCausalLM",), None, attention_layers(Attention(windows="every_layer"))),
    Family("qwen2", ("Qwen2ForCausalLM",), "qwen2", attention_layers(QWEN2_ATTENTION)),
    Family("qwen3", ("Qwen3ForCausalLM",), "qwen3", attention_layers(QWEN3_ATTENTION)),
    Family(
        "gemma3",
        ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),  # its text tower; the vision tower is ignored
        "gemma3",
        attention_layers(GEMMA_ATTENTION),
        norms=GEMMA_NORMS,
        hf_text_towers=("Gemma3ForConditionalGeneration",),
        default_theta=1000000.0,
        hf_tensors=GEMMA_HF_NORMS,
        ffn=GEMMA_FFN,
        embed_scale="sqrt_hidden",
        tie_embeddings=True,
        logit_softcap=True,
    ),
    Family(
        "gemma4",
        ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),  # the vision and audio towers are ignored
        "gemma4",
        attention_layers(
            Attention(qk_norm=True, windows="pattern", window_period=6, score_scale="one", local_rope=True)
        ),
        moe=Moe("beside_dense", renormalise="always"),
        norms=Norms(sandwich=True, gguf_eps=1e-6),
        hf_text_towers=("Gemma4ForConditionalGeneration",),
        default_theta=1000000.0,
        gemma4_layers=True,
        hf_tensors={**GEMMA_HF_NORMS, **GEMMA4_HF_LAYER},
        hf_global_tensors=GEMMA4_HF_GLOBAL,
        hf_common_moe=False,
        gguf_tensors=GEMMA4_GGUF_LAYER,
        gguf_global_tensors=GEMMA4_GGUF_GLOBAL,
        ffn=GEMMA_FFN,
        embed_scale="sqrt_hidden",
        tie_embeddings=True,
        logit_softcap=True,
    ),
    Family(
        "mixtral",
        ("MixtralForCausalLM",),
        "llama",
        attention_layers(Attention(windows="every_layer")),
        moe=Moe("every_layer", renormalise="always", gguf_renormalise_default=True),
        gguf_with_experts=True,
        gguf_permuted_qk=True,
    ),
    Family(
        "qwen2_moe",
        ("Qwen2MoeForCausalLM",),
        "qwen2moe",
        attention_layers(QWEN2_ATTENTION),
        moe=Moe("sparse_step", gguf_renormalise_default=False, shared_expert="gated"),
    ),
    Family(
        "qwen3_moe",
        ("Qwen3MoeForCausalLM",),
        "qwen3moe",
        attention_layers(QWEN3_ATTENTION),
        moe=Moe("sparse_step", gguf_renormalise_default=True),
    ),
    Family(
        "qwen3_5_moe",
        ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),  # the vision tower is ignored
        "qwen35moe",
        MappingProxyType(
            {
                "linear_attention": GATED_DELTANET,
                "full_attention": Attention(qk_norm=True, window_flag=True, output_gate=True, partial_rotary=True),
            }
        ),
        ffn=Ffn(dense=False),
        moe=Moe("sparse_step", renormalise="always", shared_expert="gated"),
        norms=Norms(plus_one=True),
        hf_text_towers=("Qwen3_5MoeForConditionalGeneration",),
        gguf_tensors=GGUF_FFN_NORM_AS_POST_ATTENTION,
    ),
    Family(
        "gpt_oss",
        ("GptOssForCausalLM",),
        "gpt-oss",
        attention_layers(Attention(windows="alternating", window_period=2, sinks=True)),
        ffn=Ffn(activation="swiglu_clamped", swiglu=(1.702, 7.0)),
        moe=Moe(
            "every_layer",
            router="topk_then_softmax",
            renormalise="never",
            gguf_renormalise_default=False,
            biases=True,
            fused_experts=True,
        ),
        default_theta=150000.0,
        gguf_yarn_truncate=False,
        gguf_tensors=GGUF_FFN_NORM_AS_POST_ATTENTION,
    ),
    # Multi-head latent attention with the DeepSeek line's MoE. llama.cpp writes all three as
    # deepseek2: a file whose experts are gated by sigmoid is V3's row (GGUF_SIGMOID_GATED), else V2's.
    latent_row(
        "deepseek_v2",
        "DeepseekV2ForCausalLM",
        "deepseek2",
        LatentAttention(rope_interleave="always"),
        # (V2's router scales its top k by routed_scaling_factor and never renormalises them)
        moe=Moe(
            "first_k_dense",
            renormalise="never",
            gguf_renormalise_default=False,
            shared_expert="ungated",
            groups="topk_method",
            routed_scaling=True,
        ),
        norms=Norms(gguf_eps=1e-6),
    ),
    latent_row(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        None,
        LatentAttention(),
        moe=replace(DEEPSEEK_V3_MOE, mtp_key="num_nextn_predict_layers"),
        norms=Norms(gguf_eps=1e-6),
    ),
    latent_row(
        "glm4_moe_lite",
        "Glm4MoeLiteForCausalLM",
        None,
        LatentAttention(),
        moe=replace(DEEPSEEK_V3_MOE, mtp_key="num_nextn_predict_layers", layer_types_key="mlp_layer_types"),
    ),
    Family(
        "glm4_moe",
        ("Glm4MoeForCausalLM",),
        "glm4moe",
        attention_layers(Attention(o_bias="never", qk_norm_flag=True, partial_rotary=True, rotary_fraction=0.5)),
        moe=replace(DEEPSEEK_V3_MOE, mtp_key="num_nextn_predict_layers"),
        hf_tensors=DEEPSEEK_MOE_HF,
        gguf_tensors={**GGUF_FFN_NORM_AS_POST_ATTENTION, **DEEPSEEK_MOE_GGUF},
    ),
    Family(
        "deepseek",
        ("DeepseekForCausalLM",),  # DeepSeekMoE (16B): its own modeling code, no transformers class
        "deepseek",
        attention_layers(Attention()),
        moe=Moe("first_k_dense", gguf_renormalise_default=False, shared_expert="ungated"),
        hf_tensors=DEEPSEEK_MOE_HF,
        gguf_permuted_qk=True,
    ),
    Family(
        "olmoe",
        ("OlmoeForCausalLM",),
        "olmoe",
        attention_layers(Attention(qk_norm=True, qk_norm_whole=True)),
        moe=Moe("every_layer", gguf_renormalise_default=False),
        hf_unsupported={"clip_qkv": (None, "queries, keys and values clipped")},
    ),
    Family(
        "phimoe",
        ("PhimoeForCausalLM",),
        "phimoe",
        attention_layers(Attention(windows="every_layer")),
        moe=Moe("every_layer", router="sparsemixer", renormalise="never", gguf_renormalise_default=None),
        norms=Norms(layer_norm=True),
        default_theta=1000000.0,
        hf_tensors={"input_layernorm.bias": "attn_norm_bias", "post_attention_layernorm.bias": "ffn_norm_bias"},
        hf_global_tensors={"model.norm.bias": "final_norm_bias", "lm_head.bias": "lm_head_bias"},
        gguf_tensors={"attn_norm.bias": "attn_norm_bias", "ffn_norm.bias": "ffn_norm_bias"},
        gguf_global_tensors={"output_norm.bias": "final_norm_bias", "output.bias": "lm_head_bias"},
        lm_head_bias=True,
    ),
    lfm2_row("lfm2", "Lfm2ForCausalLM", "lfm2", ffn=Ffn(block_sizing=True), hf_tensors=LFM2_HF_LAYER),
    lfm2_row(
        "lfm2_moe",
        "Lfm2MoeForCausalLM",
        "lfm2moe",
        # Sigmoid scores chosen with expert_bias, the first num_dense_layers layers dense, the top k
        # renormalised where norm_topk_prob says (plus 1e-6), then routed_scaling_factor.
        moe=Moe(
            "first_k_dense",
            router="sigmoid",
            gguf_renormalise_default=True,
            routed_scaling=True,
            hf_keys=MappingProxyType({"n_routed_experts": "num_experts", "first_k_dense_replace": "num_dense_layers"}),
            norm_eps=1e-6,
        ),
        hf_tensors={
            **LFM2_HF_LAYER,
            "feed_forward.gate.weight": "router",
            "feed_forward.expert_bias": "router_choice_bias",
        },
        gguf_tensors=DEEPSEEK_MOE_GGUF,
    ),
    Family(
        "granite_hybrid",
        ("GraniteMoeHybridForCausalLM",),
        "granitehybrid",
        MappingProxyType(
            {
                "mamba": MAMBA2,
                "linear_attention": MAMBA2,
                "attention": GRANITE_ATTENTION,
                "full_attention": GRANITE_ATTENTION,
            }
        ),
        # num_local_experts 0: every layer's FFN is the shared MLP alone (shared_intermediate_size);
        # else the experts (softmax over the top k's logits) plus that MLP, always on, ungated.
        moe=Moe("every_layer", router="topk_then_softmax", renormalise="never", shared_expert="ungated"),
        granite_multipliers=True,
        hf_tensors={"block_sparse_moe.router.layer.weight": "router"},
        gguf_permuted_qk=True,
    ),
    Family(
        "llama4",
        ("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),  # its text tower; the vision tower is ignored
        "llama4",
        MappingProxyType({"chunked_attention": LLAMA4_ATTENTION, "full_attention": LLAMA4_ATTENTION}),
        ffn=Ffn(hf_width_key="intermediate_size_mlp"),
        moe=Moe(
            "interleave",
            router="topk_then_sigmoid",
            renormalise="never",
            gguf_renormalise_default=None,
            shared_expert="ungated",
            scales_input=True,
        ),
        hf_text_towers=("Llama4ForConditionalGeneration",),
        default_theta=500000.0,
        gguf_permuted_qk=True,  # (llama.cpp's converter keeps the checkpoint's interleaved rows: the same order)
        hf_tensors=LLAMA4_HF_LAYER,
        hf_unsupported={"attention_bias": (False, "q/k/v/o biases")},
    ),
)


FAMILIES = {row.name: row for row in FAMILY_ROWS}


# config.json's class -> its family.
HF_ARCHITECTURES = {arch: row for row in FAMILY_ROWS for arch in row.hf_architectures}


# general.architecture -> its family; GGUF_WITH_EXPERTS: the family such a file is when it has experts.
GGUF_ARCHITECTURES = {
    row.gguf_architecture: row for row in FAMILY_ROWS if row.gguf_architecture and not row.gguf_with_experts
}
GGUF_WITH_EXPERTS = {
    row.gguf_architecture: row for row in FAMILY_ROWS if row.gguf_architecture and row.gguf_with_experts
}
# The family a file of these architectures is when its experts are gated by sigmoid
# (expert_gating_func 2): llama.cpp writes DeepSeek-V3 and GLM-4.7-Flash as deepseek2.
GGUF_SIGMOID_GATED = {"deepseek2": FAMILIES["deepseek_v3"]}
# ... and GLM-4.7-Flash's where the file's vocabulary is GLM's (tokenizer.ggml.pre glm4).
GGUF_SIGMOID_GATED_BY_VOCABULARY = {("deepseek2", "glm4"): FAMILIES["glm4_moe_lite"]}


def gemma_embed_scale(hidden: int) -> float:
    """Gemma scales its embeddings by sqrt(hidden), rounded to float32 as transformers does."""
    return float(np.float32(hidden**0.5))


def check_experts_per_token(where: str, key: str, top_k: int, n_experts: int) -> None:
    """A router takes at most every expert."""
    if top_k > n_experts:
        raise ColibriError(f"{where}: {key} {top_k} exceeds the {n_experts} experts")


def router_fields(where: str, key: str, top_k: int, moe: Moe, jitter: float | None = None) -> dict:
    """The router's spec fields: its kind, and a sparsemixer's jitter (the file's, else the row's
    default). A sparsemixer picks exactly two experts (its second pass masks out the first)."""
    if moe.router != "sparsemixer":
        return dict(router=moe.router)
    if top_k != 2:
        raise ColibriError(f"{where}: {key} {top_k}: the sparsemixer router picks exactly 2 experts")
    jitter = moe.sparsemixer_jitter if jitter is None else jitter
    if jitter < 0:
        raise ColibriError(f"{where}: the sparsemixer's router_jitter_noise must not be negative, got {jitter}")
    return dict(router=moe.router, router_jitter=jitter)


def moe_beside_dense(moe: Moe | None, n_experts: int, top_k: int, expert_intermediate_size: int, n_layers: int) -> dict:
    """Gemma 4's MoE block: every layer routes, beside its dense FFN, its top k renormalised as the
    family's row says."""
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_intermediate_size,
        norm_topk_prob=moe is not None and moe.renormalise == "always",
        moe_layers=(True,) * n_layers,
        moe_beside_dense=True,
    )


def check_kv_sharing(where: str, key: str, shared: int, windows: tuple[int, ...], kind: Callable[[bool], str]) -> int:
    """Gemma 4's KV sharing: the last `shared` layers read the keys and values of the last earlier
    layer of their kind (sliding or global), so one must exist. Returns the first sharing layer.
    `kind(sliding)` names a layer's kind in the message as the file's keys do."""
    n_layers = len(windows)
    if shared > n_layers:
        raise ColibriError(f"{where}: {key} {shared} exceeds the {n_layers} layers")
    first = n_layers - shared
    for i in range(first, n_layers):
        if not any(bool(windows[j]) == bool(windows[i]) for j in range(first)):
            raise ColibriError(
                f"{where}: layer {i} shares keys and values, but no earlier layer is {kind(bool(windows[i]))} "
                f"({key} {shared})"
            )
    return first
