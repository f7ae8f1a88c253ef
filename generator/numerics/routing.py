"""A mixture of experts' routing for one token, as firmware_src/runtime/router.c computes it
(docs/numerics.md, "Routing"): which experts, best first, and their weights.

  softmax_then_topk   p = softmax(logits); choose on p; weights p[chosen]     (Mixtral, Qwen-MoE, V2)
  topk_then_softmax   choose on the logits; weights softmax(logits[chosen])   (gpt-oss)
  sparsemixer         choose on the logits; each chosen expert's own masked softmax (Phi-3.5-MoE:
                      ops.sparsemixer_weights)
  sigmoid             p = sigmoid(logits); choose on p + choice bias; weights p[chosen]   (V3, GLM-4.x)
  topk_then_sigmoid   choose on the logits; weights sigmoid(logits[chosen])   (Llama 4, whose
                      weights scale the experts' inputs: reference.py)

With expert groups only the best `expert_groups_used` groups may be chosen from (a group scores
its two best choice scores added, best first, with a sigmoid router; its best probability with a
softmax one); the others' scores become -inf. Choosing is a top k: best first, the lowest id on
ties (groups too). Then the weights renormalised where norm_topk_prob says (w / their sum, added in
rank order, plus router_norm_eps where it is not 0: LFM2-MoE's 1e-6), then times routed_scaling where
it is not 1.
"""

from __future__ import annotations

import numpy as np

from ..model.spec import ModelSpec
from .ops import F32, seq_sum, sigmoid, softmax, sparsemixer_weights


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best of scores, best first, the lowest index on ties."""
    return np.lexsort((np.arange(len(scores)), -scores))[:k]


def limit_to_groups(spec: ModelSpec, choice: np.ndarray) -> np.ndarray:
    """choice with every expert outside the best expert_groups_used groups at -inf."""
    groups = choice.reshape(spec.expert_groups, -1)
    if spec.router == "sigmoid":
        two = np.sort(groups, axis=1)[:, ::-1][:, :2]
        group_scores = two[:, 0] + two[:, 1]
    else:
        group_scores = groups.max(axis=1)
    kept = np.zeros(spec.expert_groups, dtype=bool)
    kept[top_k(group_scores, spec.expert_groups_used)] = True
    return np.where(np.repeat(kept, groups.shape[1]), choice, F32(-np.inf)).astype(np.float32)


def route(spec: ModelSpec, logits: np.ndarray, choice_bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts best first, their weights) for one token's router logits."""
    k = spec.experts_per_token
    if spec.router == "topk_then_softmax":
        chosen = top_k(logits, k)
        weights = softmax(logits[chosen])
    elif spec.router == "topk_then_sigmoid":
        chosen = top_k(logits, k)
        weights = sigmoid(logits[chosen])
    elif spec.router == "sparsemixer":
        chosen = top_k(logits, k)
        weights = sparsemixer_weights(logits, chosen, 2 * spec.router_jitter)
    else:
        scores = sigmoid(logits) if spec.router == "sigmoid" else softmax(logits)
        choice = scores + choice_bias if choice_bias is not None else scores
        if spec.expert_groups:
            choice = limit_to_groups(spec, choice)
        chosen = top_k(choice, k)
        weights = scores[chosen]
    if spec.norm_topk_prob:
        total = seq_sum(weights)
        weights = weights / (total + F32(spec.router_norm_eps) if spec.router_norm_eps else total)
    if spec.routed_scaling != 1.0:
        weights = weights * F32(spec.routed_scaling)
    return chosen, weights
