"""A step whose logits hold a NaN or an infinity: an error on every side, never a token or a PASS
(docs/numerics.md, "Non-finite values"). The firmware (app/decode.c) and the reference
(reference.py) both check every step's logits and every layer's output, and name the first layer
whose output was not finite."""

from __future__ import annotations

import numpy as np

from ..errors import ColibriError

# The token and score frames' field (protocol 6): the first layer whose output was not finite, or
# HEAD when every layer's was and the final norm or the output matrix made the logits non-finite.
FIELD = "nonfinite"
HEAD = "head"


def all_finite(values: np.ndarray) -> bool:
    return bool(np.isfinite(values).all())


def where_text(layer: int | None) -> str:
    """Where the first non-finite value appeared, in words: a layer (0-based), or None for the
    final norm and output matrix."""
    if layer is None:
        return "in the final norm or the output matrix (every layer's output was finite)"
    return f"first in the output of layer {layer}"


class NonFiniteLogits(ColibriError):
    """`side` ("the firmware", "the reference") produced logits with a NaN or an infinity at `at`
    ("step 3", "prompt token 5"); `layer`: the first layer whose output was not finite (None: the
    final norm or output matrix)."""

    def __init__(self, side: str, at: str, layer: int | None) -> None:
        super().__init__(
            f"{side}'s logits at {at} hold a NaN or an infinity, {where_text(layer)}: the model's values "
            f'overflow float32 there (its weights are too large; docs/numerics.md, "Non-finite values")'
        )
        self.side, self.at, self.layer = side, at, layer
