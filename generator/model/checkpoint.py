"""The checkpoint every model format gives (hf.load.HfCheckpoint, gguf.load.GgufCheckpoint): what
the stages above read, whatever file the model came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from .spec import ModelSpec


class ModelTensor(Protocol):
    """One tensor under its canonical name, read when asked. Small and picklable: a worker process
    given it reads the rows it needs from the file itself, so no process holds the whole model."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a float32 matrix (a vector is one row), values exactly as the model
        uses them."""
        ...

    def load(self) -> np.ndarray:
        """The whole tensor in its canonical shape (small tensors and tests; generation reads rows)."""
        ...


class Checkpoint(Protocol):
    @property
    def spec(self) -> ModelSpec: ...

    @property
    def tensors(self) -> Mapping[str, ModelTensor]:
        """Canonical name -> where its values are, in plan order (empty when loaded to plan only)."""
        ...

    @property
    def input_files(self) -> Sequence[Path]:
        """Every file the checkpoint was read from (the build's dependencies)."""
        ...

    @property
    def tensor_types(self) -> Mapping[str, str] | None:
        """Each tensor's block type in the file ("Q4_1", "F32", ...), which --quant gguf keeps; None
        for a format that stores plain floats."""
        ...

    @property
    def held_types(self) -> Mapping[str, str]:
        """Tensors a checkpoint of floats holds already quantized, by GGUF block type (gpt-oss's
        MXFP4 experts): kept exactly under every integer quantization. Empty for most models."""
        ...
