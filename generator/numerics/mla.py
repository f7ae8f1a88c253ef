"""Multi-head latent attention in the absorbed form: the reference's definition (docs/numerics.md,
"Latent attention"), which runtime/mla.c follows operation for operation on every board.

For one token at position p of a layer, with H heads, latent width r (kv_lora_rank), non-rotated
query width n (qk_nope_head_dim), rotated width e (rope_dim) and value width v:

  q      = wq x, or wq_b rmsnorm(wq_a x)               H rows of n + e: [q_nope | q_rope]
  kv     = wkv_a x                                      r + e: [latent | k_rope]
  c      = rmsnorm(kv[:r], kv_a_norm)                   the latent
  k_rope, q_rope of each head: RoPE at p (rotate-half over e; the checkpoint's pairs de-interleaved at import)
  cache[p] = round([c | k_rope])                        one row of r + e per position, in the KV type
  query_h = [wk_b_h q_nope_h | q_rope_h]                wk_b_h: head h's r rows of n (the key up-projection, transposed)
  s_h[t] = (query_h . cache[t]) * scale                 one dot over r + e, in order, for t = 0..p
  a_h    = softmax(s_h)
  o_h[j] = sum over t in order of a_h[t] * cache[t][j]   j < r: the weighted latent
  out_h  = wv_b_h o_h                                   wv_b_h: head h's v rows of r (the value up-projection)
  y      = wo [out_0 | ... | out_{H-1}]

which equals the expanded form (keys k_h = [W_k,h c | k_rope], values W_v,h c) up to the order of
the sums: q_nope . (W_k,h c) = (W_k,h^T q_nope) . c."""

from __future__ import annotations

import numpy as np

from .kv_cache import kv_round
from .ops import dot, rmsnorm, seq_sum, softmax
from .ops import rope as apply_rope


def latent_cache(spec, kv_slots: tuple[int, ...]) -> list[np.ndarray]:
    """Each layer's cache: a row of kv_lora_rank + rope_dim floats per slot (as the cache gives them back)."""
    width = spec.kv_lora_rank + spec.rope_dim
    return [np.zeros((n, width), dtype=np.float32) for n in kv_slots]


def latent_attention(ref, layer: int, act, pos: int) -> np.ndarray:
    """The layer's attention output (after wo) for the token whose normed input is `act`, its
    latent row entered into ref.latent_cache first (ref: the Reference, whose _linear takes a
    head's block of rows of wk_b and wv_b)."""
    s, p, eps = ref.spec, f"layers.{layer}.", ref.spec.rms_norm_eps
    heads, rank, nope, rot, v = s.n_heads, s.kv_lora_rank, s.qk_nope_head_dim, s.rope_dim, s.v_head_dim
    if s.q_lora_rank:
        compressed = rmsnorm(ref._linear(p + "wq_a", act), ref.w[p + "q_a_norm"], eps)
        q = ref._linear(p + "wq_b", ref._prepare(compressed))
    else:
        q = ref._linear(p + "wq", act)
    q = q.reshape(heads, nope + rot)
    kv = ref._linear(p + "wkv_a", act)
    cos, sin = ref.tables[ref.plan.layer_rope[layer]]
    latent = rmsnorm(kv[:rank], ref.w[p + "kv_a_norm"], eps)
    k_rope = apply_rope(kv[None, rank:], cos[pos], sin[pos])[0]
    q_rope = apply_rope(q[:, nope:], cos[pos], sin[pos])
    cache, slots = ref.latent_cache[layer], ref.plan.kv_slots[layer]
    cache[pos % slots] = kv_round(np.concatenate([latent, k_rope]), ref.plan.kv_type)
    rows = cache[[t % slots for t in range(pos + 1)]]
    out = np.empty((heads, v), dtype=np.float32)
    for h in range(heads):
        absorbed = ref._linear(p + "wk_b", ref._prepare(q[h, :nope]), rows=slice(h * rank, (h + 1) * rank))
        query = np.concatenate([absorbed, q_rope[h]])
        probs = softmax(dot(rows, query[None, :], axis=1) * ref.scale)
        mixed = seq_sum(probs[:, None] * rows[:, :rank], axis=0)
        out[h] = ref._linear(p + "wv_b", ref._prepare(mixed), rows=slice(h * v, (h + 1) * v))
    return ref._linear(p + "wo", ref._prepare(out.reshape(-1)))
