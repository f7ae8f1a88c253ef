"""Where the repository is, and writing files so that a failure never leaves half of one."""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The bundled model every command (and a bare `scons`) uses when none is named.
DEFAULT_MODEL = REPO / "models" / "kjv-tiny"


@contextmanager
def atomic_output(path: Path, mode: str = "wb"):
    """(file object, its temporary path) for writing `path`: a temporary file in the same directory,
    renamed onto `path` when the block ends, removed when it raises, so no partial file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f, tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write via a temporary file in the same directory, so a failure leaves no partial file."""
    with atomic_output(path) as (f, _):
        f.write(data.encode() if isinstance(data, str) else data)


def slug(text: str) -> str:
    """A name safe for a file or directory, from a model's name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"
