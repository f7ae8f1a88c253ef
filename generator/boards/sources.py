"""The hand-written C a board's firmware is compiled from."""

from __future__ import annotations

from pathlib import Path

from ..errors import ColibriError
from ..files import REPO
from .board import Board


def firmware_sources(board: Board, repo: Path = REPO) -> list[Path]:
    """The hand-written C files a board's firmware is compiled from: the runtime, the board's kernel
    sets and parallel backend, the application and the BSP. (An ESP-IDF board's BSP is compiled by
    idf.py, which supplies its headers; the SConstruct compiles the rest as a check.)"""
    src = repo / "firmware_src"
    bsp = src / "bsp" / board.bsp
    kernels = [src / "runtime" / "kernels" / f"{k}.c" for k in board.kernels]
    for kernel in kernels:
        if not kernel.is_file():
            raise ColibriError(
                f"board {board.name}: kernel set {kernel.stem!r} has no firmware_src/runtime/kernels/{kernel.name}"
            )
    if not (bsp / "main.c").is_file():
        raise ColibriError(f"board {board.name}: no BSP at firmware_src/bsp/{board.bsp}/main.c")
    sources = (
        sorted((src / "runtime").glob("*.c"))
        + kernels
        + [src / "runtime" / "parallel" / f"{board.parallel}.c"]
        + sorted((src / "app").glob("*.c"))
        + sorted(bsp.glob("*.c"))
        + sorted(bsp.glob("*.S"))
    )
    if board.weights == "embedded":
        sources.append(src / "runtime" / "weights_embedded.S")  # the image linked into the program
    return sources
