"""The model door: a path -> the checkpoint of its format (a .gguf file or a Hugging Face
directory), and the few things the commands ask of a model path without loading it. Nothing
above the model stage names a model's files. A model named on the hub (hf:ORG/NAME, model/hub.py)
becomes a path here too, once, in model_path: everything after it sees a local path."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import Checkpoint
from .gguf import is_gguf
from .hf import load as hf
from .hub import HubReference, fetch, is_hub_reference, model_name, parse_hub_reference
from .spec import ModelSpec

__all__ = [
    "Checkpoint",
    "companion_files",
    "config_only_held_types",
    "config_only_spec",
    "generation_config",
    "is_gguf",
    "load_model",
    "model_name",
    "model_path",
    "model_value",
]


def model_value(text: str) -> Path | HubReference:
    """A --model value as written: a hub reference (hf:ORG/NAME[@REV][:FILE|:QUANT], its syntax
    checked, nothing fetched yet) or a path."""
    return parse_hub_reference(text) if is_hub_reference(text) else Path(text)


def model_path(value: Path | HubReference, show_progress: bool = True) -> Path:
    """The local path of a --model value: a hub reference is fetched into huggingface_hub's cache
    (or found there: offline, HF_HUB_OFFLINE) and becomes the file or directory it names there."""
    return fetch(value, show_progress) if isinstance(value, HubReference) else value


def load_model(path: Path | str, load_tensors: bool = True) -> Checkpoint:
    """The checkpoint at `path`: its spec checked, and where each tensor is (nothing read yet;
    load_tensors=False leaves `tensors` empty, for callers that only plan). Anything but a .gguf
    file is read as a Hugging Face directory, whose loader says what is missing."""
    path = Path(path)
    if is_gguf(path):
        # Imported here: the gguf package takes most of a second, and HF models never need it.
        from .gguf.load import load_gguf

        return load_gguf(path, load_tensors)
    return hf.load_hf(path, load_tensors)


def config_only_spec(path: Path | str) -> ModelSpec | None:
    """The spec of a configuration without weights (planned, never built), or None for a model
    with weights."""
    path = Path(path)
    return None if is_gguf(path) else hf.config_only_spec(path)


def config_only_held_types(path: Path | str) -> dict[str, str]:
    """What a configuration without weights says its checkpoint holds already quantized
    (Checkpoint.held_types: gpt-oss's MXFP4 experts); {} for most models."""
    return hf.config_only_held_types(Path(path))


def generation_config(path: Path | str) -> tuple[dict, Path]:
    """The model's generation settings ({} when it has none; a GGUF file carries none) and the file
    that holds them, to name in messages."""
    path = Path(path)
    return ({}, path) if is_gguf(path) else hf.generation_config(path)


def companion_files(path: Path | str) -> list[Path]:
    """The model's files that are not generation inputs but travel with it (its tokenizer files)."""
    path = Path(path)
    return [] if is_gguf(path) else hf.tokenizer_files(path)
