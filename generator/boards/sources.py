"""The hand-written C a board's firmware is compiled from."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ColibriError
from ..files import REPO
from .board import Board


def kernel_set_sources(name: str, repo: Path = REPO) -> list[Path]:
    """A kernel set's C files: the folder firmware_src/runtime/kernels/<name>/ (an ISA's set, its
    files by role as ggml's arch/<isa>/), or the one file kernels/<name>.c (the scalar reference,
    the generic set)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ColibriError(f"kernel set {name!r}: a set's name is lower-case letters, digits and _")
    kernels = repo / "firmware_src" / "runtime" / "kernels"
    folder = kernels / name
    if folder.is_dir():
        files = sorted(folder.glob("*.c"))
        if files:
            return files
    elif (kernels / f"{name}.c").is_file():
        return [kernels / f"{name}.c"]
    raise ColibriError(f"kernel set {name!r} has no firmware_src/runtime/kernels/{name}/*.c or kernels/{name}.c")


def firmware_sources(board: Board, repo: Path = REPO) -> list[Path]:
    """The hand-written C files a board's firmware is compiled from: the runtime, the board's kernel
    sets, parallel backend and ranks (runtime/ranks/: several where the runner starts them), the
    application and the BSP. (An ESP-IDF board's BSP is compiled by
    idf.py, which supplies its headers; the SConstruct compiles the rest as a check.)"""
    src = repo / "firmware_src"
    bsp = src / "bsp" / board.bsp
    kernels = []
    for name in board.kernels:
        try:
            kernels += kernel_set_sources(name, repo)
        except ColibriError as e:
            raise ColibriError(f"board {board.name}: {e}") from None
    if not (bsp / "main.c").is_file():
        raise ColibriError(f"board {board.name}: no BSP at firmware_src/bsp/{board.bsp}/main.c")
    sources = (
        sorted((src / "runtime").glob("*.c"))
        + kernels
        + [src / "runtime" / "parallel" / f"{board.parallel}.c"]
        + [src / "runtime" / "ranks" / f"{board.runner.ranks}.c"]
        + sorted((src / "app").glob("*.c"))
        + sorted(bsp.glob("*.c"))
        + sorted(bsp.glob("*.S"))
    )
    if board.weights == "embedded":
        sources.append(src / "runtime" / "weights_embedded.S")  # the image linked into the program
    return sources
