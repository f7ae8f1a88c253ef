"""ModelSpec: the architecture of one checkpoint, independent of how it will be stored or run."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields


@dataclass(frozen=True)
class RopeSpec:
    """Rotary position embedding parameters (rotate-half convention, as in Hugging Face)."""

    theta: float
    scaling: str = "default"  # "default" | "linear" | "llama3" | "yarn" | "proportional"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    # YaRN (gpt-oss): the ramp between interpolated and extrapolated frequencies, and the factor
    # cos and sin are multiplied by (already resolved from factor / mscale when the config omits it).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    # "proportional" (Gemma 4's global layers): the first int(fraction * head_dim / 2) pairs rotate at
    # theta^(-2i / head_dim) / factor, the others do not rotate (frequency 0).
    rotated_fraction: float = 1.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything the planner, emitter, runtime and reference need to know about a model."""

    name: str
    architecture: str  # Hugging Face class name, e.g. "LlamaForCausalLM"
    family: str  # its row in model/family_facts.py, e.g. "llama", "qwen3_moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    # Per layer: how many most recent positions (current included) attention sees; 0 = all.
    layer_windows: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Gemma-style variations of the same decoder (defaults: Llama).
    activation: str = "silu"  # gated FFN activation: "silu" | "gelu_tanh" | "swiglu_clamped"
    embed_scale: float = 1.0  # embeddings are multiplied by this (Gemma: sqrt(hidden_size))
    attn_scale: float = 0.0  # score scale; 0 means 1/sqrt(head_dim)
    post_norms: bool = False  # RMSNorm of the attention and FFN outputs before the residual add
    rope_local: RopeSpec | None = None  # RoPE of sliding-window layers, when it differs
    final_softcap: float = 0.0  # logits -> tanh(l / cap) * cap; 0 = off
    # Mixture of experts (0 experts: every FFN is dense).
    n_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an always-on expert with a sigmoid gate
    moe_layers: tuple[bool, ...] = field(default_factory=tuple)  # True where the FFN is a mixture
    # Gated DeltaNet (Qwen3.5): True where the layer's token mixer is the linear-attention recurrence
    # (a short causal convolution, then the gated delta rule on a per-head key x value state).
    linear_layers: tuple[bool, ...] = field(default_factory=tuple)
    linear_k_heads: int = 0  # query/key heads of a DeltaNet layer
    linear_v_heads: int = 0  # value heads (a multiple of the key heads; consecutive ones share a key head)
    linear_k_dim: int = 0  # width of one query/key head
    linear_v_dim: int = 0  # width of one value head
    linear_conv_kernel: int = 0  # taps of the causal depthwise convolution over q, k and v
    attn_output_gate: bool = False  # the q projection also makes a per-head sigmoid gate of the attention output
    rope_dim: int = 0  # the leading dims of each head RoPE rotates (partial rotary); 0 = all of head_dim
    # gpt-oss: a learned logit per query head joins that head's softmax and is dropped after it.
    attn_sinks: bool = False
    # "softmax_then_topk" (Mixtral, Qwen-MoE) or "topk_then_softmax" (gpt-oss: softmax over the k chosen logits)
    router: str = "softmax_then_topk"
    router_bias: bool = False  # the router linear has a bias
    expert_biases: bool = False  # every routed expert's gate, up and down projections have biases
    # activation "swiglu_clamped" (gpt-oss): gate = min(gate, limit), up = clamp(up, -limit, limit),
    # (up + 1) * (gate * sigmoid(alpha * gate)).
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    # Gemma 4: full-attention (global) layers have their own head width and KV heads (0: as the
    # sliding ones); with k_eq_v their values are the keys' projection (before k_norm and RoPE).
    global_head_dim: int = 0
    global_kv_heads: int = 0
    k_eq_v: bool = False
    v_norm: bool = False  # values RMS-normalised without a weight (Gemma 4)
    # Gemma 4 per-layer input embeddings (0: none): a [vocab, n_layers * ple_dim] table read one row
    # per token, mixed with a projection of the token's embedding, fed into every layer's residual.
    ple_dim: int = 0
    layer_scalars: bool = False  # every layer's output is multiplied by its learned scalar (Gemma 4)
    # Gemma 4's MoE block: the dense FFN and the routed experts side by side, each with its own pre-
    # and post-norm, the router reading the un-normed residual through its own norm; routing weights
    # renormalised then multiplied by a learned per-expert scale.
    moe_beside_dense: bool = False
    # Gemma 4 (E2B, E4B): the last kv_shared_layers layers compute no keys or values; each attends
    # over those of the last earlier layer of its type (kv_source). With double_wide_mlp their FFN
    # is twice intermediate_size wide.
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash; kv_lora_rank 0: none). Every layer's
    # keys and values come from a latent of kv_lora_rank (RMS-normed) and one shared RoPE key of
    # rope_dim; a query head is qk_nope_head_dim + rope_dim wide (head_dim), a value head
    # v_head_dim; the queries directly (wq) or through a q_lora_rank-wide low-rank path. The cache
    # keeps kv_lora_rank + rope_dim values per position and layer (model/latent_attention.py).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # The DeepSeek line's routing (DeepSeek-V2/V3, GLM-4.x MoE; numerics/routing.py). router "sigmoid":
    # sigmoid scores, the top k chosen on scores + router_choice_bias (V3's e_score_correction_bias)
    # and weighted by the scores alone. With expert_groups the experts are that many equal groups
    # and only the best expert_groups_used groups may be chosen from: a group scores the sum of its
    # top two choice scores (sigmoid) or its best probability (softmax: V2's group_limited_greedy).
    # The weights are then multiplied by routed_scaling. ungated_shared_expert: the shared expert
    # (n_shared_experts of them as one MLP) is always added whole, without a sigmoid gate.
    expert_groups: int = 0
    expert_groups_used: int = 0
    router_choice_bias: bool = False
    routed_scaling: float = 1.0
    ungated_shared_expert: bool = False
    # Multi-token-prediction layers the checkpoint holds past the last (model.layers.<n>, blk.<n>):
    # not part of next-token decoding, left out (report says so).
    mtp_layers: int = 0
    # OLMoE: with qk_norm, one RMSNorm over all the heads' queries (q_norm: n_heads x head_dim wide)
    # and one over all the keys (k_norm: n_kv_heads x head_dim), not one per head.
    qk_norm_whole: bool = False
    # Phi-3.5-MoE: LayerNorm (a weight and a bias: attn_norm_bias, ffn_norm_bias, final_norm_bias)
    # in place of every RMSNorm; a bias on the output matrix; router "sparsemixer" and its jitter,
    # whose double is the threshold of the logits near the chosen one.
    layer_norm: bool = False
    lm_head_bias: bool = False
    router_jitter: float = 0.0
    # LFM2's gated short convolution: True where the layer's token mixer is in_proj to B, C and x,
    # C * conv(B * x) over the last short_conv_kernel positions (depthwise, causal), out_proj.
    short_conv_layers: tuple[bool, ...] = field(default_factory=tuple)
    short_conv_kernel: int = 0  # taps of the convolution (config.json's conv_L_cache)
    router_norm_eps: float = 0.0  # renormalised routing weights: w / (their sum + this) (LFM2-MoE: 1e-6)
    # Mamba-2 (Granite 4.0 hybrid; numerics/mamba2.py): True where the layer's token mixer is
    # in_proj to z, xBC and dt; a causal depthwise convolution (mamba_conv_kernel taps, a bias) of
    # xBC and SiLU; the selective state recurrence per head (mamba_heads of mamba_head_dim, B and C
    # shared by the heads of each of mamba_groups groups, mamba_state wide); RMSNorm per group of
    # y * silu(z); out_proj. dt is clamped to [mamba_dt_min, mamba_dt_max] (0: no upper limit).
    mamba_layers: tuple[bool, ...] = field(default_factory=tuple)
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0
    mamba_conv_kernel: int = 0
    mamba_dt_min: float = 0.0
    mamba_dt_max: float = 0.0
    # Granite's multipliers: each block's output times residual_scale before the residual add; the
    # logits divided by logits_scaling.
    residual_scale: float = 1.0
    logits_scaling: float = 1.0
    # Llama 4: with chunked_windows a layer's window (layer_windows) is a chunk: a position sees the
    # positions of its own chunk up to itself (p - p % window .. p), not the last `window` ones.
    # nope_layers: True where the layer applies no RoPE; qk_l2_norm_layers: True where the queries
    # and keys are RMS-normalised without a weight after RoPE (transformers' Llama4TextL2Norm). On
    # no-RoPE layers with attn_temperature_floor > 0 the queries are multiplied by
    # log(1 + (p + 1) // floor) * attn_temperature_scale + 1. expert_input_scaled: each chosen
    # expert's routing weight scales its input, its output is added whole (router
    # "topk_then_sigmoid": the top k logits, their sigmoids the weights).
    chunked_windows: bool = False
    nope_layers: tuple[bool, ...] = field(default_factory=tuple)
    qk_l2_norm_layers: tuple[bool, ...] = field(default_factory=tuple)
    attn_temperature_floor: int = 0
    attn_temperature_scale: float = 0.0
    expert_input_scaled: bool = False

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.rope_dim or self.head_dim

    def is_global(self, layer: int) -> bool:
        """A full-attention layer (sees every position), as opposed to a sliding-window one."""
        return not (self.layer_windows and self.layer_windows[layer])

    def layer_head_dim(self, layer: int) -> int:
        return self.global_head_dim if self.global_head_dim and self.is_global(layer) else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        if self.kv_lora_rank:  # latent attention: one cached row (the latent and the RoPE key) for every head
            return 1
        return self.global_kv_heads if self.global_kv_heads and self.is_global(layer) else self.n_kv_heads

    def layer_q_dim(self, layer: int) -> int:
        return self.n_heads * self.layer_head_dim(layer)

    def layer_kv_dim(self, layer: int) -> int:
        if self.kv_lora_rank:  # latent attention: the latent and the RoPE key of a position
            return self.kv_lora_rank + self.rope_dim
        return self.layer_kv_heads(layer) * self.layer_head_dim(layer)

    def layer_rotary_dim(self, layer: int) -> int:
        return self.rope_dim or self.layer_head_dim(layer)

    def layer_k_eq_v(self, layer: int) -> bool:
        return self.k_eq_v and self.is_global(layer)

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, or for the last
        kv_shared_layers layers the last earlier layer of the same type (-1: there is none)."""
        first = self.n_layers - self.kv_shared_layers
        if layer < first:
            return layer
        same = [i for i in range(first) if self.is_global(i) == self.is_global(layer)]
        return same[-1] if same else -1

    def is_kv_consumer(self, layer: int) -> bool:
        return self.kv_source(layer) != layer

    def layer_ffn_dim(self, layer: int) -> int:
        return self.intermediate_size * (2 if self.double_wide_mlp and self.is_kv_consumer(layer) else 1)

    @property
    def max_head_dim(self) -> int:
        return max([self.head_dim] + [self.layer_head_dim(i) for i in range(self.n_layers)])

    @property
    def max_q_dim(self) -> int:
        return max([self.q_dim] + [self.layer_q_dim(i) for i in range(self.n_layers)])

    @property
    def max_kv_dim(self) -> int:
        return max([self.kv_dim] + [self.layer_kv_dim(i) for i in range(self.n_layers)])

    @property
    def linear_key_dim(self) -> int:
        return self.linear_k_heads * self.linear_k_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_v_heads * self.linear_v_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the convolution: the queries, keys and values of a DeltaNet layer, side by side."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    def is_linear(self, layer: int) -> bool:
        return bool(self.linear_layers) and self.linear_layers[layer]

    def is_short_conv(self, layer: int) -> bool:
        return bool(self.short_conv_layers) and self.short_conv_layers[layer]

    def is_mamba(self, layer: int) -> bool:
        return bool(self.mamba_layers) and self.mamba_layers[layer]

    @property
    def mamba_inner(self) -> int:
        """Width of a Mamba-2 layer's x, z and y: its heads side by side."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of a Mamba-2 layer's convolution: x, then every group's B, then every group's C."""
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state

    def is_nope(self, layer: int) -> bool:
        """A layer that applies no RoPE (Llama 4's global layers)."""
        return bool(self.nope_layers) and self.nope_layers[layer]

    def first_seen(self, layer: int, pos: int) -> int:
        """The first position a query at `pos` of `layer` attends to: 0, the start of its sliding
        window, or with chunked_windows the start of its chunk."""
        window = self.layer_windows[layer] if self.layer_windows else 0
        if not window:
            return 0
        return pos - pos % window if self.chunked_windows else max(0, pos - window + 1)

    @property
    def score_scale(self) -> float:
        return self.attn_scale if self.attn_scale else self.head_dim**-0.5

    def layer_rope(self, layer: int) -> RopeSpec:
        return self.rope_local if (self.rope_local and self.layer_windows[layer]) else self.rope

    def identity(self) -> dict:
        """The spec as the model hash sees it: every field, except those added with a later family
        (LATER_FIELDS) while they hold their default, so the models that came before keep their
        image bytes and hashes, and mtp_layers (what is left out changes nothing built)."""
        out = asdict(self)
        del out["mtp_layers"]  # (layers left out: the firmware and its image do not depend on them)
        _drop_later_defaults(out, self, LATER_FIELDS)
        _drop_later_defaults(out["rope"], self.rope, LATER_ROPE_FIELDS)
        if self.rope_local is not None:
            _drop_later_defaults(out["rope_local"], self.rope_local, LATER_ROPE_FIELDS)
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace variance): part of the model hash."""
        return json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))


# Fields added after the model hash's first form (Qwen3.5's Gated DeltaNet, gpt-oss): left out of a
# spec's identity while at their defaults, so a model without the feature keeps the identity (and
# the weight image, bit for bit) it had before.
LATER_FIELDS = (
    "linear_layers",
    "linear_k_heads",
    "linear_v_heads",
    "linear_k_dim",
    "linear_v_dim",
    "linear_conv_kernel",
    "attn_output_gate",
    "rope_dim",
    "attn_sinks",
    "router",
    "router_bias",
    "expert_biases",
    "swiglu_alpha",
    "swiglu_limit",
    "global_head_dim",
    "global_kv_heads",
    "k_eq_v",
    "v_norm",
    "ple_dim",
    "layer_scalars",
    "moe_beside_dense",
    "kv_shared_layers",
    "double_wide_mlp",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "expert_groups",
    "expert_groups_used",
    "router_choice_bias",
    "routed_scaling",
    "ungated_shared_expert",
    "qk_norm_whole",
    "layer_norm",
    "lm_head_bias",
    "router_jitter",
    "short_conv_layers",
    "short_conv_kernel",
    "router_norm_eps",
    "mamba_layers",
    "mamba_heads",
    "mamba_head_dim",
    "mamba_groups",
    "mamba_state",
    "mamba_conv_kernel",
    "mamba_dt_min",
    "mamba_dt_max",
    "residual_scale",
    "logits_scaling",
    "chunked_windows",
    "nope_layers",
    "qk_l2_norm_layers",
    "attn_temperature_floor",
    "attn_temperature_scale",
    "expert_input_scaled",
)
LATER_ROPE_FIELDS = ("beta_fast", "beta_slow", "truncate", "attention_factor", "rotated_fraction")


def _drop_later_defaults(out: dict, obj, names: tuple[str, ...]) -> None:
    for f in fields(obj):
        if f.name in names:
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            if getattr(obj, f.name) == default:
                del out[f.name]


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The canonical tensor vocabulary of a model: name -> shape, in the order the weight image
    stores them. The importer maps a checkpoint's names onto it; the plan lays it out."""
    d, f, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, d)}
    if spec.ple_dim:
        # Gemma 4's per-layer inputs: the table (one row per token, every layer's slice side by
        # side), the projection of the token's embedding and its norm (one slice wide).
        shapes["ple_embed"] = (v, spec.n_layers * spec.ple_dim)
        shapes["ple_model_proj"] = (spec.n_layers * spec.ple_dim, d)
        shapes["ple_proj_norm"] = (spec.ple_dim,)
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (d,)
        if spec.layer_norm:
            shapes[p + "attn_norm_bias"] = (d,)
        if spec.is_linear(i):
            shapes.update(_linear_attention_shapes(spec, p))
        elif spec.is_short_conv(i):
            shapes.update(_short_conv_shapes(spec, p))
        elif spec.is_mamba(i):
            shapes.update(mamba2_shapes(spec, p))
        else:
            shapes.update(_attention_shapes(spec, p, i))
        if spec.post_norms:
            shapes[p + "post_attn_norm"] = (d,)
        shapes[p + "ffn_norm"] = (d,)
        if spec.layer_norm:
            shapes[p + "ffn_norm_bias"] = (d,)
        if spec.moe_beside_dense and spec.moe_layers and spec.moe_layers[i]:
            shapes.update(_gemma4_moe_shapes(spec, p))
        elif spec.moe_layers and spec.moe_layers[i]:
            # Expert-major: each expert's three matrices together, so a token reads only its experts.
            fe = spec.expert_intermediate_size
            shapes[p + "router"] = (spec.n_experts, d)
            if spec.router_bias:
                shapes[p + "router_bias"] = (spec.n_experts,)
            if spec.router_choice_bias:
                shapes[p + "router_choice_bias"] = (spec.n_experts,)
            for e in range(spec.n_experts):
                shapes[p + f"experts.{e}.w_gate"] = (fe, d)
                shapes[p + f"experts.{e}.w_up"] = (fe, d)
                shapes[p + f"experts.{e}.w_down"] = (d, fe)
            if spec.expert_biases:
                # Every expert's biases in one vector per projection, expert after expert: small,
                # kept resident beside the router while the experts' matrices may be paged.
                shapes[p + "expert_b_gate"] = (spec.n_experts * fe,)
                shapes[p + "expert_b_up"] = (spec.n_experts * fe,)
                shapes[p + "expert_b_down"] = (spec.n_experts * d,)
            if spec.shared_expert_intermediate_size:
                fs = spec.shared_expert_intermediate_size
                shapes[p + "shared.w_gate"] = (fs, d)
                shapes[p + "shared.w_up"] = (fs, d)
                shapes[p + "shared.w_down"] = (d, fs)
                if not spec.ungated_shared_expert:
                    shapes[p + "shared_gate"] = (1, d)
        else:
            fl = spec.layer_ffn_dim(i)
            shapes[p + "w_gate"] = (fl, d)
            shapes[p + "w_up"] = (fl, d)
            shapes[p + "w_down"] = (d, fl)
        if spec.mlp_bias:
            shapes[p + "b_gate"] = (f,)
            shapes[p + "b_up"] = (f,)
            shapes[p + "b_down"] = (d,)
        if spec.post_norms:
            shapes[p + "post_ffn_norm"] = (d,)
        if spec.ple_dim:
            shapes[p + "ple_gate"] = (spec.ple_dim, d)
            shapes[p + "ple_proj"] = (d, spec.ple_dim)
            shapes[p + "ple_norm"] = (d,)
        if spec.layer_scalars:
            shapes[p + "layer_scalar"] = (1,)
    shapes["final_norm"] = (d,)
    if spec.layer_norm:
        shapes["final_norm_bias"] = (d,)
    if not spec.tie_embeddings:
        shapes["lm_head"] = (v, d)
    if spec.lm_head_bias:
        shapes["lm_head_bias"] = (v,)
    return shapes


def _attention_shapes(spec: ModelSpec, p: str, layer: int) -> dict[str, tuple[int, ...]]:
    """A softmax-attention layer's tensors (no wv where the values are the keys: Gemma 4's k_eq_v)."""
    if spec.kv_lora_rank:
        return latent_attention_shapes(spec, p)
    d, qd, kvd, hd = spec.hidden_size, spec.layer_q_dim(layer), spec.layer_kv_dim(layer), spec.layer_head_dim(layer)
    own_kv = not spec.is_kv_consumer(layer)  # (Gemma 4's KV-sharing layers: queries only)
    shapes: dict[str, tuple[int, ...]] = {p + "wq": (qd, d)}
    if spec.attn_output_gate:
        shapes[p + "wq_gate"] = (qd, d)
    if own_kv:
        shapes[p + "wk"] = (kvd, d)
    if own_kv and not spec.layer_k_eq_v(layer):
        shapes[p + "wv"] = (kvd, d)
    if spec.qkv_bias:
        shapes[p + "bq"] = (qd,)
        if own_kv:
            shapes[p + "bk"] = (kvd,)
            shapes[p + "bv"] = (kvd,)
    if spec.qk_norm:
        shapes[p + "q_norm"] = (qd if spec.qk_norm_whole else hd,)
        if own_kv:
            shapes[p + "k_norm"] = (kvd if spec.qk_norm_whole else hd,)
    shapes[p + "wo"] = (d, qd)
    if spec.o_bias:
        shapes[p + "bo"] = (d,)
    if spec.attn_sinks:
        shapes[p + "sinks"] = (spec.n_heads,)
    return shapes


def _gemma4_moe_shapes(spec: ModelSpec, p: str) -> dict[str, tuple[int, ...]]:
    """Gemma 4's MoE block (ffn_norm and post_ffn_norm around it are the layer's): the dense FFN and
    its post-norm, the router's norm weight (its scale times hidden^-1/2, folded at import), the
    router, the per-expert scales, the experts' pre-norm, the experts, their post-norm."""
    d, fe = spec.hidden_size, spec.expert_intermediate_size
    f = spec.layer_ffn_dim(int(p.split(".")[1]))
    shapes: dict[str, tuple[int, ...]] = {
        p + "w_gate": (f, d),
        p + "w_up": (f, d),
        p + "w_down": (d, f),
        p + "post_dense_norm": (d,),
        p + "router_norm": (d,),
        p + "router": (spec.n_experts, d),
        p + "expert_scale": (spec.n_experts,),
        p + "moe_norm": (d,),
    }
    for e in range(spec.n_experts):
        shapes[p + f"experts.{e}.w_gate"] = (fe, d)
        shapes[p + f"experts.{e}.w_up"] = (fe, d)
        shapes[p + f"experts.{e}.w_down"] = (d, fe)
    shapes[p + "post_moe_norm"] = (d,)
    return shapes


def _linear_attention_shapes(spec: ModelSpec, p: str) -> dict[str, tuple[int, ...]]:
    """A Gated DeltaNet layer's tensors: the q/k/v, z (output gate), b (beta) and a (decay)
    projections, the convolution's taps (channel after channel, kernel values each), the decay's
    dt_bias and -exp(A_log) per value head (the decay's scale, as llama.cpp stores it: ssm_a), the
    gated RMSNorm's weight (one value head wide) and out_proj."""
    d, nv = spec.hidden_size, spec.linear_v_heads
    return {
        p + "lin_qkv": (spec.linear_conv_dim, d),
        p + "lin_z": (spec.linear_value_dim, d),
        p + "lin_b": (nv, d),
        p + "lin_a": (nv, d),
        p + "lin_conv": (spec.linear_conv_dim * spec.linear_conv_kernel,),
        p + "lin_dt_bias": (nv,),
        p + "lin_decay_scale": (nv,),
        p + "lin_norm": (spec.linear_v_dim,),
        p + "lin_out": (d, spec.linear_value_dim),
    }


def _short_conv_shapes(spec: ModelSpec, p: str) -> dict[str, tuple[int, ...]]:
    """A gated short convolution's tensors: in_proj (B, C and x, each hidden wide, stacked), the
    convolution's taps (channel after channel, its kernel values each), out_proj."""
    d = spec.hidden_size
    return {
        p + "conv_in": (3 * d, d),
        p + "conv_taps": (d * spec.short_conv_kernel,),
        p + "conv_out": (d, d),
    }


def latent_attention_shapes(spec: ModelSpec, p: str) -> dict[str, tuple[int, ...]]:
    """A latent attention layer's tensors: the queries (wq, or wq_a, its norm and wq_b), the latent
    and RoPE key's projection (wkv_a) and the latent's norm, per head the key up-projection
    transposed (wk_b: kv_lora_rank rows of qk_nope_head_dim, which the absorbed form applies to the
    query) and the value up-projection (wv_b: v_head_dim rows of kv_lora_rank), then wo."""
    d, h, r = spec.hidden_size, spec.n_heads, spec.kv_lora_rank
    shapes: dict[str, tuple[int, ...]] = {}
    if spec.q_lora_rank:
        shapes[p + "wq_a"] = (spec.q_lora_rank, d)
        shapes[p + "q_a_norm"] = (spec.q_lora_rank,)
        shapes[p + "wq_b"] = (spec.q_dim, spec.q_lora_rank)
    else:
        shapes[p + "wq"] = (spec.q_dim, d)
    shapes[p + "wkv_a"] = (r + spec.rope_dim, d)
    shapes[p + "kv_a_norm"] = (r,)
    shapes[p + "wk_b"] = (h * r, spec.qk_nope_head_dim)
    shapes[p + "wv_b"] = (h * spec.v_head_dim, r)
    shapes[p + "wo"] = (d, h * spec.v_head_dim)
    return shapes


def mamba2_shapes(spec: ModelSpec, p: str) -> dict[str, tuple[int, ...]]:
    """A Mamba-2 layer's tensors: in_proj (z, xBC, dt rows), the convolution's taps (channel after
    channel, its kernel values each) and bias, per head dt's bias, A (-exp(A_log)) and D, the gated
    norm's weight, out_proj."""
    d, inner, conv, heads = spec.hidden_size, spec.mamba_inner, spec.mamba_conv_dim, spec.mamba_heads
    return {
        p + "ssm_in": (inner + conv + heads, d),
        p + "ssm_conv": (conv * spec.mamba_conv_kernel,),
        p + "ssm_conv_bias": (conv,),
        p + "ssm_dt_bias": (heads,),
        p + "ssm_a": (heads,),
        p + "ssm_d": (heads,),
        p + "ssm_norm": (inner,),
        p + "ssm_out": (d, inner),
    }
