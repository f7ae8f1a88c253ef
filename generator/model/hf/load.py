"""Import stage: a Hugging Face model directory -> ModelSpec + its tensors under canonical names,
each read when asked (an HfTensor: where it is, not its values), so a model of any size
goes through generation one piece at a time.

config.json is read by config.py (families.py: what sets each family apart), tensor names by
names.py, the tensors' views by views.py; here, the directory: its files, every safetensors
header checked against the config, and what a configuration without weights says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ColibriError
from ...files import SHARD_INDEX_BYTES, optional_file
from ..family_facts import FAMILIES
from ..hub import model_name
from ..llama4 import hf_parts as llama4_parts
from ..spec import ModelSpec, expected_shapes
from . import mxfp4
from .config import parse_config, read_json
from .granite import granite_parts
from .latent import HfLatentView, latent_parts, rope_interleaved
from .names import NOT_TEXT_PREFIXES, canonical_name, mtp_layer_part, unused_kv_part
from .safetensors_io import TensorInfo, read_header
from .views import HfFusedSlice, HfTensor, file_shape, fused_parts, mxfp4_parts, tensor_view


@dataclass
class HfCheckpoint:
    """A checkpoint read from a Hugging Face directory (model/checkpoint.Checkpoint)."""

    spec: ModelSpec
    tensors: dict[str, HfTensor]  # canonical name -> where its values are, in plan order
    input_files: list[Path]  # every file the checkpoint was read from (build dependencies)
    tensor_types: None = None  # safetensors hold plain floats: no block types to keep (--quant gguf)
    # Tensors the checkpoint holds already quantized (gpt-oss's MXFP4 experts: hf/mxfp4.py), by
    # their GGUF block type: kept exactly under every integer --quant.
    held_types: dict[str, str] = field(default_factory=dict)


def _tensor_files(model_dir: Path) -> dict[str, tuple[Path, TensorInfo]]:
    """HF tensor name -> (file, header entry), from one file or a sharded index."""
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    located: dict[str, tuple[Path, TensorInfo]] = {}
    if single.is_file():
        for name, info in read_header(single).items():
            located[name] = (single, info)
        return located
    if not index.is_file():
        raise ColibriError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    weight_map = read_json(index, SHARD_INDEX_BYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ColibriError("model.safetensors.index.json: 'weight_map' must be a non-empty object")
    root = model_dir.resolve()
    headers: dict[Path, dict[str, TensorInfo]] = {}
    for name, shard in sorted(weight_map.items()):
        if not isinstance(shard, str) or not shard:
            raise ColibriError(f"model.safetensors.index.json: tensor {name!r} has no shard file name")
        path = (model_dir / shard).resolve()
        if path.parent != root:
            raise ColibriError(f"model.safetensors.index.json: shard {shard!r} is outside the model directory")
        if not path.is_file():
            raise ColibriError(f"model.safetensors.index.json: shard {shard!r} for tensor {name!r} does not exist")
        if path not in headers:
            headers[path] = read_header(path)
        if name not in headers[path]:
            raise ColibriError(f"model.safetensors.index.json: tensor {name!r} is not in shard {shard!r}")
        located[name] = (path, headers[path][name])
    for path, header in headers.items():
        for name in header:
            if weight_map.get(name) is None:
                raise ColibriError(f"{path.name}: tensor {name!r} is not listed in model.safetensors.index.json")
    return located


def load_hf(model_dir: Path | str, load_tensors: bool = True) -> HfCheckpoint:
    """Read a model directory: config, and every safetensors header checked against it. No tensor
    is read here: `tensors` says where each one is (with load_tensors=False it is left empty, for
    callers that only plan)."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ColibriError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise ColibriError(f"{model_dir} is not a directory (give the folder holding config.json)")
    config_path = model_dir / "config.json"
    if not optional_file(config_path, str(config_path)):
        raise ColibriError(f"{model_dir}: no config.json (is this a Hugging Face model directory?)")
    gen_path = model_dir / "generation_config.json"
    has_generation = optional_file(gen_path, str(gen_path))
    generation = read_json(gen_path) if has_generation else None
    config = read_json(config_path)
    spec = parse_config(config, model_name(model_dir), generation)
    packed = mxfp4.quant_method(config) == mxfp4.QUANT_METHOD and FAMILIES[spec.family].fused_experts

    interleaved = FAMILIES[spec.family].latent is not None and rope_interleaved(config, FAMILIES[spec.family].latent)
    located = _tensor_files(model_dir)
    wanted = expected_shapes(spec)
    by_canonical: dict[str, tuple[Path, TensorInfo]] = {}
    fused: dict[str, HfFusedSlice | mxfp4.HfMxfp4Slice | HfLatentView] = {}
    held: dict[str, str] = {}
    for hf_name, (path, info) in sorted(located.items()):
        if hf_name.startswith(NOT_TEXT_PREFIXES) or mtp_layer_part(hf_name, spec):
            continue  # the vision tower of a multimodal checkpoint; a multi-token-prediction layer
        parts = mxfp4_parts(hf_name, located, spec) if packed else None
        if parts is not None:  # gpt-oss's MXFP4 experts: their blocks kept as they are
            fused.update(parts)
            held.update({canonical: "MXFP4" for canonical in parts})
            for canonical in parts:
                by_canonical[canonical] = (path, info)
            continue
        parts = (
            fused_parts(hf_name, path, info, spec)
            or latent_parts(hf_name, path, info, spec, interleaved)
            or granite_parts(hf_name, path, info, spec)
            or llama4_parts(hf_name, path, info, spec)
        )
        if parts is not None:  # gpt-oss's fused experts: their shapes checked there
            fused.update(parts)
            for canonical in parts:
                by_canonical[canonical] = (path, info)
            continue
        canonical = canonical_name(hf_name, spec.family)
        if spec.kv_shared_layers and unused_kv_part(hf_name, spec):
            continue  # a KV-sharing layer's own k/v projections and norms: not used
        if canonical is None:
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue  # a cache some exporters save; recomputed by the generator
            raise ColibriError(f"unexpected tensor {hf_name!r} for {spec.architecture} with this config.json")
        if canonical == "lm_head" and spec.tie_embeddings:
            continue  # some exporters also save the tied copy
        if canonical not in wanted:
            raise ColibriError(f"unexpected tensor {hf_name!r} for {spec.architecture} with this config.json")
        by_canonical[canonical] = (path, info)
        if spec.attn_output_gate and canonical.endswith(".wq"):
            by_canonical[canonical + "_gate"] = (path, info)  # the same q_proj: its gate rows
    views = {}
    for canonical, shape in wanted.items():
        if canonical not in by_canonical:
            raise ColibriError(f"missing tensor for {canonical!r} ({spec.architecture}, expected shape {list(shape)})")
        if canonical in fused:
            views[canonical] = fused[canonical]  # its shape checked by fused_parts
            continue
        path, info = by_canonical[canonical]
        views[canonical] = tensor_view(spec, canonical, path, info)
        if views[canonical].shape != shape:
            implied = list(file_shape(spec, canonical, shape))
            raise ColibriError(f"tensor {info.name!r} has shape {list(info.shape)}, config.json implies {implied}")

    tensors: dict[str, HfTensor] = {}
    if load_tensors:
        tensors = views
    files = sorted(
        {config_path, *(p for p, _ in by_canonical.values())}
        | ({gen_path} if has_generation else set())
        | (
            {model_dir / "model.safetensors.index.json"}
            if (model_dir / "model.safetensors.index.json").is_file()
            else set()
        )
    )
    return HfCheckpoint(spec=spec, tensors=tensors, input_files=files, held_types=held)


# The files beside the weights that a release carries with them (not generation inputs: the
# firmware sees token ids only).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_weights(model_dir: Path) -> bool:
    return (model_dir / "model.safetensors").is_file() or (model_dir / "model.safetensors.index.json").is_file()


def config_only_spec(model_dir: Path) -> ModelSpec | None:
    """The spec of a configuration without weights (a published config.json alone, as
    models/configs holds), or None when the directory has weights or no config.json."""
    config_path = model_dir / "config.json"
    if has_weights(model_dir) or not config_path.is_file():
        return None
    return parse_config(read_json(config_path), model_name(model_dir))


def config_only_held_types(model_dir: Path) -> dict[str, str]:
    """The tensors a configuration without weights says its checkpoint holds quantized (gpt-oss's
    MXFP4 experts, by config.json's quantization_config), as HfCheckpoint.held_types would be."""
    config = read_json(model_dir / "config.json")
    spec = parse_config(config, model_name(model_dir))
    if mxfp4.quant_method(config) != mxfp4.QUANT_METHOD or not FAMILIES[spec.family].fused_experts:
        return {}
    return mxfp4.published_held_types(spec)


def generation_config(model_dir: Path) -> tuple[dict, Path]:
    """generation_config.json's settings ({} without one), and the file, to name in messages."""
    path = model_dir / "generation_config.json"
    return (read_json(path) if optional_file(path, str(path)) else {}), path


def tokenizer_files(model_dir: Path) -> list[Path]:
    return [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
