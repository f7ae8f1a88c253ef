"""bench's cost model: the weight bytes and multiply-accumulates one decoded token costs (the
matrices, and attention at a context), and the speed they predict on a board from exact
instruction counts (its [predict] timing model: the ESP32-P4's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..boards import Board, TimingModel, load_board
from ..compile.plan import Plan
from ..errors import ColibriError
from .plain import PlainFigures


def weight_bytes_per_token(plan: Plan) -> int:
    """Bytes of weights one decoded token reads: every tensor once, except the embedding table,
    of which it reads one row (unless the output head is tied to it, which reads all of it), and
    for MoE layers only k of the experts (their share of the expert bytes)."""
    spec = plan.spec
    total = 0
    for t in plan.tensors:
        if t.name == "embed":
            row = t.nbytes // t.rows
            total += t.nbytes if spec.tie_embeddings else row
        elif ".experts." in t.name:
            total += t.nbytes * spec.experts_per_token // spec.n_experts
        else:
            total += t.nbytes
    return total


def macs_per_token(plan: Plan) -> int:
    """Multiply-accumulates of the matrix products of one decoded token (attention excluded)."""
    spec = plan.spec
    total = 0
    for t in plan.tensors:
        if t.rows == 1 and t.name != "embed":
            continue  # norms and biases
        if t.name == "embed":
            total += t.rows * t.cols if spec.tie_embeddings else 0
        elif ".experts." in t.name:
            total += t.rows * t.cols * spec.experts_per_token // spec.n_experts
        else:
            total += t.rows * t.cols
    return total


def attention_macs(plan: Plan, context: int) -> int:
    """Multiply-accumulates of attention for one token that sees `context` positions (itself
    included): per layer and query head, the scores q . k_t and the weighted sum of the values,
    head_dim each per position the layer sees (all of them, or its sliding window)."""
    spec = plan.spec
    windows = spec.layer_windows or (0,) * spec.n_layers
    seen = sum(min(context, w) if w else context for w in windows)
    return spec.n_heads * 2 * spec.head_dim * seen


def decode_attention_macs(plan: Plan, prompt_tokens: int, steps: int) -> float:
    """Attention multiply-accumulates per decoded token of a run, averaged over its forward
    passes: after the prompt, `steps` tokens are sampled and all but the last are fed back, the
    i-th at position prompt_tokens + i, seeing prompt_tokens + i + 1 positions."""
    passes = steps - 1
    if passes < 1:
        return 0.0
    return sum(attention_macs(plan, prompt_tokens + i + 1) for i in range(passes)) / passes


def predicted_timing(board: Board) -> TimingModel:
    """The timing model of the board `board` stands in for (its board file's `predicts`, whose
    [predict] section holds it): what bench predicts that board's speed with."""
    target = load_board(board.predicts) if board.predicts else board
    if target.predict is None:
        raise ColibriError(
            f"{board.path.name}: bench needs a timing model to predict a board's speed from exact "
            f"instruction counts: `predicts` must name a board with a [predict] section"
        )
    return target.predict


@dataclass(frozen=True)
class PredictedSpeed(PlainFigures):
    """A board's speed predicted from exact instruction counts (seconds per token each way)."""

    tok_s: float
    compute_s: float
    memory_s: float
    model: str  # the timing model, described


def predict_speed(timing: TimingModel, instructions_per_token: float, bytes_per_token: int) -> PredictedSpeed:
    """A token takes whichever is longer: its instructions at the board's clock, or its weight reads."""
    compute = instructions_per_token * timing.cycles_per_instruction / timing.clock_hz
    memory = bytes_per_token / timing.weight_bytes_per_s
    return PredictedSpeed(1.0 / max(compute, memory), compute, memory, timing.describe())
