"""A checkpoint's tensors as canonical tensors, read when asked: HfTensor (a tensor of a
safetensors file, or a view of it: Gemma's (1 + w) norms, Qwen3.5's q_proj rows and convolution
taps, a scale), HfFusedSlice (one expert cut from a fused gpt-oss or Gemma 4 expert tensor), and
gpt-oss's packed MXFP4 experts (mxfp4.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..family_facts import FAMILIES
from ..spec import ModelSpec
from . import mxfp4
from .names import HF_FUSED_EXPERT_BIASES, text_tower_name
from .safetensors_io import TensorInfo, read_rows, rows_cols


@dataclass(frozen=True)
class HfTensor:
    """One tensor of a checkpoint, read when asked. Small and picklable: a worker process given it
    reads the rows it needs from the file itself, so no process holds the whole model.

    The interface generation uses (any importer's tensors provide it): `shape`, and
    `rows(start, stop)`, rows [start, stop) of the tensor as a matrix (a vector is one row),
    float32, values exactly as the model uses them."""

    path: Path
    info: TensorInfo
    plus_one: bool = False  # Gemma's (1 + w) norms, folded in here in float32
    # A view of some of the file's rows: of every `row_period` rows, the `row_count` from `row_first`
    # (Qwen3.5's q_proj holds each head's queries, then its output gate). 0: every row.
    row_period: int = 0
    row_first: int = 0
    row_count: int = 0
    flat: bool = False  # the whole tensor as one vector (Qwen3.5's conv1d taps, [channels, 1, kernel])
    neg_exp: bool = False  # -exp(w), in float64 rounded to float32 (Qwen3.5's A_log: the decay's scale)
    scale: float = 1.0  # multiplied in float32 (Gemma 4's router scale by hidden^-1/2)

    @property
    def shape(self) -> tuple[int, ...]:
        if self.flat:
            return (int(np.prod(self.info.shape)),)
        if self.row_period:
            rows, cols = rows_cols(self.info)
            return (rows // self.row_period * self.row_count, cols)
        return self.info.shape

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.flat:
            arr = read_rows(self.path, self.info, 0, rows_cols(self.info)[0]).reshape(1, -1)[:, :][start:stop]
        elif self.row_period:
            wanted = np.arange(start, stop)
            physical = wanted // self.row_count * self.row_period + self.row_first + wanted % self.row_count
            if len(physical) == 0:
                return np.zeros((0, rows_cols(self.info)[1]), dtype=np.float32)
            lo = int(physical[0])
            arr = read_rows(self.path, self.info, lo, int(physical[-1]) + 1)[physical - lo]
        else:
            arr = read_rows(self.path, self.info, start, stop)
        if self.neg_exp:
            arr = (-np.exp(arr.astype(np.float64))).astype(np.float32)
        if self.scale != 1.0:
            arr = (arr.astype(np.float32) * np.float32(self.scale)).astype(np.float32)
        if self.plus_one:
            # Gemma's RMSNorm scales by (1 + w), computed in float32: folded in once here, so
            # every norm in the runtime is the same x * inv * w.
            arr = (np.float32(1.0) + arr).astype(np.float32)
        return arr

    def load(self) -> np.ndarray:
        """The whole tensor, in its own shape (small tensors and tests; generation reads rows)."""
        return self.rows(0, 1 if self.flat else self.shape[0] if self.row_period else rows_cols(self.info)[0]).reshape(
            self.shape
        )


@dataclass(frozen=True)
class HfFusedSlice:
    """One canonical tensor cut from a fused gpt-oss expert tensor, read when asked (the HfTensor
    interface): expert `expert`'s [rows_in, cols_in] block of a stacked tensor (or, for a bias, its
    row), its even (`parity` 0) or odd (1) columns or all of them (None), transposed for the
    matrices (the checkpoint applies them as x @ W; canonical rows are output features). A bias
    with expert None is every expert's columns, expert after expert, as one vector."""

    path: Path
    info: TensorInfo
    shape: tuple[int, ...]  # the canonical shape
    expert: int | None
    parity: int | None
    transposed: bool
    half: int | None = None  # Gemma 4's gate_up_proj: the first (0) or second (1) half of the rows

    def _block(self, expert: int) -> np.ndarray:
        per_expert = rows_cols(self.info)[0] // self.info.shape[0]
        if self.half is not None:
            half = per_expert // 2
            start = expert * per_expert + self.half * half
            return read_rows(self.path, self.info, start, start + half)
        arr = read_rows(self.path, self.info, expert * per_expert, (expert + 1) * per_expert)
        if self.parity is not None:
            arr = arr[:, self.parity :: 2]
        return arr.T if self.transposed else arr

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.expert is None:  # a bias vector of all experts: one row
            flat = np.concatenate([self._block(e).reshape(-1) for e in range(self.info.shape[0])])
            return np.ascontiguousarray(flat[None, :][start:stop], dtype=np.float32)
        return np.ascontiguousarray(self._block(self.expert)[start:stop], dtype=np.float32)

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0] if len(self.shape) == 2 else 1).reshape(self.shape)


def fused_parts(hf_name: str, path: Path, info: TensorInfo, spec: ModelSpec) -> dict[str, HfFusedSlice] | None:
    """The canonical tensors a fused gpt-oss expert tensor holds, or None when hf_name is not one."""
    hf_name = text_tower_name(hf_name)
    family = FAMILIES[spec.family]
    if not hf_name.startswith("model.layers.") or not (family.fused_experts or family.gemma4_layers):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    p, n, d, fe = f"layers.{index}.", spec.n_experts, spec.hidden_size, spec.expert_intermediate_size
    if (
        family.gemma4_layers
    ):  # experts.gate_up_proj [E, 2 x inner, hidden] (gate rows, then up), down [E, hidden, inner]
        shapes = {"experts.gate_up_proj": (n, 2 * fe, d), "experts.down_proj": (n, d, fe)}
        if part not in shapes or not spec.n_experts:
            return None
        if info.shape != shapes[part]:
            raise ColibriError(
                f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(shapes[part])}"
            )
        if part == "experts.down_proj":
            return {p + f"experts.{e}.w_down": HfFusedSlice(path, info, (d, fe), e, None, False) for e in range(n)}
        out = {}
        for e in range(n):
            out[p + f"experts.{e}.w_gate"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=0)
            out[p + f"experts.{e}.w_up"] = HfFusedSlice(path, info, (fe, d), e, None, False, half=1)
        return out
    expected = {
        "mlp.experts.gate_up_proj": (n, d, 2 * fe),
        "mlp.experts.down_proj": (n, fe, d),
        "mlp.experts.gate_up_proj_bias": (n, 2 * fe),
        "mlp.experts.down_proj_bias": (n, d),
    }
    if part not in expected:
        return None
    if info.shape != expected[part]:
        raise ColibriError(
            f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {list(expected[part])}"
        )
    out = {}
    if part == "mlp.experts.gate_up_proj":
        for e in range(n):
            out[p + f"experts.{e}.w_gate"] = HfFusedSlice(path, info, (fe, d), e, 0, True)
            out[p + f"experts.{e}.w_up"] = HfFusedSlice(path, info, (fe, d), e, 1, True)
    elif part == "mlp.experts.down_proj":
        for e in range(n):
            out[p + f"experts.{e}.w_down"] = HfFusedSlice(path, info, (d, fe), e, None, True)
    else:
        width = fe if part == "mlp.experts.gate_up_proj_bias" else d
        for name, parity in HF_FUSED_EXPERT_BIASES[part]:
            out[p + name] = HfFusedSlice(path, info, (n * width,), None, parity, False)
    return out


def mxfp4_parts(
    hf_name: str, located: dict[str, tuple[Path, TensorInfo]], spec: ModelSpec
) -> dict[str, mxfp4.HfMxfp4Slice] | None:
    """The expert matrices of a packed MXFP4 tensor pair (hf/mxfp4.py), named by its _blocks
    tensor ({} for its _scales, read with it), or None when hf_name is not one."""
    if not hf_name.startswith("model.layers.") or not hf_name.endswith(("_blocks", "_scales")):
        return None
    index, _, part = hf_name[len("model.layers.") :].partition(".")
    stem, _, kind = part.rpartition("_")
    if not index.isdigit() or str(int(index)) != index or int(index) >= spec.n_layers:
        return None
    if stem not in mxfp4.PACKED_PARTS:
        return None
    partner = f"model.layers.{index}.{stem}_{'scales' if kind == 'blocks' else 'blocks'}"
    if partner not in located:
        raise ColibriError(f"tensor {hf_name!r} has no {partner!r} beside it (MXFP4 blocks need their scales)")
    if kind == "scales":
        return {}
    n, d, fe = spec.n_experts, spec.hidden_size, spec.expert_intermediate_size
    return mxfp4.expert_slices(f"layers.{index}.", stem, located[hf_name], located[partner], n, d, fe)


def tensor_view(spec: ModelSpec, canonical: str, path: Path, info: TensorInfo) -> HfTensor:
    """The canonical tensor as a view of the file's: Gemma's and Qwen3.5's (1 + w) norms (not
    Qwen3.5's gated norm, which scales by w), the queries and the output gate of Qwen3.5's q_proj
    (each head's head_dim queries, then its head_dim gates), its convolution's taps as one vector."""
    family = FAMILIES[spec.family]
    plus_one = family.norms.plus_one and canonical.endswith("norm") and not canonical.endswith("lin_norm")
    if family.gemma4_layers and canonical.endswith("router_norm"):
        return HfTensor(path, info, scale=spec.hidden_size**-0.5)
    if spec.attn_output_gate and (canonical.endswith(".wq") or canonical.endswith(".wq_gate")):
        hd = spec.head_dim
        if info.shape != (2 * spec.q_dim, spec.hidden_size):
            return HfTensor(path, info)  # reported with the shape the config implies
        return HfTensor(path, info, row_period=2 * hd, row_first=hd if canonical.endswith("_gate") else 0, row_count=hd)
    if canonical.endswith("lin_conv"):
        if info.shape != (spec.linear_conv_dim, 1, spec.linear_conv_kernel):
            return HfTensor(path, info)
        return HfTensor(path, info, flat=True)
    if canonical.endswith("conv_taps"):  # LFM2's [hidden, 1, kernel]
        if info.shape != (spec.hidden_size, 1, spec.short_conv_kernel):
            return HfTensor(path, info)
        return HfTensor(path, info, flat=True)
    if canonical.endswith("lin_decay_scale"):
        return HfTensor(path, info, neg_exp=True)
    return HfTensor(path, info, plus_one=plus_one)


def file_shape(spec: ModelSpec, canonical: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a checkpoint's tensor must have for the canonical `shape` (as config.json implies)."""
    if spec.attn_output_gate and canonical.endswith((".wq", ".wq_gate")):
        return (2 * shape[0], shape[1])
    if canonical.endswith("lin_conv"):
        return (spec.linear_conv_dim, 1, spec.linear_conv_kernel)
    if canonical.endswith("conv_taps"):
        return (spec.hidden_size, 1, spec.short_conv_kernel)
    return shape
