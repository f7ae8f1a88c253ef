"""bench --plot: decode tok/s against context length, per token over the runs, as a PNG."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

from ..boards import Board
from ..device.session import RunResult
from ..errors import ColibriError


def rate_by_context(n_prompt: int, token_us_runs: list[list[int]]) -> tuple[list[int], list[float]]:
    """Decode tok/s at each context length: per token, the median over the runs of the gap to the
    previous token, as a rate. The token at index i (i >= 1) was computed with n_prompt + i
    positions in the KV cache."""
    gaps = [[(b - a) for a, b in zip(us, us[1:])] for us in token_us_runs]
    n = min(len(g) for g in gaps)
    contexts, rates = [], []
    for i in range(n):
        gap = statistics.median(g[i] for g in gaps)
        if gap > 0:
            contexts.append(n_prompt + i + 1)
            rates.append(1e6 / gap)
    return contexts, rates


def plot_rate_vs_context(path: Path, contexts: list[int], tok_s: list[float], title: str) -> None:
    """A PNG of decode tok/s against context length (each token, and a 16-token moving median)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..files import write_atomic

    window = 16
    smooth = [statistics.median(tok_s[max(0, i - window + 1) : i + 1]) for i in range(len(tok_s))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(contexts, tok_s, ".", markersize=3, alpha=0.35, label="each token")
    ax.plot(contexts, smooth, "-", linewidth=2, label=f"moving median of {window}")
    ax.set_xlabel("context length (positions in the KV cache)")
    ax.set_ylabel("decode tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    write_atomic(Path(path), png.getvalue())  # never a half-written PNG


def check_plot(board: Board, plot: Path | None, steps: int) -> None:
    if plot is None:
        return
    if board.runner.counts_instructions_exactly():
        raise ColibriError(
            f"--plot draws tok/s against wall-clock time; {board.name} is emulated and "
            f"reports exact instruction counts instead (use --json)"
        )
    if plot.suffix.lower() != ".png":
        raise ColibriError(f"--plot writes a PNG image: name it with .png (got {plot.name})")
    if steps < 3:
        raise ColibriError("--plot needs at least 3 decode steps (--steps)")
    if not plot.parent.is_dir():
        raise ColibriError(f"--plot: directory {plot.parent} does not exist")


def plot_runs(
    path: Path, prompt_tokens: int, results: list[RunResult], title: str, progress: Callable[[str], None] | None
) -> None:
    """--plot's PNG of the runs: decode tok/s at each context length (the median over the runs)."""
    contexts, per_token = rate_by_context(prompt_tokens, [r.token_us for r in results])
    plot_rate_vs_context(path, contexts, per_token, title)
    if progress:
        progress(f"wrote {path}: decode tok/s against context length {contexts[0]}..{contexts[-1]}")
