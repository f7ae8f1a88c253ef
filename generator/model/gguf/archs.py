"""The architecture a GGUF file names (general.architecture), found in the family table
(model/family_facts.py: GGUF_ARCHITECTURES, and a llama file with experts is Mixtral)."""

from __future__ import annotations

from ...errors import ColibriError
from ..family_facts import (
    GGUF_ARCHITECTURES,
    GGUF_SIGMOID_GATED,
    GGUF_SIGMOID_GATED_BY_VOCABULARY,
    GGUF_WITH_EXPERTS,
    Family,
)
from .file import GgufFile


def arch_of(gguf: GgufFile) -> tuple[str, Family]:
    supported = ", ".join(GGUF_ARCHITECTURES)
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ColibriError(f"{gguf.path.name}: no general.architecture string in the metadata (supported: {supported})")
    if arch not in GGUF_ARCHITECTURES:
        raise ColibriError(f"{gguf.path.name}: unsupported architecture {arch!r} (supported: {supported})")
    if arch in GGUF_WITH_EXPERTS and gguf.metadata.get(f"{arch}.expert_count", 0):
        return arch, GGUF_WITH_EXPERTS[arch]
    if arch in GGUF_SIGMOID_GATED and gguf.metadata.get(f"{arch}.expert_gating_func") == 2:
        vocabulary = gguf.metadata.get("tokenizer.ggml.pre")
        if isinstance(vocabulary, str) and (arch, vocabulary) in GGUF_SIGMOID_GATED_BY_VOCABULARY:
            return arch, GGUF_SIGMOID_GATED_BY_VOCABULARY[arch, vocabulary]
        return arch, GGUF_SIGMOID_GATED[arch]
    return arch, GGUF_ARCHITECTURES[arch]
