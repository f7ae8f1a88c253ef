"""Plan stage: where every byte lives. The Plan gathers the tensor layout in the weight image
(layout.py), the scratch arena, the KV cache arena, the DeltaNet state and the RoPE tables
(arenas.py), all 64-byte aligned, all computed once; and here, what a plan puts in each of a
board's memory regions against their budgets, and the largest context that fits.

The emitter turns a Plan into named C constants; the image writer follows the same offsets;
`report` and the tests read plan.json. Nothing downstream recomputes a size.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from typing import Callable

from ..boards import CATEGORIES, Board
from ..errors import ColibriError
from ..model.spec import ModelSpec
from ..numerics.kv_cache import DEFAULT_KV_TYPE, check_kv_type, kv_arena_bytes
from ..numerics.quantize import (
    GGUF,
    Q8_INPUT_TYPES,
    QK,
    QUANTS,
    gguf_block_type,
)
from .arenas import (
    ATTENTION_BLOCK,
    Buffer,
    kv_layout,
    layer_cache_dim,
    linear_state_layout,
    mamba2_state_floats,
    mamba2_state_summary,
    max_matmul_input,
    rope_tables,
    scratch_arena,
    short_conv_ring_rows,
)
from .layout import ImageLayout, TensorEntry, expanded_layout, image_layout, kv_group_split, tensor_layout

PLAN_FORMAT = 1


PLAN_FORMAT = 1


@dataclass(frozen=True)
class RegionUse:
    name: str
    kind: str
    budget: int  # 0: no fixed budget
    items: dict[str, int]

    @property
    def used(self) -> int:
        return sum(self.items.values())

    @property
    def over_budget(self) -> bool:
        return self.budget > 0 and self.used > self.budget


@dataclass(frozen=True)
class Plan:
    spec: ModelSpec
    board: str
    quant: str
    n_ctx: int
    tensors: tuple[TensorEntry, ...]
    image: ImageLayout
    scratch: tuple[Buffer, ...]
    scratch_bytes: int
    kv_slots: tuple[int, ...]  # per layer: positions its KV cache holds (a ring of `window` for sliding layers)
    kv_offsets: tuple[int, ...]  # per layer: first float of its keys (or values) in the K (or V) arena
    kv_bytes: int  # K and V for all layers (values and, for q8_0, their binary16 block scales)
    ropes: tuple  # distinct RopeSpecs; layer_rope[i] indexes this
    rope_dims: tuple[int, ...]  # the dims each table rotates (its rows hold the widest's half, padded)
    layer_rope: tuple[int, ...]
    rope_table_bytes: int  # cos + sin of every table
    max_input: int  # longest matrix row: the activation quantization buffer's length
    prefill_batch: int = 1  # prompt tokens one forward pass takes at once (the board's choice)
    # Exact speculative decoding: the most tokens one verification pass feeds (the sampled one and
    # drafted ones), each with its logits in spec_logits; 0 where it cannot keep the bits (speculation_tokens)
    speculate_tokens: int = 0
    expand_q4: bool = False  # q4_0 matrices are expanded to int8 + scales in RAM when the image loads
    expanded_bytes: int = 0  # the RAM arena those expanded matrices take
    kept_f32: tuple[str, ...] = ()  # matrices kept in f32 under q8_0/q4_0/q4_1: rows not whole blocks of QK
    gguf_types: tuple[tuple[str, str], ...] = ()  # --quant gguf: each tensor's block type in the GGUF file
    # Tensors the checkpoint holds already quantized (gpt-oss's MXFP4 experts), by GGUF block type:
    # kept exactly under q8_0, q4_0 and q4_1 (f32 decodes them; gguf takes gguf_types)
    held_types: tuple[tuple[str, str], ...] = ()
    # Gated DeltaNet layers' recurrent state, a fixed arena whatever the context: per such layer its
    # convolution's last kernel - 1 inputs, then each value head's key_dim x value_dim state (floats).
    linear_state_offsets: tuple[int, ...] = ()  # per layer: its first float in the arena; -1: not a DeltaNet layer
    linear_state_bytes: int = 0
    kv_type: str = DEFAULT_KV_TYPE  # how the KV cache holds keys and values: f32, f16 or q8_0
    attention_block: int = 1  # query tokens attention takes at once (each key tile read once for all)
    ranks: int = 1  # MPI ranks the weights are split over: one weight image per rank (compile/layout.py rank_image)
    # Per layer: its attention split by KV group over the ranks (layout.kv_group_split; all False
    # on one rank): a rank's cache keeps its KV groups only (kv_offsets, kv_bytes are a rank's)
    kv_split: tuple[bool, ...] = ()

    def layer_cache_dim(self, layer: int) -> int:
        """Keys (or values) a layer's cache keeps per position, on each rank."""
        return layer_cache_dim(self.spec, layer, self.kv_split, self.ranks)

    @property
    def kv_values(self) -> int:
        """Keys (or values) of all layers, in values: the K (or V) arena's length (a rank's)."""
        return sum(slots * self.layer_cache_dim(i) for i, slots in enumerate(self.kv_slots))

    @property
    def kv_scales(self) -> int:
        """q8_0: the binary16 block scales of the K (or V) arena, one per 32 values; else 0."""
        return self.kv_values // QK if self.kv_type == "q8_0" else 0

    @property
    def value_arena_values(self) -> int:
        """The V arena's length in values: the K arena's, or 0 with latent attention (its one row
        per position, the latent and the RoPE key, lives in the K arena: no values are cached)."""
        return 0 if self.spec.kv_lora_rank else self.kv_values

    @property
    def kv_bytes_per_position(self) -> int:
        """What one more position costs the cache over every layer that keeps it (keys and values,
        or latent attention's row, with their q8_0 scales)."""
        arenas = 1 if self.spec.kv_lora_rank else 2
        widths = sum(self.layer_cache_dim(i) for i, slots in enumerate(self.kv_slots) if slots)
        return arenas * kv_arena_bytes(widths, self.kv_type)

    @property
    def linear_conv_state_floats(self) -> int:
        """One DeltaNet layer's convolution state."""
        s = self.spec
        return max(0, s.linear_conv_kernel - 1) * s.linear_conv_dim if any(s.linear_layers) else 0

    @property
    def linear_delta_state_floats(self) -> int:
        """One DeltaNet layer's delta-rule state: a key_dim x value_dim matrix per value head."""
        s = self.spec
        return s.linear_v_heads * s.linear_k_dim * s.linear_v_dim if any(s.linear_layers) else 0

    @property
    def short_conv_ring_rows(self) -> int:
        """The inputs each short convolution layer keeps (numerics/short_conv.py); 0: no such layers."""
        return short_conv_ring_rows(self.spec, self.speculate_tokens)

    def linear_state_report(self) -> dict | None:
        """The recurrent state as report shows it (None without stateful layers): bytes per layer
        (a DeltaNet's convolution and delta rule; a short convolution's ring of inputs), the arena's
        total, and that no context changes it."""
        if not self.linear_state_bytes:
            return None
        conv, delta = 4 * self.linear_conv_state_floats, 4 * self.linear_delta_state_floats
        layers = sum(self.spec.linear_layers)
        conv_layers = sum(self.spec.short_conv_layers)
        ring = 4 * self.short_conv_ring_rows * self.spec.hidden_size
        mamba_layers = sum(self.spec.mamba_layers)
        attention = self.spec.n_layers - layers - conv_layers - mamba_layers
        parts = []
        if layers:
            parts.append(
                f"Gated DeltaNet state: {layers} layers x {conv + delta:,} B (convolution {conv:,} B + delta rule "
                f"{delta:,} B)"
            )
        if conv_layers:
            parts.append(
                f"short convolution state: {conv_layers} layers x {ring:,} B (the last {self.short_conv_ring_rows} "
                f"inputs of {self.spec.hidden_size} channels)"
            )
        if mamba_layers:
            parts.append(mamba2_state_summary(self.spec, mamba_layers))
        summary = (
            f"{'; '.join(parts)} = {self.linear_state_bytes:,} B, fixed: it does not grow with the context "
            f"(counted under kv_cache, beside the KV cache of the {attention} attention layer{'s' * (attention != 1)})"
        )
        return {
            "layers": layers,
            "conv_bytes_per_layer": conv,
            "delta_bytes_per_layer": delta,
            **({"short_conv_layers": conv_layers, "short_conv_bytes_per_layer": ring} if conv_layers else {}),
            **(
                {"mamba_layers": mamba_layers, "mamba_bytes_per_layer": 4 * mamba2_state_floats(self.spec)}
                if mamba_layers
                else {}
            ),
            "bytes": self.linear_state_bytes,
            "grows_with_context": False,
            "summary": summary,
        }

    def per_layer_inputs_report(self) -> dict | None:
        """Gemma 4's per-layer input table as report shows it (None without one): its bytes, counted
        with the weights (the image: flash on an MCU, the mapping on Linux), and the one row a token
        reads of it."""
        t = self.paged_table
        if t is None:
            return None
        row = t.nbytes // t.rows
        summary = (
            f"per-layer inputs: ple_embed {t.dtype} [{t.rows} x {t.cols}] = {t.nbytes:,} B in the weight image, "
            f"one row of {row:,} B read per token (not in RAM: never held under a memory budget)"
        )
        return {"tensor": t.name, "dtype": t.dtype, "bytes": t.nbytes, "row_bytes": row, "summary": summary}

    @property
    def context_state_bytes(self) -> int:
        """What the model keeps of the sequence so far: the KV cache and the DeltaNet states."""
        return self.kv_bytes + self.linear_state_bytes

    @property
    def activations_q8(self) -> bool:
        """Some matrix has integer quants: matmul inputs are quantized to q8_0 for it."""
        return any(t.dtype in Q8_INPUT_TYPES for t in self.tensors)

    def gguf_kept(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        """--quant gguf: the tensors kept exactly as the file holds them, and those quantized again
        (name, the file's type, the type they became)."""
        exact, again = [], []
        for name, ggml_type in self.gguf_types:
            dtype, is_exact = gguf_block_type(ggml_type)
            t = self.tensor(name)
            if is_exact and (t.dtype == dtype or ggml_type in ("F32", "F16", "BF16")):
                exact.append(name)
            else:
                again.append((name, ggml_type, t.dtype))
        return exact, again

    def gguf_summary(self) -> str | None:
        """One line on what --quant gguf kept exactly (None for other quantizations)."""
        if not self.gguf_types:
            return None
        return self._gguf_summary(*self.gguf_kept())

    def _gguf_summary(self, exact: list[str], again: list[tuple[str, str, str]]) -> str:
        kept = set(exact)
        types: dict[str, int] = {}
        for name, ggml_type in self.gguf_types:
            if name in kept:
                key = f"{ggml_type} as {self.tensor(name).dtype}"
                types[key] = types.get(key, 0) + 1
        line = f"{len(exact)} of {len(self.gguf_types)} tensors kept exactly as the GGUF file holds them ("
        line += ", ".join(f"{n} {k}" for k, n in sorted(types.items())) + ")"
        if again:
            moved: dict[str, int] = {}
            for _, ggml_type, dtype in again:
                moved[f"{ggml_type} to {dtype}"] = moved.get(f"{ggml_type} to {dtype}", 0) + 1
            line += "; quantized again: " + ", ".join(f"{n} {k}" for k, n in sorted(moved.items()))
        return line

    def held_summary(self) -> str | None:
        """One line on the tensors kept as the checkpoint holds them (None when none are)."""
        kept = [(n, g) for n, g in self.held_types if self.tensor(n).dtype != "f32"]
        if not kept:
            return None
        types: dict[str, int] = {}
        for name, ggml_type in kept:
            key = f"{ggml_type} as {self.tensor(name).dtype}"
            types[key] = types.get(key, 0) + 1
        nbytes = sum(self.tensor(n).nbytes for n, _ in kept)
        return (
            f"{len(kept)} tensors kept exactly as the checkpoint holds them ("
            + ", ".join(f"{n} {k}" for k, n in sorted(types.items()))
            + f", {nbytes:,} B): {', '.join(_name_patterns(n for n, _ in kept))}; --quant {self.quant} "
            f"applies to the others"
        )

    @property
    def kept_f32_bytes(self) -> int:
        return sum(self.tensor(n).nbytes for n in self.kept_f32)

    def kept_f32_summary(self) -> str | None:
        """One line on the matrices kept in f32 (None when there are none)."""
        if not self.kept_f32:
            return None
        widths = sorted({self.tensor(n).cols for n in self.kept_f32})
        names = _name_patterns(self.kept_f32)
        return (
            f"{len(self.kept_f32)} matrices kept in f32 ({self.kept_f32_bytes:,} B; rows of {', '.join(map(str, widths))} "
            f"are not whole blocks of {QK}): {', '.join(names)}"
        )

    @property
    def q4_0_weights(self) -> str | None:
        """How the firmware reads q4_0 matrices (None for other quantizations)."""
        if self.quant != "q4_0":
            return None
        return (
            "expanded to int8 + scales in RAM at load, read by the q8_0 kernels"
            if self.expand_q4
            else "read in place by the q4_0 kernels"
        )

    @property
    def q4_1_weights(self) -> str | None:
        """How the firmware reads q4_1 matrices (None for other quantizations): in place on every
        board (an int8 copy would not spare the minimums' part of the product)."""
        return "read in place by the q4_1 kernels" if self.quant == "q4_1" else None

    @property
    def paged_table(self) -> TensorEntry | None:
        """Gemma 4's per-layer input table (ple_embed): read one row per token, so it stays where the
        image is (flash on an MCU, the mapping on Linux, never held under a memory budget)."""
        return self._tensor_by_name.get("ple_embed")

    @cached_property
    def _tensor_by_name(self) -> dict[str, TensorEntry]:
        # A 30 B MoE has 18,867 tensors: a scan per name made summarizing the plan quadratic.
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> TensorEntry:
        return self._tensor_by_name[name]

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "board": self.board,
            "quant": self.quant,
            "n_ctx": self.n_ctx,
            "prefill_batch": self.prefill_batch,
            "speculate_tokens": self.speculate_tokens,
            "q4_0_weights": self.q4_0_weights,
            "q4_1_weights": self.q4_1_weights,
            "kept_f32": list(self.kept_f32),
            **({"gguf": {"file_types": dict(self.gguf_types), **self.gguf_report()}} if self.gguf_types else {}),
            **({"held": {"types": dict(self.held_types), "summary": self.held_summary()}} if self.held_types else {}),
            "spec": asdict(self.spec),
            "image": asdict(self.image),
            "tensors": [asdict(t) for t in self.tensors],
            "scratch": {"bytes": self.scratch_bytes, "buffers": [asdict(b) for b in self.scratch]},
            **({"ranks": {"count": self.ranks}} if self.ranks > 1 else {}),
            "kv_cache": {
                "type": self.kv_type,
                "bytes": self.kv_bytes,
                "slots_per_layer": list(self.kv_slots),
                "kv_heads": self.spec.n_kv_heads,
                "head_dim": self.spec.head_dim,
                "bytes_per_position": self.kv_bytes_per_position,
                **({"split_by_kv_group": [i for i, s in enumerate(self.kv_split) if s]} if self.ranks > 1 else {}),
            },
            **(
                {
                    "linear_state": {
                        "bytes": self.linear_state_bytes,
                        "layer_offsets": list(self.linear_state_offsets),
                        "conv_floats_per_layer": self.linear_conv_state_floats,
                        "delta_floats_per_layer": self.linear_delta_state_floats,
                        **({"short_conv_ring_rows": self.short_conv_ring_rows} if self.short_conv_ring_rows else {}),
                    }
                }
                if self.linear_state_bytes
                else {}
            ),
            "rope_tables": {
                "bytes": self.rope_table_bytes,
                "tables": [asdict(r) for r in self.ropes],
                "layer_table": list(self.layer_rope),
            },
            "totals": self.totals(),
        }

    def gguf_report(self) -> dict:
        """--quant gguf: the tensors kept exactly, those quantized again, and the one-line summary."""
        exact, again = self.gguf_kept()
        return {
            "exact": exact,
            "quantized_again": [{"tensor": n, "file_type": g, "block_type": d} for n, g, d in again],
            "summary": self._gguf_summary(exact, again),
        }

    def totals(self) -> dict:
        return {
            "weights": self.image.image_bytes,
            "kv_cache": self.kv_bytes,
            "scratch": self.scratch_bytes,
            "rope_tables": self.rope_table_bytes,
            "expanded_weights": self.expanded_bytes,
            **({"linear_state": self.linear_state_bytes} if self.linear_state_bytes else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _name_patterns(names) -> list[str]:
    """Tensor names with their layer and expert numbers folded: layers.*.experts.*.w_down."""
    out = []
    for name in names:
        pattern = re.sub(r"(?<=layers\.)\d+|(?<=experts\.)\d+", "*", name)
        if pattern not in out:
            out.append(pattern)
    return out


def speculation_off(spec: ModelSpec, offered: int, prefill_batch: int, n_ctx: int) -> str:
    """Why no speculative verification pass is offered ("" when one is): where a rejected draft
    would change what plain decoding computes (experts: the routing counts would include drafts;
    Gated DeltaNet and Mamba-2 layers: their state, a product of every position's, cannot step
    back; sliding windows shorter than the context: a draft's keys would evict ones still needed),
    or where the board checks no drafts. Short convolution layers step back: their ring keeps a
    pass's worth of inputs more."""
    step_back = "state cannot step back over a rejected draft"
    if any(spec.linear_layers):
        return f"its Gated DeltaNet layers' {step_back}"
    if any(spec.mamba_layers):
        return f"its Mamba-2 layers' {step_back}"
    if spec.n_experts:
        return "its experts' routing counts would include the rejected drafts"
    if any(0 < window < n_ctx for window in spec.layer_windows):
        return "its sliding windows are shorter than the context: a draft's keys would evict ones still needed"
    if offered < 2 or prefill_batch < 2:
        return "the board checks no drafts"
    return ""


def speculation_tokens(spec: ModelSpec, requested: int, prefill_batch: int, n_ctx: int) -> int:
    """The tokens a speculative verification pass may feed (the board's speculate_tokens, at most its
    prefill batch), or 0 where speculation_off says why not."""
    if speculation_off(spec, requested, prefill_batch, n_ctx):
        return 0
    return min(requested, prefill_batch)


def speculation_notice(plan: Plan, board: Board, asked: int) -> str | None:
    """What to tell a user who asked for `asked` drafted tokens a pass of a plan without room for
    them (None: not asked, or the plan has room): speculation is off for the model or on the board,
    and why."""
    if not asked or plan.speculate_tokens:
        return None
    why = speculation_off(plan.spec, board.speculate_tokens, plan.prefill_batch, plan.n_ctx)
    where = f"on {board.name}" if why.startswith("the board") else "for this model"
    return f"speculation is off {where}: {why}, so it decodes plainly"


@lru_cache(maxsize=4)
def _same_layout(spec: ModelSpec, quant: str, gguf_types: tuple, held_types: tuple):
    """tensor_layout, laid out once for the plans of one model at several contexts and KV types
    (report's tables, the largest context that fits): a model of 256 experts x 61 layers has some
    45,000 tensors, and its layout was most of a report's time. Its results are immutable."""
    return tensor_layout(spec, quant, dict(gguf_types), dict(held_types))


def make_plan(
    spec: ModelSpec,
    board: str,
    quant: str,
    n_ctx: int,
    prefill_batch: int = 1,
    expand_q4: bool = False,
    gguf_types: dict[str, str] | None = None,
    held_types: dict[str, str] | None = None,
    speculate_tokens: int = 0,
    kv_type: str = DEFAULT_KV_TYPE,
    ranks: int = 1,
) -> Plan:
    """The plan for `spec` on `board` (over `ranks` MPI ranks: every size a rank's). Buffers of per-token activations have room for
    `prefill_batch` tokens: the prompt goes through the model that many tokens at a time, each
    weight row read once for all of them; decoding uses the first slot. With expand_q4, q4_0
    matrices stay q4_0 in the image (flash) and get int8 copies in a RAM arena at load."""
    if quant not in QUANTS:
        raise ColibriError(f"unknown quantization {quant!r} (supported: {', '.join(QUANTS)})")
    if n_ctx < 2:
        raise ColibriError(f"context length must be at least 2, got {n_ctx}")
    if prefill_batch < 1:
        raise ColibriError(f"prefill batch must be at least 1, got {prefill_batch}")
    if n_ctx > spec.max_position_embeddings:
        raise ColibriError(
            f"context length {n_ctx} exceeds the model's max_position_embeddings ({spec.max_position_embeddings})"
        )
    check_kv_type(spec, kv_type)
    if quant == GGUF and not gguf_types:
        raise ColibriError("--quant gguf keeps a GGUF file's own blocks: the model must be a .gguf file")
    gguf_types = dict(gguf_types or {}) if quant == GGUF else {}
    held_types = dict(held_types or {})
    tensors, data_bytes, kept_f32 = _same_layout(spec, quant, tuple(gguf_types.items()), tuple(held_types.items()))
    expand_q4 = expand_q4 and quant == "q4_0"
    expanded_bytes = 0
    if expand_q4:
        tensors, expanded_bytes = expanded_layout(tensors)
    spec_tokens = speculation_tokens(spec, speculate_tokens, prefill_batch, n_ctx)
    attention_block = min(prefill_batch, ATTENTION_BLOCK)
    q8_inputs = any(t.dtype in Q8_INPUT_TYPES for t in tensors)
    scratch, scratch_bytes = scratch_arena(spec, n_ctx, prefill_batch, spec_tokens, attention_block, q8_inputs, kv_type)
    kv_split = kv_group_split(spec, ranks)
    kv_slots, kv_offsets, kv_values = kv_layout(spec, n_ctx, kv_split, ranks)
    linear_offsets, linear_floats = linear_state_layout(spec, spec_tokens)
    ropes, rope_dims, layer_rope = rope_tables(spec)
    return Plan(
        spec=spec,
        board=board,
        quant=quant,
        n_ctx=n_ctx,
        tensors=tensors,
        image=image_layout(len(tensors), data_bytes),
        scratch=scratch,
        scratch_bytes=scratch_bytes,
        kv_slots=kv_slots,
        kv_offsets=kv_offsets,
        kv_bytes=(1 if spec.kv_lora_rank else 2) * kv_arena_bytes(kv_values, kv_type),
        ropes=ropes,
        rope_dims=rope_dims,
        layer_rope=layer_rope,
        rope_table_bytes=len(ropes) * 2 * n_ctx * (max(rope_dims) // 2) * 4,
        max_input=max_matmul_input(spec),
        prefill_batch=prefill_batch,
        speculate_tokens=spec_tokens,
        expand_q4=expand_q4,
        expanded_bytes=expanded_bytes,
        kept_f32=kept_f32,
        gguf_types=tuple(gguf_types.items()),
        held_types=tuple(held_types.items()),
        linear_state_offsets=linear_offsets,
        linear_state_bytes=linear_floats * 4,
        kv_type=kv_type,
        attention_block=attention_block,
        ranks=ranks,
        kv_split=kv_split,
    )


def replan(plan: Plan, n_ctx: int, kv_type: str | None = None, expand_q4: bool | None = None) -> Plan:
    """The same plan at another context length (with another KV cache type, q4_0 expanded or not:
    None keeps the plan's)."""
    return make_plan(
        plan.spec,
        plan.board,
        plan.quant,
        n_ctx,
        plan.prefill_batch,
        plan.expand_q4 if expand_q4 is None else expand_q4,
        dict(plan.gguf_types),
        dict(plan.held_types),
        plan.speculate_tokens,
        kv_type or plan.kv_type,
        plan.ranks,
    )


def with_kv_type(plan: Plan, kv_type: str) -> Plan:
    """The same plan with another KV cache type (report's table of every type)."""
    return replan(plan, plan.n_ctx, kv_type)


# ---- a plan for a board: what fits where -----------------------------------------------------


def planned_use(board: Board, plan: Plan) -> list[RegionUse]:
    """Per region, what the plan puts there, with the board's code_reserve standing in for the code
    (which is only known after linking): the check made before anything is compiled."""
    reserve = board.code_reserve
    sizes = {
        "code": reserve,
        "weights": plan.image.image_bytes,
        "expanded_weights": plan.expanded_bytes,
        "kv_cache": plan.context_state_bytes,
        "scratch": plan.scratch_bytes,
        "rope_tables": plan.rope_table_bytes,
    }
    return [RegionUse(r.name, r.kind, r.size, {c: sizes[c] for c in CATEGORIES if c in r.holds}) for r in board.memory]


def plan_for_board(
    spec: ModelSpec,
    board: Board,
    quant: str,
    n_ctx: int,
    gguf_types: dict[str, str] | None = None,
    held_types: dict[str, str] | None = None,
    kv_type: str | None = None,
    ranks: int = 1,
) -> Plan:
    """The plan for a board (over `ranks` MPI ranks). q4_0 weights are expanded to int8 in RAM at load (the q8_0 kernels
    then read them, with no nibbles to unpack per token) when the board has a region for expanded
    weights and everything still fits; otherwise the q4_0 kernels read them in place.
    gguf_types: for --quant gguf, each tensor's block type in the file; held_types: the tensors the
    checkpoint holds already quantized (Checkpoint.held_types). kv_type None: the board's."""
    plan = make_plan(
        spec,
        board.name,
        quant,
        n_ctx,
        board.prefill_batch,
        gguf_types=gguf_types,
        held_types=held_types,
        speculate_tokens=board.speculate_tokens,
        kv_type=kv_type or board.kv_type,
        ranks=ranks,
    )
    if quant == "q4_0" and board.region_holding("expanded_weights") is not None:
        expanded = replan(plan, n_ctx, expand_q4=True)
        if not any(use.over_budget for use in planned_use(board, expanded)):
            return expanded
    return plan


def fit_problem(
    model: str, quant: str, n_ctx: int, board_name: str, uses: list[RegionUse], code_note: str = ""
) -> str | None:
    """The one line saying which region a plan overflows, with what it holds: None if it fits.
    `check_fits` (before compiling) and `report` (which shows the whole table first) both say it."""
    for use in uses:
        if use.over_budget:
            parts = ", ".join(f"{name} {size:,}" for name, size in use.items.items() if size)
            return (
                f"{model} ({quant}, context {n_ctx}) does not fit board {board_name}: "
                f"region {use.name} needs {use.used:,} B ({parts}{code_note}) but has {use.budget:,} B"
            )
    return None


def check_fits(board: Board, plan: Plan) -> None:
    """Refuse, before compiling, a model or context that cannot fit the board's budgets."""
    problem = fit_problem(
        plan.spec.name, plan.quant, plan.n_ctx, board.name, planned_use(board, plan), "; code is the board's reserve"
    )
    if problem:
        raise ColibriError(problem)


def largest_fitting_ctx(board: Board, plan: Plan, uses: Callable[[Plan], list[RegionUse]] | None = None) -> int | None:
    """The one rule for the largest context that fits: the largest context whose plan leaves no
    budgeted region over its budget, capped by the model's max_position_embeddings; None when no
    region has a budget (only the model limits it); 0 when not even a context of 2 fits.
    `uses` says what a plan puts in each region: by default planned_use (before compiling, the
    code is the board's reserve); report passes the linked firmware's sizes."""
    if not any(r.size > 0 for r in board.memory):
        return None
    use_of = uses or (lambda trial: planned_use(board, trial))

    def fits(n_ctx: int) -> bool:
        return not any(u.over_budget for u in use_of(replan(plan, n_ctx)))

    # Bisection: what a context needs (KV cache, scratch, RoPE tables) only grows with it.
    lo, hi = 0, plan.spec.max_position_embeddings
    if fits(2):
        lo = 2
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def largest_planned_ctx(board: Board, plan: Plan) -> int | None:
    """The largest context that fits, before compiling (the code is the board's reserve)."""
    return largest_fitting_ctx(board, plan)
