"""The NumPy reference decoder: the same forward pass as firmware_src/runtime/model.c, operation
for operation (numerics.py), reading its weights from the same weight image. For q8_0 weights its
logits are bit-identical to the firmware's on every board; `verify` compares their SHA-256."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .compile.image import read_header
from .compile.plan import Plan
from .errors import NonFiniteLogits
from .numerics import blocks, rope
from .numerics.kv_cache import kv_round
from .numerics.mamba2 import mamba2_step
from .numerics.mla import latent_attention, latent_cache
from .numerics.ops import (
    F32,
    attn_temperature,
    conv_step,
    delta_rule_step,
    dot,
    exp_sum,
    expf,
    f32,
    gated_rmsnorm,
    gelu_tanh,
    l2norm,
    layer_norm,
    matvec_f32,
    rmsnorm,
    rmsnorm_unscaled,
    seq_sum,
    sigmoid,
    silu,
    softcap,
    softmax,
    softmax_with_sink,
    softplus,
    swiglu_clamped,
)
from .numerics.ops import rope as apply_rope
from .numerics.perplexity import Score
from .numerics.quantize import (
    HALF,
    INTEGER_QUANTS,
    KEPT_BLOCK_TYPES,
    QK,
    dequantize_q4_1,
    dequantize_q8_0,
    matvec_q4_1,
    matvec_q8_0,
    quantize_q8_0,
    unpack_q4_0,
    unpack_q4_1,
)
from .numerics.routing import route
from .numerics.sampling import Rng, SamplingParams, sample
from .numerics.short_conv import short_conv_step


@dataclass(frozen=True)
class KeptBlocks:
    """A matrix of a kept GGUF type as the image holds it: its rows' blocks (rows, row bytes), a view."""

    dtype: str
    raw: np.ndarray
    cols: int


def logits_digest(logits: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(logits, dtype="<f4").tobytes()).hexdigest()


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    stop_reason: str = "length"
    expert_counts: dict[int, list[int]] = field(default_factory=dict)
    scores: list[Score] = field(default_factory=list)
    held: int = 0  # positions the KV cache holds afterwards: where a conversation continues


# q4_0 matrices are unpacked to int8 when first used and kept up to this many bytes of unpacked
# quants (beyond it, unpacked at every use): a small model runs as fast as with everything
# unpacked, a large one stays within the bound.
Q4_UNPACKED_BYTES = 256 << 20


class Reference:
    """The decoder over a weight image: bytes, or better np.memmap(path) (image.map_image), whose
    tensors it reads in place: q8_0 quants and scales and f32 values are views of the image, never
    copies, so a large image costs address space, not memory."""

    def __init__(self, plan: Plan, image):
        header = read_header(image)
        self.plan, self.spec = plan, plan.spec
        base = header.data_offset
        self.w: dict[str, object] = {}
        self.q4_packed: dict[str, np.ndarray] = {}
        self.q4_unpacked: dict[str, np.ndarray] = {}
        self.q4_unpacked_bytes = 0
        # The conversation's tokens by position (those the KV cache holds): the repetition
        # penalty's window, as the firmware's history in app/decode.c.
        self.seen: list[int] = []
        # Called with (layer, operation, output) after each operation of every forward pass, under
        # the names runtime/checkpoint.h's checkpoints have in model.c (verify_localise.py); None: not.
        self.checkpoint: Callable[[int, str, np.ndarray], None] | None = None
        for t in plan.tensors:
            start = base + t.offset
            if t.dtype == "q8_0":
                qs = np.frombuffer(image, dtype=np.int8, count=t.rows * t.cols, offset=start).reshape(t.rows, t.cols)
            if t.dtype in ("q4_0", "q4_1"):  # nibbles, unpacked at use (_quants); q4_1: scales, then minimums
                self.q4_packed[t.name] = (
                    t.dtype,
                    np.frombuffer(image, dtype=np.uint8, count=t.rows * t.cols // 2, offset=start).reshape(
                        t.rows, t.cols // 2
                    ),
                )
                qs = None
            if t.dtype in KEPT_BLOCK_TYPES:
                raw = np.frombuffer(image, dtype=np.uint8, count=t.nbytes, offset=start)
                self.w[t.name] = KeptBlocks(t.dtype, raw.reshape(t.rows, -1), t.cols)
            elif t.dtype in INTEGER_QUANTS:
                d = np.frombuffer(
                    image, dtype=HALF, count=t.rows * t.cols // 32, offset=start + t.scales_offset
                ).reshape(t.rows, t.cols // 32)
                self.w[t.name] = (qs, d)
                if t.dtype == "q4_1":
                    m = np.frombuffer(
                        image, dtype=HALF, count=t.rows * t.cols // 32, offset=start + t.mins_offset
                    ).reshape(t.rows, t.cols // 32)
                    self.w[t.name] = (qs, d, m)
            else:
                arr = np.frombuffer(image, dtype="<f4", count=t.rows * t.cols, offset=start)
                self.w[t.name] = arr.reshape(t.rows, t.cols) if t.rows > 1 else arr
        self.tables = [rope.tables(r, dim, plan.n_ctx) for r, dim in zip(plan.ropes, plan.rope_dims)]
        self.scale = F32(self.spec.score_scale)
        s = self.spec
        # Per layer, a ring of kv_slots[layer] positions: position t lives in slot t % slots.
        self.k_cache = [
            np.zeros((n, s.layer_kv_heads(i), s.layer_head_dim(i)), dtype=np.float32)
            for i, n in enumerate(plan.kv_slots)
        ]
        self.v_cache = [np.zeros_like(k) for k in self.k_cache]
        for i in range(s.n_layers):  # Gemma 4's KV-sharing layers read their source's cache
            src = s.kv_source(i)
            self.k_cache[i], self.v_cache[i] = self.k_cache[src], self.v_cache[src]
        self.latent_cache = latent_cache(s, plan.kv_slots) if s.kv_lora_rank else []
        self.expert_counts = np.zeros((s.n_layers, max(1, s.n_experts)), dtype=np.int64)
        # The first layer whose output held a NaN or an infinity in this request (None: none), as
        # model.c keeps it: where a step's non-finite logits are said to come from.
        self.nonfinite_layer: int | None = None
        # Gated DeltaNet layers: the convolution's last kernel - 1 inputs and each value head's
        # key x value state, the whole context in a fixed size (zeroed when a sequence starts).
        self.conv_state = self._layer_states(s.is_linear, (s.linear_conv_kernel - 1, s.linear_conv_dim))
        self.delta_state = self._layer_states(s.is_linear, (s.linear_v_heads, s.linear_k_dim, s.linear_v_dim))
        # Gated short convolution layers (LFM2): a ring of their last inputs (short_conv.py).
        self.conv_ring = self._layer_states(s.is_short_conv, (plan.short_conv_ring_rows, s.hidden_size))
        # Mamba-2 layers (Granite 4.0 hybrid): the convolution's last inputs and each head's state.
        self.mamba_conv = self._layer_states(s.is_mamba, (s.mamba_conv_kernel - 1, s.mamba_conv_dim))
        self.mamba_ssm = self._layer_states(s.is_mamba, (s.mamba_heads, s.mamba_head_dim, s.mamba_state))

    def _layer_states(self, has: Callable[[int], bool], shape: tuple[int, ...]) -> dict[int, np.ndarray]:
        """A fixed-size recurrent state of `shape`, zeros, for each layer of the kind `has` names."""
        return {i: np.zeros(shape, dtype=np.float32) for i in range(self.spec.n_layers) if has(i)}

    # -- building blocks -------------------------------------------------------------------
    def _prepare(self, x: np.ndarray):
        """The matmul input as the kernels see it: the floats, and for q8_0 and q4_0 weights their
        q8_0 quants (made once, when the input's length is whole blocks: matrices whose rows are
        not stay f32 and read the floats)."""
        quantized = self.plan.activations_q8 and x.shape[-1] % QK == 0
        return x, (quantize_q8_0(x) if quantized else None)

    def _quants(self, name: str, row: int | None = None) -> np.ndarray:
        """A q8_0, q4_0 or q4_1 matrix's quants (or one row's): q4_0 (the int8 values q - 8) and q4_1
        (0..15) nibbles unpacked here, and kept while the unpacked matrices stay within
        Q4_UNPACKED_BYTES."""
        qs = self.w[name][0]
        if qs is not None:
            return qs if row is None else qs[row]
        if name in self.q4_unpacked:
            qs = self.q4_unpacked[name]
            return qs if row is None else qs[row]
        dtype, packed = self.q4_packed[name]
        unpack = unpack_q4_0 if dtype == "q4_0" else unpack_q4_1
        if row is not None:
            return unpack(packed[row])
        qs = unpack(packed)
        if self.q4_unpacked_bytes + qs.nbytes <= Q4_UNPACKED_BYTES:
            self.q4_unpacked[name] = qs
            self.q4_unpacked_bytes += qs.nbytes
        return qs

    def _linear(self, name: str, act, bias: str | None = None, rows: slice = slice(None)) -> np.ndarray:
        """The matrix (or its `rows`: a head's block, latent attention's) times the input."""
        w = self.w[name]
        x, q = act
        if isinstance(w, KeptBlocks):
            out = blocks.matvec(w.dtype, w.raw[rows], w.cols, q[0], q[1])
        elif isinstance(w, tuple) and len(w) == 3:
            out = matvec_q4_1(self._quants(name)[rows], w[1][rows], w[2][rows], q[0], q[1])
        elif isinstance(w, tuple):
            out = matvec_q8_0(self._quants(name)[rows], w[1][rows], q[0], q[1])
        else:
            out = matvec_f32(w[rows], x)
        if bias is not None:
            out = out + self.w[bias]
        return out

    def _row(self, name: str, token: int) -> np.ndarray:
        """Row `token` of an embedding table (embed, ple_embed) as floats: only that row is read."""
        w = self.w[name]
        if isinstance(w, KeptBlocks):
            return blocks.dequantize(w.dtype, blocks.rows_of(w.dtype, w.raw[token], w.cols))
        if isinstance(w, tuple) and len(w) == 3:
            return dequantize_q4_1(self._quants(name, token), w[1][token], w[2][token])
        if isinstance(w, tuple):
            return dequantize_q8_0(self._quants(name, token), w[1][token])
        return w[token].copy()

    def _embed(self, token: int) -> np.ndarray:
        row = self._row("embed", token)
        if self.spec.embed_scale != 1.0:
            row = row * F32(self.spec.embed_scale)
        return row

    def _per_layer_inputs(self, token: int, x: np.ndarray) -> np.ndarray:
        """Gemma 4's per-layer inputs of a token, [n_layers, ple_dim]: (norm(P x / sqrt(hidden)) +
        E[token] * sqrt(ple_dim)) / sqrt(2), x the scaled token embedding, P ple_model_proj, the
        norm per layer slice, E the ple_embed table (one row read)."""
        s = self.spec
        proj = self._linear("ple_model_proj", self._prepare(x)) * F32(s.hidden_size**-0.5)
        proj = rmsnorm(proj.reshape(s.n_layers, s.ple_dim), self.w["ple_proj_norm"], s.rms_norm_eps)
        table = self._row("ple_embed", token).reshape(s.n_layers, s.ple_dim) * F32(s.ple_dim**0.5)
        return (proj + table) * F32(2.0**-0.5)

    def _per_layer_block(self, layer: int, x: np.ndarray, ple: np.ndarray) -> np.ndarray:
        """x + norm(proj(gelu_tanh(gate x) * ple[layer])): a layer's per-layer input into its residual."""
        p = f"layers.{layer}."
        gated = gelu_tanh(self._linear(p + "ple_gate", self._prepare(x))) * ple[layer]
        out = self._linear(p + "ple_proj", self._prepare(gated))
        return x + rmsnorm(out, self.w[p + "ple_norm"], self.spec.rms_norm_eps)

    def _gated_ffn(self, prefix: str, act, biases: bool = False, layer: int | None = None) -> np.ndarray:
        """down(act(gate x) * up x) with the weights under `prefix` (w_gate, w_up, w_down); a dense
        layer's (`layer`) checkpoints its gate and the activation's output."""
        gate = self._linear(prefix + "w_gate", act, prefix + "b_gate" if biases else None)
        up = self._linear(prefix + "w_up", act, prefix + "b_up" if biases else None)
        hidden = (gelu_tanh(gate) if self.spec.activation == "gelu_tanh" else silu(gate)) * up
        if layer is not None:
            self._cp(layer, "ffn_gate", gate)
            self._cp(layer, "ffn_activation", hidden)
        return self._linear(prefix + "w_down", self._prepare(hidden), prefix + "b_down" if biases else None)

    def _expert_bias(self, layer: int, part: str, expert: int) -> np.ndarray:
        """Expert `expert`'s bias of `part` (b_gate, b_up, b_down) from the layer's bias vector."""
        values = self.w[f"layers.{layer}.expert_{part}"]
        width = values.shape[0] // self.spec.n_experts
        return values[expert * width : (expert + 1) * width]

    def _biased_expert(self, layer: int, expert: int, act) -> np.ndarray:
        """A gpt-oss expert: its projections with their biases, the clamped SwiGLU between."""
        s, p = self.spec, f"layers.{layer}.experts.{expert}."
        gate = self._linear(p + "w_gate", act) + self._expert_bias(layer, "b_gate", expert)
        up = self._linear(p + "w_up", act) + self._expert_bias(layer, "b_up", expert)
        hidden = swiglu_clamped(gate, up, s.swiglu_alpha, s.swiglu_limit)
        return self._linear(p + "w_down", self._prepare(hidden)) + self._expert_bias(layer, "b_down", expert)

    def _cp(self, layer: int, op: str, out: np.ndarray) -> None:
        """Checkpoint `op` of `layer` (-1: the embedding; n_layers: the head) with its output."""
        if self.checkpoint is not None:
            self.checkpoint(layer, op, out)

    def _moe(self, layer: int, act, router_act=None) -> np.ndarray:
        """Softmax over the router logits, top k (best first, lowest id on ties), optional
        renormalisation (then Gemma 4's per-expert scales), expert outputs summed in rank order,
        plus the gated shared expert. The router reads router_act where given (Gemma 4), else act."""
        s, p = self.spec, f"layers.{layer}."
        logits = self._linear(
            p + "router", act if router_act is None else router_act, p + "router_bias" if s.router_bias else None
        )
        self._cp(layer, "router", logits)
        chosen, weights = route(s, logits, self.w[p + "router_choice_bias"] if s.router_choice_bias else None)
        self._cp(layer, "experts", np.asarray(chosen, dtype=np.float32))
        self._cp(layer, "expert_weights", weights)
        if s.moe_beside_dense:
            weights = weights * self.w[p + "expert_scale"][chosen]
        out = None
        for rank, expert in enumerate(chosen):
            self.expert_counts[layer, expert] += 1
            if s.expert_input_scaled:  # Llama 4: the weight scales the expert's input, its output added whole
                term = self._gated_ffn(f"{p}experts.{expert}.", self._prepare(act[0] * weights[rank]))
            elif s.expert_biases:
                term = weights[rank] * self._biased_expert(layer, expert, act)
            else:
                term = weights[rank] * self._gated_ffn(f"{p}experts.{expert}.", act)
            out = term if out is None else out + term
        if s.shared_expert_intermediate_size and s.ungated_shared_expert:  # the DeepSeek line's: always on
            out = out + self._gated_ffn(p + "shared.", act)
        elif s.shared_expert_intermediate_size:
            scale = sigmoid(self._linear(p + "shared_gate", act))[0]
            out = out + scale * self._gated_ffn(p + "shared.", act)
        return out

    def _deltanet(self, layer: int, act) -> np.ndarray:
        """A Gated DeltaNet layer's output for one token (its state updated): the q/k/v projection
        through the causal convolution and SiLU, l2-normalised q (scaled by 1/sqrt(key dim)) and k,
        beta = sigmoid(b), the decay exp(-exp(A_log) * softplus(a + dt_bias)) (-exp(A_log): the
        image's lin_decay_scale, made at import), the delta rule per
        value head, the gated RMSNorm with z, out_proj. Nothing here depends on the position."""
        s, p = self.spec, f"layers.{layer}."
        nk, nv, dk, dv = s.linear_k_heads, s.linear_v_heads, s.linear_k_dim, s.linear_v_dim
        mixed = self._linear(p + "lin_qkv", act)
        z = self._linear(p + "lin_z", act).reshape(nv, dv)
        beta = sigmoid(self._linear(p + "lin_b", act))
        a = self._linear(p + "lin_a", act)
        taps = self.w[p + "lin_conv"].reshape(s.linear_conv_dim, s.linear_conv_kernel)
        mixed, self.conv_state[layer] = conv_step(self.conv_state[layer], mixed, taps)
        key_dim = s.linear_key_dim
        q = l2norm(mixed[:key_dim].reshape(nk, dk)) * F32(dk**-0.5)
        k = l2norm(mixed[key_dim : 2 * key_dim].reshape(nk, dk))
        v = mixed[2 * key_dim :].reshape(nv, dv)
        rate = self.w[p + "lin_decay_scale"] * softplus(a + self.w[p + "lin_dt_bias"])
        decay = expf(rate)
        out = np.empty((nv, dv), dtype=np.float32)
        state = self.delta_state[layer]
        for h in range(nv):
            kh = h // (nv // nk)
            out[h], state[h] = delta_rule_step(state[h], q[kh], k[kh], v[h], decay[h], beta[h])
        out = gated_rmsnorm(out, self.w[p + "lin_norm"], z, s.rms_norm_eps)
        return self._linear(p + "lin_out", self._prepare(out.reshape(-1)))

    def _short_conv(self, layer: int, act, pos: int) -> np.ndarray:
        """A gated short convolution layer's output at `pos`: out_proj(C * conv(B * x))."""
        p = f"layers.{layer}."
        bcx = self._linear(p + "conv_in", act)
        taps = self.w[p + "conv_taps"].reshape(self.spec.hidden_size, self.spec.short_conv_kernel)
        gated = short_conv_step(self.conv_ring[layer], pos, bcx, taps)
        return self._linear(p + "conv_out", self._prepare(gated))

    def _reset_sequence(self) -> None:
        """A sequence starts at position 0: the DeltaNet layers' states start from zero (the KV
        cache needs nothing: a position's keys are written before they are read)."""
        for state in (*self.conv_state.values(), *self.delta_state.values(), *self.conv_ring.values()):
            state[:] = 0
        for state in (*self.mamba_conv.values(), *self.mamba_ssm.values()):
            state[:] = 0

    def _mamba2(self, layer: int, act) -> np.ndarray:
        """A Mamba-2 layer's output for one token (its states updated): out_proj of mamba2_step."""
        p = f"layers.{layer}."
        proj = self._linear(p + "ssm_in", act)
        y = mamba2_step(self.spec, self.mamba_conv[layer], self.mamba_ssm[layer], proj, self.w, p)
        return self._linear(p + "ssm_out", self._prepare(y))

    def _residual(self, out: np.ndarray) -> np.ndarray:
        """A block's output as the residual adds it: times residual_scale (Granite; 1 is exact)."""
        return out * F32(self.spec.residual_scale)

    # -- the forward pass ------------------------------------------------------------------
    def forward(self, token: int, pos: int, want_logits: bool = True) -> np.ndarray | None:
        s = self.spec
        eps = s.rms_norm_eps
        if pos == 0:
            self._reset_sequence()
        x = self._embed(token)
        self._cp(-1, "embedding", x)
        ple = self._per_layer_inputs(token, x) if s.ple_dim else None
        for layer in range(s.n_layers):
            p = f"layers.{layer}."
            hd, kvh = s.layer_head_dim(layer), s.layer_kv_heads(layer)
            group = s.n_heads // kvh
            xn = self._norm(x, p + "attn_norm")
            self._cp(layer, "attn_norm", xn)
            act = self._prepare(xn)
            if s.kv_lora_rank or s.is_mamba(layer) or s.is_linear(layer) or s.is_short_conv(layer):
                if s.kv_lora_rank:  # latent attention (numerics/mla.py)
                    mixed = latent_attention(self, layer, act, pos)
                elif s.is_mamba(layer):
                    mixed = self._mamba2(layer, act)
                else:
                    mixed = self._short_conv(layer, act, pos) if s.is_short_conv(layer) else self._deltanet(layer, act)
                self._cp(layer, "mixer", mixed)
                x = x + self._residual(mixed)
                self._cp(layer, "attn_residual", x)
                x = self._ffn_block(layer, x)
                self._cp(layer, "layer_out", x)
                self._check_layer(layer, x)
                continue
            own_kv = not s.is_kv_consumer(layer)  # Gemma 4's KV-sharing layers: queries only
            q = self._linear(p + "wq", act, p + "bq" if s.qkv_bias else None).reshape(s.n_heads, hd)
            self._cp(layer, "q", q.reshape(-1))
            k = v = np.zeros((kvh, hd), dtype=np.float32)
            if own_kv:
                k = self._linear(p + "wk", act, p + "bk" if s.qkv_bias else None).reshape(kvh, hd)
            if own_kv and s.layer_k_eq_v(layer):  # Gemma 4's global layers: the values are the keys' projection
                v = k.copy()
            elif own_kv:
                v = self._linear(p + "wv", act, p + "bv" if s.qkv_bias else None).reshape(kvh, hd)
            if own_kv:
                self._cp(layer, "k", k.reshape(-1))
                self._cp(layer, "v", v.reshape(-1))
            if s.qk_norm and s.qk_norm_whole:  # OLMoE: one norm over all the heads' queries, one over the keys
                q = rmsnorm(q.reshape(-1), self.w[p + "q_norm"], eps).reshape(q.shape)
                k = rmsnorm(k.reshape(-1), self.w[p + "k_norm"], eps).reshape(k.shape) if own_kv else k
            elif s.qk_norm:
                q = rmsnorm(q, self.w[p + "q_norm"], eps)
                if own_kv:
                    k = rmsnorm(k, self.w[p + "k_norm"], eps)
            if s.v_norm:
                v = rmsnorm_unscaled(v, eps)
            cos, sin = self.tables[self.plan.layer_rope[layer]]
            if s.is_nope(layer):  # Llama 4's global layers: no RoPE, the queries' temperature (numerics/ops.py)
                q = attn_temperature(q, pos, s.attn_temperature_floor, s.attn_temperature_scale)
            elif s.rope_dim:  # partial RoPE: the leading rope_dim dims of each head rotate, the rest pass
                r = s.rope_dim
                q = np.concatenate([apply_rope(q[:, :r], cos[pos], sin[pos]), q[:, r:]], axis=1)
                k = np.concatenate([apply_rope(k[:, :r], cos[pos], sin[pos]), k[:, r:]], axis=1)
            else:
                q = apply_rope(q, cos[pos], sin[pos])
                k = apply_rope(k, cos[pos], sin[pos])
            if s.qk_l2_norm_layers and s.qk_l2_norm_layers[layer]:  # Llama 4: after RoPE, without a weight
                q, k = rmsnorm_unscaled(q, eps), rmsnorm_unscaled(k, eps)
            self._cp(layer, "q_rope", q.reshape(-1))
            if own_kv:
                self._cp(layer, "k_rope", k.reshape(-1))
            slots = self.plan.kv_slots[s.kv_source(layer)]
            if own_kv:
                # Rounded once, when written, to the cache's type (docs/numerics.md, "KV cache").
                self.k_cache[layer][pos % slots] = kv_round(k, self.plan.kv_type)
                self.v_cache[layer][pos % slots] = kv_round(v, self.plan.kv_type)

            ring = [t % slots for t in range(s.first_seen(layer, pos), pos + 1)]
            out = np.empty((s.n_heads, hd), dtype=np.float32)
            for h in range(s.n_heads):
                keys = self.k_cache[layer][ring, h // group]
                values = self.v_cache[layer][ring, h // group]
                scores = dot(keys, q[h][None, :], axis=1) * self.scale
                probs = softmax_with_sink(scores, self.w[p + "sinks"][h]) if s.attn_sinks else softmax(scores)
                out[h] = seq_sum(probs[:, None] * values, axis=0)
            if s.attn_output_gate:
                out = out * sigmoid(self._linear(p + "wq_gate", act)).reshape(s.n_heads, hd)
            self._cp(layer, "attention", out.reshape(-1))
            proj = self._linear(p + "wo", self._prepare(out.reshape(-1)), p + "bo" if s.o_bias else None)
            self._cp(layer, "mixer", proj)
            if s.post_norms:
                proj = rmsnorm(proj, self.w[p + "post_attn_norm"], eps)
            x = x + self._residual(proj)
            self._cp(layer, "attn_residual", x)
            x = self._ffn_block(layer, x)
            if s.ple_dim:
                x = self._per_layer_block(layer, x, ple)
            if s.layer_scalars:
                x = x * self.w[p + "layer_scalar"][0]
            self._cp(layer, "layer_out", x)
            self._check_layer(layer, x)
        if not want_logits:
            return None
        xn = self._norm(x, "final_norm")
        self._cp(s.n_layers, "final_norm", xn)
        head = "embed" if s.tie_embeddings else "lm_head"
        logits = f32(self._linear(head, self._prepare(xn), "lm_head_bias" if s.lm_head_bias else None))
        if s.logits_scaling != 1.0:
            logits = logits / F32(s.logits_scaling)
        logits = softcap(logits, s.final_softcap) if s.final_softcap else logits
        self._cp(s.n_layers, "logits", logits)
        return logits

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x through the norm `name`: RMSNorm, or with layer_norm LayerNorm with its bias (name_bias)."""
        if self.spec.layer_norm:
            return layer_norm(x, self.w[name], self.w[name + "_bias"], self.spec.rms_norm_eps)
        return rmsnorm(x, self.w[name], self.spec.rms_norm_eps)

    def _check_layer(self, layer: int, x: np.ndarray) -> None:
        """Note `layer` if its output is the first in this request with a NaN or an infinity."""
        if self.nonfinite_layer is None and not np.isfinite(x).all():
            self.nonfinite_layer = layer

    def _finite(self, logits: np.ndarray, at: str) -> np.ndarray:
        """The logits, if they are all finite; else the error the firmware's flag also raises."""
        if not np.isfinite(logits).all():
            raise NonFiniteLogits("the reference", at, self.nonfinite_layer)
        return logits

    def _ffn_block(self, layer: int, x: np.ndarray) -> np.ndarray:
        """x + FFN(norm(x)): the gated FFN, or on MoE layers the mixture (and its post-norm, if any)."""
        s, p = self.spec, f"layers.{layer}."
        xn = self._norm(x, p + "ffn_norm")
        self._cp(layer, "ffn_norm", xn)
        act = self._prepare(xn)
        if s.moe_beside_dense and s.moe_layers[layer]:
            # Gemma 4: the dense FFN and the experts side by side, each normed before and after;
            # the router reads x through its own norm, the experts x through theirs.
            eps = s.rms_norm_eps
            dense = rmsnorm(self._gated_ffn(p, act), self.w[p + "post_dense_norm"], eps)
            router_act = self._prepare(rmsnorm(x, self.w[p + "router_norm"], eps))
            moe_act = self._prepare(rmsnorm(x, self.w[p + "moe_norm"], eps))
            moe = rmsnorm(self._moe(layer, moe_act, router_act), self.w[p + "post_moe_norm"], eps)
            down = dense + moe
        elif s.moe_layers and s.moe_layers[layer]:
            down = self._moe(layer, act)
        else:
            down = self._gated_ffn(p, act, s.mlp_bias, layer)
        self._cp(layer, "ffn", down)
        if s.post_norms:
            down = rmsnorm(down, self.w[p + "post_ffn_norm"], s.rms_norm_eps)
        return x + self._residual(down)

    def generate(
        self,
        prompt: list[int],
        steps: int,
        params: SamplingParams,
        stop_at_eos: bool = True,
        keep_logits: bool = False,
        start: int = 0,
        score_from: int | None = None,
        decode_from: int | None = None,
    ) -> Generation:
        """What the firmware does for one request: prompt at positions start... (start > 0 continues
        the conversation this object holds), scored from prompt index score_from + 1 if asked; with
        decode_from, the prompt from that index on is decoded as steps (teacher forcing: each step's
        token is the prompt's next one, not a sampled one, while there is one)."""
        with np.errstate(over="ignore", invalid="ignore"):  # a NaN or an infinity is an error of its own (_finite)
            return self._generate(prompt, steps, params, stop_at_eos, keep_logits, start, score_from, decode_from)

    def _generate(
        self,
        prompt: list[int],
        steps: int,
        params: SamplingParams,
        stop_at_eos: bool,
        keep_logits: bool,
        start: int,
        score_from: int | None,
        decode_from: int | None,
    ) -> Generation:
        params = params.as_f32()
        rng = Rng(params.seed)
        out = Generation()
        self.expert_counts[:] = 0
        self.nonfinite_layer = None
        logits = None
        prefilled = len(prompt) if decode_from is None else decode_from
        seen = self.seen = [*self.seen[:start], *prompt[:prefilled]]
        for i, tok in enumerate(prompt[:prefilled]):
            scored = score_from is not None and i >= score_from
            logits = self.forward(tok, start + i, want_logits=(scored or i == prefilled - 1))
            if scored and i + 1 < len(prompt):
                logits = self._finite(logits, f"prompt token {i + 1}")
                lp_max, z = exp_sum(logits)
                out.scores.append(Score(i + 1, prompt[i + 1], logits[prompt[i + 1]] - lp_max, z))
        pos = start + prefilled
        for step in range(steps):
            forced = prefilled + step < len(prompt)
            logits = self._finite(logits, f"step {step}")
            token = prompt[prefilled + step] if forced else sample(logits, params, rng, seen)
            out.tokens.append(token)
            out.digests.append(logits_digest(logits))
            if keep_logits:
                out.logits.append(logits.copy())
            if stop_at_eos and not forced and token in self.spec.eos_token_ids:
                out.stop_reason = "eos"
                break
            if step == steps - 1:
                break
            seen.append(token)
            logits = self.forward(token, pos)
            pos += 1
        out.held = pos
        s = self.spec
        out.expert_counts = {
            i: self.expert_counts[i].tolist() for i in range(s.n_layers) if s.moe_layers and s.moe_layers[i]
        }
        return out
