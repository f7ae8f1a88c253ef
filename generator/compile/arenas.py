"""Plan stage, the RAM arenas: the scratch buffers of one forward pass (sized for the prefill
batch), the KV cache (each layer's slots and where its keys start), the Gated DeltaNet layers'
recurrent state and the RoPE tables. Each is laid out here once; plan.make_plan gathers them."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.spec import ModelSpec
from ..numerics.quantize import QK
from .layout import align_up, kv_heads_held

# Attention reads the KV cache in tiles of KV_TILE positions of one KV head (widened to float32 in
# scratch when the cache is f16 or q8_0), each tile once for every query head sharing that KV head
# and for up to ATTENTION_BLOCK query tokens of a prompt at once (runtime/attention.c).
KV_TILE = 64
ATTENTION_BLOCK = 16


@dataclass(frozen=True)
class Buffer:
    name: str
    ctype: str  # "float" | "int8_t" | "int32_t"
    count: int
    offset: int  # from the start of the arena; multiple of ALIGN
    nbytes: int
    purpose: str


def _arena(items: list[tuple[str, str, int, str]]) -> tuple[tuple[Buffer, ...], int]:
    sizes = {"float": 4, "int8_t": 1, "int32_t": 4}
    out, cursor = [], 0
    for name, ctype, count, purpose in items:
        nbytes = count * sizes[ctype]
        out.append(Buffer(name, ctype, count, cursor, nbytes, purpose))
        cursor = align_up(cursor + nbytes)
    return tuple(out), cursor


def max_matmul_input(spec: ModelSpec) -> int:
    """The longest matrix row: the activation quantization buffer's length."""
    d = spec.hidden_size
    f = ffn_width(spec)
    return max(
        d,
        spec.max_q_dim,
        f,
        spec.linear_value_dim,
        spec.n_layers * spec.ple_dim,
        *latent_inputs(spec),
        spec.mamba_inner,
    )


def latent_inputs(spec: ModelSpec) -> tuple[int, ...]:
    """Latent attention's matmul inputs: the low-rank queries, a head's non-rotated query (wk_b's
    input), its weighted latent (wv_b's), every head's values (wo's)."""
    if not spec.kv_lora_rank:
        return ()
    return (spec.q_lora_rank, spec.qk_nope_head_dim, spec.kv_lora_rank, spec.n_heads * spec.v_head_dim)


def ffn_width(spec: ModelSpec) -> int:
    """The widest FFN of any layer, dense, expert or shared expert."""
    return max(
        spec.intermediate_size,
        spec.expert_intermediate_size,
        spec.shared_expert_intermediate_size,
        *(spec.layer_ffn_dim(i) for i in range(spec.n_layers)),
    )


def scratch_arena(
    spec: ModelSpec,
    n_ctx: int,
    prefill_batch: int,
    spec_tokens: int,
    attention_block: int,
    q8_inputs: bool,
    kv_type: str,
) -> tuple[tuple[Buffer, ...], int]:
    """The scratch buffers of one forward pass: per-token activations for `prefill_batch` tokens,
    the logits (and spec_tokens more for speculative decoding), the sampler's, the MoE's, the per-layer
    inputs', the DeltaNet's; the q8_0 activation buffers where a matrix has integer quants
    (q8_inputs); a KV tile where the cache is not f32."""
    d, v = spec.hidden_size, spec.vocab_size
    f = ffn_width(spec)
    max_input = max_matmul_input(spec)
    n = prefill_batch
    items = [
        ("x", "float", n * d, "residual stream, per token of the batch"),
        ("xn", "float", n * d, "normalised input of the current block, per token"),
        ("q", "float", n * spec.max_q_dim, "queries, per token"),
        ("k", "float", n * spec.max_kv_dim, "keys, per token (copied into the KV cache)"),
        ("v", "float", n * spec.max_kv_dim, "values, per token (copied into the KV cache)"),
        (
            "att",
            "float",
            attention_block * spec.n_heads * n_ctx,
            "attention scores over the context, per query token of a block and per head",
        ),
        (
            "attn_out",
            "float",
            n * max(spec.max_q_dim, spec.n_heads * spec.v_head_dim),
            "attention output of all heads, per token",
        ),
        ("proj", "float", n * d, "output of wo or w_down before the residual add, per token"),
        ("gate", "float", n * f, "FFN gate projection (of a dense FFN or of one expert), per token"),
        ("up", "float", n * f, "FFN up projection, then the gated product, per token"),
        ("logits", "float", v, "logits of the current step"),
        *(
            [("spec_logits", "float", spec_tokens * v, "speculative decoding: the logits after each token of a pass")]
            if spec_tokens
            else []
        ),
        ("probs", "float", v, "sampling: probabilities, sorted"),
        ("cand", "int32_t", v, "sampling: candidate token ids, sorted"),
    ]
    if spec.n_experts:
        items += [
            (
                "router_logits",
                "float",
                spec.n_experts * (2 if spec.router == "sigmoid" or spec.expert_groups else 1),
                "MoE: router logits, then probabilities",
            ),
            ("moe_out", "float", n * d, "MoE: weighted sum of the selected experts' outputs, per token"),
            (
                "expert_terms",
                "float",
                (spec.experts_per_token + bool(spec.shared_expert_intermediate_size)) * d,
                "MoE: each selected expert's weighted output (and the shared expert's), summed in rank order "
                "once all are computed",
            ),
            ("expert_ids", "int32_t", spec.experts_per_token, "MoE: experts selected for this token, best first"),
            ("expert_weights", "float", spec.experts_per_token, "MoE: their routing weights"),
            (
                "expert_counts",
                "int32_t",
                spec.n_layers * spec.n_experts,
                "MoE: selections per layer and expert in this run",
            ),
        ]
    if spec.kv_lora_rank:
        width = spec.kv_lora_rank + spec.rope_dim
        items += [
            ("mla_q_a", "float", n * max(1, spec.q_lora_rank), "latent attention: the low-rank queries, per token"),
            ("mla_query", "float", spec.n_heads * width, "latent attention: one token's absorbed queries, per head"),
            ("mla_mixed", "float", spec.n_heads * spec.kv_lora_rank, "latent attention: each head's weighted latent"),
        ]
    if spec.attn_output_gate:
        items += [("q_gate", "float", n * spec.q_dim, "gated attention: the output gate's logits, per token")]
    if spec.ple_dim:
        items += [
            (
                "ple",
                "float",
                n * spec.n_layers * spec.ple_dim,
                "per-layer inputs: every layer's slice, per token (made once from its embedding)",
            ),
            ("ple_gate", "float", n * spec.ple_dim, "per-layer input gate, then times the layer's slice, per token"),
            ("ple_row", "float", spec.n_layers * spec.ple_dim, "per-layer inputs: one token's ple_embed row"),
        ]
    if spec.moe_beside_dense:
        items += [
            ("dense_out", "float", n * d, "MoE block: the dense FFN's normed output, per token"),
            ("router_in", "float", d, "MoE block: one token's router input (its own norm of the residual)"),
        ]
    if any(spec.linear_layers):
        items += [
            ("lin_qkv", "float", n * spec.linear_conv_dim, "DeltaNet: q, k, v projections, then convolved, per token"),
            ("lin_z", "float", n * spec.linear_value_dim, "DeltaNet: output gate projection, per token"),
            ("lin_b", "float", n * spec.linear_v_heads, "DeltaNet: beta projection, per token"),
            ("lin_a", "float", n * spec.linear_v_heads, "DeltaNet: decay projection, per token"),
            (
                "lin_out",
                "float",
                n * spec.linear_value_dim,
                "DeltaNet: delta-rule output, then gated-normed, per token",
            ),
            (
                "lin_memory",
                "float",
                spec.linear_value_dim,
                "DeltaNet: each value head's state times its key (heads run in parallel)",
            ),
        ]
    if any(spec.mamba_layers):
        items += [
            (
                "ssm_proj",
                "float",
                n * (spec.mamba_inner + spec.mamba_conv_dim + spec.mamba_heads),
                "Mamba-2: in_proj's z, xBC and dt, per token",
            ),
            ("ssm_y", "float", n * spec.mamba_inner, "Mamba-2: the heads' outputs, gated and normed, per token"),
        ]
    if any(spec.short_conv_layers):
        items += [
            ("conv_bcx", "float", n * 3 * d, "short convolution: in_proj's B, C and x, per token"),
            ("conv_y", "float", n * d, "short convolution: C times the convolved B * x, per token"),
        ]
    if q8_inputs:
        items += [
            ("act_qs", "int8_t", n * max_input, "q8_0 quants of the current matmul input, per token"),
            ("act_d", "float", n * max_input // QK, "q8_0 block scales of the current matmul input, per token"),
        ]
    if kv_type != "f32":
        items.append(
            (
                "kv_tile",
                "float",
                KV_TILE * spec.max_kv_dim,
                f"a tile of {KV_TILE} positions' keys or values widened to float32, per KV head",
            )
        )
    return _arena(items)


def layer_cache_dim(spec: ModelSpec, layer: int, kv_split: tuple[bool, ...] = (), ranks: int = 1) -> int:
    """The values a layer's cache keeps per position (keys, or values): every KV head's, or on a
    layer split by KV group over ranks (layout.kv_group_split) a rank's KV heads' only."""
    if not kv_split or not kv_split[layer]:
        return spec.layer_kv_dim(layer)
    return kv_heads_held(spec, kv_split, ranks, layer) * spec.layer_head_dim(layer)


def kv_layout(
    spec: ModelSpec, n_ctx: int, kv_split: tuple[bool, ...] = (), ranks: int = 1
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Per layer, the positions its KV cache holds and its first value in the K (or V) arena; and
    the arena's length in values (a rank's, over ranks: layer_cache_dim)."""
    # Sliding-window layers keep only their window: position t lives in slot t % slots.
    # DeltaNet layers keep no keys or values: their state is the recurrent arena's.
    # Gemma 4's KV-sharing layers hold none either: they read their kv_source's (kv_offsets says where).
    kv_slots = tuple(
        0
        if spec.is_linear(i) or spec.is_short_conv(i) or spec.is_mamba(i) or spec.is_kv_consumer(i)
        else min(w, n_ctx)
        if w
        else n_ctx
        for i, w in enumerate(spec.layer_windows)
    )
    kv_offsets, cursor = [], 0
    for i, slots in enumerate(kv_slots):
        kv_offsets.append(kv_offsets[spec.kv_source(i)] if spec.is_kv_consumer(i) else cursor)
        cursor += slots * layer_cache_dim(spec, i, kv_split, ranks)
    return kv_slots, tuple(kv_offsets), cursor


def short_conv_ring_rows(spec: ModelSpec, spec_tokens: int) -> int:
    """The inputs a short convolution layer keeps (0 without such layers): its kernel's, and one
    more per token a speculative pass may feed beyond the first, so dropped drafts step back
    exactly (numerics/short_conv.py)."""
    return spec.short_conv_kernel - 1 + max(1, spec_tokens) if any(spec.short_conv_layers) else 0


def mamba2_state_floats(spec: ModelSpec) -> int:
    """A Mamba-2 layer's state in floats (0 without such layers): its convolution's last kernel - 1
    inputs, then each head's head_dim x state recurrent state (numerics/mamba2.py)."""
    if not any(spec.mamba_layers):
        return 0
    conv = (spec.mamba_conv_kernel - 1) * spec.mamba_conv_dim
    return conv + spec.mamba_heads * spec.mamba_head_dim * spec.mamba_state


def mamba2_state_summary(spec: ModelSpec, layers: int) -> str:
    """Report's line on the Mamba-2 layers' state."""
    conv = 4 * (spec.mamba_conv_kernel - 1) * spec.mamba_conv_dim
    ssm = 4 * spec.mamba_heads * spec.mamba_head_dim * spec.mamba_state
    return f"Mamba-2 state: {layers} layers x {conv + ssm:,} B (convolution {conv:,} B + SSM {ssm:,} B)"


def linear_state_layout(spec: ModelSpec, spec_tokens: int = 0) -> tuple[tuple[int, ...], int]:
    """Per layer, its first float in the recurrent state arena (-1: a layer without state; () for
    a model without such layers); and the arena's length in floats. A Gated DeltaNet layer keeps
    its convolution's last inputs and its delta-rule state, a short convolution layer its ring of
    inputs (short_conv_ring_rows x hidden), a Mamba-2 layer mamba2_state_floats."""
    linear_offsets, linear_cursor = [], 0
    per_linear_layer = (max(0, spec.linear_conv_kernel - 1) * spec.linear_conv_dim) + (
        spec.linear_v_heads * spec.linear_k_dim * spec.linear_v_dim
    )
    per_conv_layer = short_conv_ring_rows(spec, spec_tokens) * spec.hidden_size
    for i in range(spec.n_layers):
        stateful = spec.is_linear(i) or spec.is_short_conv(i) or spec.is_mamba(i)
        linear_offsets.append(linear_cursor if stateful else -1)
        linear_cursor += per_linear_layer if spec.is_linear(i) else per_conv_layer if spec.is_short_conv(i) else 0
        linear_cursor += mamba2_state_floats(spec) if spec.is_mamba(i) else 0
    return (tuple(linear_offsets) if linear_cursor else ()), linear_cursor


def rope_tables(spec: ModelSpec) -> tuple[tuple, tuple[int, ...], tuple[int, ...]]:
    """The distinct RoPE tables (RopeSpecs), the dims each rotates, and each layer's table."""
    # One table per distinct (RoPE, rotated width): Gemma 4's global layers rotate their wider heads.
    tables: list = []
    layer_rope = []
    for layer in range(spec.n_layers):
        key = (spec.layer_rope(layer), spec.layer_rotary_dim(layer))
        if key not in tables:
            tables.append(key)
        layer_rope.append(tables.index(key))
    ropes = [r for r, _ in tables]
    rope_dims = tuple(dim for _, dim in tables)
    return tuple(ropes), rope_dims, tuple(layer_rope)
