"""The one exception type a user can cause: it carries a complete one-line message (NonFiniteLogits
is one, with where the logits stopped being finite)."""


class ColibriError(Exception):
    """A failure caused by the user's input or environment (not a bug).

    The CLI prints ``colibri: error: <message>`` and exits non-zero; the message must say what
    was wrong and, where possible, what to do about it.
    """


class NonFiniteLogits(ColibriError):
    """`side` ("the firmware", "the reference") produced logits with a NaN or an infinity at `at`
    ("step 3", "prompt token 5"); `layer`: the first layer whose output was not finite, None when
    every layer's was (the final norm or the output matrix made them). docs/numerics.md,
    "Non-finite values"."""

    def __init__(self, side: str, at: str, layer: int | None) -> None:
        where = (
            "in the final norm or the output matrix (every layer's output was finite)"
            if layer is None
            else f"first in the output of layer {layer}"
        )
        super().__init__(
            f"{side}'s logits at {at} hold a NaN or an infinity, {where}: the model's values overflow "
            f'float32 there (its weights are too large; docs/numerics.md, "Non-finite values")'
        )
        self.side, self.at, self.layer = side, at, layer
