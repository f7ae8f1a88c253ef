"""generate(): one model through import -> quantize -> plan -> image -> emit, into a directory.

SCons calls this from its generation builder; the CLI never writes generated files itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..boards import Board
from ..errors import ColibriError
from ..files import write_atomic
from ..model.load import Checkpoint, load_model
from ..numerics.quantize import GGUF
from .emit import GENERATED_FILES, check_c_limits, render
from .image import default_jobs, write_image, write_rank_image
from .image_format import QUANT_CODES
from .layout import check_ranks, rank_image, rank_image_name
from .plan import Plan, plan_for_board

WEIGHTS_FILE = "weights.img"
PLAN_FILE = "plan.json"
PROGRESS_SECONDS = 2.0
OUTPUT_FILES = (*GENERATED_FILES, WEIGHTS_FILE, PLAN_FILE)
# The self-test's golden vectors, generated after the image by the NumPy reference (generator/selftest.py:
# the SConstruct's GOLDEN builder), compiled with model_data.c.
SELFTEST_DATA_FILE = "selftest_data.c"
SELFTEST_CHECKS_FILE = "selftest_checks.h"  # with it: the block types whose kernels the self-test checks


@dataclass(frozen=True)
class Generated:
    plan: Plan
    model_hash: bytes
    files: tuple[Path, ...]


def resolve_ctx(board: Board, max_position_embeddings: int, ctx: int | None) -> int:
    if ctx is None:
        return min(board.default_ctx, max_position_embeddings)
    return ctx


def model_default_quant(checkpoint: Checkpoint) -> str:
    """What a model is built with when --quant is not given: a GGUF file's own block types (its
    numbers, not re-rounded ones), or q8_0 for a checkpoint of plain floats."""
    return GGUF if checkpoint.tensor_types is not None else "q8_0"


def plan_checkpoint(
    checkpoint: Checkpoint,
    model_dir: Path,
    board: Board,
    quant: str | None,
    ctx: int | None,
    kv_type: str | None = None,
    ranks: int = 1,
) -> Plan:
    """The plan of a checkpoint for a board: --quant gguf takes each tensor's block type from the
    GGUF file it was read from; no --quant, the model's default (model_default_quant); no
    --kv-type, the board's."""
    quant = quant or model_default_quant(checkpoint)
    n_ctx = resolve_ctx(board, checkpoint.spec.max_position_embeddings, ctx)
    gguf_types = checkpoint.tensor_types
    if quant == GGUF and gguf_types is None:
        raise ColibriError(
            f"--quant gguf keeps a GGUF file's own blocks, and {model_dir} is not a GGUF file "
            f"(choose f32, q8_0, q4_0 or q4_1)"
        )
    held = dict(getattr(checkpoint, "held_types", None) or {})
    plan = plan_for_board(
        checkpoint.spec,
        board,
        quant,
        n_ctx,
        dict(gguf_types) if quant == GGUF else None,
        held_types=held,
        kv_type=kv_type,
        ranks=check_ranks(board, ranks),
    )
    check_c_limits(checkpoint.spec, plan)
    return plan


def generation_line(plan: Plan) -> str:
    """The line that opens a weight image's generation: what happens to the tensors. A GGUF
    file's blocks are copied as the file holds them, so only those quantized again are said to be."""
    n, size = len(plan.tensors), _megabytes(sum(t.nbytes for t in plan.tensors))
    if plan.quant != "gguf":
        return f"quantizing {n} tensors to {plan.quant} ({size})"
    _, again = plan.gguf_kept()
    if not again:
        return f"writing {n} tensors as the GGUF file holds them, none quantized again ({size})"
    into = ", ".join(sorted({dtype for _, _, dtype in again}))
    return (
        f"writing {n} tensors: {n - len(again)} as the GGUF file holds them, {len(again)} quantized "
        f"again to {into} ({size})"
    )


def requantized_note(plan: Plan, name: str, error) -> str:
    ggml_type = dict(plan.gguf_types)[name]
    return (
        f"note: {name} ({ggml_type} in the file) quantized again to {plan.tensor(name).dtype}: largest "
        f"error {error.largest:.3g}, RMS {error.rms:.3g}"
    )


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class QuantizeProgress:
    """Progress lines while the weights are written: one every PROGRESS_SECONDS, so a small model
    gets none beyond the opening line and a large one a line every few seconds, never a line per
    tensor: tensors and bytes done, and the time left at the rate so far."""

    def __init__(self, progress, clock=time.monotonic, verb: str = "quantizing"):
        self.progress, self.clock, self.verb = progress, clock, verb
        self.start = self.last = clock()

    def __call__(self, i: int, n: int, done: int, total: int) -> None:
        now = self.clock()
        if i < n and now - self.last >= PROGRESS_SECONDS:
            rate = done / max(now - self.start, 1e-9)
            eta = (total - done) / rate if rate > 0 else 0.0
            self.progress(
                f"{self.verb} weights: {i}/{n} tensors, {_megabytes(done)} of {_megabytes(total)}, {eta:.0f} s left"
            )
            self.last = now


def write_rank_images(plan: Plan, whole: Path, model_hash: bytes, out_dir: Path) -> tuple:
    """A build for several ranks: each rank's image (compile/layout.py rank_image) beside the whole one, under
    a hidden name until the sources naming their identities are written; ((RankImage, identity), ...)."""
    if plan.ranks == 1:
        return ()
    written = []
    for r in range(plan.ranks):
        rank = rank_image(plan.spec, plan.tensors, r, plan.ranks)
        staged = out_dir / f".{rank_image_name(rank.rank)}.staged"
        identity = write_rank_image(whole, plan.tensors, rank, model_hash, QUANT_CODES[plan.quant], staged)
        written.append((rank, identity))
    return tuple(written)


def generate(
    model_dir: Path,
    board: Board,
    quant: str,
    ctx: int | None,
    out_dir: Path,
    progress=None,
    jobs: int | None = None,
    kv_type: str | None = None,
    ranks: int = 1,
) -> Generated:
    """Generate every file for (model, board, quant, ctx) into out_dir. The weight image streams
    tensor by tensor (quantized in `jobs` worker processes; default: every core): memory stays
    bounded by the largest piece of a tensor, whatever the model's size. The bytes are the same at
    any job count."""
    checkpoint = load_model(model_dir)
    plan = plan_checkpoint(checkpoint, model_dir, board, quant, ctx, kv_type, ranks)

    report = None
    if progress:
        if quant != "f32":
            progress(generation_line(plan))
        report = QuantizeProgress(progress, verb="writing" if quant in ("f32", "gguf") else "quantizing")
    out_dir.mkdir(parents=True, exist_ok=True)
    # The image is written under a hidden name and takes its place last, after the sources that
    # name its hash: a failure anywhere leaves the previous generation whole (or nothing).
    staged = out_dir / f".{WEIGHTS_FILE}.staged"
    try:
        image = write_image(plan, checkpoint.tensors, staged, default_jobs() if jobs is None else jobs, report)
        if progress and plan.gguf_types:
            progress(f"note: {plan.gguf_summary()}")
            for name, error in image.requantized.items():
                progress(requantized_note(plan, name, error))
        if progress and plan.held_summary():
            progress(f"note: {plan.held_summary()}")
        rank_images = write_rank_images(plan, staged, image.model_hash, out_dir)
        sources = render(plan, image.model_hash, board, image.identity, rank_images)
        files = []
        for name, text in sources.items():
            write_atomic(out_dir / name, text)
            files.append(out_dir / name)
        write_atomic(out_dir / PLAN_FILE, plan.to_json())
        os.replace(staged, out_dir / WEIGHTS_FILE)
        for image_of_rank, _ in rank_images:
            name = rank_image_name(image_of_rank.rank)
            os.replace(out_dir / f".{name}.staged", out_dir / name)
            files.append(out_dir / name)
    finally:
        staged.unlink(missing_ok=True)
        for stale in out_dir.glob(".weights.rank*.img.staged"):
            stale.unlink()
    files += [out_dir / WEIGHTS_FILE, out_dir / PLAN_FILE]
    return Generated(plan, image.model_hash, tuple(files))
