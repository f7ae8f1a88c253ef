"""What bench measures besides tokens per second: the weight bytes one token reads, the memory
bandwidth of this machine (measured in the same run), and for an emulated MCU a prediction of an
ESP32-P4's speed from exact instruction counts."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from .plan import Plan

# The stated model behind the ESP32-P4 prediction: the HP core at 400 MHz retiring about one
# instruction per cycle, and weights streamed from PSRAM or flash at the low end of the measured
# 84-107 MB/s; a token takes whichever is longer (compute and memory do not overlap on this core).
P4_HZ = 400e6
P4_CYCLES_PER_INSTRUCTION = 1.0
P4_WEIGHT_BYTES_PER_S = 84e6


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


def read_bandwidth(megabytes: int = 256, repeats: int = 3) -> float:
    """This machine's single-thread memory read bandwidth in bytes/s: the best of a few sums over
    an array much larger than the caches."""
    data = np.ones(megabytes * 2**20 // 8, dtype=np.int64)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = max(best, data.nbytes / (time.perf_counter() - start))
    return best


def latency_percentiles(token_us: list[int]) -> dict:
    """Milliseconds between consecutive tokens: p50, p90, p99 and max."""
    gaps = [(b - a) / 1000.0 for a, b in zip(token_us, token_us[1:])]
    if not gaps:
        return {}
    q = statistics.quantiles(gaps, n=100, method="inclusive") if len(gaps) > 1 else gaps * 99
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(gaps)}


def predict_p4(instructions_per_token: float, bytes_per_token: int) -> dict:
    compute = instructions_per_token * P4_CYCLES_PER_INSTRUCTION / P4_HZ
    memory = bytes_per_token / P4_WEIGHT_BYTES_PER_S
    return {"tok_s": 1.0 / max(compute, memory), "compute_s": compute, "memory_s": memory,
            "model": f"{P4_HZ / 1e6:.0f} MHz, {P4_CYCLES_PER_INSTRUCTION} cycles/instruction, "
                     f"weights at {P4_WEIGHT_BYTES_PER_S / 1e6:.0f} MB/s, the slower of the two"}


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


def plot_rate_vs_context(path, contexts: list[int], rates: list[float], title: str) -> None:
    """A PNG of decode tok/s against context length (each token, and a 16-token moving median)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .emit import write_atomic

    window = 16
    smooth = [statistics.median(rates[max(0, i - window + 1):i + 1]) for i in range(len(rates))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(contexts, rates, ".", markersize=3, alpha=0.35, label="each token")
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
