"""Hugging Face tensor names -> canonical names: the common parts of a layer (attention, FFN, MoE,
gpt-oss's router and sinks; a family's own are in model/family_facts.py), the prefixes under which a
multimodal checkpoint keeps its text tower, and what is not text.

Canonical tensor names (used by the planner, the weight image, the generated C and the reference):
  embed, final_norm, lm_head (untied only), and per layer ``layers.N.<part>`` with parts
  attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down,
  b_gate, b_up, b_down (biases and q/k norms only where the architecture has them).
"""

from __future__ import annotations

from ..family_facts import FAMILIES
from ..spec import ModelSpec

HF_LAYER_PARTS = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.o_proj.bias": "bo",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
    "mlp.gate_proj.bias": "b_gate",
    "mlp.up_proj.bias": "b_up",
    "mlp.down_proj.bias": "b_down",
}


# What a KV-sharing layer of a Gemma 4 checkpoint may still hold and does not use (transformers
# ignores them too).
GEMMA4_UNUSED_KV_PARTS = (
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.k_norm.weight",
    "self_attn.v_norm.weight",
)


# Prefixes under which multimodal checkpoints keep their text tower, and parts that are not text.
TEXT_TOWER_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


NOT_TEXT_PREFIXES = (
    "model.vision_tower.",
    "vision_tower.",
    "model.multi_modal_projector.",
    "multi_modal_projector.",
    "model.visual.",  # Qwen3.5's vision tower
    "mtp.",  # Qwen3.5's multi-token-prediction head: not part of next-token decoding
    "model.audio_tower.",  # Gemma 4's audio tower and the embedders of both towers
    "model.embed_vision.",
    "model.embed_audio.",
    "vision_model.",  # Llama 4's vision tower
)


# Expert weights: Mixtral's block_sparse_moe.experts.E.w1/w3/w2, Qwen-MoE's mlp.experts.E.*_proj.
HF_EXPERT_PARTS = {
    "w1": "w_gate",
    "w3": "w_up",
    "w2": "w_down",
    "gate_proj": "w_gate",
    "up_proj": "w_up",
    "down_proj": "w_down",
}


HF_MOE_LAYER_PARTS = {
    "block_sparse_moe.gate.weight": "router",
    "mlp.gate.weight": "router",
    "mlp.shared_expert.gate_proj.weight": "shared.w_gate",
    "mlp.shared_expert.up_proj.weight": "shared.w_up",
    "mlp.shared_expert.down_proj.weight": "shared.w_down",
    "mlp.shared_expert_gate.weight": "shared_gate",
}


# gpt-oss: the router and the sinks under their own names (a family without them meets them as
# unexpected tensors, as any other), and a layer's experts in fused tensors, [E, hidden, 2 x inner]
# with gate and up interleaved (gate = [..., ::2], up = [..., 1::2]), [E, inner, hidden] for down
# (both applied as x @ W), and their biases [E, 2 x inner] and [E, hidden] (fused_parts).
HF_GPT_OSS_LAYER_PARTS = {
    "self_attn.sinks": "sinks",
    "mlp.router.weight": "router",
    "mlp.router.bias": "router_bias",
}


HF_FUSED_EXPERT_BIASES = {
    "mlp.experts.gate_up_proj_bias": (("expert_b_gate", 0), ("expert_b_up", 1)),
    "mlp.experts.down_proj_bias": (("expert_b_down", None),),
}


HF_GLOBAL = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}


def canonical_name(hf_name: str, family_name: str) -> str | None:
    """A checkpoint's tensor name -> its canonical name: the family's own names (model/family_facts.py)
    over the common ones; the common MoE and expert names where the family takes them."""
    family = FAMILIES[family_name]
    hf_name = text_tower_name(hf_name)
    if hf_name in HF_GLOBAL:
        return HF_GLOBAL[hf_name]
    if hf_name in family.hf_global_tensors:
        return family.hf_global_tensors[hf_name]
    parts = {**HF_LAYER_PARTS, **family.hf_layer_tensors}
    if hf_name.startswith("model.layers."):
        rest = hf_name[len("model.layers.") :]
        index, _, part = rest.partition(".")
        if not index.isdigit() or str(int(index)) != index:
            return None
        if part in parts:
            return f"layers.{index}.{parts[part]}"
        if not family.hf_common_moe:
            return None
        if part in HF_MOE_LAYER_PARTS:
            return f"layers.{index}.{HF_MOE_LAYER_PARTS[part]}"
        if part in HF_GPT_OSS_LAYER_PARTS:
            return f"layers.{index}.{HF_GPT_OSS_LAYER_PARTS[part]}"
        for prefix in ("block_sparse_moe.experts.", "mlp.experts.", "feed_forward.experts."):
            if part.startswith(prefix):
                expert, _, rest = part[len(prefix) :].partition(".")
                name = rest[: -len(".weight")] if rest.endswith(".weight") else None
                if expert.isdigit() and str(int(expert)) == expert and name in HF_EXPERT_PARTS:
                    return f"layers.{index}.experts.{expert}.{HF_EXPERT_PARTS[name]}"
    return None


def unused_kv_part(hf_name: str, spec: ModelSpec) -> bool:
    hf_name = text_tower_name(hf_name)
    if not hf_name.startswith("model.layers."):
        return False
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    return (
        index.isdigit()
        and int(index) < spec.n_layers
        and spec.is_kv_consumer(int(index))
        and part in GEMMA4_UNUSED_KV_PARTS
    )


def mtp_layer_part(hf_name: str, spec: ModelSpec) -> bool:
    """A tensor of a multi-token-prediction layer (model.layers.<n> past the last): left out."""
    if not spec.mtp_layers or not hf_name.startswith("model.layers."):
        return False
    index = hf_name[len("model.layers.") :].partition(".")[0]
    return index.isdigit() and spec.n_layers <= int(index) < spec.n_layers + spec.mtp_layers


def text_tower_name(hf_name: str) -> str:
    """A multimodal checkpoint's text-tower tensor under the name a text-only checkpoint gives it."""
    for prefix, replacement in TEXT_TOWER_PREFIXES:
        if hf_name.startswith(prefix):
            return replacement + hf_name[len(prefix) :]
    return hf_name
