"""Import stage for GGUF files: metadata -> ModelSpec, tensors -> the canonical names and float32.

The GGUF counterpart of hf/load.load_hf: the same ModelSpec and the same canonical
tensors a safetensors checkpoint of the model gives, from llama.cpp's names and keys
(`{arch}.block_count`, `blk.N.attn_q.weight`, `blk.N.ffn_gate_exps.weight`, ...).

llama.cpp's converter permutes the rows of q_proj and k_proj (weights and biases) of
llama-architecture models for its interleaved RoPE; `unpermute_rows` undoes it exactly (a pure
row reordering). Gemma's converter stores norms as (1 + w): the canonical form already.
Floats in the metadata are float32; each is read back as the shortest decimal that rounds to
the same float32 (1e-05, not 9.99999974738e-06), which is what the checkpoint's config said.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..spec import ModelSpec, RopeSpec, expected_shapes
from .file import GgufFile, GgufTensorInfo, read_gguf
from .tensors import EXACT_TYPES, QuantBlocks, readable, rows_blocks, rows_f32, tensor_blocks


@dataclass(frozen=True)
class GgufArch:
    """What sets one GGUF architecture apart (the GGUF side of hf/load.FAMILIES)."""

    family: str  # the spec's family, as hf/load.FAMILIES names it
    architecture: str  # the Hugging Face class the spec names
    permuted_qk: bool = False  # llama.cpp's converter permuted the q/k rows (llama architecture)
    qkv_bias: bool = False  # always has q/k/v biases (Qwen2); elsewhere the tensors present decide
    qk_norm: bool = False
    gemma: bool = False  # see hf/load.Family.gemma
    moe: bool = False
    shared_expert: bool = False
    norm_topk_prob: bool = False  # llama.cpp's default when {arch}.expert_weights_norm is absent
    hybrid_linear: bool = False  # see hf/load.Family.hybrid_linear (Qwen3.5's Gated DeltaNet layers)
    # gpt-oss (llama.cpp's openai-moe): sink logits, top-k then softmax, its SwiGLU with llama.cpp's
    # fixed alpha 1.702 and limit 7.0, post_attention_norm as the FFN's input norm, sliding layers
    # alternating (llama.cpp's default pattern 2: even layers slide), and YaRN without truncation
    # (the ramp's ends not rounded; what gpt-oss's config says, and the file does not record).
    attn_sinks: bool = False
    router: str = "softmax_then_topk"
    swiglu: tuple[float, float] | None = None  # (alpha, limit) of the clamped SwiGLU
    post_attention_norm: str = "post_attn_norm"  # the canonical norm blk.N.post_attention_norm is
    swa_pattern: int = 0  # llama.cpp's default sliding-window pattern (0: every layer slides)
    yarn_truncate: bool = True
    rope_theta: float = 10000.0
    gemma4: bool = False  # see hf/load.Family.gemma4 (_gemma4 reads its keys)


GGUF_ARCHITECTURES = {
    "llama": GgufArch("llama", "LlamaForCausalLM", permuted_qk=True),
    "qwen2": GgufArch("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": GgufArch("qwen3", "Qwen3ForCausalLM", qk_norm=True),
    "gemma3": GgufArch("gemma3", "Gemma3ForCausalLM", qk_norm=True, gemma=True),
    "gemma4": GgufArch("gemma4", "Gemma4ForCausalLM", qk_norm=True, gemma=True, moe=True, gemma4=True),
    "qwen2moe": GgufArch("qwen2_moe", "Qwen2MoeForCausalLM", qkv_bias=True, moe=True, shared_expert=True),
    "qwen3moe": GgufArch("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=True, moe=True, norm_topk_prob=True),
    "qwen35moe": GgufArch(
        "qwen3_5_moe",
        "Qwen3_5MoeForCausalLM",
        qk_norm=True,
        moe=True,
        shared_expert=True,
        norm_topk_prob=True,
        hybrid_linear=True,
    ),
    "gpt-oss": GgufArch(
        "gpt_oss",
        "GptOssForCausalLM",
        moe=True,
        attn_sinks=True,
        router="topk_then_softmax",
        swiglu=(1.702, 7.0),
        post_attention_norm="ffn_norm",
        swa_pattern=2,
        yarn_truncate=False,
        rope_theta=150000.0,
    ),
}
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
# A llama-architecture file with experts is Mixtral.
LLAMA_MOE = GgufArch("mixtral", "MixtralForCausalLM", permuted_qk=True, moe=True, norm_topk_prob=True)

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
# The most routed experts a layer may have (the largest published MoE models have 512; 4,096 leaves
# room and keeps every per-expert table small).
MAX_EXPERTS = 4096
LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")
ROPE_SCALINGS = ("none", "linear", "yarn")
# llama.cpp's end-of-generation tokens by their text, for files whose eos_token_id is something else.
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>")


@dataclass
class GgufCheckpoint:
    """A checkpoint read from a GGUF file (model/checkpoint.Checkpoint), and also what each
    tensor was stored as, its exact blocks and the chat template."""

    spec: ModelSpec
    tensors: dict[str, GgufTensor]  # canonical name -> where its rows are (read lazily)
    input_files: list[Path]
    gguf: GgufFile
    tensor_types: dict[str, str] = field(default_factory=dict)  # canonical name -> GGUF type ("Q4_1", ...)
    held_types: dict[str, str] = field(default_factory=dict)  # none: --quant gguf keeps the file's types
    chat_template: str | None = None
    _sources: dict = field(default_factory=dict, repr=False)  # canonical -> (info, expert or None, permute)

    def blocks(self, canonical: str) -> QuantBlocks | None:
        """The tensor's exact Q8_0/Q4_0/Q4_1/Q4_K blocks (rows in canonical order), or None (also
        for a tensor whose columns the file reorders: its blocks cannot be kept)."""
        info, expert, heads = self._sources[canonical]
        view = self.tensors.get(canonical)
        if view is not None and (view.col_order or view.flat):
            return None
        if view is not None and view.scale != 1.0:
            return None
        if view is not None and view.row_order:
            blocks = tensor_blocks(self.gguf, info)
            if blocks is None:
                return None
            rows = blocks.raw.reshape(-1, *blocks.raw.shape[-2:])  # a stacked tensor's rows, expert after expert
            return type(blocks)(blocks.ggml_type, rows).take(np.asarray(view.row_order))
        blocks = tensor_blocks(self.gguf, info)
        if blocks is None:
            return None
        if expert is not None:
            blocks = blocks.take(expert)
        return blocks.take(unpermute_order(blocks.shape[0], heads)) if heads else blocks


@dataclass(frozen=True)
class GgufTensor:
    """Where one canonical tensor is in a GGUF file (what hf/load.HfTensor is for a
    safetensors shard): its rows are read, and decoded, only when asked for. An expert is one slice
    of a stacked tensor; llama's q and k rows are read in the order that undoes the file's
    permutation. Small and picklable: a worker process reads its own rows."""

    path: Path
    info: GgufTensorInfo
    shape: tuple[int, ...]  # the canonical shape
    expert: int | None  # the slice of a stacked expert tensor
    heads: int  # > 0: rows un-permuted for this many heads
    # Qwen3.5 (view_of): the file's rows, or a vector's values, in canonical order; () keeps them.
    # llama.cpp reorders the DeltaNet's value heads (grouped by key head in Hugging Face, tiled in
    # the file) and keeps q_proj's queries and output gate in one tensor.
    row_order: tuple[int, ...] = ()
    col_order: tuple[int, ...] = ()  # the file's columns in canonical order (out_proj); () keeps them
    flat: bool = False  # the whole matrix as one vector (the convolution's [channels, kernel] taps)
    scale: float = 1.0  # multiplied in float32 (Gemma 4's router scale by hidden^-1/2)

    @property
    def ggml_type(self) -> str:
        return self.info.ggml_type

    @property
    def exact_blocks(self) -> bool:
        """Its blocks can be kept as they are (Q8_0, Q4_0, Q4_1, Q4_K): not where the file's
        columns are reordered or its matrix read as a vector."""
        return self.info.ggml_type in EXACT_TYPES and not self.col_order and not self.flat and self.scale == 1.0

    def _source_rows(self, start: int, stop: int) -> np.ndarray:
        if self.row_order and len(self.shape) == 2:
            return np.asarray(self.row_order[start:stop], dtype=np.int64)
        n_rows = self.shape[0] if len(self.shape) == 2 else 1
        matrix_heads = self.heads if len(self.shape) == 2 else 0  # a vector's values are permuted, not rows
        order = unpermute_order(n_rows, matrix_heads)[start:stop] if matrix_heads else np.arange(start, stop)
        return order + (self.expert * n_rows if self.expert is not None else 0)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as float32, dequantized as llama.cpp does."""
        if self.scale != 1.0:
            plain = GgufTensor(self.path, self.info, self.shape, self.expert, self.heads, self.row_order)
            return (plain.rows(start, stop).astype(np.float32) * np.float32(self.scale)).astype(np.float32)
        if self.flat or (self.row_order and len(self.shape) == 1):
            file_rows = self.info.shape[0] if (self.flat and len(self.info.shape) == 2) else 1
            values = rows_f32(self.path, self.info, np.arange(file_rows)).reshape(1, -1)
            return values[:, list(self.row_order)] if self.row_order else values
        values = rows_f32(self.path, self.info, self._source_rows(start, stop))
        if self.col_order:
            values = values[:, list(self.col_order)]
        if self.heads and len(self.shape) == 1:  # a q or k bias: its values un-permuted
            values = values[:, unpermute_order(values.shape[1], self.heads)]
        return values

    def blocks(self, start: int, stop: int) -> QuantBlocks:
        """Rows [start, stop) as the file's own blocks (exact_blocks tensors)."""
        return rows_blocks(self.path, self.info, self._source_rows(start, stop))

    def load(self) -> np.ndarray:
        """The whole tensor in its canonical shape (small tensors and tests; generation reads rows)."""
        n_rows = self.shape[0] if len(self.shape) == 2 else 1
        return self.rows(0, n_rows).reshape(self.shape)


def unpermute_order(rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes convert_hf_to_gguf's LlamaModel.permute for `n_heads` heads:
    it stored, per head, the even rotary pairs' rows interleaved; HF keeps the two halves."""
    half = rows // n_heads // 2
    permuted = np.arange(rows).reshape(n_heads, 2, half).swapaxes(1, 2).reshape(rows)
    return np.argsort(permuted)


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


def _arch(gguf: GgufFile) -> tuple[str, GgufArch]:
    supported = ", ".join(GGUF_ARCHITECTURES)
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ColibriError(f"{gguf.path.name}: no general.architecture string in the metadata (supported: {supported})")
    if arch not in GGUF_ARCHITECTURES:
        raise ColibriError(f"{gguf.path.name}: unsupported architecture {arch!r} (supported: {supported})")
    info = GGUF_ARCHITECTURES[arch]
    if arch == "llama" and gguf.metadata.get("llama.expert_count", 0):
        info = LLAMA_MOE
    return arch, info


def _yarn(meta: _Meta, theta: float, truncate: bool) -> RopeSpec:
    """YaRN from llama.cpp's keys, the attention factor resolved as transformers does when the file
    has none (0.1 ln(factor) + 1)."""
    factor = meta.float("rope.scaling.factor")
    if factor <= 0:
        raise ColibriError(f"{meta.where}: rope scaling factor must be positive, got {factor}")
    if meta.has("rope.scaling.yarn_log_multiplier"):
        raise ColibriError(f"{meta.where}: yarn rope with a log multiplier (mscale) is not supported")
    beta_fast = meta.float("rope.scaling.yarn_beta_fast", 32.0)
    beta_slow = meta.float("rope.scaling.yarn_beta_slow", 1.0)
    if not (beta_fast > 0 and beta_slow > 0):
        raise ColibriError(f"{meta.where}: yarn rope beta_fast and beta_slow must be positive")
    if meta.has("rope.scaling.yarn_attn_factor"):
        attention = meta.float("rope.scaling.yarn_attn_factor")
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


def _rope(meta: _Meta, theta_default: float, yarn_truncate: bool = True) -> RopeSpec:
    if "rope_freqs.weight" in meta.gguf.tensors:
        raise ColibriError(
            f"{meta.where}: llama3 RoPE scaling (a rope_freqs tensor) is not supported from GGUF "
            f"files (its parameters are not in the metadata)"
        )
    theta = meta.float("rope.freq_base", theta_default)
    if theta <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.rope.freq_base' must be positive")
    kind = meta.str("rope.scaling.type", "none")
    if kind not in ROPE_SCALINGS:
        raise ColibriError(f"{meta.where}: unsupported rope scaling {kind!r} (supported: {', '.join(ROPE_SCALINGS)})")
    if kind == "yarn":
        return _yarn(meta, theta, yarn_truncate)
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


def parse_metadata(gguf: GgufFile) -> ModelSpec:
    """GGUF metadata (+ which tensors exist) -> ModelSpec, with every field checked."""
    arch, info = _arch(gguf)
    meta = _Meta(gguf, arch)
    family = info
    gemma = family.gemma
    tensors = gguf.tensors
    if "token_embd.weight" not in tensors:
        raise ColibriError(f"{meta.where}: no token_embd.weight tensor")

    hidden = meta.int("embedding_length")
    n_layers = meta.int("block_count")
    layers_present = 1 + max((int(m.group(1)) for m in map(LAYER_NAME.fullmatch, tensors) if m), default=-1)
    if n_layers > layers_present:  # said before any per-layer table is made (a count of 2^32 - 1 would be)
        raise ColibriError(f"{meta.where}: block_count {n_layers} but the file has tensors for {layers_present} layers")
    n_heads = meta.int("attention.head_count")
    if family.gemma4:
        return _gemma4(gguf, meta, info, hidden, n_layers, n_heads)
    n_kv = meta.int("attention.head_count_kv", n_heads)
    if meta.has("attention.key_length"):
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
    rope_dim = meta.int("rope.dimension_count", head_dim)
    if family.hybrid_linear and (rope_dim > head_dim or rope_dim % 2):
        raise ColibriError(f"{meta.where}: rope.dimension_count {rope_dim} must be even and at most {head_dim}")
    if not family.hybrid_linear and rope_dim != head_dim:
        raise ColibriError(
            f"{meta.where}: partial rotary embeddings (rope.dimension_count "
            f"{meta.int('rope.dimension_count')} of {head_dim}) are not supported"
        )
    vocab = meta.int("vocab_size", tensors["token_embd.weight"].shape[0])
    eps = meta.float("attention.layer_norm_rms_epsilon", 1e-6 if gemma else 1e-5)
    if not 0 < eps < 1:
        raise ColibriError(f"{meta.where}: layer_norm_rms_epsilon must be between 0 and 1")
    bos, eos = _token_ids(meta, vocab)

    def present(part: str) -> bool:
        return f"blk.0.{part}" in tensors

    qkv_bias = present("attn_q.bias")
    if family.qkv_bias and not qkv_bias:
        raise ColibriError(f"{meta.where}: missing tensor 'blk.0.attn_q.bias' ({arch} has q/k/v biases)")
    moe = {}
    if family.moe:
        n_experts = meta.int("expert_count")
        if n_experts > MAX_EXPERTS:
            raise ColibriError(f"{meta.where}: expert_count {n_experts} exceeds {MAX_EXPERTS:,} (the most supported)")
        top_k = meta.int("expert_used_count")
        if top_k > n_experts:
            raise ColibriError(f"{meta.where}: expert_used_count {top_k} exceeds the {n_experts} experts")
        ff = meta.int("feed_forward_length", meta.gguf.metadata.get(f"{arch}.expert_feed_forward_length"))
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=meta.int("expert_feed_forward_length", ff),
            # (Qwen3.5 always renormalises, as transformers does, whatever the file says.)
            norm_topk_prob=True if info.hybrid_linear else meta.bool("expert_weights_norm", info.norm_topk_prob),
            shared_expert_intermediate_size=(
                meta.int("expert_shared_feed_forward_length", 0, minimum=0) if family.shared_expert else 0
            ),
            moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layers)),
            router=info.router,
            router_bias=present("ffn_gate_inp.bias"),
            expert_biases=present("ffn_gate_exps.bias"),
        )
        intermediate = ff
    else:
        intermediate = meta.int("feed_forward_length")

    return ModelSpec(
        name=gguf.path.stem,
        architecture=info.architecture,
        family=info.family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope=_rope(meta, 1000000.0 if gemma else info.rope_theta, info.yarn_truncate),
        max_position_embeddings=meta.int("context_length", 2048),
        tie_embeddings="output.weight" not in tensors,
        qkv_bias=qkv_bias,
        o_bias=present("attn_output.bias"),
        mlp_bias=present("ffn_gate.bias") or present("ffn_up.bias"),
        qk_norm=family.qk_norm,
        layer_windows=_windows(meta, n_layers, 6 if gemma else info.swa_pattern),
        bos_token_id=bos,
        eos_token_ids=eos,
        activation="gelu_tanh" if gemma else ("swiglu_clamped" if info.swiglu else "silu"),
        embed_scale=float(np.float32(hidden**0.5)) if gemma else 1.0,
        attn_scale=(meta.float("attention.scale") if meta.has("attention.scale") else float(head_dim) ** -0.5)
        if gemma
        else 0.0,
        post_norms=gemma,
        rope_local=RopeSpec(theta=meta.float("rope.freq_base_swa", 10000.0)) if gemma else None,
        final_softcap=meta.float("final_logit_softcapping", 0.0) if gemma else 0.0,
        **moe,
        **(_hybrid_linear(meta, n_layers, head_dim, rope_dim) if family.hybrid_linear else {}),
        attn_sinks=info.attn_sinks,
        **(dict(swiglu_alpha=info.swiglu[0], swiglu_limit=info.swiglu[1]) if info.swiglu else {}),
    )


def _per_layer_ints(meta: _Meta, key: str, n_layers: int) -> tuple[int, ...]:
    """A key llama.cpp writes as one integer or as one per layer."""
    name, value = meta._get(key, None)
    if isinstance(value, np.ndarray) and value.ndim == 1 and len(value) == n_layers and value.dtype.kind in "iu":
        if (value < 1).any():
            raise ColibriError(f"{meta.where}: metadata {name!r} must be at least 1 for every layer")
        return tuple(int(v) for v in value)
    return (meta.int(key),) * n_layers


def _gemma4(gguf: GgufFile, meta: _Meta, info: GgufArch, hidden: int, n_layers: int, n_heads: int) -> ModelSpec:
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
    windows = _windows(meta, n_layers, 6)
    kv = _per_layer_ints(meta, "attention.head_count_kv", n_layers)
    sliding_kv = {k for k, w in zip(kv, windows) if w} or {kv[0]}
    global_kv = {k for k, w in zip(kv, windows) if not w} or {kv[0]}
    if len(sliding_kv) > 1 or len(global_kv) > 1:
        raise ColibriError(f"{meta.where}: every sliding (and every global) layer must have the same KV heads")
    n_kv, n_global_kv = sliding_kv.pop(), global_kv.pop()
    if n_heads % n_kv or n_heads % n_global_kv:
        raise ColibriError(f"{meta.where}: head_count {n_heads} is not divisible by the layers' KV heads")
    vocab = meta.int("vocab_size", tensors["token_embd.weight"].shape[0])
    eps = meta.float("attention.layer_norm_rms_epsilon", 1e-6)
    if not 0 < eps < 1:
        raise ColibriError(f"{meta.where}: layer_norm_rms_epsilon must be between 0 and 1")
    bos, eos = _token_ids(meta, vocab)
    theta = meta.float("rope.freq_base", 1000000.0)
    if theta <= 0:
        raise ColibriError(f"{meta.where}: metadata '{meta.arch}.rope.freq_base' must be positive")
    rope = RopeSpec(theta=theta)
    if GEMMA4_ROPE_FREQS in tensors:
        freqs = tensors[GEMMA4_ROPE_FREQS]
        values = rows_f32(gguf.path, freqs).reshape(-1)
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
    if shared > n_layers:
        raise ColibriError(f"{meta.where}: attention.shared_kv_layers {shared} exceeds the {n_layers} layers")
    first = n_layers - shared
    for i in range(first, n_layers):
        if not any(bool(windows[j]) == bool(windows[i]) for j in range(first)):
            raise ColibriError(
                f"{meta.where}: layer {i} shares keys and values, but no earlier layer is of its kind "
                f"(attention.shared_kv_layers {shared})"
            )
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
        if top_k > n_experts:
            raise ColibriError(f"{meta.where}: expert_used_count {top_k} exceeds the {n_experts} experts")
        moe = dict(
            n_experts=n_experts,
            experts_per_token=top_k,
            expert_intermediate_size=meta.int("expert_feed_forward_length"),
            norm_topk_prob=True,
            moe_layers=(True,) * n_layers,
            moe_beside_dense=True,
        )
    return ModelSpec(
        name=gguf.path.stem,
        architecture=info.architecture,
        family=info.family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope=rope,
        max_position_embeddings=meta.int("context_length", 2048),
        tie_embeddings="output.weight" not in tensors,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=True,
        layer_windows=windows,
        bos_token_id=bos,
        eos_token_ids=eos,
        activation="gelu_tanh",
        embed_scale=float(np.float32(hidden**0.5)),
        attn_scale=1.0,
        post_norms=True,
        rope_local=RopeSpec(theta=meta.float("rope.freq_base_swa", 10000.0)),
        final_softcap=meta.float("final_logit_softcapping", 0.0),
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


def _canonical(name: str, arch: GgufArch | None = None) -> tuple[str, bool] | None:
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


def _locate(gguf: GgufFile, spec: ModelSpec, arch: GgufArch) -> dict:
    """canonical name -> (tensor info, expert index or None, heads to un-permute or 0)."""
    wanted = expected_shapes(spec)
    where = gguf.path.name
    sources = {}
    for name, info in gguf.tensors.items():
        if arch.gemma4 and name == GEMMA4_ROPE_FREQS:
            continue  # read by _gemma4 into the spec's RoPE
        m = LAYER_NAME.fullmatch(name)
        if arch.gemma4 and m and m.group(2) == GEMMA4_GATE_UP and f"layers.{m.group(1)}.experts.0.w_gate" in wanted:
            fe = spec.expert_intermediate_size
            if tuple(info.shape) != (spec.n_experts, 2 * fe, spec.hidden_size):
                raise ColibriError(
                    f"{where}: tensor {name!r} has shape {list(info.shape)}, the metadata implies "
                    f"{[spec.n_experts, 2 * fe, spec.hidden_size]}"
                )
            for e in range(spec.n_experts):
                sources[f"layers.{m.group(1)}.experts.{e}.w_gate"] = (info, e, 0)
                sources[f"layers.{m.group(1)}.experts.{e}.w_up"] = (info, e, 0)
            continue
        found = _canonical(name, arch)
        if (
            arch.gemma4
            and m
            and m.group(2) in GEMMA4_UNUSED_KV
            and int(m.group(1)) < spec.n_layers
            and spec.is_kv_consumer(int(m.group(1)))
        ):
            continue  # a KV-sharing layer's own k/v projections and norms: not used
        if found is None or (found[0] not in wanted and not found[1]):
            raise ColibriError(f"{where}: unexpected tensor {name!r} for {spec.architecture} with this metadata")
        canonical, stacked = found
        if stacked:
            if len(info.shape) != 3 or info.shape[0] != spec.n_experts or canonical.format(0) not in wanted:
                raise ColibriError(
                    f"{where}: tensor {name!r} has shape {list(info.shape)}, expected {spec.n_experts} stacked experts"
                )
            for e in range(spec.n_experts):
                sources[canonical.format(e)] = (info, e, 0)
            continue
        heads = 0
        if arch.permuted_qk and canonical.rsplit(".", 1)[-1] in ("wq", "bq"):
            heads = spec.n_heads
        elif arch.permuted_qk and canonical.rsplit(".", 1)[-1] in ("wk", "bk"):
            heads = spec.n_kv_heads
        sources[canonical] = (info, None, heads)
        if spec.attn_output_gate and canonical.endswith(".wq"):
            sources[canonical + "_gate"] = (info, None, 0)  # the same attn_q: its gate rows
    for canonical, shape in wanted.items():
        if canonical not in sources:
            raise ColibriError(
                f"{where}: missing tensor for {canonical!r} ({spec.architecture}, expected shape {list(shape)})"
            )
        info, expert, _ = sources[canonical]
        got = info.shape[1:] if expert is not None else info.shape
        if arch.gemma4 and info.name.endswith(GEMMA4_GATE_UP):
            continue  # its shape checked above
        if _is_stacked_bias(canonical):  # (n_experts, width), read as one vector
            got = (
                (int(np.prod(info.shape)),) if len(info.shape) == 2 and info.shape[0] == spec.n_experts else info.shape
            )
        if _squeezed(got) != _squeezed(_file_shape(spec, canonical, shape)):
            raise ColibriError(
                f"{where}: tensor {info.name!r} has shape {list(info.shape)}, the metadata implies {list(shape)}"
            )
    return sources


def _file_shape(spec: ModelSpec, canonical: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape llama.cpp stores a canonical tensor in: Qwen3.5's attn_q holds each head's queries
    and gate, its ssm_conv1d is [channels, kernel]."""
    if spec.attn_output_gate and canonical.endswith((".wq", ".wq_gate")):
        return (2 * shape[0], shape[1])
    if canonical.endswith(".lin_conv"):
        return (spec.linear_conv_dim, spec.linear_conv_kernel)
    return shape


def _value_head_order(spec: ModelSpec, width: int) -> np.ndarray:
    """Where each canonical value-head element is in the file: Hugging Face groups the value heads
    by key head (head g * r + j, r = V_HEADS / K_HEADS), llama.cpp tiles them (j * K_HEADS + g)."""
    nk, nv = spec.linear_k_heads, spec.linear_v_heads
    heads = np.arange(nv)
    source = (heads % (nv // nk)) * nk + heads // (nv // nk)
    return (source[:, None] * width + np.arange(width)[None, :]).reshape(-1)


def _view_of(spec: ModelSpec, canonical: str) -> dict:
    """GgufTensor's view fields for a canonical tensor (Qwen3.5's and Gemma 4's; {} for everything else)."""
    part = canonical.rsplit(".", 1)[-1]
    if spec.moe_beside_dense and part in ("w_gate", "w_up") and ".experts." in canonical:
        # Gemma 4's ffn_gate_up_exps: each expert's gate rows, then its up rows (rows of the whole tensor).
        fe, expert = spec.expert_intermediate_size, int(canonical.split(".")[3])
        first = expert * 2 * fe + (fe if part == "w_up" else 0)
        return dict(row_order=tuple(range(first, first + fe)))
    if spec.moe_beside_dense and part == "router_norm":
        return dict(scale=spec.hidden_size**-0.5)  # the router's scale times hidden^-1/2, as hf/load folds it
    if spec.attn_output_gate and part in ("wq", "wq_gate"):
        hd = spec.head_dim
        rows = np.arange(spec.q_dim)
        first = hd if part == "wq_gate" else 0
        return dict(row_order=tuple(int(r) for r in (rows // hd) * 2 * hd + first + rows % hd))
    if not part.startswith("lin_"):
        return {}
    dv, key_dim = spec.linear_v_dim, spec.linear_key_dim
    view: dict = dict(flat=part == "lin_conv")
    if spec.linear_k_heads == spec.linear_v_heads:
        return view
    if part == "lin_qkv":
        order = np.concatenate([np.arange(2 * key_dim), 2 * key_dim + _value_head_order(spec, dv)])
    elif part == "lin_conv":
        kernel = spec.linear_conv_kernel
        channels = np.concatenate([np.arange(2 * key_dim), 2 * key_dim + _value_head_order(spec, dv)])
        order = (channels[:, None] * kernel + np.arange(kernel)[None, :]).reshape(-1)
    elif part == "lin_z":
        order = _value_head_order(spec, dv)
    elif part in ("lin_b", "lin_a", "lin_dt_bias", "lin_decay_scale"):
        order = _value_head_order(spec, 1)
    elif part == "lin_out":
        return dict(view, col_order=tuple(int(i) for i in _value_head_order(spec, dv)))
    else:
        return view
    return dict(view, row_order=tuple(int(i) for i in order))


def _is_stacked_bias(canonical: str) -> bool:
    return canonical.rsplit(".", 1)[-1] in EXPERT_BIASES.values()


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without leading 1s: llama.cpp stores a (1, n) matrix as a vector of n."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def load_gguf(path: Path | str, load_tensors: bool = True) -> GgufCheckpoint:
    """Read a GGUF file. With load_tensors=False only the header is checked (fast planning)."""
    path = Path(path)
    if not path.exists():
        raise ColibriError(f"model file {path} does not exist")
    if not path.is_file():
        raise ColibriError(f"{path} is not a file")
    gguf = read_gguf(path)
    for info in gguf.tensors.values():
        if not readable(info.ggml_type):  # said before anything is built, not when the blocks are read
            raise ColibriError(
                f"{path.name}: tensor {info.name!r} has type {info.ggml_type}, which this build cannot read"
            )
    spec = parse_metadata(gguf)
    _, arch = _arch(gguf)
    sources = _locate(gguf, spec, arch)
    wanted = expected_shapes(spec)
    template = gguf.metadata.get("tokenizer.chat_template")
    tensors: dict[str, GgufTensor] = {}
    if load_tensors:
        for canonical, shape in wanted.items():
            info, expert, heads = sources[canonical]
            view = _view_of(spec, canonical)
            if _is_stacked_bias(canonical):
                view["flat"] = True
            tensors[canonical] = GgufTensor(path, info, tuple(shape), expert, heads or 0, **view)
    return GgufCheckpoint(
        spec=spec,
        tensors=tensors,
        input_files=[path],
        gguf=gguf,
        tensor_types={c: sources[c][0].ggml_type for c in wanted},
        chat_template=template if isinstance(template, str) else None,
        _sources=sources,
    )
