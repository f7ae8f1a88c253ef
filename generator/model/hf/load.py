"""Import stage: a Hugging Face model directory -> ModelSpec + its tensors under canonical names,
each read when asked (an HfTensor: where it is, not its values), so a model of any size
goes through generation one piece at a time.

Canonical tensor names (used by the planner, the weight image, the generated C and the reference):
  embed, final_norm, lm_head (untied only), and per layer ``layers.N.<part>`` with parts
  attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down,
  b_gate, b_up, b_down (biases and q/k norms only where the architecture has them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..spec import ModelSpec, RopeSpec, expected_shapes
from . import mxfp4
from .safetensors_io import TensorInfo, read_header, read_rows, rows_cols, strict_json

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
    fused_experts: bool = False  # gpt-oss: a layer's experts in fused, interleaved tensors (_fused_parts)
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
# A Gated DeltaNet layer's tensors (Qwen3.5's linear_attn).
HF_LINEAR_LAYER_PARTS = {
    "linear_attn.in_proj_qkv.weight": "lin_qkv",
    "linear_attn.in_proj_z.weight": "lin_z",
    "linear_attn.in_proj_b.weight": "lin_b",
    "linear_attn.in_proj_a.weight": "lin_a",
    "linear_attn.conv1d.weight": "lin_conv",
    "linear_attn.dt_bias": "lin_dt_bias",
    "linear_attn.A_log": "lin_decay_scale",
    "linear_attn.norm.weight": "lin_norm",
    "linear_attn.out_proj.weight": "lin_out",
}
LINEAR_LAYER_TYPES = ("linear_attention", "full_attention")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")

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
# Gemma's norms: post_attention_layernorm normalises the attention output (not the FFN input).
HF_GEMMA_LAYER_PARTS = dict(
    HF_LAYER_PARTS,
    **{
        "post_attention_layernorm.weight": "post_attn_norm",
        "pre_feedforward_layernorm.weight": "ffn_norm",
        "post_feedforward_layernorm.weight": "post_ffn_norm",
    },
)
# Gemma 4's parts beyond Gemma 3's: the MoE block's norms, router and experts (stacked: _fused_parts),
# the per-layer inputs' gate, projection and norm, the layer scalar.
HF_GEMMA4_LAYER_PARTS = dict(
    HF_GEMMA_LAYER_PARTS,
    **{
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
    },
)
HF_GEMMA4_GLOBAL = {
    "model.embed_tokens_per_layer.weight": "ple_embed",
    "model.per_layer_model_projection.weight": "ple_model_proj",
    "model.per_layer_projection_norm.weight": "ple_proj_norm",
}
# Gemma4TextConfig's global-layer RoPE when config.json names none (its sliding layers': theta 1e4).
GEMMA4_DEFAULT_ROPE = RopeSpec(theta=1000000.0, scaling="proportional", rotated_fraction=0.25)
GEMMA4_UNSUPPORTED = {
    # key: (value that is supported, why)
    "use_bidirectional_attention": (None, "bidirectional attention"),
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
# (both applied as x @ W), and their biases [E, 2 x inner] and [E, hidden] (_fused_parts).
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


@dataclass(frozen=True)
class HfTensor:
    """One tensor of a checkpoint, read when asked. Small and picklable: a worker process given it
    reads the rows it needs from the file itself, so no process holds the whole model.

    The interface generation uses (any importer's tensors provide it): `shape`, and
    `rows(start, stop)`, rows [start, stop) of the tensor as a matrix (a vector is one row),
    float32, values exactly as the model uses them."""

    path: Path
    info: TensorInfo
    plus_one: bool = False  # Gemma's (1 + w) norms, folded in here in float32
    # A view of some of the file's rows: of every `row_period` rows, the `row_count` from `row_first`
    # (Qwen3.5's q_proj holds each head's queries, then its output gate). 0: every row.
    row_period: int = 0
    row_first: int = 0
    row_count: int = 0
    flat: bool = False  # the whole tensor as one vector (Qwen3.5's conv1d taps, [channels, 1, kernel])
    neg_exp: bool = False  # -exp(w), in float64 rounded to float32 (Qwen3.5's A_log: the decay's scale)
    scale: float = 1.0  # multiplied in float32 (Gemma 4's router scale by hidden^-1/2)

    @property
    def shape(self) -> tuple[int, ...]:
        if self.flat:
            return (int(np.prod(self.info.shape)),)
        if self.row_period:
            rows, cols = rows_cols(self.info)
            return (rows // self.row_period * self.row_count, cols)
        return self.info.shape

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.flat:
            arr = read_rows(self.path, self.info, 0, rows_cols(self.info)[0]).reshape(1, -1)[:, :][start:stop]
        elif self.row_period:
            wanted = np.arange(start, stop)
            physical = wanted // self.row_count * self.row_period + self.row_first + wanted % self.row_count
            if len(physical) == 0:
                return np.zeros((0, rows_cols(self.info)[1]), dtype=np.float32)
            lo = int(physical[0])
            arr = read_rows(self.path, self.info, lo, int(physical[-1]) + 1)[physical - lo]
        else:
            arr = read_rows(self.path, self.info, start, stop)
        if self.neg_exp:
            arr = (-np.exp(arr.astype(np.float64))).astype(np.float32)
        if self.scale != 1.0:
            arr = (arr.astype(np.float32) * np.float32(self.scale)).astype(np.float32)
        if self.plus_one:
            # Gemma's RMSNorm scales by (1 + w), computed in float32: folded in once here, so
            # every norm in the runtime is the same x * inv * w.
            arr = (np.float32(1.0) + arr).astype(np.float32)
        return arr

    def load(self) -> np.ndarray:
        """The whole tensor, in its own shape (small tensors and tests; generation reads rows)."""
        return self.rows(0, 1 if self.flat else self.shape[0] if self.row_period else rows_cols(self.info)[0]).reshape(
            self.shape
        )


@dataclass(frozen=True)
class HfFusedSlice:
    """One canonical tensor cut from a fused gpt-oss expert tensor, read when asked (the HfTensor
    interface): expert `expert`'s [rows_in, cols_in] block of a stacked tensor (or, for a bias, its
    row), its even (`parity` 0) or odd (1) columns or all of them (None), transposed for the
    matrices (the checkpoint applies them as x @ W; canonical rows are output features). A bias
    with expert None is every expert's columns, expert after expert, as one vector."""

    path: Path
    info: TensorInfo
    shape: tuple[int, ...]  # the canonical shape
    expert: int | None
    parity: int | None
    transposed: bool
    half: int | None = None  # Gemma 4's gate_up_proj: the first (0) or second (1) half of the rows

    def _block(self, expert: int) -> np.ndarray:
        per_expert = rows_cols(self.info)[0] // self.info.shape[0]
        if self.half is not None:
            half = per_expert // 2
            start = expert * per_expert + self.half * half
            return read_rows(self.path, self.info, start, start + half)
        arr = read_rows(self.path, self.info, expert * per_expert, (expert + 1) * per_expert)
        if self.parity is not None:
            arr = arr[:, self.parity :: 2]
        return arr.T if self.transposed else arr

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.expert is None:  # a bias vector of all experts: one row
            flat = np.concatenate([self._block(e).reshape(-1) for e in range(self.info.shape[0])])
            return np.ascontiguousarray(flat[None, :][start:stop], dtype=np.float32)
        return np.ascontiguousarray(self._block(self.expert)[start:stop], dtype=np.float32)

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0] if len(self.shape) == 2 else 1).reshape(self.shape)


def _fused_parts(hf_name: str, path: Path, info: TensorInfo, spec: ModelSpec) -> dict[str, HfFusedSlice] | None:
    """The canonical tensors a fused gpt-oss expert tensor holds, or None when hf_name is not one."""
    for prefix, replacement in TEXT_TOWER_PREFIXES:
        if hf_name.startswith(prefix):
            hf_name = replacement + hf_name[len(prefix) :]
            break
    family = FAMILIES[spec.family]
    if not hf_name.startswith("model.layers.") or not (family.fused_experts or family.gemma4):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    p, n, d, fe = f"layers.{index}.", spec.n_experts, spec.hidden_size, spec.expert_intermediate_size
    if family.gemma4:  # experts.gate_up_proj [E, 2 x inner, hidden] (gate rows, then up), down [E, hidden, inner]
        shapes = {"experts.gate_up_proj": (n, 2 * fe, d), "experts.down_proj": (n, d, fe)}
        if part not in shapes or not spec.n_experts:
            return None
        if info.shape != shapes[part]:
            raise ColibriError(
                f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(shapes[part])}"
            )
        if part == "experts.down_proj":
            return {p + f"experts.{e}.w_down": HfFusedSlice(path, info, (d, fe), e, None, False) for e in range(n)}
        out = {}
        for e in range(n):
            out[p + f"experts.{e}.w_gate"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=0)
            out[p + f"experts.{e}.w_up"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=1)
        return out
    expected = {
        "mlp.experts.gate_up_proj": (n, d, 2 * fe),
        "mlp.experts.down_proj": (n, fe, d),
        "mlp.experts.gate_up_proj_bias": (n, 2 * fe),
        "mlp.experts.down_proj_bias": (n, d),
    }
    if part not in expected:
        return None
    if info.shape != expected[part]:
        raise ColibriError(
            f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(expected[part])}"
        )
    out = {}
    if part == "mlp.experts.gate_up_proj":
        for e in range(n):
            out[p + f"experts.{e}.w_gate"] = HfFusedSlice(path, info, (fe, d), e, 0, True)
            out[p + f"experts.{e}.w_up"] = HfFusedSlice(path, info, (fe, d), e, 1, True)
    elif part == "mlp.experts.down_proj":
        for e in range(n):
            out[p + f"experts.{e}.w_down"] = HfFusedSlice(path, info, (d, fe), e, None, True)
    else:
        width = fe if part == "mlp.experts.gate_up_proj_bias" else d
        for name, parity in HF_FUSED_EXPERT_BIASES[part]:
            out[p + name] = HfFusedSlice(path, info, (n * width,), None, parity, False)
    return out


@dataclass
class HfCheckpoint:
    """A checkpoint read from a Hugging Face directory (model/checkpoint.Checkpoint)."""

    spec: ModelSpec
    tensors: dict[str, HfTensor]  # canonical name -> where its values are, in plan order
    input_files: list[Path]  # every file the checkpoint was read from (build dependencies)
    tensor_types: None = None  # safetensors hold plain floats: no block types to keep (--quant gguf)
    # Tensors the checkpoint holds already quantized (gpt-oss's MXFP4 experts: hf/mxfp4.py), by
    # their GGUF block type: kept exactly under every integer --quant.
    held_types: dict[str, str] = field(default_factory=dict)


def _mxfp4_parts(
    hf_name: str, located: dict[str, tuple[Path, TensorInfo]], spec: ModelSpec
) -> dict[str, mxfp4.HfMxfp4Slice] | None:
    """The expert matrices of a packed MXFP4 tensor pair (hf/mxfp4.py), named by its _blocks
    tensor ({} for its _scales, read with it), or None when hf_name is not one."""
    if not hf_name.startswith("model.layers.") or not hf_name.endswith(("_blocks", "_scales")):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    stem, _, kind = part.rpartition("_")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    if stem not in mxfp4.PACKED_PARTS:
        return None
    partner = f"model.layers.{index}.{stem}_{'scales' if kind == 'blocks' else 'blocks'}"
    if partner not in located:
        raise ColibriError(f"tensor {hf_name!r} has no {partner!r} beside it (MXFP4 blocks need their scales)")
    if kind == "scales":
        return {}
    n, d, fe = spec.n_experts, spec.hidden_size, spec.expert_intermediate_size
    return mxfp4.expert_slices(f"layers.{index}.", stem, located[hf_name], located[partner], n, d, fe)


def read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ColibriError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ColibriError(f"{path}: cannot read ({e})") from None
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

    def int(self, key: str, default=None, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise ColibriError(f"{self.where}: missing required integer {key!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ColibriError(f"{self.where}: {key!r} must be an integer, got {json.dumps(value)}")
        if value < minimum:
            raise ColibriError(f"{self.where}: {key!r} must be at least {minimum}, got {value}")
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
    if not 0 < low < high:
        raise ColibriError(f"{cfg.where}: llama3 rope needs 0 < low_freq_factor < high_freq_factor")
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
    if family.window_flag and not cfg.bool("use_sliding_window", False):
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
    if family.windows == "pattern":
        pattern = data.get("sliding_window_pattern", data.get("_sliding_window_pattern", 6))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ColibriError(f"{cfg.where}: 'sliding_window_pattern' must be a positive integer")
        return tuple(0 if (i + 1) % pattern == 0 else window for i in range(n_layers))
    if family.windows == "every_layer":
        return (window,) * n_layers
    if family.windows == "alternating":  # gpt-oss without layer_types: even layers slide, odd ones see all
        return tuple(window if i % 2 == 0 else 0 for i in range(n_layers))
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


def _moe(cfg: _Config, family: Family, n_layers: int) -> dict:
    """Mixture-of-experts settings: which layers route, to how many experts, how big they are."""
    key = "num_local_experts" if "num_local_experts" in cfg.data else "num_experts"
    n_experts = cfg.int(key)
    top_k = cfg.int("num_experts_per_tok")
    if top_k > n_experts:
        raise ColibriError(f"{cfg.where}: num_experts_per_tok {top_k} exceeds the {n_experts} experts")
    if family.moe == "gpt_oss":
        # gpt-oss: every layer routes; top-k of the router logits, then softmax over those k.
        return dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=cfg.int("intermediate_size"),
            moe_layers=(True,) * n_layers,
            router="topk_then_softmax",
            router_bias=True,
            expert_biases=True,
        )
    if family.moe == "mixtral":
        # Mixtral: every layer routes; experts have intermediate_size; top-k weights always renormalised.
        return dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=cfg.int("intermediate_size"),
            norm_topk_prob=True,
            moe_layers=(True,) * n_layers,
        )
    step = cfg.int("decoder_sparse_step", 1)
    dense = cfg.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ColibriError(f"{cfg.where}: 'mlp_only_layers' must be a list of layer indices")
    shared = cfg.int("shared_expert_intermediate_size", 0, minimum=0) if family.shared_expert else 0
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=cfg.int("moe_intermediate_size"),
        # Qwen3.5's router always renormalises its top k (its config.json has no norm_topk_prob).
        norm_topk_prob=True if family.hybrid_linear else cfg.bool("norm_topk_prob", False),
        shared_expert_intermediate_size=shared,
        moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers)),
    )


def _hybrid_linear(cfg: _Config, n_layers: int, head_dim: int) -> dict:
    """Qwen3.5's Gated DeltaNet settings: which layers are linear attention (layer_types, or every
    full_attention_interval-th layer full attention), the DeltaNet heads and convolution, the
    partial RoPE of its full-attention layers and their output gate."""
    data = cfg.data
    layer_types = data.get("layer_types")
    if layer_types is None:
        interval = cfg.int("full_attention_interval", 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise ColibriError(f"{cfg.where}: 'layer_types' must list one type per layer ({n_layers})")
    for t in layer_types:
        if t not in LINEAR_LAYER_TYPES:
            raise ColibriError(
                f"{cfg.where}: unsupported layer type {json.dumps(t)} (supported: {', '.join(LINEAR_LAYER_TYPES)})"
            )
    if "full_attention" not in layer_types:
        raise ColibriError(f"{cfg.where}: 'layer_types' has no full_attention layer (at least one is supported)")
    k_heads = cfg.int("linear_num_key_heads")
    v_heads = cfg.int("linear_num_value_heads")
    if v_heads % k_heads:
        raise ColibriError(
            f"{cfg.where}: linear_num_value_heads {v_heads} is not a multiple of linear_num_key_heads {k_heads}"
        )
    params = data.get("rope_parameters")
    factor = cfg.float("partial_rotary_factor", data.get("partial_rotary_factor", 1.0), params or {})
    rope_dim = int(head_dim * factor)
    if not 0 < factor <= 1 or rope_dim < 2 or rope_dim % 2:
        raise ColibriError(
            f"{cfg.where}: partial_rotary_factor {factor} must rotate an even number of head_dim's {head_dim} dims"
        )
    return dict(
        linear_layers=tuple(t == "linear_attention" for t in layer_types),
        linear_k_heads=k_heads,
        linear_v_heads=v_heads,
        linear_k_dim=cfg.int("linear_key_head_dim"),
        linear_v_dim=cfg.int("linear_value_head_dim"),
        linear_conv_kernel=cfg.int("linear_conv_kernel_dim"),
        attn_output_gate=True,
        rope_dim=0 if rope_dim == head_dim else rope_dim,
    )


def _gemma4(cfg: _Config, n_layers: int, windows: tuple[int, ...], vocab: int) -> dict:
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
        if top_k > n_experts:
            raise ColibriError(f"{cfg.where}: top_k_experts {top_k} exceeds the {n_experts} experts")
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=cfg.int("moe_intermediate_size"),
            norm_topk_prob=True,
            moe_layers=(True,) * n_layers,
            moe_beside_dense=True,
        )
    shared = cfg.int("num_kv_shared_layers", 0, minimum=0)
    if shared > n_layers:
        raise ColibriError(f"{cfg.where}: num_kv_shared_layers {shared} exceeds the {n_layers} layers")
    first = n_layers - shared
    for i in range(first, n_layers):
        if not any(bool(windows[j]) == bool(windows[i]) for j in range(first)):
            kind = "sliding_attention" if windows[i] else "full_attention"
            raise ColibriError(
                f"{cfg.where}: layer {i} shares keys and values, but no earlier layer is {kind} "
                f"(num_kv_shared_layers {shared})"
            )
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
    if arch in TEXT_CONFIG_ARCHITECTURES:
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise ColibriError(f"config.json: {arch} needs a 'text_config' object")
        cfg = _Config(text, "config.json text_config")
        data = text
    gemma = family.gemma

    hidden = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    n_kv = cfg.int("num_key_value_heads", n_heads)
    head_dim = data.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise ColibriError(f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {n_heads}")
        head_dim = hidden // n_heads
    else:
        head_dim = cfg.int("head_dim")
    if n_heads % n_kv:
        raise ColibriError(f"config.json: num_attention_heads {n_heads} is not divisible by num_key_value_heads {n_kv}")
    if head_dim % 2:
        raise ColibriError(f"config.json: head_dim {head_dim} must be even for rotary embeddings")
    if gemma:
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
    if family.clamped_swiglu:
        activation = "swiglu_clamped"
        swiglu = dict(swiglu_alpha=cfg.float("swiglu_alpha", 1.702), swiglu_limit=cfg.float("swiglu_limit", 7.0))
        if swiglu["swiglu_limit"] <= 0:
            raise ColibriError(f"config.json: 'swiglu_limit' must be positive, got {swiglu['swiglu_limit']}")
    if not family.hybrid_linear and data.get("partial_rotary_factor", 1.0) != 1.0:
        raise ColibriError("config.json: partial_rotary_factor other than 1.0 is not supported")
    n_layers = cfg.int("num_hidden_layers")
    max_pos = cfg.int("max_position_embeddings", 2048)
    eps = cfg.float("rms_norm_eps", 1e-6)
    if not 0 < eps < 1:
        raise ColibriError("config.json: 'rms_norm_eps' must be between 0 and 1")

    attention_bias = cfg.bool("attention_bias", False)
    qkv_bias = True if family.qkv_bias == "always" else attention_bias
    o_bias = False if family.o_bias == "never" else attention_bias
    mlp_bias = cfg.bool("mlp_bias", False) if family.mlp_bias else False

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
    gemma4 = _gemma4(cfg, n_layers, windows, vocab) if family.gemma4 else {}

    return ModelSpec(
        name=name,
        architecture=arch,
        family=family_name,
        vocab_size=vocab,
        hidden_size=hidden,
        # (Qwen3.5 has no dense FFN: every layer routes, and its config.json no intermediate_size.)
        intermediate_size=cfg.int(
            "intermediate_size", data.get("moe_intermediate_size") if family.hybrid_linear else None
        ),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope=(
            GEMMA4_DEFAULT_ROPE
            if family.gemma4 and data.get("rope_parameters") is None
            else _rope(cfg, max_pos, 1000000.0 if gemma else family.default_theta)
        ),
        max_position_embeddings=max_pos,
        tie_embeddings=cfg.bool("tie_word_embeddings", gemma),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=family.qk_norm,
        layer_windows=windows,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=eos,
        activation=activation,
        embed_scale=float(np.float32(hidden**0.5)) if gemma else 1.0,
        # (Gemma 4 normalises queries and keys and scores them unscaled.)
        attn_scale=1.0 if family.gemma4 else (cfg.float("query_pre_attn_scalar", head_dim) ** -0.5) if gemma else 0.0,
        post_norms=gemma,
        rope_local=_rope_local(cfg, max_pos) if gemma else None,
        # (Gemma 3 configs may carry attn_logit_softcapping, but transformers' Gemma 3 never applies it.)
        # transformers applies final_logit_softcapping in Gemma3ForCausalLM, not in the multimodal class.
        final_softcap=_softcap(cfg, "final_logit_softcapping") if arch != "Gemma3ForConditionalGeneration" else 0.0,
        **(_moe(cfg, family, n_layers) if family.moe else {}),
        **gemma4,
        **(_hybrid_linear(cfg, n_layers, head_dim) if family.hybrid_linear else {}),
        attn_sinks=family.attn_sinks,
        **swiglu,
    )


def _canonical(hf_name: str, family: str) -> str | None:
    for prefix, replacement in TEXT_TOWER_PREFIXES:
        if hf_name.startswith(prefix):
            hf_name = replacement + hf_name[len(prefix) :]
            break
    if hf_name in HF_GLOBAL:
        return HF_GLOBAL[hf_name]
    if FAMILIES[family].gemma4 and hf_name in HF_GEMMA4_GLOBAL:
        return HF_GEMMA4_GLOBAL[hf_name]
    parts = HF_GEMMA_LAYER_PARTS if FAMILIES[family].gemma else HF_LAYER_PARTS
    if FAMILIES[family].gemma4:
        parts = HF_GEMMA4_LAYER_PARTS
    if hf_name.startswith("model.layers."):
        rest = hf_name[len("model.layers.") :]
        index, _, part = rest.partition(".")
        if not index.isdigit() or str(int(index)) != index:
            return None
        if part in parts:
            return f"layers.{index}.{parts[part]}"
        if FAMILIES[family].gemma4:
            return None
        if part in HF_MOE_LAYER_PARTS:
            return f"layers.{index}.{HF_MOE_LAYER_PARTS[part]}"
        if FAMILIES[family].hybrid_linear and part in HF_LINEAR_LAYER_PARTS:
            return f"layers.{index}.{HF_LINEAR_LAYER_PARTS[part]}"
        if part in HF_GPT_OSS_LAYER_PARTS:
            return f"layers.{index}.{HF_GPT_OSS_LAYER_PARTS[part]}"
        for prefix in ("block_sparse_moe.experts.", "mlp.experts."):
            if part.startswith(prefix):
                expert, _, rest = part[len(prefix) :].partition(".")
                name = rest[: -len(".weight")] if rest.endswith(".weight") else None
                if expert.isdigit() and str(int(expert)) == expert and name in HF_EXPERT_PARTS:
                    return f"layers.{index}.experts.{expert}.{HF_EXPERT_PARTS[name]}"
    return None


def _unused_kv_part(hf_name: str, spec: ModelSpec) -> bool:
    for prefix, replacement in TEXT_TOWER_PREFIXES:
        if hf_name.startswith(prefix):
            hf_name = replacement + hf_name[len(prefix) :]
            break
    if not hf_name.startswith("model.layers."):
        return False
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    return (
        index.isdigit()
        and int(index) < spec.n_layers
        and spec.is_kv_consumer(int(index))
        and part in GEMMA4_UNUSED_KV_PARTS
    )


def _view(spec: ModelSpec, canonical: str, path: Path, info: TensorInfo) -> HfTensor:
    """The canonical tensor as a view of the file's: Gemma's and Qwen3.5's (1 + w) norms (not
    Qwen3.5's gated norm, which scales by w), the queries and the output gate of Qwen3.5's q_proj
    (each head's head_dim queries, then its head_dim gates), its convolution's taps as one vector."""
    family = FAMILIES[spec.family]
    plus_one = (
        (family.gemma or family.hybrid_linear)
        and not family.gemma4
        and canonical.endswith("norm")
        and not canonical.endswith("lin_norm")
    )
    if family.gemma4 and canonical.endswith("router_norm"):
        return HfTensor(path, info, scale=spec.hidden_size**-0.5)
    if spec.attn_output_gate and (canonical.endswith(".wq") or canonical.endswith(".wq_gate")):
        hd = spec.head_dim
        if info.shape != (2 * spec.q_dim, spec.hidden_size):
            return HfTensor(path, info)  # reported with the shape the config implies
        return HfTensor(path, info, row_period=2 * hd, row_first=hd if canonical.endswith("_gate") else 0, row_count=hd)
    if canonical.endswith("lin_conv"):
        if info.shape != (spec.linear_conv_dim, 1, spec.linear_conv_kernel):
            return HfTensor(path, info)
        return HfTensor(path, info, flat=True)
    if canonical.endswith("lin_decay_scale"):
        return HfTensor(path, info, neg_exp=True)
    return HfTensor(path, info, plus_one=plus_one)


def _file_shape(spec: ModelSpec, canonical: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a checkpoint's tensor must have for the canonical `shape` (as config.json implies)."""
    if spec.attn_output_gate and canonical.endswith((".wq", ".wq_gate")):
        return (2 * shape[0], shape[1])
    if canonical.endswith("lin_conv"):
        return (spec.linear_conv_dim, 1, spec.linear_conv_kernel)
    return shape


def _tensor_files(model_dir: Path) -> dict[str, tuple[Path, TensorInfo]]:
    """HF tensor name -> (file, header entry), from one file or a sharded index."""
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    located: dict[str, tuple[Path, TensorInfo]] = {}
    if single.is_file():
        for name, info in read_header(single).items():
            located[name] = (single, info)
        return located
    if not index.is_file():
        raise ColibriError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ColibriError("model.safetensors.index.json: 'weight_map' must be a non-empty object")
    root = model_dir.resolve()
    headers: dict[Path, dict[str, TensorInfo]] = {}
    for name, shard in sorted(weight_map.items()):
        if not isinstance(shard, str) or not shard:
            raise ColibriError(f"model.safetensors.index.json: tensor {name!r} has no shard file name")
        path = (model_dir / shard).resolve()
        if path.parent != root:
            raise ColibriError(f"model.safetensors.index.json: shard {shard!r} is outside the model directory")
        if not path.is_file():
            raise ColibriError(f"model.safetensors.index.json: shard {shard!r} for tensor {name!r} does not exist")
        if path not in headers:
            headers[path] = read_header(path)
        if name not in headers[path]:
            raise ColibriError(f"model.safetensors.index.json: tensor {name!r} is not in shard {shard!r}")
        located[name] = (path, headers[path][name])
    for path, header in headers.items():
        for name in header:
            if weight_map.get(name) is None:
                raise ColibriError(f"{path.name}: tensor {name!r} is not listed in model.safetensors.index.json")
    return located


def load_hf(model_dir: Path | str, load_tensors: bool = True) -> HfCheckpoint:
    """Read a model directory: config, and every safetensors header checked against it. No tensor
    is read here: `tensors` says where each one is (with load_tensors=False it is left empty, for
    callers that only plan)."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ColibriError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise ColibriError(f"{model_dir} is not a directory (give the folder holding config.json)")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ColibriError(f"{model_dir}: no config.json (is this a Hugging Face model directory?)")
    gen_path = model_dir / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else None
    config = read_json(config_path)
    spec = parse_config(config, model_dir.resolve().name, generation)
    packed = mxfp4.quant_method(config) == mxfp4.QUANT_METHOD and FAMILIES[spec.family].fused_experts

    located = _tensor_files(model_dir)
    wanted = expected_shapes(spec)
    by_canonical: dict[str, tuple[Path, TensorInfo]] = {}
    fused: dict[str, HfFusedSlice | mxfp4.HfMxfp4Slice] = {}
    held: dict[str, str] = {}
    for hf_name, (path, info) in sorted(located.items()):
        if hf_name.startswith(NOT_TEXT_PREFIXES):
            continue  # the vision tower of a multimodal checkpoint
        parts = _mxfp4_parts(hf_name, located, spec) if packed else None
        if parts is not None:  # gpt-oss's MXFP4 experts: their blocks kept as they are
            fused.update(parts)
            held.update({canonical: "MXFP4" for canonical in parts})
            for canonical in parts:
                by_canonical[canonical] = (path, info)
            continue
        parts = _fused_parts(hf_name, path, info, spec)
        if parts is not None:  # gpt-oss's fused experts: their shapes checked there
            fused.update(parts)
            for canonical in parts:
                by_canonical[canonical] = (path, info)
            continue
        canonical = _canonical(hf_name, spec.family)
        if spec.kv_shared_layers and _unused_kv_part(hf_name, spec):
            continue  # a KV-sharing layer's own k/v projections and norms: not used
        if canonical is None:
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue  # a cache some exporters save; recomputed by the generator
            raise ColibriError(f"unexpected tensor {hf_name!r} for {spec.architecture} with this config.json")
        if canonical == "lm_head" and spec.tie_embeddings:
            continue  # some exporters also save the tied copy
        if canonical not in wanted:
            raise ColibriError(f"unexpected tensor {hf_name!r} for {spec.architecture} with this config.json")
        by_canonical[canonical] = (path, info)
        if spec.attn_output_gate and canonical.endswith(".wq"):
            by_canonical[canonical + "_gate"] = (path, info)  # the same q_proj: its gate rows
    views = {}
    for canonical, shape in wanted.items():
        if canonical not in by_canonical:
            raise ColibriError(f"missing tensor for {canonical!r} ({spec.architecture}, expected shape {list(shape)})")
        if canonical in fused:
            views[canonical] = fused[canonical]  # its shape checked by _fused_parts
            continue
        path, info = by_canonical[canonical]
        views[canonical] = _view(spec, canonical, path, info)
        if views[canonical].shape != shape:
            implied = list(_file_shape(spec, canonical, shape))
            raise ColibriError(f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {implied}")

    tensors: dict[str, HfTensor] = {}
    if load_tensors:
        tensors = views
    files = sorted(
        {config_path, *(p for p, _ in by_canonical.values())}
        | ({gen_path} if gen_path.is_file() else set())
        | (
            {model_dir / "model.safetensors.index.json"}
            if (model_dir / "model.safetensors.index.json").is_file()
            else set()
        )
    )
    return HfCheckpoint(spec=spec, tensors=tensors, input_files=files, held_types=held)


# The files beside the weights that a release carries with them (not generation inputs: the
# firmware sees token ids only).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_weights(model_dir: Path) -> bool:
    return (model_dir / "model.safetensors").is_file() or (model_dir / "model.safetensors.index.json").is_file()


def config_only_spec(model_dir: Path) -> ModelSpec | None:
    """The spec of a configuration without weights (a published config.json alone, as
    models/configs holds), or None when the directory has weights or no config.json."""
    config_path = model_dir / "config.json"
    if has_weights(model_dir) or not config_path.is_file():
        return None
    return parse_config(read_json(config_path), model_dir.resolve().name)


def config_only_held_types(model_dir: Path) -> dict[str, str]:
    """The tensors a configuration without weights says its checkpoint holds quantized (gpt-oss's
    MXFP4 experts, by config.json's quantization_config), as HfCheckpoint.held_types would be."""
    config = read_json(model_dir / "config.json")
    spec = parse_config(config, model_dir.resolve().name)
    if mxfp4.quant_method(config) != mxfp4.QUANT_METHOD or not FAMILIES[spec.family].fused_experts:
        return {}
    return mxfp4.published_held_types(spec)


def generation_config(model_dir: Path) -> tuple[dict, Path]:
    """generation_config.json's settings ({} without one), and the file, to name in messages."""
    path = model_dir / "generation_config.json"
    return (read_json(path) if path.is_file() else {}), path


def tokenizer_files(model_dir: Path) -> list[Path]:
    return [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
