"""Where each canonical tensor is in a GGUF file (GgufTensor), read and decoded only when asked:
one expert of a stacked tensor, llama's q and k rows un-permuted, Qwen3.5's value heads and
q_proj gate rows reordered, Gemma 4's stacked gate and up, a scale.

llama.cpp's converter permutes the rows of q_proj and k_proj (weights and biases) of
llama-architecture models for its interleaved RoPE; `unpermute_order` undoes it exactly (a pure
row reordering). Gemma's converter stores norms as (1 + w): the canonical form already.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..spec import ModelSpec
from .file import GgufTensorInfo
from .names import EXPERT_BIASES
from .tensors import EXACT_TYPES, QuantBlocks, rows_blocks, rows_f32


@dataclass(frozen=True)
class GgufTensor:
    """Where one canonical tensor is in a GGUF file (what hf/views.HfTensor is for a
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
    # Latent attention's wk_b from an older file's attn_kv_b: of each of transposed_heads heads'
    # head_rows rows, the first cols (qk_nope_head_dim), transposed (kv_lora_rank rows a head).
    transposed_heads: int = 0
    head_rows: int = 0

    @property
    def ggml_type(self) -> str:
        return self.info.ggml_type

    @property
    def exact_blocks(self) -> bool:
        """Its blocks can be kept as they are (Q8_0, Q4_0, Q4_1, Q4_K): not where the file's
        columns are reordered or its matrix read as a vector."""
        return (
            self.info.ggml_type in EXACT_TYPES
            and not self.col_order
            and not self.flat
            and self.scale == 1.0
            and not self.transposed_heads
        )

    def _source_rows(self, start: int, stop: int) -> np.ndarray:
        if self.row_order and len(self.shape) == 2:
            return np.asarray(self.row_order[start:stop], dtype=np.int64)
        n_rows = self.shape[0] if len(self.shape) == 2 else 1
        matrix_heads = self.heads if len(self.shape) == 2 else 0  # a vector's values are permuted, not rows
        order = unpermute_order(n_rows, matrix_heads)[start:stop] if matrix_heads else np.arange(start, stop)
        return order + (self.expert * n_rows if self.expert is not None else 0)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as float32, dequantized as llama.cpp does."""
        if self.transposed_heads:
            return self._transposed_rows(start, stop)
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

    def _transposed_rows(self, start: int, stop: int) -> np.ndarray:
        rank, cols = self.info.shape[-1], self.shape[1]
        out = [np.zeros((0, cols), dtype=np.float32)]
        for h in range(start // rank, -(-stop // rank)):
            first = h * self.head_rows
            block = rows_f32(self.path, self.info, np.arange(first, first + cols)).T
            out.append(block[max(start - h * rank, 0) : min(stop - h * rank, rank)])
        return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)

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


def _value_head_order(spec: ModelSpec, width: int) -> np.ndarray:
    """Where each canonical value-head element is in the file: Hugging Face groups the value heads
    by key head (head g * r + j, r = V_HEADS / K_HEADS), llama.cpp tiles them (j * K_HEADS + g)."""
    nk, nv = spec.linear_k_heads, spec.linear_v_heads
    heads = np.arange(nv)
    source = (heads % (nv // nk)) * nk + heads // (nv // nk)
    return (source[:, None] * width + np.arange(width)[None, :]).reshape(-1)


def view_of(spec: ModelSpec, canonical: str) -> dict:
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
    if part == "conv_taps":  # LFM2's [hidden, kernel]
        return dict(flat=True)
    if part in ("ssm_conv", "ssm_a", "ssm_d", "ssm_norm"):  # Mamba-2's, as gguf/granite.mamba2_file_shape
        return dict(flat=True)
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


def is_stacked_bias(canonical: str) -> bool:
    return canonical.rsplit(".", 1)[-1] in EXPERT_BIASES.values()


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without leading 1s: llama.cpp stores a (1, n) matrix as a vector of n."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape
