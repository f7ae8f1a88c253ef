"""llama.cpp's tensor names -> canonical names (`token_embd.weight`, `blk.N.attn_q.weight`,
`blk.N.ffn_gate_exps.weight`, ...): the common global and per-layer tables (a family's own are in
model/family_facts.py), Gemma 4's stacked gate and up, and the stacked experts and their biases."""

from __future__ import annotations

import re

from ..family_facts import Family

# Gemma 4's experts' gate and up in one stacked tensor (gguf/load.py splits it).
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


def canonical_name(name: str, family: Family | None = None) -> tuple[str, bool] | None:
    """GGUF tensor name -> (canonical name or per-expert pattern, stacked experts?): the family's
    own names (model/family_facts.py) first, then the common ones."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name], False
    if family is not None and name in family.gguf_global_tensors:
        return family.gguf_global_tensors[name], False
    m = LAYER_NAME.fullmatch(name)
    if not m:
        return None
    index, part = m.groups()
    own = family.gguf_layer_tensors if family is not None else {}
    if part in own:
        return f"layers.{index}.{own[part]}", False
    if part in EXPERT_BIASES:
        return f"layers.{index}.{EXPERT_BIASES[part]}", False
    if part in LAYER_TENSORS:
        return f"layers.{index}.{LAYER_TENSORS[part]}", False
    if part in EXPERT_TENSORS:
        return f"layers.{index}.experts.{{}}.{EXPERT_TENSORS[part]}", True
    return None
