"""bench: runs the firmware --repeat times and measures what decoding costs and achieves: prefill
and decode tokens per second, latencies, peak memory, the weight bytes one token reads against the
memory read bandwidth the firmware measures next to each run (Linux boards), and for an emulated MCU
exact instruction counts and a prediction of an ESP32-P4's speed.

Its modules, by role: cost.py (bytes and multiply-accumulates per token, the predicted speed),
stream.py (what is decoded, and what it was fed), run.py (run_bench: the runs on the board),
figures.py (one run's figures and their summaries), result.py (BenchResult, the --json document),
text.py (bench's line of text), plot.py (--plot). The names the commands and tools use are
re-exported here."""

from __future__ import annotations

from .cost import attention_macs, decode_attention_macs, predict_speed, predicted_timing, weight_bytes_per_token
from .figures import ProbeRange, bandwidth_summary, run_figures
from .plot import check_plot
from .result import BenchResult, ClockedFigures
from .run import BenchRuns, default_repeat, probes_bandwidth, run_bench
from .stream import (
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_STEPS,
    DEFAULT_TEXT,
    SAMPLED,
    Stream,
    StreamFigures,
    default_steps,
    make_stream,
    read_text,
    repetition,
    synthetic_prompt,
)
from .text import bench_line

__all__ = [
    "DEFAULT_PROMPT_TOKENS",
    "DEFAULT_STEPS",
    "DEFAULT_TEXT",
    "SAMPLED",
    "BenchResult",
    "BenchRuns",
    "ClockedFigures",
    "ProbeRange",
    "Stream",
    "StreamFigures",
    "attention_macs",
    "bandwidth_summary",
    "bench_line",
    "check_plot",
    "decode_attention_macs",
    "default_repeat",
    "default_steps",
    "make_stream",
    "predict_speed",
    "predicted_timing",
    "probes_bandwidth",
    "read_text",
    "repetition",
    "run_bench",
    "run_figures",
    "synthetic_prompt",
    "weight_bytes_per_token",
]
