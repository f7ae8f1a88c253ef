"""What bench prints: its one line of text for a result (the speeds, the bandwidth share, the
stream and, under a memory budget, the expert cache), and a sweep's rows as a table (md, csv or
json) with the warning of a busy machine."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .result import BenchResult
from .stream import NGRAM, StreamFigures

if TYPE_CHECKING:
    pass


def bench_line(out: BenchResult, name: str) -> str:
    """bench's one line of text for a run_bench() result; `name` is the model's."""
    emulator = out.emulated_by
    at = f" at {out.remote.host}" if out.remote else ""
    where = f"on {out.board}{at}" + (f" EMULATED by {emulator}" if emulator else "")
    head = f"bench {name} {where} ({out.quant}, {out.kernels} kernels, "
    if out.counted:
        counted = out.counted
        instructions = counted.decode_instructions_per_token
        p4 = counted.predicted_esp32p4
        runs = "one run: the count is exact" if out.repeat == 1 else f"median of {out.repeat} identical runs"
        return (
            f"{head}{out.prompt_tokens}-token prompt, {out.decode_steps} steps, {runs}{stream_text(out)}): "
            f"{instructions / 1e6:.3f} M instructions per decoded token ({counted.instructions_counted}), "
            f"{counted.instructions_per_mac_with_attention:.2f} per multiply-accumulate: {out.macs_per_token:,} in "
            f"the matrices + {counted.attention_macs_per_token:,.0f} in attention at this context (mean "
            f"{counted.mean_context:g} positions); {counted.instructions_per_mac:.2f} per matrix multiply-accumulate "
            f"alone; {(counted.prefill_instructions_per_token or 0) / 1e6:.3f} M per prompt token; predicted ESP32-P4: "
            f"{p4.tok_s:.1f} tok/s ({p4.model})"
        )
    clocked = out.clocked
    assert clocked is not None  # a run either counts instructions or is timed
    ms = clocked.ms_per_token
    weights = f"{out.weight_bytes_per_token / 1e6:.1f} MB of weights per token"
    bandwidth = clocked.bandwidth.read_bandwidth_bytes_s
    if bandwidth is None:
        share = (
            f"{weights} (no bandwidth figure: the emulator's reads are not the board's)"
            if emulator
            else f"{weights} (no memory bandwidth probe under a memory budget: its buffer would break it)"
            if out.memory_budget and not out.memory_budget.unlimited
            else f"{weights} (no bandwidth figure)"
        )
    else:
        probe = clocked.read_bandwidth_probe
        assert probe is not None and clocked.bandwidth.bandwidth_limit_tok_s is not None  # the probe gave it
        share = (
            f"{weights} = {100 * (clocked.bandwidth.bandwidth_fraction or 0):.0f}% of the read bandwidth the "
            f"firmware measured just before each run (median of the runs' shares; probes {bandwidth.min / 1e9:.1f}–"
            f"{bandwidth.max / 1e9:.1f} GB/s, median {bandwidth.median / 1e9:.1f}, {probe.threads} "
            f"thread(s) over {probe.mib} MiB{' in 2 MiB pages' if probe.huge_pages else ''}; "
            f"limit {clocked.bandwidth.bandwidth_limit_tok_s:.0f} tok/s)"
        )
    label = ": the emulator's speed on this machine, not the board's" if emulator else ""
    return (
        f"{head}{out.threads} thread(s), {out.prompt_tokens}-token prompt, {out.decode_steps} steps, "
        f"median of {out.repeat}{stream_text(out)}): "
        f"prefill {clocked.prefill_tok_s:.1f} tok/s, decode {clocked.decode_tok_s:.1f} "
        f"tok/s (ms/token p50 {ms.p50 if ms else 0:.2f}, p99 {ms.p99 if ms else 0:.2f}){label}; {share}; "
        f"peak RSS {clocked.peak_rss_bytes / 2**20:.0f} MiB{cache_text(out)}"
    )


REPEATING = 0.5  # a stream with at least this share of repeated 4-grams is said to repeat


def stream_text(out: BenchResult) -> str:
    """bench's words on what it decoded."""
    return f"; stream: {out.stream.description}{stream_warning(out.stream)}"


def stream_warning(s: StreamFigures) -> str:
    """On a MoE model, a stream that repeats itself gives cache numbers no user sees: said so."""
    share = s.repeated_ngrams
    if not s.experts or not s.experts.per_token or share is None or share < REPEATING:
        return ""
    return (
        f"; it REPEATS: {100 * share:.0f}% of its {NGRAM}-grams occurred before in it, so routing repeats and "
        f"the expert cache hits more than a user's stream would"
    )


def cache_text(out: BenchResult) -> str:
    """bench's words on the expert cache: empty without a memory budget."""
    summary, plan = out.cache, out.memory_budget
    if not summary or not plan or plan.unlimited:
        return ""
    c, bound = summary.medians, summary.bound
    text = (
        f"; memory budget {plan.budget / 2**20:.0f} MiB: {plan.slots} expert slots "
        f"({plan.slots_per_layer:.2g} per MoE layer), "
        f"{100 * (c.hit_rate or 0):.1f}% hits ({c.stats.prefetch_hits:.0f} of them prefetched), "
        f"{c.read_bytes_per_token / 1e6:.2f} MB read per token, waiting {c.read_wait_ms_per_token:.2f} ms "
        f"per token on reads" + ("" if c.stats.locked and not c.stats.lock_refused else ", resident weights NOT locked")
    )
    if c.storage_read_bytes_s:
        how = "O_DIRECT" if c.storage_direct else "buffered, page cache dropped"
        text += (
            f"; storage reads {c.storage_read_bytes_s / 1e9:.2f} GB/s ({how}) in the same run: bound "
            f"{c.storage_bound_tok_s:.1f} tok/s if a token only read, "
            f"{100 * (c.of_storage_bound or 0):.0f}% of it reached"
        )
    ram = out.in_ram
    if ram and ram.decode_tok_s:
        text += (
            f"; in RAM (the same stream without the budget, alternating runs) {ram.decode_tok_s:.1f} tok/s, "
            f"{100 * (ram.of_in_ram or 0):.0f}% of it reached under the budget"
        )
    elif ram and ram.note:
        text += f"; in-RAM comparison {ram.note}"
    if bound and bound.bound_tok_s and bound.in_ram_tok_s and c.storage_bound_tok_s:
        text += (
            "; the storage bound is the tighter limit"
            if bound.limited_by == "storage"
            else "; the in-RAM speed is the tighter limit (compute, not reads, bounds this budget)"
        )
    return text


# ---- sweeps, as llama-bench runs them: comma-separated values of --threads, --prompt-tokens and
# --steps, a run (of --repeat runs) per combination, a row each, written as a Markdown table, CSV
# or JSON under llama-bench's column names where they mean the same (n_threads, n_prompt, n_gen,
# avg_ts, stddev_ts; pp_ for prompt processing, tg_ for text generation), and a warning when the
# machine's load would distort the numbers.

Counts = int | tuple[int, ...]  # an option of arguments.counts(): one value or several

COLUMNS = (
    "model",
    "board",
    "quant",
    "n_threads",
    "n_prompt",
    "n_gen",
    "repetitions",
    "pp_avg_ts",
    "pp_stddev_ts",
    "tg_avg_ts",
    "tg_stddev_ts",
)


def values_of(value: Counts | None) -> tuple:
    """The values an option of counts() holds: one (None included: the default) or several."""
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class Point:
    """One combination of a sweep."""

    threads: int
    prompt_tokens: int
    steps: int | None  # None: bench's default for the board and context


def points(threads: Counts, prompt_tokens: Counts, steps: Counts | None) -> list[Point]:
    """Every combination, threads slowest, then prompt lengths, then steps (llama-bench's order)."""
    return [
        Point(t, p, s) for t, p, s in itertools.product(values_of(threads), values_of(prompt_tokens), values_of(steps))
    ]


def is_sweep(threads: Counts, prompt_tokens: Counts, steps: Counts | None) -> bool:
    return len(points(threads, prompt_tokens, steps)) > 1


def _mean_and_stddev(speeds: list[float | None]) -> tuple[float | None, float | None]:
    known = [s for s in speeds if s is not None]
    if not known:
        return None, None
    return statistics.fmean(known), statistics.stdev(known) if len(known) > 1 else 0.0


def row(out: BenchResult, name: str) -> dict[str, object]:
    """One combination's row: its settings and the mean and standard deviation over its runs of
    the prompt's and the decode's tokens per second (an emulator's on an emulated board)."""
    pp = _mean_and_stddev([r.run.prefill_tok_s for r in out.runs])
    tg = _mean_and_stddev([r.run.decode_tok_s for r in out.runs])
    return dict(
        zip(
            COLUMNS,
            (name, out.board, out.quant, out.threads, out.prompt_tokens, out.decode_steps, len(out.runs), *pp, *tg),
            strict=True,
        )
    )


def _cell(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def format_rows(rows: list[dict[str, object]], output: str) -> str:
    """The rows as a Markdown table, CSV (a header line) or a JSON array of objects."""
    if output == "json":
        return json.dumps(rows, indent=2)
    if output == "csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows([_cell(r[c]) for c in COLUMNS] for r in rows)
        return text.getvalue().rstrip("\n")
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" if c.startswith(("n_", "pp", "tg", "rep")) else "---" for c in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


# A load average above this share of the cores, from other work, leaves the runs less than a core each.
BUSY_SHARE = 0.5


def machine_load() -> float:
    """The one-minute load average (processes running or waiting for a core)."""
    return os.getloadavg()[0]


def load_warning(before: float, after: float, cores: int, threads: int) -> str | None:
    """Why the machine's load would distort the numbers, or None: other work, measured before the
    bench and after it (less the bench's own threads), above half the cores."""
    others_after = max(0.0, after - threads)
    if max(before, others_after) <= BUSY_SHARE * cores:
        return None
    return (
        f"the machine is busy: load average {before:.1f} before the bench and {after:.1f} after it on "
        f"{cores} core(s) (its own runs add up to {threads}): other work takes turns on the cores the runs "
        f"are timed on, so the speeds are low and vary; bench again when the machine is idle"
    )
