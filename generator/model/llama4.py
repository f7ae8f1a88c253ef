"""Llama 4's text model, the parts its row (family_facts.py) cannot say as a value: which layers
apply RoPE, attend within chunks, L2-normalise their queries and keys or tune their queries'
temperature, read from config.json (hf/config.py) or from what llama.cpp fixes for a GGUF file
(gguf/metadata.py), resolved here once into the spec's fields; the interleaved MoE's fields; and
the views of a checkpoint's tensors (q/k rows de-interleaved, the fused experts cut per expert)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ColibriError
from .family_blocks import Moe
from .family_facts import check_experts_per_token
from .hf.latent import HfLatentView
from .hf.names import text_tower_name
from .hf.safetensors_io import TensorInfo, read_rows, rows_cols
from .hf.views import HfFusedSlice
from .latent_attention import rope_row_order
from .spec import ModelSpec

CHUNKED, FULL = "chunked_attention", "full_attention"


@dataclass(frozen=True)
class ChunkedLayers:
    """Llama 4's attention layers: where RoPE applies, where attention is chunked (and the chunk),
    whether the RoPE layers' queries and keys are L2-normalised, the no-RoPE layers' temperature
    tuning ((floor_scale, attn_scale), or None)."""

    rope: tuple[bool, ...]
    chunked: tuple[bool, ...]
    chunk: int
    qk_l2_norm: bool
    temperature: tuple[int, float] | None

    def windows(self) -> tuple[int, ...]:
        return tuple(self.chunk if c else 0 for c in self.chunked)

    def fields(self) -> dict:
        """The spec's fields but layer_windows (windows())."""
        nope = tuple(not r for r in self.rope)
        floor, scale = self.temperature if self.temperature and any(nope) else (0, 0.0)
        return dict(
            chunked_windows=any(self.chunked),
            nope_layers=nope,
            qk_l2_norm_layers=self.rope if self.qk_l2_norm else (False,) * len(self.rope),
            attn_temperature_floor=floor,
            attn_temperature_scale=scale,
        )


def hf_chunked_layers(cfg: Any, n_layers: int) -> ChunkedLayers:
    """config.json's keys as transformers' Llama4TextConfig reads them: no_rope_layers (1: the layer
    applies RoPE; at least one entry per layer; empty or absent: every no_rope_layer_interval-th
    layer has none), attention_chunk_size (null: no chunks), layer_types (absent: the RoPE layers
    chunked), use_qk_norm, attn_temperature_tuning, floor_scale, attn_scale. `cfg`: hf/config.py's
    typed accessors."""
    data, where = cfg.data, cfg.where
    chunk = 0 if data.get("attention_chunk_size", 8192) is None else cfg.int("attention_chunk_size", 8192)
    flags = data.get("no_rope_layers")
    if not flags:
        interval = cfg.int("no_rope_layer_interval", 4)
        rope = tuple((i + 1) % interval != 0 for i in range(n_layers))
    elif not isinstance(flags, list) or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise ColibriError(f"{where}: 'no_rope_layers' must list 1 (RoPE) or 0 (no RoPE) for each layer")
    elif len(flags) < n_layers:
        raise ColibriError(f"{where}: 'no_rope_layers' lists {len(flags)} layers, the model has {n_layers}")
    else:
        rope = tuple(bool(f) for f in flags[:n_layers])
    kinds = data.get("layer_types")
    if kinds is None:
        chunked = tuple(r and chunk > 0 for r in rope)
    elif not isinstance(kinds, list) or len(kinds) != n_layers or any(k not in (CHUNKED, FULL) for k in kinds):
        raise ColibriError(f"{where}: 'layer_types' must say {CHUNKED} or {FULL} for each of the {n_layers} layers")
    elif CHUNKED in kinds and not chunk:
        raise ColibriError(f"{where}: {CHUNKED} layers need 'attention_chunk_size'")
    else:
        chunked = tuple(k == CHUNKED for k in kinds)
    tuning = data.get("attn_temperature_tuning", True)
    if not isinstance(tuning, int):  # (the published Llama-4-Scout's says 4: an integer read as true)
        raise ColibriError(f"{where}: 'attn_temperature_tuning' must be true or false, got {json.dumps(tuning)}")
    temperature = (cfg.int("floor_scale", 8192), cfg.float("attn_scale", 0.1)) if tuning else None
    return ChunkedLayers(rope, chunked, chunk, cfg.bool("use_qk_norm", True), temperature)


def gguf_chunked_layers(
    chunking: tuple[int, int, float], period: int, window: int | None, n_layers: int, n_experts: int
):
    """What llama.cpp's llama4 assumes, as its files do not say it: a sliding_window of 0 turns the
    chunks off and RoPE on in every layer; otherwise chunks of `chunking`'s size on the RoPE layers,
    every `period`-th layer without RoPE and temperature-tuned (`chunking`'s floor and scale); q/k
    L2 norm unless the model has 128 experts (Llama 4 Maverick has none)."""
    chunk, floor, scale = chunking
    if window == 0:
        rope = (True,) * n_layers
        return ChunkedLayers(rope, (False,) * n_layers, 0, n_experts != 128, (floor, scale))
    rope = tuple((i + 1) % period != 0 for i in range(n_layers))
    return ChunkedLayers(rope, rope, chunk, n_experts != 128, (floor, scale))


def interleaved_moe(moe: Moe, expert_width: int) -> dict:
    """The interleaved MoE's fields both importers share: one shared expert of the experts' width,
    added whole, and the routing weight on the expert's input."""
    return dict(
        shared_expert_intermediate_size=expert_width,
        ungated_shared_expert=True,
        expert_input_scaled=moe.scales_input,
        router=moe.router,
    )


def hf_interleaved_moe(cfg: Any, moe: Moe, n_layers: int) -> dict:
    """config.json's MoE: num_local_experts of intermediate_size, the top num_experts_per_tok, on
    the layers moe_layers lists (absent: every interleave_moe_layer_step-th, as transformers)."""
    n_experts = cfg.int("num_local_experts")
    top_k = cfg.int("num_experts_per_tok", 1)
    check_experts_per_token(cfg.where, "num_experts_per_tok", top_k, n_experts)
    listed = cfg.data.get("moe_layers")
    if listed is None:
        step = cfg.int("interleave_moe_layer_step", 1)
        listed = list(range(step - 1, n_layers, step))
    if not isinstance(listed, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers for i in listed
    ):
        raise ColibriError(f"{cfg.where}: 'moe_layers' must list layer indices from 0 to {n_layers - 1}")
    width = cfg.int("intermediate_size")
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=width,
        moe_layers=tuple(i in listed for i in range(n_layers)),
        **interleaved_moe(moe, width),
    )


@dataclass(frozen=True)
class HfExpertHalf:
    """Expert `expert`'s gate (half 0) or up (half 1) projection cut from Llama 4's fused
    gate_up_proj ([experts, hidden, 2 x inner], applied as x @ W: the gate's columns, then the
    up's), transposed to canonical rows (the HfTensor interface)."""

    path: Path
    info: TensorInfo
    shape: tuple[int, ...]
    expert: int
    half: int

    def rows(self, start: int, stop: int) -> np.ndarray:
        per_expert = rows_cols(self.info)[0] // self.info.shape[0]
        block = read_rows(self.path, self.info, self.expert * per_expert, (self.expert + 1) * per_expert)
        width = block.shape[1] // 2
        return np.ascontiguousarray(block[:, self.half * width : (self.half + 1) * width].T[start:stop], np.float32)

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0])


def hf_parts(hf_name: str, path: Path, info: TensorInfo, spec: ModelSpec) -> dict | None:
    """The canonical tensors a Llama 4 checkpoint's tensor holds through a view (its shape checked),
    or None when it is not one: q_proj's and k_proj's rows de-interleaved per head (the checkpoint's
    RoPE rotates adjacent pairs, the runtime a head's two halves), a MoE layer's fused experts."""
    hf_name = text_tower_name(hf_name)
    if spec.family != "llama4" or not hf_name.startswith("model.layers."):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    p, d, hd, n, fe = f"layers.{index}.", spec.hidden_size, spec.head_dim, spec.n_experts, spec.expert_intermediate_size
    heads = {"self_attn.q_proj.weight": ("wq", spec.n_heads), "self_attn.k_proj.weight": ("wk", spec.n_kv_heads)}
    shapes = {
        "self_attn.q_proj.weight": (spec.n_heads * hd, d),
        "self_attn.k_proj.weight": (spec.n_kv_heads * hd, d),
        "feed_forward.experts.gate_up_proj": (n, d, 2 * fe),
        "feed_forward.experts.down_proj": (n, fe, d),
    }
    if part not in shapes or (part.startswith("feed_forward.experts.") and not spec.moe_layers[int(index)]):
        return None
    if info.shape != shapes[part]:
        raise ColibriError(
            f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(shapes[part])}"
        )
    if part in heads:
        name, count = heads[part]
        return {p + name: HfLatentView(path, info, shapes[part], order=tuple(rope_row_order(hd, hd, count, True)))}
    if part == "feed_forward.experts.down_proj":
        return {p + f"experts.{e}.w_down": HfFusedSlice(path, info, (d, fe), e, None, True) for e in range(n)}
    out = {}
    for e in range(n):
        out[p + f"experts.{e}.w_gate"] = HfExpertHalf(path, info, (fe, d), e, 0)
        out[p + f"experts.{e}.w_up"] = HfExpertHalf(path, info, (fe, d), e, 1)
    return out
