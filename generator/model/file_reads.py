"""Reading a model file's bytes: the one way both formats' tensor readers (gguf/tensors.py,
hf/safetensors_io.py) copy a range of a file into memory, and the one check of the weights they
read (check_weights).

The largest weight a model may hold (docs/numerics.md, "Non-finite values"): every value a
tensor is read as, after dequantizing, within +-2^32 (4.29e9), NaN and infinities refused.

Why 2^32: a matrix's input is a normed activation (RMSNorm: |x_i| <= sqrt(width) * the largest norm
weight), so a product row . x sums at most 2^24 terms of at most 2^32 * 2^12 * 2^32, below 2^100:
no single matrix product of an admitted model overflows float32 (2^128). Products of products
(queries . keys, gate * up) still can; those are caught where they happen, by the per-layer check
of the firmware and the reference. The largest weight of the models Colibri is tested with is
below 2^11 (Gemma 3 270M: 1,657, a norm; SmolLM2-135M: 9.25; kjv-tiny: 3.35; the random-init test
models: below 2): real models sit far inside the limit, and a weight of 3e38 (among the largest
float32s, finite but meaningless) is refused by name instead of decoding NaN."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ColibriError


def read_exactly(path: Path, start: int, nbytes: int, truncated: str, unreadable: str) -> np.ndarray:
    """`nbytes` of the file from `start` into a new array: the kernel copies them once (a mapping
    would fault page by page), and a file cut short while it is read is an error (`truncated`), not
    a crash; an OS error is `unreadable` with its reason."""
    out = np.empty(nbytes, np.uint8)
    view = memoryview(out)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            while view:
                n = os.preadv(fd, [view], start)
                if n <= 0:
                    raise ColibriError(truncated)
                view, start = view[n:], start + n
        finally:
            os.close(fd)
    except OSError as e:
        raise ColibriError(f"{unreadable}: {e.strerror or e}") from None
    return out


WEIGHT_LIMIT = 2.0**32
# MXFP4 blocks: an e8m0 byte below this one cannot take a value (at most 6 * 2^(e - 127)) past the
# limit; blocks with a larger one are decoded and checked.
E8M0_FIRST_CHECKED = 157


def within_limit(values: np.ndarray) -> bool:
    """Every value finite and within +-WEIGHT_LIMIT (NaN fails the comparison)."""
    return bool(np.all(np.abs(values) <= WEIGHT_LIMIT))


def check_weights(where: str, name: str, values: np.ndarray) -> None:
    """`values` (a tensor, or rows of it, as float32) all finite and within +-WEIGHT_LIMIT; `where`
    the file, `name` the tensor, as the one-line error names them."""
    if values.size == 0:
        return
    high, low = float(np.max(values)), float(np.min(values))  # NaN propagates through both
    if not (np.isfinite(high) and np.isfinite(low)):
        raise ColibriError(f"{where}: tensor {name!r} contains NaN or Inf")
    peak = max(high, -low)
    if peak > WEIGHT_LIMIT:
        raise ColibriError(
            f"{where}: tensor {name!r} holds a weight of {high if high >= -low else low:.4g}, beyond the "
            f"+-2^32 ({WEIGHT_LIMIT:.3g}) a weight may be: its products overflow float32 "
            f'(docs/numerics.md, "Non-finite values")'
        )
