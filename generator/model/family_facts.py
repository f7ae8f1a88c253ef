"""Family facts both importers state the same way, whatever the format's keys: what hf/config.py
reads from config.json and gguf/metadata.py from llama.cpp's metadata must give the same ModelSpec,
so a fact about a family (Gemma's embedding scale, Gemma 4's MoE block and KV sharing, a router's
top-k) is written once, here. Each check names the key the file used."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import ColibriError
from .families import Moe


def gemma_embed_scale(hidden: int) -> float:
    """Gemma scales its embeddings by sqrt(hidden), rounded to float32 as transformers does."""
    return float(np.float32(hidden**0.5))


def check_experts_per_token(where: str, key: str, top_k: int, n_experts: int) -> None:
    """A router takes at most every expert."""
    if top_k > n_experts:
        raise ColibriError(f"{where}: {key} {top_k} exceeds the {n_experts} experts")


def moe_beside_dense(moe: Moe | None, n_experts: int, top_k: int, expert_intermediate_size: int, n_layers: int) -> dict:
    """Gemma 4's MoE block: every layer routes, beside its dense FFN, its top k renormalised as the
    family's row says."""
    return dict(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_intermediate_size,
        norm_topk_prob=moe is not None and moe.renormalise == "always",
        moe_layers=(True,) * n_layers,
        moe_beside_dense=True,
    )


def check_kv_sharing(where: str, key: str, shared: int, windows: tuple[int, ...], kind: Callable[[bool], str]) -> int:
    """Gemma 4's KV sharing: the last `shared` layers read the keys and values of the last earlier
    layer of their kind (sliding or global), so one must exist. Returns the first sharing layer.
    `kind(sliding)` names a layer's kind in the message as the file's keys do."""
    n_layers = len(windows)
    if shared > n_layers:
        raise ColibriError(f"{where}: {key} {shared} exceeds the {n_layers} layers")
    first = n_layers - shared
    for i in range(first, n_layers):
        if not any(bool(windows[j]) == bool(windows[i]) for j in range(first)):
            raise ColibriError(
                f"{where}: layer {i} shares keys and values, but no earlier layer is {kind(bool(windows[i]))} "
                f"({key} {shared})"
            )
    return first
