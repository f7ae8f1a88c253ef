"""Import stage for GGUF files: metadata -> ModelSpec (metadata.py), tensors -> the canonical
names (names.py) as views read when asked (views.py).

The GGUF counterpart of hf/load.load_hf: the same ModelSpec and the same canonical
tensors a safetensors checkpoint of the model gives, from llama.cpp's names and keys. Here, the
file: every tensor located and its shape checked against the metadata, and its exact blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ColibriError
from ..family_facts import Family
from ..spec import ModelSpec, expected_shapes
from .archs import arch_of
from .file import GgufFile, read_gguf
from .granite import mamba2_file_shape
from .latent import check_split, kv_b_sources, latent_view
from .latent import file_shape as latent_file_shape
from .metadata import parse_metadata
from .names import GEMMA4_GATE_UP, GEMMA4_ROPE_FREQS, GEMMA4_UNUSED_KV, LAYER_NAME, canonical_name
from .tensors import QuantBlocks, readable, tensor_blocks
from .views import GgufTensor, is_stacked_bias, squeezed, unpermute_order, view_of


@dataclass
class GgufCheckpoint:
    """A checkpoint read from a GGUF file (model/checkpoint.Checkpoint), and also what each
    tensor was stored as, its exact blocks and the chat template."""

    spec: ModelSpec
    tensors: dict[str, GgufTensor]  # canonical name -> where its rows are (read lazily)
    input_files: list[Path]
    gguf: GgufFile
    tensor_types: dict[str, str] = field(default_factory=dict)  # canonical name -> GGUF type ("Q4_1", ...)
    held_types: dict[str, str] = field(default_factory=dict)  # none: --quant gguf keeps the file's types
    chat_template: str | None = None
    _sources: dict = field(default_factory=dict, repr=False)  # canonical -> (info, expert or None, permute)

    def blocks(self, canonical: str) -> QuantBlocks | None:
        """The tensor's exact Q8_0/Q4_0/Q4_1/Q4_K blocks (rows in canonical order), or None (also
        for a tensor whose columns the file reorders: its blocks cannot be kept)."""
        info, expert, heads = self._sources[canonical]
        view = self.tensors.get(canonical)
        if view is not None and (view.col_order or view.flat or view.transposed_heads):
            return None
        if view is not None and view.scale != 1.0:
            return None
        if view is not None and view.row_order:
            blocks = tensor_blocks(self.gguf, info)
            if blocks is None:
                return None
            rows = blocks.raw.reshape(-1, *blocks.raw.shape[-2:])  # a stacked tensor's rows, expert after expert
            return type(blocks)(blocks.ggml_type, rows).take(np.asarray(view.row_order))
        blocks = tensor_blocks(self.gguf, info)
        if blocks is None:
            return None
        if expert is not None:
            blocks = blocks.take(expert)
        return blocks.take(unpermute_order(blocks.shape[0], heads)) if heads else blocks


def _locate(gguf: GgufFile, spec: ModelSpec, family: Family) -> dict:
    """canonical name -> (tensor info, expert index or None, heads to un-permute or 0)."""
    wanted = expected_shapes(spec)
    where = gguf.path.name
    sources = {}
    for name, info in gguf.tensors.items():
        if name == GEMMA4_ROPE_FREQS:
            continue  # read into the spec's RoPE (metadata.py: Gemma 4's proportional, else llama3)
        m = LAYER_NAME.fullmatch(name)
        if (
            family.gemma4_layers
            and m
            and m.group(2) == GEMMA4_GATE_UP
            and f"layers.{m.group(1)}.experts.0.w_gate" in wanted
        ):
            fe = spec.expert_intermediate_size
            if tuple(info.shape) != (spec.n_experts, 2 * fe, spec.hidden_size):
                raise ColibriError(
                    f"{where}: tensor {name!r} has shape {list(info.shape)}, the metadata implies "
                    f"{[spec.n_experts, 2 * fe, spec.hidden_size]}"
                )
            for e in range(spec.n_experts):
                sources[f"layers.{m.group(1)}.experts.{e}.w_gate"] = (info, e, 0)
                sources[f"layers.{m.group(1)}.experts.{e}.w_up"] = (info, e, 0)
            continue
        latent_kv_b = kv_b_sources(name, info, spec)
        if latent_kv_b:  # an older deepseek2 file's attn_kv_b: both up-projections
            sources.update(latent_kv_b)
            continue
        if m and spec.mtp_layers and int(m.group(1)) >= spec.n_layers:
            continue  # a multi-token-prediction layer (block_count counts it): left out
        found = canonical_name(name, family)
        if (
            family.gemma4_layers
            and m
            and m.group(2) in GEMMA4_UNUSED_KV
            and int(m.group(1)) < spec.n_layers
            and spec.is_kv_consumer(int(m.group(1)))
        ):
            continue  # a KV-sharing layer's own k/v projections and norms: not used
        if found is None or (found[0] not in wanted and not found[1]):
            raise ColibriError(f"{where}: unexpected tensor {name!r} for {spec.architecture} with this metadata")
        canonical, stacked = found
        if stacked:
            if len(info.shape) != 3 or info.shape[0] != spec.n_experts or canonical.format(0) not in wanted:
                raise ColibriError(
                    f"{where}: tensor {name!r} has shape {list(info.shape)}, expected {spec.n_experts} stacked experts"
                )
            for e in range(spec.n_experts):
                sources[canonical.format(e)] = (info, e, 0)
            continue
        heads = 0
        if family.gguf_permuted_qk and canonical.rsplit(".", 1)[-1] in ("wq", "bq"):
            heads = spec.n_heads
        elif family.gguf_permuted_qk and canonical.rsplit(".", 1)[-1] in ("wk", "bk"):
            heads = spec.n_kv_heads
        sources[canonical] = (info, None, heads)
        if spec.attn_output_gate and canonical.endswith(".wq"):
            sources[canonical + "_gate"] = (info, None, 0)  # the same attn_q: its gate rows
    for canonical, shape in wanted.items():
        if canonical not in sources:
            raise ColibriError(
                f"{where}: missing tensor for {canonical!r} ({spec.architecture}, expected shape {list(shape)})"
            )
        info, expert, _ = sources[canonical]
        got = info.shape[1:] if expert is not None else info.shape
        if family.gemma4_layers and info.name.endswith(GEMMA4_GATE_UP):
            continue  # its shape checked above
        if is_stacked_bias(canonical):  # (n_experts, width), read as one vector
            got = (
                (int(np.prod(info.shape)),) if len(info.shape) == 2 and info.shape[0] == spec.n_experts else info.shape
            )
        stored = latent_file_shape(spec, canonical, info.name, shape) or _file_shape(spec, canonical, shape)
        if squeezed(got) != squeezed(stored):
            raise ColibriError(
                f"{where}: tensor {info.name!r} has shape {list(info.shape)}, the metadata implies {list(shape)}"
            )
    return sources


def _file_shape(spec: ModelSpec, canonical: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape llama.cpp stores a canonical tensor in: Qwen3.5's attn_q holds each head's queries
    and gate, its ssm_conv1d is [channels, kernel]."""
    if spec.attn_output_gate and canonical.endswith((".wq", ".wq_gate")):
        return (2 * shape[0], shape[1])
    if canonical.endswith(".lin_conv"):
        return (spec.linear_conv_dim, spec.linear_conv_kernel)
    if canonical.endswith(".conv_taps"):
        return (spec.hidden_size, spec.short_conv_kernel)
    return mamba2_file_shape(spec, canonical) or shape


def load_gguf(path: Path | str, load_tensors: bool = True) -> GgufCheckpoint:
    """Read a GGUF file. With load_tensors=False only the header is checked (fast planning)."""
    path = Path(path)
    if not path.exists():
        raise ColibriError(f"model file {path} does not exist")
    if not path.is_file():
        raise ColibriError(f"{path} is not a file")
    gguf = read_gguf(path)
    for info in gguf.tensors.values():
        if not readable(info.ggml_type):  # said before anything is built, not when the blocks are read
            raise ColibriError(
                f"{path.name}: tensor {info.name!r} has type {info.ggml_type}, which this build cannot read"
            )
    spec = parse_metadata(gguf)
    _, family = arch_of(gguf)
    if spec.kv_lora_rank:
        check_split(gguf, spec.n_layers)
    sources = _locate(gguf, spec, family)
    wanted = expected_shapes(spec)
    template = gguf.metadata.get("tokenizer.chat_template")
    tensors: dict[str, GgufTensor] = {}
    if load_tensors:
        for canonical, shape in wanted.items():
            info, expert, heads = sources[canonical]
            view = view_of(spec, canonical) or latent_view(spec, canonical, info.name)
            if is_stacked_bias(canonical):
                view["flat"] = True
            tensors[canonical] = GgufTensor(path, info, tuple(shape), expert, heads or 0, **view)
    return GgufCheckpoint(
        spec=spec,
        tensors=tensors,
        input_files=[path],
        gguf=gguf,
        tensor_types={c: sources[c][0].ggml_type for c in wanted},
        chat_template=template if isinstance(template, str) else None,
        _sources=sources,
    )
