"""Localising a divergence: when verify finds a step whose logits (or token) differ from the
reference's, the step is replayed on the board with its checkpoints (protocol 7's trace=STEP:
runtime/checkpoint.h, called after each operation of each layer in model.c) and in the reference
through its checkpoint hook (reference.py), and the first operation whose output differs is named:
its layer, what it is, the kernel set and kernel that ran it, whether its inputs were equal, and the
largest difference of the values the board sent, in float32 units in the last place (ULPs).
Equal logits with another token are a sampling divergence; an equal router with other experts a
routing divergence."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .compile.image import map_image
from .compile.plan import Plan
from .device.session import Checkpoint, RunRequest, RunResult
from .documents import JsonDocument, json_field
from .errors import ColibriError
from .reference import Reference

Key = tuple[int, str]  # (layer, operation); layer -1: the embedding, n_layers: the final norm and logits

# What each operation reads, as checkpoints of the same layer before it: for each entry the first of
# its alternatives this pass has (a mixer reads the attention output where there is one, else the
# normed input). "previous" is the layer before's output (the embedding before layer 0).
_INPUTS: dict[str, list[tuple[str, ...]]] = {
    "attn_norm": [("previous",)],
    "q": [("attn_norm",)],
    "k": [("attn_norm",)],
    "v": [("attn_norm",)],
    "q_rope": [("q",)],
    "k_rope": [("k",)],
    "attention": [("q_rope",), ("k_rope",), ("v",)],
    "mixer": [("attention", "attn_norm")],
    "attn_residual": [("mixer",), ("previous",)],
    "ffn_norm": [("attn_residual",)],
    "router": [("ffn_norm",)],
    "experts": [("router",)],
    "expert_weights": [("router",)],
    "ffn_gate": [("ffn_norm",)],
    "ffn_activation": [("ffn_gate",), ("ffn_norm",)],  # and the up projection of ffn_norm
    "ffn": [("ffn_activation", "ffn_norm"), ("experts",), ("expert_weights",)],
    "layer_out": [("ffn",), ("attn_residual",)],
    "final_norm": [("previous",)],
    "logits": [("final_norm",)],
}

_WHAT = {
    "embedding": "the token's embedding row",
    "attn_norm": "the norm before the token mixer",
    "q": "the query projection",
    "k": "the key projection",
    "v": "the value projection",
    "q_rope": "the queries' norm (where the model has one) and RoPE",
    "k_rope": "the keys' norm (where the model has one) and RoPE",
    "attention": "attention over the KV cache (scores, softmax, values)",
    "mixer": "the token mixer's output",
    "attn_residual": "the residual after the token mixer",
    "ffn_norm": "the norm before the feed-forward block",
    "router": "the router's logits",
    "experts": "the experts chosen",
    "expert_weights": "the routing weights",
    "ffn_gate": "the FFN's gate projection",
    "ffn_activation": "the FFN's activation times its up projection",
    "ffn": "the feed-forward block's output",
    "layer_out": "the layer's output (the residual)",
    "final_norm": "the final norm",
    "logits": "the output projection (logits)",
}


def f32_bits(values: np.ndarray) -> list[str]:
    """float32s as the firmware sends them: the 8 hex digits of their bits."""
    return [f"{int(b):08x}" for b in np.asarray(values, dtype="<f4").view("<u4")]


def from_bits(bits: list[str]) -> np.ndarray:
    return np.array([int(b, 16) for b in bits], dtype="<u4").view("<f4")


def sampled(values: np.ndarray, count: int) -> np.ndarray:
    """The values the board sends of a checkpoint of n floats: count of them, at i * n // count."""
    n = len(values)
    return values[[i * n // count for i in range(count)]] if count else values[:0]


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32s lie between a and b (0: the same bits), element by element."""

    def ordered(x: np.ndarray) -> np.ndarray:
        i = np.asarray(x, dtype="<f4").view("<i4").astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(ordered(a) - ordered(b))


def reference_checkpoints(plan: Plan, weights: Path, request: RunRequest, step: int) -> dict[Key, np.ndarray]:
    """The reference's checkpoints of the forward pass whose logits step `step` samples: the request
    replayed up to that step, each pass's checkpoints replacing the last (a pass starts with its
    embedding), so the last pass's remain; an operation run for several tokens keeps the last one's."""
    ref = Reference(plan, map_image(weights))
    seen: dict[Key, np.ndarray] = {}

    def hook(layer: int, op: str, out: np.ndarray) -> None:
        if op == "embedding":
            seen.clear()
        seen[(layer, op)] = np.ascontiguousarray(out, dtype="<f4").reshape(-1).copy()

    ref.checkpoint = hook
    ref.generate(request.prompt, step + 1, request.sampling, request.stop_at_eos, decode_from=request.decode_from)
    return seen


@dataclass(frozen=True)
class CheckpointPair(JsonDocument):
    """One checkpoint of the traced pass on both sides (the trace file's rows)."""

    layer: int
    op: str
    n: int
    equal: bool
    firmware_sha256: str | None  # None: the board sent none for this operation
    reference_sha256: str
    firmware_values: list[str] | None
    reference_values: list[str]


@dataclass(frozen=True)
class Localisation(JsonDocument):
    """Where the replayed step first differs. kind: "operation" (an operation's output differs),
    "routing" (the same router logits, other experts chosen), "sampling" (every checkpoint and the
    logits equal, another token), "not reproduced" (the replay's checkpoints all equal and its token too)."""

    step: int
    kind: str
    layer: int | None  # None: the embedding or the head (final norm, logits); see `where`
    where: str
    op: str | None
    what: str | None
    kernel_set: str | None
    kernel: str | None
    inputs: list[str]
    inputs_equal: bool | None  # None: the operation reads no earlier checkpoint (the embedding)
    largest_difference: float | None
    largest_ulps: int | None
    values_compared: int
    checkpoints_compared: int
    firmware_token: int | None
    reference_token: int | None
    checkpoints: list[CheckpointPair] = json_field(skip=True)

    def line(self) -> str:
        """verify's line under its FAIL."""
        s = self.step
        if self.kind == "sampling":
            return (
                f"localised: step {s} is a sampling divergence: all {self.checkpoints_compared} checkpoints and the "
                f"logits are equal, but the firmware sampled token {self.firmware_token} and the reference "
                f"{self.reference_token} (runtime/sampler.c against numerics/sampling.py)"
            )
        if self.kind == "not reproduced":
            return (
                f"localised: nothing: step {s} replayed with its {self.checkpoints_compared} checkpoints gave the "
                "same results on both sides (a divergence that does not repeat: threads, memory, the link)"
            )
        inputs = ", ".join(self.inputs) if self.inputs else "none"
        equal = (
            "its inputs were equal"
            if self.inputs_equal
            else "its inputs already differed"
            if self.inputs_equal is False
            else "it reads no earlier checkpoint"
        )
        if self.kind == "routing":
            head = f"localised: step {s}, {self.where}: a routing divergence: the router's logits are equal, "
            head += "the experts chosen differ"
        else:
            head = f"localised: step {s}, {self.where}, operation {self.op} ({self.what})"
        diff = ""
        if self.largest_difference is not None:
            unit = "ULP" if self.largest_ulps == 1 else "ULPs"
            diff = (
                f"; largest difference {self.largest_difference:.3g} ({self.largest_ulps:,} {unit}) over the "
                f"{self.values_compared} values sent"
            )
        kernel = f", run by {self.kernel} (kernel set {self.kernel_set or '?'})"
        return f"{head}{kernel}: {equal} ({inputs}){diff}"


def where_of(layer: int, n_layers: int) -> str:
    if layer < 0:
        return "the embedding"
    if layer >= n_layers:
        return "the output head"
    return f"layer {layer}"


def kernel_of(plan: Plan, layer: int, op: str, batched: bool) -> str:
    """The kernel (or runtime function) that computes `op` of `layer` on this plan."""
    dtypes = {t.name: t.dtype for t in plan.tensors}
    product = "matmul" if batched else "matvec"
    s, p = plan.spec, f"layers.{layer}."

    def matrix(name: str) -> str:
        dtype = dtypes.get(name)
        if dtype is None:
            return f"{product} (runtime/matmul.c)"
        quantized = "quantize_q8_0, " if plan.activations_q8 and dtype != "f32" else ""
        return f"{quantized}{product}_{dtype}"

    if op in ("attn_norm", "ffn_norm", "final_norm"):
        return "op_layer_norm (runtime/ops.c)" if s.layer_norm else "op_rmsnorm (runtime/ops.c)"
    if op == "embedding":
        return f"embedding_row of {dtypes.get('embed', '?')} (runtime/matmul.c)"
    if op in ("q", "k", "v"):
        return matrix(p + "w" + op)
    if op in ("q_rope", "k_rope"):
        return "op_rmsnorm, op_rope (runtime/ops.c)" if s.qk_norm else "op_rope (runtime/ops.c)"
    if op == "attention":
        f16 = "_f16" if plan.kv_type == "f16" else ""
        return f"attention_scores{f16}, softmax_rows, attention_mix{f16} (runtime/attention.c)"
    if op == "mixer":
        if s.kv_lora_rank:
            return "mla_attention (runtime/mla.c)"
        if s.is_linear(layer):
            return "delta_rule_step (runtime/deltanet.c), " + matrix(p + "lin_out")
        if s.is_short_conv(layer):
            return "short_conv_layer (runtime/short_conv.c)"
        return matrix(p + "wo")
    if op == "router":
        return matrix(p + "router")
    if op in ("experts", "expert_weights"):
        return "router_route (runtime/router.c)"
    if op == "ffn_gate":
        return matrix(p + "w_gate")
    if op == "ffn_activation":
        return f"{matrix(p + 'w_up')}, {'gelu_tanh_mul' if s.activation == 'gelu_tanh' else 'swiglu'}"
    if op == "ffn":
        if s.moe_layers and s.moe_layers[layer]:
            return "the experts' gated FFNs (model.c moe_ffn)"
        return matrix(p + "w_down")
    if op == "logits":
        return matrix("embed" if s.tie_embeddings else "lm_head")
    return "the residual add (model.c residual_add)"


def _inputs(key: Key, present: set[Key]) -> list[Key]:
    """The checkpoints `key`'s operation reads (_INPUTS), those of this pass."""
    layer, op = key
    previous = (layer - 1, "layer_out") if layer > 0 else (-1, "embedding")
    out = []
    for choices in _INPUTS.get(op, []):
        for name in choices:
            candidate = previous if name == "previous" else (layer, name)
            if candidate in present:
                out.append(candidate)
                break
    return out


def localise(
    plan: Plan,
    step: int,
    firmware: RunResult,
    reference: dict[Key, np.ndarray],
    reference_token: int | None,
    batched: bool,
) -> Localisation:
    """The first checkpoint of the replayed step whose output differs, in the forward pass's order."""
    n_layers = plan.spec.n_layers
    board: dict[Key, Checkpoint] = {}
    for c in firmware.checkpoints:  # an operation run for each token of a batch: the last token's
        board[(c.layer, c.op)] = c
    pairs, order = [], list(reference)
    equal: dict[Key, bool] = {}
    for key in order:
        values = reference[key]
        sha = hashlib.sha256(values.tobytes()).hexdigest()
        got = board.get(key)
        count = len(got.values) if got else min(len(values), 16)
        equal[key] = got is not None and got.sha256 == sha
        pairs.append(
            CheckpointPair(
                key[0],
                key[1],
                len(values),
                equal[key],
                got.sha256 if got else None,
                sha,
                got.values if got else None,
                f32_bits(sampled(values, count)),
            )
        )
    fw_token = firmware.tokens[step] if step < len(firmware.tokens) else None
    first = next((i for i, key in enumerate(order) if not equal[key]), None)
    kernel_set = firmware.hello.get("kernels")
    common = dict(
        step=step,
        checkpoints_compared=len(order),
        firmware_token=fw_token,
        reference_token=reference_token,
        checkpoints=pairs,
        kernel_set=kernel_set,
    )
    if first is None:
        kind = "sampling" if fw_token != reference_token else "not reproduced"
        return Localisation(
            kind=kind,
            layer=None,
            where="",
            op=None,
            what=None,
            kernel=None,
            inputs=[],
            inputs_equal=None,
            largest_difference=None,
            largest_ulps=None,
            values_compared=0,
            **common,
        )
    key, pair = order[first], pairs[first]
    layer, op = key
    inputs = _inputs(key, set(order))
    inputs_equal = all(equal[k] for k in inputs) if inputs else None
    largest, largest_ulps, compared = None, None, 0
    if pair.firmware_values is not None and len(pair.firmware_values) == len(pair.reference_values):
        a, b = from_bits(pair.firmware_values), from_bits(pair.reference_values)
        compared = len(a)
        with np.errstate(invalid="ignore", over="ignore"):
            largest = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if compared else None
        largest_ulps = int(np.max(ulps(a, b))) if compared else None
    routing = op == "experts" and inputs_equal
    return Localisation(
        kind="routing" if routing else "operation",
        layer=layer if 0 <= layer < n_layers else None,
        where=where_of(layer, n_layers),
        op=op,
        what=_WHAT.get(op, op),
        kernel=kernel_of(plan, layer, op, batched),
        inputs=[f"{where_of(k[0], n_layers)} {k[1]}" for k in inputs],
        inputs_equal=inputs_equal,
        largest_difference=largest,
        largest_ulps=largest_ulps,
        values_compared=compared,
        **common,
    )


def localise_step(
    plan: Plan,
    weights: Path,
    request: RunRequest,
    step: int,
    reference_token: int | None,
    replay: Callable[[RunRequest], RunResult],
) -> Localisation:
    """Replay `request` up to step `step` on the board with that step's checkpoints (trace=step;
    steps after it are not needed), the same in the reference, and localise the first difference."""
    traced = replace(request, steps=step + 1, trace=step, speculate=0)
    firmware = replay(traced)
    reference = reference_checkpoints(plan, weights, traced, step)
    prefilled = len(request.prompt) if request.decode_from is None else request.decode_from
    last_batch = (prefilled - 1) % max(1, plan.prefill_batch) + 1
    return localise(plan, step, firmware, reference, reference_token, batched=step == 0 and last_batch > 1)


def write_trace(path: Path, board: str, localisation: Localisation) -> None:
    """verify --trace: every checkpoint of the replayed step, both sides, one per line, for a diff."""
    from .files import write_atomic

    lines = [json.dumps({"board": board, "localisation": localisation.to_json()})]
    lines += [json.dumps(pair.to_json()) for pair in localisation.checkpoints]
    try:
        write_atomic(path, "\n".join(lines) + "\n")
    except OSError as e:
        raise ColibriError(f"cannot write the trace to {path}: {e.strerror or e}") from None
