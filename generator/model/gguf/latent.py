"""Multi-head latent attention in a GGUF file (llama.cpp's deepseek2): its keys into the ModelSpec's
fields (model/latent_attention.py), and its tensors as the runtime reads them: the RoPE rows of
attn_q / attn_q_b and attn_kv_a_mqa de-interleaved (llama.cpp rotates adjacent pairs and its
converter keeps the checkpoint's order), and the key and value up-projections either as the newer
files split them (attn_k_b, already transposed, and attn_v_b) or cut from the older files' attn_kv_b."""

from __future__ import annotations

from ...errors import ColibriError
from ..latent_attention import check_latent, latent_fields, latent_score_scale, rope_row_order
from ..spec import ModelSpec
from .file import GgufFile
from .names import LAYER_NAME

KV_B = "attn_kv_b.weight"  # the older files' kv_b_proj, whole
SPLIT = ("attn_k_b.weight", "attn_v_b.weight")  # the newer files'


def gguf_latent(meta, hidden: int, n_heads: int, rope_factor: float) -> dict:
    """deepseek2's keys as ModelSpec fields."""
    where = meta.where
    rope = meta.int("rope.dimension_count")
    # Newer files describe the absorbed (MQA) form in key/value_length and the heads in *_mla;
    # older ones the heads in key/value_length.
    mla = meta.has("attention.key_length_mla")
    head = meta.int("attention.key_length_mla" if mla else "attention.key_length")
    values = {
        "kv_lora_rank": meta.int("attention.kv_lora_rank", minimum=0),
        "q_lora_rank": meta.int("attention.q_lora_rank", 0, minimum=0),
        "qk_nope_head_dim": head - rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": meta.int("attention.value_length_mla" if mla else "attention.value_length"),
    }
    names = {
        "kv_lora_rank": f"{meta.arch}.attention.kv_lora_rank",
        "q_lora_rank": f"{meta.arch}.attention.q_lora_rank",
        "qk_nope_head_dim": f"{meta.arch}.attention.key_length{'_mla' if mla else ''} less rope.dimension_count",
        "qk_rope_head_dim": f"{meta.arch}.rope.dimension_count",
        "v_head_dim": f"{meta.arch}.attention.value_length{'_mla' if mla else ''}",
    }
    check_latent(where, names, hidden, values)
    # llama.cpp writes 0.1 x mscale_all_dim as the YaRN log multiplier: the softmax scale's mscale.
    log_mul = meta.float("rope.scaling.yarn_log_multiplier", 0.0)
    return latent_fields(values, n_heads, latent_score_scale(head, rope_factor, log_mul / 0.1))


def check_split(gguf: GgufFile, n_layers: int) -> None:
    """A layer's key and value up-projections: both split (attn_k_b and attn_v_b) or attn_kv_b whole."""
    tensors = gguf.tensors
    for i in range(n_layers):
        have = [f"blk.{i}.{part}" in tensors for part in SPLIT]
        if have[0] != have[1]:
            present, absent = (SPLIT[0], SPLIT[1]) if have[0] else (SPLIT[1], SPLIT[0])
            raise ColibriError(
                f"{gguf.path.name}: blk.{i}.{present} without blk.{i}.{absent} (the key and value up-projections "
                f"come together, or whole as {KV_B})"
            )
        if have[0] and f"blk.{i}.{KV_B}" in tensors:
            raise ColibriError(f"{gguf.path.name}: blk.{i} has both {KV_B} and {SPLIT[0]}/{SPLIT[1]}")


def kv_b_sources(name: str, info, spec: ModelSpec) -> dict | None:
    """An older file's attn_kv_b as the canonical wk_b and wv_b (None: not one)."""
    m = LAYER_NAME.fullmatch(name)
    if not spec.kv_lora_rank or not m or m.group(2) != KV_B:
        return None
    return {f"layers.{m.group(1)}.wk_b": (info, None, 0), f"layers.{m.group(1)}.wv_b": (info, None, 0)}


def file_shape(spec: ModelSpec, canonical: str, info_name: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape deepseek2 stores a canonical latent tensor in (None: the canonical one)."""
    h, r, nope, v = spec.n_heads, spec.kv_lora_rank, spec.qk_nope_head_dim, spec.v_head_dim
    part = canonical.rsplit(".", 1)[-1]
    if part in ("wk_b", "wv_b") and info_name.endswith(KV_B):
        return (h * (nope + v), r)
    if part == "wk_b":
        return (h, r, nope)
    if part == "wv_b":
        return (h, v, r)
    return None


def latent_view(spec: ModelSpec, canonical: str, info_name: str) -> dict:
    """GgufTensor's view fields for a latent attention tensor ({} for the others)."""
    if not spec.kv_lora_rank:
        return {}
    h, r, nope, rope, v = spec.n_heads, spec.kv_lora_rank, spec.qk_nope_head_dim, spec.rope_dim, spec.v_head_dim
    part = canonical.rsplit(".", 1)[-1]
    if part in ("wq", "wq_b"):
        return dict(row_order=tuple(rope_row_order(nope + rope, rope, h, True)))
    if part == "wkv_a":
        return dict(row_order=tuple(rope_row_order(r + rope, rope, 1, True)))
    if part == "wv_b" and info_name.endswith(KV_B):
        return dict(row_order=tuple(head * (nope + v) + nope + i for head in range(h) for i in range(v)))
    if part == "wk_b" and info_name.endswith(KV_B):
        return dict(transposed_heads=h, head_rows=nope + v)
    return {}
