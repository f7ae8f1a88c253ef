"""Plan stage: where every byte lives. Tensor layout in the weight image, the scratch arena,
the KV cache arena and the RoPE tables, all 64-byte aligned, all computed here once.

The emitter turns a Plan into named C constants; the image writer follows the same offsets;
`report` and the tests read plan.json. Nothing downstream recomputes a size.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Callable

from ..boards import CATEGORIES, Board
from ..errors import ColibriError
from ..model.spec import ModelSpec, expected_shapes
from ..numerics import blocks
from ..numerics.kv_cache import DEFAULT_KV_TYPE, check_kv_type, kv_arena_bytes
from ..numerics.quantize import (
    GGUF,
    INTEGER_QUANTS,
    KEPT_BLOCK_TYPES,
    Q8_INPUT_TYPES,
    QK,
    QUANTS,
    SCALE_BYTES,
    gguf_block_type,
)
from . import image_format

ALIGN = image_format.ALIGN  # tensors in the image, buffers in the arenas
PLAN_FORMAT = 1
# Attention reads the KV cache in tiles of KV_TILE positions of one KV head (widened to float32 in
# scratch when the cache is f16 or q8_0), each tile once for every query head sharing that KV head
# and for up to ATTENTION_BLOCK query tokens of a prompt at once (runtime/attention.c).
KV_TILE = 64
ATTENTION_BLOCK = 16


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


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
class TensorEntry:
    name: str  # canonical name, e.g. "layers.0.wq"
    c_name: str  # C identifier fragment, e.g. "LAYERS_0_WQ"
    dtype: str  # "f32" | "q8_0" | "q4_0" | "q4_1" | a kept GGUF block type (numerics/blocks.py: "q4_k", ...)
    rows: int
    cols: int
    offset: int  # from the start of the image's data region; multiple of ALIGN
    nbytes: int
    scales_offset: int  # q8_0, q4_0, q4_1: where the binary16 block scales start, relative to `offset`; else 0
    expanded_offset: int = -1  # q4_0 expanded at load: where its int8 copy starts in the RAM arena
    mins_offset: int = 0  # q4_1: where the binary16 block minimums start (right after the scales); else 0

    @property
    def extent(self) -> int:
        """Its bytes and the zero padding up to the next tensor: what its CRC-32 covers."""
        return align_up(self.nbytes)


@dataclass(frozen=True)
class ExpertPart:
    """One of a routed expert's three matrices, where it lies inside its expert's extent."""

    part: str  # "w_gate" | "w_up" | "w_down"
    dtype: str
    rows: int
    cols: int
    at: int  # from its expert's first byte; multiple of ALIGN
    nbytes: int
    scales_offset: int  # as TensorEntry's, relative to the matrix
    mins_offset: int
    expanded_at: int = -1  # q4_0 expanded at load: from its expert's int8 copy's first byte


@dataclass(frozen=True)
class ExpertGroup:
    """A MoE layer's routed experts: n_experts extents of `stride` bytes one after another from
    `offset`, each its w_gate, w_up and w_down at the same places (the directory's entries
    first_tensor + 3 * expert + part). The generated C states a layer's experts this way, as one
    table row, instead of a named constant per matrix (a 30 B MoE has 18,432 of them)."""

    layer: int
    first_tensor: int  # index of expert 0's w_gate in the plan's tensors
    n_experts: int
    offset: int  # expert 0's w_gate, from the data region's start
    stride: int  # from one expert's first byte to the next's: an expert's extent, padding included
    parts: tuple[ExpertPart, ...]
    expanded_offset: int = -1  # q4_0 expanded at load: expert 0's copy in the RAM arena
    expanded_stride: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.n_experts * self.stride


EXPERT_PARTS = ("w_gate", "w_up", "w_down")


def expert_groups(spec: ModelSpec, tensors: tuple[TensorEntry, ...]) -> tuple[ExpertGroup, ...]:
    """The routed experts of every MoE layer as groups. Every expert of a layer has the same shapes
    and block types (a GGUF file stores a layer's experts as one tensor; a quantization applies to
    all), so their extents share one stride: this checks it, with every offset."""
    index = {t.name: i for i, t in enumerate(tensors)}
    out = []
    for layer in range(spec.n_layers):
        first = index.get(f"layers.{layer}.experts.0.w_gate")
        if first is None:
            continue
        n = spec.n_experts
        gate0 = tensors[first]
        stride = (
            tensors[first + 3].offset - gate0.offset
            if n > 1
            else align_up(tensors[first + 2].offset + tensors[first + 2].nbytes) - gate0.offset
        )
        e_stride = (tensors[first + 3].expanded_offset - gate0.expanded_offset) if n > 1 else 0
        parts = tuple(
            ExpertPart(
                p,
                t.dtype,
                t.rows,
                t.cols,
                t.offset - gate0.offset,
                t.nbytes,
                t.scales_offset,
                t.mins_offset,
                t.expanded_offset - gate0.expanded_offset if t.expanded_offset >= 0 else -1,
            )
            for p, t in zip(EXPERT_PARTS, tensors[first : first + 3])
        )
        for e in range(n):
            for k, part in enumerate(parts):
                t = tensors[first + 3 * e + k]
                if (
                    t.name != f"layers.{layer}.experts.{e}.{part.part}"
                    or t.offset != gate0.offset + e * stride + part.at
                    or (t.dtype, t.rows, t.cols, t.nbytes, t.scales_offset, t.mins_offset)
                    != (part.dtype, part.rows, part.cols, part.nbytes, part.scales_offset, part.mins_offset)
                    or (t.expanded_offset >= 0) != (part.expanded_at >= 0)
                    or (
                        t.expanded_offset >= 0
                        and t.expanded_offset != gate0.expanded_offset + e * e_stride + part.expanded_at
                    )
                ):
                    raise ColibriError(f"internal: layer {layer}'s experts do not share one layout ({t.name})")
        if align_up(parts[2].at + parts[2].nbytes) != stride:
            raise ColibriError(f"internal: layer {layer}'s experts are not contiguous in the image")
        out.append(
            ExpertGroup(
                layer,
                first,
                n,
                gate0.offset,
                stride,
                parts,
                gate0.expanded_offset,
                e_stride if gate0.expanded_offset >= 0 else 0,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Buffer:
    name: str
    ctype: str  # "float" | "int8_t" | "int32_t"
    count: int
    offset: int  # from the start of the arena; multiple of ALIGN
    nbytes: int
    purpose: str


@dataclass(frozen=True)
class ImageLayout:
    header_bytes: int
    dir_offset: int
    dir_bytes: int
    data_offset: int
    data_bytes: int
    image_bytes: int


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

    @property
    def kv_values(self) -> int:
        """Keys (or values) of all layers, in values: the K (or V) arena's length."""
        return sum(slots * self.spec.layer_kv_dim(i) for i, slots in enumerate(self.kv_slots))

    @property
    def kv_scales(self) -> int:
        """q8_0: the binary16 block scales of the K (or V) arena, one per 32 values; else 0."""
        return self.kv_values // QK if self.kv_type == "q8_0" else 0

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

    def linear_state_report(self) -> dict | None:
        """The Gated DeltaNet layers' recurrent state as report shows it (None without such layers):
        bytes per layer (convolution, delta rule), the arena's total, and that no context changes it."""
        if not self.linear_state_bytes:
            return None
        conv, delta = 4 * self.linear_conv_state_floats, 4 * self.linear_delta_state_floats
        layers = sum(self.spec.linear_layers)
        attention = self.spec.n_layers - layers
        summary = (
            f"Gated DeltaNet state: {layers} layers x {conv + delta:,} B (convolution {conv:,} B + delta rule "
            f"{delta:,} B) = {self.linear_state_bytes:,} B, fixed: it does not grow with the context "
            f"(counted under kv_cache, beside the KV cache of the {attention} attention layer{'s' * (attention != 1)})"
        )
        return {
            "layers": layers,
            "conv_bytes_per_layer": conv,
            "delta_bytes_per_layer": delta,
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
            "kv_cache": {
                "type": self.kv_type,
                "bytes": self.kv_bytes,
                "slots_per_layer": list(self.kv_slots),
                "kv_heads": self.spec.n_kv_heads,
                "head_dim": self.spec.head_dim,
            },
            **(
                {
                    "linear_state": {
                        "bytes": self.linear_state_bytes,
                        "layer_offsets": list(self.linear_state_offsets),
                        "conv_floats_per_layer": self.linear_conv_state_floats,
                        "delta_floats_per_layer": self.linear_delta_state_floats,
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


def _c_name(name: str) -> str:
    return name.replace(".", "_").upper()


def _tensor_layout(
    spec: ModelSpec, quant: str, gguf_types: dict[str, str], held_types: dict[str, str]
) -> tuple[tuple[TensorEntry, ...], int, tuple[str, ...]]:
    """Every tensor's place in the image's data region, and the matrices kept in f32 under an
    integer quantization because their rows are not whole blocks of QK (as llama.cpp does, rather
    than refusing the model). Under --quant gguf each matrix's block type is its type in the file
    (gguf_block_type); under an integer quantization a tensor the checkpoint holds in a kept block
    type (held_types) stays in it."""
    entries, kept_f32 = [], []
    cursor = 0
    for name, shape in expected_shapes(spec).items():
        block_type = gguf_block_type(gguf_types[name])[0] if quant == GGUF else quant
        if name in held_types and quant in INTEGER_QUANTS:
            block_type = gguf_block_type(held_types[name])[0]
        verbatim = len(shape) == 2 and block_type in KEPT_BLOCK_TYPES
        quantized = len(shape) == 2 and block_type in INTEGER_QUANTS
        if quantized and shape[1] % QK:
            kept_f32.append(name)
            quantized = False
        if verbatim and shape[1] % blocks.FORMATS[block_type].values:  # the GGUF reader refuses such a file
            raise ColibriError(f"{name}: rows of {shape[1]} are not whole {block_type} blocks")
        if verbatim:  # the file's blocks, row after row
            rows, cols = shape
            scales_offset = mins_offset = 0
            nbytes = rows * blocks.row_bytes(block_type, cols)
            dtype = block_type
        elif quantized:
            rows, cols = shape
            quant_bytes = rows * cols if block_type == "q8_0" else rows * cols // 2
            scales_offset = align_up(quant_bytes)
            nbytes = scales_offset + rows * (cols // QK) * SCALE_BYTES
            # q4_1: the binary16 minimums follow the scales
            mins_offset = nbytes if block_type == "q4_1" else 0
            nbytes += rows * (cols // QK) * SCALE_BYTES if block_type == "q4_1" else 0
            dtype = block_type
        else:
            rows, cols = shape if len(shape) == 2 else (1, shape[0])
            scales_offset = mins_offset = 0
            nbytes = rows * cols * 4
            dtype = "f32"
        entries.append(
            TensorEntry(name, _c_name(name), dtype, rows, cols, cursor, nbytes, scales_offset, mins_offset=mins_offset)
        )
        cursor = align_up(cursor + nbytes)
    return tuple(entries), cursor, tuple(kept_f32)


def _arena(items: list[tuple[str, str, int, str]]) -> tuple[tuple[Buffer, ...], int]:
    sizes = {"float": 4, "int8_t": 1, "int32_t": 4}
    out, cursor = [], 0
    for name, ctype, count, purpose in items:
        nbytes = count * sizes[ctype]
        out.append(Buffer(name, ctype, count, cursor, nbytes, purpose))
        cursor = align_up(cursor + nbytes)
    return tuple(out), cursor


def _expanded_layout(tensors: tuple[TensorEntry, ...]) -> tuple[tuple[TensorEntry, ...], int]:
    """Places in the RAM arena for the int8 copies of q4_0 matrices: quants, padding to 64,
    scales, exactly the q8_0 layout, so the q8_0 kernels read them."""
    out, cursor = [], 0
    for t in tensors:
        if t.dtype == "q4_0":
            out.append(replace(t, expanded_offset=cursor))
            cursor = align_up(cursor + align_up(t.rows * t.cols) + t.rows * (t.cols // QK) * SCALE_BYTES)
        else:
            out.append(t)
    return tuple(out), cursor


def speculation_tokens(spec: ModelSpec, requested: int, prefill_batch: int, n_ctx: int) -> int:
    """The tokens a speculative verification pass may feed (the board's speculate_tokens, at most its
    prefill batch), or 0 where a rejected draft would change what plain decoding computes: experts
    (the routing counts would include drafts), Gated DeltaNet layers (their state cannot step
    back) and sliding windows shorter than the context (a draft's keys would evict ones still
    needed)."""
    if requested < 2 or prefill_batch < 2 or spec.n_experts or any(spec.linear_layers):
        return 0
    if any(0 < window < n_ctx for window in spec.layer_windows):
        return 0
    return min(requested, prefill_batch)


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
) -> Plan:
    """The plan for `spec` on `board`. Buffers of per-token activations have room for
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
    tensors, data_bytes, kept_f32 = _tensor_layout(spec, quant, gguf_types, held_types)
    expand_q4 = expand_q4 and quant == "q4_0"
    expanded_bytes = 0
    if expand_q4:
        tensors, expanded_bytes = _expanded_layout(tensors)
    dir_bytes = image_format.DIR_ENTRY_BYTES * len(tensors)
    data_offset = align_up(image_format.HEADER_BYTES + dir_bytes)
    image = ImageLayout(
        image_format.HEADER_BYTES,
        image_format.HEADER_BYTES,
        dir_bytes,
        data_offset,
        data_bytes,
        data_offset + data_bytes + image_format.TRAILER_BYTES,
    )

    d, v = spec.hidden_size, spec.vocab_size
    f = max(
        spec.intermediate_size,
        spec.expert_intermediate_size,
        spec.shared_expert_intermediate_size,
        *(spec.layer_ffn_dim(i) for i in range(spec.n_layers)),
    )
    max_input = max(d, spec.max_q_dim, f, spec.linear_value_dim, spec.n_layers * spec.ple_dim)
    n = prefill_batch
    spec_tokens = speculation_tokens(spec, speculate_tokens, prefill_batch, n_ctx)
    attention_block = min(prefill_batch, ATTENTION_BLOCK)
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
        ("attn_out", "float", n * spec.max_q_dim, "attention output of all heads, per token"),
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
            ("router_logits", "float", spec.n_experts, "MoE: router logits, then probabilities"),
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
    if any(t.dtype in Q8_INPUT_TYPES for t in tensors):
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
    scratch, scratch_bytes = _arena(items)
    # Sliding-window layers keep only their window: position t lives in slot t % slots.
    # DeltaNet layers keep no keys or values: their state is the recurrent arena's.
    # Gemma 4's KV-sharing layers hold none either: they read their kv_source's (kv_offsets says where).
    kv_slots = tuple(
        0 if spec.is_linear(i) or spec.is_kv_consumer(i) else min(w, n_ctx) if w else n_ctx
        for i, w in enumerate(spec.layer_windows)
    )
    kv_offsets, cursor = [], 0
    for i, slots in enumerate(kv_slots):
        kv_offsets.append(kv_offsets[spec.kv_source(i)] if spec.is_kv_consumer(i) else cursor)
        cursor += slots * spec.layer_kv_dim(i)
    linear_offsets, linear_cursor = [], 0
    per_linear_layer = (max(0, spec.linear_conv_kernel - 1) * spec.linear_conv_dim) + (
        spec.linear_v_heads * spec.linear_k_dim * spec.linear_v_dim
    )
    for i in range(spec.n_layers):
        linear_offsets.append(linear_cursor if spec.is_linear(i) else -1)
        linear_cursor += per_linear_layer if spec.is_linear(i) else 0
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
    return Plan(
        spec=spec,
        board=board,
        quant=quant,
        n_ctx=n_ctx,
        tensors=tensors,
        image=image,
        scratch=scratch,
        scratch_bytes=scratch_bytes,
        kv_slots=kv_slots,
        kv_offsets=tuple(kv_offsets),
        kv_bytes=2 * kv_arena_bytes(cursor, kv_type),
        ropes=tuple(ropes),
        rope_dims=rope_dims,
        layer_rope=tuple(layer_rope),
        rope_table_bytes=len(ropes) * 2 * n_ctx * (max(rope_dims) // 2) * 4,
        max_input=max_input,
        prefill_batch=prefill_batch,
        speculate_tokens=spec_tokens,
        expand_q4=expand_q4,
        expanded_bytes=expanded_bytes,
        kept_f32=kept_f32,
        gguf_types=tuple(gguf_types.items()),
        held_types=tuple(held_types.items()),
        linear_state_offsets=tuple(linear_offsets) if any(spec.linear_layers) else (),
        linear_state_bytes=linear_cursor * 4,
        kv_type=kv_type,
        attention_block=attention_block,
    )


def replan(plan: Plan, n_ctx: int) -> Plan:
    """The same plan at another context length."""
    return make_plan(
        plan.spec,
        plan.board,
        plan.quant,
        n_ctx,
        plan.prefill_batch,
        plan.expand_q4,
        dict(plan.gguf_types),
        dict(plan.held_types),
        plan.speculate_tokens,
        plan.kv_type,
    )


def with_kv_type(plan: Plan, kv_type: str) -> Plan:
    """The same plan with another KV cache type (report's table of every type)."""
    return make_plan(
        plan.spec,
        plan.board,
        plan.quant,
        plan.n_ctx,
        plan.prefill_batch,
        plan.expand_q4,
        dict(plan.gguf_types),
        dict(plan.held_types),
        plan.speculate_tokens,
        kv_type,
    )


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
) -> Plan:
    """The plan for a board. q4_0 weights are expanded to int8 in RAM at load (the q8_0 kernels
    then read them, with no nibbles to unpack per token) when the board has a region for expanded
    weights and everything still fits; otherwise the q4_0 kernels read them in place.
    gguf_types: for --quant gguf, each tensor's block type in the file; held_types: the tensors the
    checkpoint holds already quantized (Checkpoint.held_types). kv_type None: the board's."""
    kv_type = kv_type or board.kv_type
    plan = make_plan(
        spec,
        board.name,
        quant,
        n_ctx,
        board.prefill_batch,
        gguf_types=gguf_types,
        held_types=held_types,
        speculate_tokens=board.speculate_tokens,
        kv_type=kv_type,
    )
    if quant == "q4_0" and board.region_holding("expanded_weights") is not None:
        expanded = make_plan(
            spec,
            board.name,
            quant,
            n_ctx,
            board.prefill_batch,
            expand_q4=True,
            held_types=held_types,
            speculate_tokens=board.speculate_tokens,
            kv_type=kv_type,
        )
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
