"""generate(): one model through import -> quantize -> plan -> image -> emit, into a directory.

SCons calls this from its generation builder; the CLI never writes generated files itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .emit import GENERATED_FILES, render
from ..files import write_atomic
from ..model.hf_import import load_checkpoint
from .image import build_image, identity_sha256
from .plan import Plan, plan_for_board
from .targets import Board

WEIGHTS_FILE = "weights.img"
PLAN_FILE = "plan.json"
PROGRESS_SECONDS = 2.0
OUTPUT_FILES = (*GENERATED_FILES, WEIGHTS_FILE, PLAN_FILE)


@dataclass(frozen=True)
class Generated:
    plan: Plan
    model_hash: bytes
    files: tuple[Path, ...]


def resolve_ctx(board: Board, max_position_embeddings: int, ctx: int | None) -> int:
    if ctx is None:
        return min(board.default_ctx, max_position_embeddings)
    return ctx


class QuantizeProgress:
    """Progress lines while quantizing: one every PROGRESS_SECONDS, so a small model gets none
    beyond the opening line and a large one a line every few seconds, never a line per tensor."""

    def __init__(self, progress, clock=time.monotonic):
        self.progress, self.clock = progress, clock
        self.last = clock()

    def __call__(self, i: int, n: int, name: str) -> None:
        now = self.clock()
        if i < n and now - self.last >= PROGRESS_SECONDS:
            self.progress(f"quantizing weights: {i}/{n} tensors")
            self.last = now


def generate(model_dir: Path, board: Board, quant: str, ctx: int | None, out_dir: Path,
             progress=None) -> Generated:
    checkpoint = load_checkpoint(model_dir)
    n_ctx = resolve_ctx(board, checkpoint.spec.max_position_embeddings, ctx)
    plan = plan_for_board(checkpoint.spec, board, quant, n_ctx)

    report = None
    if progress and quant != "f32":
        megabytes = sum(t.nbytes for t in plan.tensors) / 1e6
        progress(f"quantizing {len(plan.tensors)} tensors to {quant} ({megabytes:.1f} MB)")
        report = QuantizeProgress(progress)
    image = build_image(plan, checkpoint.tensors, report)
    sources = render(plan, image.model_hash, board, identity_sha256(image.data))
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for name, text in sources.items():
        write_atomic(out_dir / name, text)
        files.append(out_dir / name)
    write_atomic(out_dir / WEIGHTS_FILE, image.data)
    write_atomic(out_dir / PLAN_FILE, plan.to_json())
    files += [out_dir / WEIGHTS_FILE, out_dir / PLAN_FILE]
    return Generated(plan, image.model_hash, tuple(files))
