"""Multi-head latent attention in a Hugging Face checkpoint: config.json's settings (into the
ModelSpec's fields, model/latent_attention.py) and its tensors as the runtime reads them: the RoPE
rows of the queries and of kv_a_proj_with_mqa de-interleaved where the checkpoint holds
interleaved pairs, and kv_b_proj cut into each head's key up-projection (transposed: wk_b) and
value up-projection (wv_b)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..family_blocks import LatentAttention
from ..latent_attention import check_latent, latent_fields, latent_score_scale, rope_row_order
from ..spec import ModelSpec
from .names import text_tower_name
from .safetensors_io import TensorInfo, read_rows

LATENT_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def hf_latent(cfg, attention: LatentAttention, hidden: int, n_heads: int) -> dict:
    """config.json's latent attention as ModelSpec fields."""
    data = cfg.data
    if data.get("attention_bias"):
        raise ColibriError(f"{cfg.where}: 'attention_bias' true is not supported for latent attention")
    q_rank = data.get("q_lora_rank")
    values = {
        "kv_lora_rank": cfg.int("kv_lora_rank", minimum=0),
        "q_lora_rank": 0 if q_rank is None else cfg.int("q_lora_rank", minimum=0),
        "qk_nope_head_dim": cfg.int("qk_nope_head_dim", minimum=0),
        "qk_rope_head_dim": cfg.int("qk_rope_head_dim", minimum=0),
        "v_head_dim": cfg.int("v_head_dim", minimum=0),
    }
    check_latent(cfg.where, {k: repr(k) for k in LATENT_KEYS}, hidden, values)
    params = data.get("rope_parameters")
    if not isinstance(params, dict):
        params = data.get("rope_scaling") or {}
    scaled = params.get("rope_type", params.get("type", "default")) != "default"
    factor = cfg.float("factor", 1.0, params) if scaled else 1.0
    mscale_all_dim = cfg.float("mscale_all_dim", 0.0, params) if scaled else 0.0
    head_dim = values["qk_nope_head_dim"] + values["qk_rope_head_dim"]
    return latent_fields(values, n_heads, latent_score_scale(head_dim, factor, mscale_all_dim))


def routed_layer_types(cfg, key: str, n_layers: int) -> tuple[bool, ...]:
    """GLM-4.7-Flash's routed layers: `key` ("dense" or "sparse" per layer), else transformers'
    default, a dense first layer and sparse ones after it."""
    kinds = cfg.data.get(key)
    if kinds is None:
        return tuple(i > 0 for i in range(n_layers))
    if not isinstance(kinds, list) or len(kinds) != n_layers or not all(k in ("dense", "sparse") for k in kinds):
        raise ColibriError(f'{cfg.where}: {key!r} must say "dense" or "sparse" for each of the {n_layers} layers')
    return tuple(kind == "sparse" for kind in kinds)


def rope_interleaved(config: dict, attention: LatentAttention) -> bool:
    """Whether the checkpoint's RoPE rows hold interleaved pairs (V2 always; V3 and GLM as
    config.json's rope_interleave says, true when absent)."""
    data = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    return attention.rope_interleave == "always" or data.get("rope_interleave", True) is not False


@dataclass(frozen=True)
class HfLatentView:
    """A canonical latent-attention tensor as a view of a checkpoint's (the HfTensor interface):
    rows in `order` (RoPE rows de-interleaved), or (heads_of set) each head's first qk_nope_head_dim
    rows of kv_b_proj, transposed: wk_b, kv_lora_rank rows of qk_nope_head_dim a head."""

    path: Path
    info: TensorInfo
    shape: tuple[int, ...]
    order: tuple[int, ...] = ()
    head_rows: int = 0  # kv_b_proj's rows per head (qk_nope_head_dim + v_head_dim); 0: not wk_b

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.head_rows:
            rank, nope = self.info.shape[1], self.shape[1]
            out = [np.zeros((0, nope), dtype=np.float32)]
            for h in range(start // rank, -(-stop // rank)):
                block = read_rows(self.path, self.info, h * self.head_rows, h * self.head_rows + nope).T
                out.append(block[max(start - h * rank, 0) : min(stop - h * rank, rank)])
            return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)
        wanted = np.asarray(self.order[start:stop], dtype=np.int64)
        if len(wanted) == 0:
            return np.zeros((0, self.shape[-1]), dtype=np.float32)
        lo, hi = int(wanted.min()), int(wanted.max()) + 1
        return np.ascontiguousarray(read_rows(self.path, self.info, lo, hi)[wanted - lo], dtype=np.float32)

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0]).reshape(self.shape)


def latent_parts(hf_name: str, path: Path, info: TensorInfo, spec: ModelSpec, interleaved: bool) -> dict | None:
    """The canonical tensors a latent attention tensor of the checkpoint holds (its shape checked),
    or None when hf_name is not one that needs a view."""
    if not spec.kv_lora_rank:
        return None
    hf_name = text_tower_name(hf_name)
    if not hf_name.startswith("model.layers."):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    p, h, r = f"layers.{index}.", spec.n_heads, spec.kv_lora_rank
    nope, rope, v = spec.qk_nope_head_dim, spec.rope_dim, spec.v_head_dim
    qk = nope + rope
    source = spec.q_lora_rank or spec.hidden_size
    views = {
        "self_attn.q_proj.weight": ("wq", (h * qk, spec.hidden_size)),
        "self_attn.q_b_proj.weight": ("wq_b", (h * qk, source)),
        "self_attn.kv_a_proj_with_mqa.weight": ("wkv_a", (r + rope, spec.hidden_size)),
        "self_attn.kv_b_proj.weight": ("kv_b", (h * (nope + v), r)),
    }
    if part not in views:
        return None
    name, shape = views[part]
    if part == "self_attn.q_proj.weight" and spec.q_lora_rank:
        return None  # an unexpected tensor, said as such by the loader
    if info.shape != shape:
        raise ColibriError(f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(shape)}")
    if name == "kv_b":
        values = tuple(head * (nope + v) + nope + i for head in range(h) for i in range(v))  # each head's last v rows
        return {
            p + "wk_b": HfLatentView(path, info, (h * r, nope), head_rows=nope + v),
            p + "wv_b": HfLatentView(path, info, (h * v, r), order=values),
        }
    blocks = h if name != "wkv_a" else 1
    order = rope_row_order(shape[0] // blocks, rope, blocks, interleaved)
    return {p + name: HfLatentView(path, info, shape, order=tuple(order))}
