"""Reading a model file's bytes: the one way both formats' tensor readers (gguf/tensors.py,
hf/safetensors_io.py) copy a range of a file into memory."""

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
