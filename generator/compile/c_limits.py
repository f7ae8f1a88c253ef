"""Every model value the generated C holds, checked against the C type it lands in, in one place,
before anything is generated: a sliding window of 2^32 + 3 or 2^62 must be one line naming the
config key, not gcc's -Werror=overflow in colibri_layer_window[], and 2^31 must not compile as
INT_MIN. Counts and widths are C ints (int32_t arrays and #defines the runtime reads into int);
byte sizes and offsets that can pass 2^31 are 64-bit in the generated C and are not listed here.
Floats are written as float32 constants, so each must be finite there."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import ColibriError
from ..model.spec import ModelSpec
from .plan import Plan

INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class CValue:
    key: str  # the config key (Hugging Face's name; a GGUF file's is the same value)
    lands_in: str  # where the generated C holds it
    values: Callable[[ModelSpec, Plan], Iterable]
    ctype: str  # "int32" | "float32"


def _layers(method: str) -> Callable[[ModelSpec, Plan], Iterable]:
    return lambda s, p: (getattr(s, method)(i) for i in range(s.n_layers))


def _ropes(s: ModelSpec, p: Plan) -> Iterable:
    return [v for r in p.ropes for v in (r.theta, r.factor, r.attention_factor)]


C_VALUES = (
    CValue("vocab_size", "COLIBRI_VOCAB", lambda s, p: [s.vocab_size], "int32"),
    CValue("hidden_size", "COLIBRI_DIM", lambda s, p: [s.hidden_size], "int32"),
    CValue("intermediate_size", "COLIBRI_FFN_DIM", lambda s, p: [s.intermediate_size], "int32"),
    CValue("num_hidden_layers", "COLIBRI_N_LAYERS", lambda s, p: [s.n_layers], "int32"),
    CValue("num_attention_heads", "COLIBRI_N_HEADS", lambda s, p: [s.n_heads], "int32"),
    CValue("num_key_value_heads", "COLIBRI_N_KV_HEADS", lambda s, p: [s.n_kv_heads], "int32"),
    CValue("head_dim", "COLIBRI_HEAD_DIM", lambda s, p: [s.head_dim, s.global_head_dim], "int32"),
    CValue("num_attention_heads * head_dim", "COLIBRI_Q_DIM", lambda s, p: [s.q_dim, s.max_q_dim], "int32"),
    CValue("num_key_value_heads * head_dim", "COLIBRI_KV_DIM", lambda s, p: [s.kv_dim, s.max_kv_dim], "int32"),
    CValue("sliding_window", "int32_t colibri_layer_window[]", lambda s, p: s.layer_windows, "int32"),
    CValue("eos_token_id", "int32_t colibri_eos_ids[]", lambda s, p: s.eos_token_ids, "int32"),
    CValue("intermediate_size (per layer)", "int32_t colibri_layer_ffn_dim[]", _layers("layer_ffn_dim"), "int32"),
    CValue("num_experts", "COLIBRI_N_EXPERTS", lambda s, p: [s.n_experts], "int32"),
    CValue("num_experts_per_tok", "COLIBRI_EXPERTS_PER_TOKEN", lambda s, p: [s.experts_per_token], "int32"),
    CValue("moe_intermediate_size", "COLIBRI_EXPERT_FFN_DIM", lambda s, p: [s.expert_intermediate_size], "int32"),
    CValue(
        "shared_expert_intermediate_size",
        "COLIBRI_SHARED_FFN_DIM",
        lambda s, p: [s.shared_expert_intermediate_size],
        "int32",
    ),
    CValue(
        "linear attention heads and widths",
        "COLIBRI_LINEAR_*",
        lambda s, p: [s.linear_k_heads, s.linear_v_heads, s.linear_key_dim, s.linear_value_dim, s.linear_conv_dim],
        "int32",
    ),
    CValue("hidden_size_per_layer_input", "COLIBRI_PLE_DIM", lambda s, p: [s.ple_dim, s.ple_dim * s.n_layers], "int32"),
    CValue("context length (--ctx)", "COLIBRI_N_CTX", lambda s, p: [p.n_ctx], "int32"),
    CValue(
        "context length (--ctx) * key/value width", "int32_t colibri_kv_offset[]", lambda s, p: p.kv_offsets, "int32"
    ),
    CValue("rms_norm_eps", "COLIBRI_RMS_NORM_EPS", lambda s, p: [s.rms_norm_eps], "float32"),
    CValue("query_pre_attn_scalar", "COLIBRI_ATTN_SCALE", lambda s, p: [s.score_scale], "float32"),
    CValue("embedding scale", "COLIBRI_EMBED_SCALE", lambda s, p: [s.embed_scale], "float32"),
    CValue("final_logit_softcapping", "COLIBRI_FINAL_SOFTCAP", lambda s, p: [s.final_softcap], "float32"),
    CValue("swiglu_limit", "COLIBRI_SWIGLU_*", lambda s, p: [s.swiglu_alpha, s.swiglu_limit], "float32"),
    CValue("rope_theta, rope_scaling", "the RoPE tables", _ropes, "float32"),
)


def _fits(value: object, ctype: str) -> bool:
    if ctype == "int32":
        return isinstance(value, (int, np.integer)) and 0 <= value <= INT32_MAX
    return isinstance(value, (int, float, np.floating)) and math.isfinite(value) and abs(value) <= FLOAT32_MAX


_LIMITS = {
    "int32": f"an integer from 0 to {INT32_MAX:,} (int32_t)",
    "float32": f"a finite float32 (at most {FLOAT32_MAX:.4g} in magnitude)",
}


def check_c_limits(spec: ModelSpec, plan: Plan) -> None:
    """Every row of C_VALUES: the first value outside its C type is one line naming the config key,
    where the C holds it and the limit."""
    for row in C_VALUES:
        for value in row.values(spec, plan):
            if not _fits(value, row.ctype):
                raise ColibriError(
                    f"{spec.name}: {row.key} = {value!r} does not fit {row.lands_in} in the generated C: "
                    f"it must be {_LIMITS[row.ctype]}"
                )
