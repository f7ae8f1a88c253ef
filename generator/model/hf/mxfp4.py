"""gpt-oss checkpoints as OpenAI publishes them: the experts in MXFP4, kept exactly.

config.json says `"quantization_config": {"quant_method": "mxfp4", ...}` and each layer's fused
experts come as packed blocks instead of floats:

  mlp.experts.gate_up_proj_blocks  U8 [experts, 2 * expert_ffn, hidden / 32, 16]
  mlp.experts.gate_up_proj_scales  U8 [experts, 2 * expert_ffn, hidden / 32]
  mlp.experts.down_proj_blocks     U8 [experts, hidden, expert_ffn / 32, 16]
  mlp.experts.down_proj_scales     U8 [experts, hidden, expert_ffn / 32]

Rows are output features (gate and up interleaved: even rows gate, odd rows up), each row's 32-value
blocks along the input. A block is 16 bytes of e2m1 codes, value 2j in the low nibble of byte j and
value 2j + 1 in its high nibble, and one e8m0 byte e: value = FP4[code] * 2^(e - 127), as
transformers' convert_moe_packed_tensors dequantizes it. GGUF's MXFP4 block holds the same codes and
the same e, only ordered differently (value j in the low nibble of byte j, value j + 16 in the high
one, e first): `ggml_blocks` reorders them, so the image holds the blocks llama.cpp's converter
writes for the same checkpoint, and the numbers stay the checkpoint's under any --quant but f32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..file_reads import E8M0_FIRST_CHECKED, within_limit
from ..gguf.tensors import QuantBlocks
from .safetensors_io import TensorInfo, read_bytes

QUANT_METHOD = "mxfp4"
BLOCK_VALUES = 32
BLOCK_BYTES = 16  # the codes of one block; its e8m0 scale is in the _scales tensor
# e2m1 codes -> values (transformers' FP4_VALUES): sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32
)
E8M0_NAN = 0xFF


def quant_method(config: dict) -> str | None:
    """The checkpoint's quantization method (None: plain floats); one this project cannot read is
    refused here, before any tensor is looked at."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != QUANT_METHOD:
        raise ColibriError(
            f"config.json: quantization_config quant_method {method!r} is not supported "
            f"(give a checkpoint of plain floats, or gpt-oss's mxfp4 experts)"
        )
    return method


def values(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Checkpoint blocks (n, 16) and e8m0 bytes (n,) -> their (n, 32) values in float32, exactly:
    FP4[code] * 2^(e - 127), as transformers computes them (one ldexp, no rounding)."""
    out = np.empty((len(codes), BLOCK_VALUES), np.float32)
    out[:, 0::2] = FP4_VALUES[codes & 0x0F]
    out[:, 1::2] = FP4_VALUES[codes >> 4]
    with np.errstate(over="ignore"):
        return np.ldexp(out, scales.astype(np.int32)[:, None] - 127).astype(np.float32)


def ggml_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Checkpoint blocks (n, 16) and their e8m0 bytes (n,) -> GGUF MXFP4 blocks (n, 17)."""
    values = np.empty((len(codes), BLOCK_VALUES), np.uint8)
    values[:, 0::2] = codes & 0x0F
    values[:, 1::2] = codes >> 4
    out = np.empty((len(codes), 1 + BLOCK_BYTES), np.uint8)
    out[:, 0] = scales
    out[:, 1:] = values[:, :16] | (values[:, 16:] << 4)
    return out


@dataclass(frozen=True)
class HfMxfp4Slice:
    """One expert's matrix cut from a layer's packed gate_up or down tensors (the HfTensor interface,
    plus `blocks`: its MXFP4 blocks, as an image keeps them): rows `parity`::2 of the expert's rows
    (gate 0, up 1) or all of them (None)."""

    path: Path
    info: TensorInfo  # the _blocks tensor
    scales_path: Path
    scales_info: TensorInfo
    shape: tuple[int, int]  # the canonical shape (rows, cols)
    expert: int
    parity: int | None
    ggml_type = "MXFP4"
    exact_blocks = True  # image.keeping: its blocks go into the image as they are

    def _physical_rows(self, start: int, stop: int) -> tuple[int, int, int]:
        """(first, last + 1, step) of the packed tensor's rows (expert-major) for rows [start, stop)."""
        per_expert = self.info.shape[1]
        base = self.expert * per_expert
        if self.parity is None:
            return base + start, base + stop, 1
        return base + 2 * start + self.parity, base + 2 * (stop - 1) + self.parity + 1, 2

    def _packed(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop)'s checkpoint blocks (n, 16) and e8m0 bytes (n,), row after row; a
        scale of 0xFF (NaN in the OCP MX spec) or one whose values overflow float32 is refused."""
        nb = self.shape[1] // BLOCK_VALUES
        if stop <= start:
            return np.zeros((0, BLOCK_BYTES), np.uint8), np.zeros(0, np.uint8)
        first, end, step = self._physical_rows(start, stop)
        codes = read_bytes(self.path, _as_rows(self.info, BLOCK_BYTES), first * nb, end * nb)
        scales = read_bytes(self.scales_path, _as_rows(self.scales_info, 1), first * nb, end * nb)
        codes = codes.reshape(end - first, nb, BLOCK_BYTES)[::step].reshape(-1, BLOCK_BYTES)
        scales = scales.reshape(end - first, nb)[::step].reshape(-1)
        top = scales >= E8M0_FIRST_CHECKED  # 0xFF is NaN; smaller scales cannot pass the weight limit
        if np.any(scales == E8M0_NAN) or not within_limit(values(codes[top], scales[top])):
            raise ColibriError(
                f"{self.scales_path.name}: tensor {self.scales_info.name!r}: an e8m0 scale is 0xFF (NaN) or "
                f"makes one of its values overflow float32 or pass the +-2^32 a weight may be "
                f'(docs/numerics.md, "Non-finite values")'
            )
        return codes, scales

    def blocks(self, start: int, stop: int) -> QuantBlocks:
        nb = self.shape[1] // BLOCK_VALUES
        raw = ggml_blocks(*self._packed(start, stop))
        return QuantBlocks("MXFP4", raw.reshape(max(0, stop - start), nb, 1 + BLOCK_BYTES))

    def rows(self, start: int, stop: int) -> np.ndarray:
        return values(*self._packed(start, stop)).reshape(max(0, stop - start), self.shape[1])

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0])


def _as_rows(info: TensorInfo, width: int) -> TensorInfo:
    """A packed tensor seen as rows of `width` bytes: one block's codes (16) or one scale (1)."""
    count = int(np.prod(info.shape))
    return TensorInfo(info.name, info.dtype, (count // width, width), info.begin, info.end)


# part of a layer's name -> (canonical matrix, parity, file shape of its _blocks / _scales given
# (experts, hidden, expert_ffn))
PACKED_PARTS = {
    "mlp.experts.gate_up_proj": (("w_gate", 0), ("w_up", 1)),
    "mlp.experts.down_proj": (("w_down", None),),
}


def published_held_types(spec) -> dict[str, str]:
    """What a config-only plan of a checkpoint published with MXFP4 experts holds of them: every
    layer's every expert matrix (a checkpoint with weights says it from its tensors instead)."""
    return {
        f"layers.{i}.experts.{e}.{name}": "MXFP4"
        for i in range(spec.n_layers)
        for e in range(spec.n_experts)
        for name in ("w_gate", "w_up", "w_down")
    }


def packed_shapes(part: str, n: int, d: int, fe: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    rows, cols = (2 * fe, d) if part == "mlp.experts.gate_up_proj" else (d, fe)
    return (n, rows, cols // BLOCK_VALUES, BLOCK_BYTES), (n, rows, cols // BLOCK_VALUES)


def expert_slices(
    prefix: str, part: str, blocks: tuple[Path, TensorInfo], scales: tuple[Path, TensorInfo], n: int, d: int, fe: int
) -> dict[str, HfMxfp4Slice]:
    """The canonical expert matrices (`prefix` + experts.{e}.w_*) of one packed tensor pair, their
    shapes checked against the config."""
    want_blocks, want_scales = packed_shapes(part, n, d, fe)
    for (path, info), want in ((blocks, want_blocks), (scales, want_scales)):
        if info.dtype != "U8" or info.shape != want:
            raise ColibriError(
                f"{path.name}: tensor {info.name!r} is {info.dtype} {list(info.shape)}, config.json implies "
                f"U8 {list(want)} (MXFP4 blocks of {BLOCK_VALUES} values)"
            )
    out = {}
    for e in range(n):
        for name, parity in PACKED_PARTS[part]:
            shape = (fe, d) if name != "w_down" else (d, fe)
            out[f"{prefix}experts.{e}.{name}"] = HfMxfp4Slice(
                blocks[0], blocks[1], scales[0], scales[1], shape, e, parity
            )
    return out
