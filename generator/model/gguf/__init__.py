"""GGUF files (llama.cpp's format): the reader (file.py), tensor data (tensors.py), the import to
a ModelSpec and canonical tensors (load.py: the architectures in archs.py, the metadata read by
metadata.py, tensor names by names.py, the tensors' views by views.py) and the tokenizer in the
metadata (tokenizer.py).

Kept light: `is_gguf` is asked by every command, and the modules below import the `gguf` package,
which takes most of a second."""

from __future__ import annotations

from pathlib import Path


def is_gguf(path: Path | str) -> bool:
    """Whether `path` names a GGUF file: the one test of the format, by its suffix as llama.cpp's
    tools and the hub name them."""
    return Path(path).suffix.lower() == ".gguf"
