"""llama.cpp's tensor names -> canonical names (`token_embd.weight`, `blk.N.attn_q.weight`,
`blk.N.ffn_gate_exps.weight`, ...): the global and per-layer tables, Qwen3.5's and Gemma 4's, and
the stacked experts and their biases."""

from __future__ import annotations

import re

from .archs import GgufArch

# Qwen3.5's tensors (llama.cpp's qwen35moe): the DeltaNet's, and its FFN norm under another name.
HYBRID_LINEAR_TENSORS = {
    "attn_qkv.weight": "lin_qkv",
    "attn_gate.weight": "lin_z",
    "ssm_beta.weight": "lin_b",
    "ssm_alpha.weight": "lin_a",
    "ssm_conv1d.weight": "lin_conv",
    "ssm_dt.bias": "lin_dt_bias",
    "ssm_a": "lin_decay_scale",
    "ssm_norm.weight": "lin_norm",
    "ssm_out.weight": "lin_out",
    "post_attention_norm.weight": "ffn_norm",
}


# Gemma 4's tensors (llama.cpp's gemma4): the per-layer inputs, the layer scalar, the MoE block's
# norms, router scale and per-expert scales; its experts' gate and up in one stacked tensor.
GEMMA4_GLOBAL_TENSORS = {
    "per_layer_token_embd.weight": "ple_embed",
    "per_layer_model_proj.weight": "ple_model_proj",
    "per_layer_proj_norm.weight": "ple_proj_norm",
}


GEMMA4_TENSORS = {
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


GEMMA4_GATE_UP = "ffn_gate_up_exps.weight"


GEMMA4_UNUSED_KV = ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight")  # of a KV-sharing layer, if a file has them


# The global layers' RoPE (llama.cpp writes rope_freqs: 1 for each pair that rotates, 1e30 for the others).
GEMMA4_ROPE_FREQS = "rope_freqs.weight"


GLOBAL_TENSORS = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}


LAYER_TENSORS = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_output.weight": "wo",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_output.bias": "bo",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "post_attention_norm.weight": "post_attn_norm",
    "ffn_norm.weight": "ffn_norm",
    "post_ffw_norm.weight": "post_ffn_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
    "ffn_gate.bias": "b_gate",
    "ffn_up.bias": "b_up",
    "ffn_down.bias": "b_down",
    "ffn_gate_inp.weight": "router",
    "ffn_gate_shexp.weight": "shared.w_gate",
    "ffn_up_shexp.weight": "shared.w_up",
    "ffn_down_shexp.weight": "shared.w_down",
    "ffn_gate_inp_shexp.weight": "shared_gate",
    "attn_sinks.weight": "sinks",
    "ffn_gate_inp.bias": "router_bias",
}


# Experts stacked in one tensor (n_experts, rows, cols): split into the canonical per-expert names.
EXPERT_TENSORS = {"ffn_gate_exps.weight": "w_gate", "ffn_up_exps.weight": "w_up", "ffn_down_exps.weight": "w_down"}


# Experts' biases stacked (n_experts, width): one canonical vector each, expert after expert.
EXPERT_BIASES = {
    "ffn_gate_exps.bias": "expert_b_gate",
    "ffn_up_exps.bias": "expert_b_up",
    "ffn_down_exps.bias": "expert_b_down",
}


LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")


def canonical_name(name: str, arch: GgufArch | None = None) -> tuple[str, bool] | None:
    """GGUF tensor name -> (canonical name or per-expert pattern, stacked experts?)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name], False
    if arch is not None and arch.gemma4 and name in GEMMA4_GLOBAL_TENSORS:
        return GEMMA4_GLOBAL_TENSORS[name], False
    m = LAYER_NAME.fullmatch(name)
    if not m:
        return None
    index, part = m.groups()
    if arch is not None and arch.gemma4 and part in GEMMA4_TENSORS:
        return f"layers.{index}.{GEMMA4_TENSORS[part]}", False
    if arch is not None and arch.hybrid_linear and part in HYBRID_LINEAR_TENSORS:
        return f"layers.{index}.{HYBRID_LINEAR_TENSORS[part]}", False
    if part == "post_attention_norm.weight" and arch is not None:
        return f"layers.{index}.{arch.post_attention_norm}", False
    if part in EXPERT_BIASES:
        return f"layers.{index}.{EXPERT_BIASES[part]}", False
    if part in LAYER_TENSORS:
        return f"layers.{index}.{LAYER_TENSORS[part]}", False
    if part in EXPERT_TENSORS:
        return f"layers.{index}.experts.{{}}.{EXPERT_TENSORS[part]}", True
    return None
