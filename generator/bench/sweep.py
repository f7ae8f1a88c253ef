"""bench's sweeps, as llama-bench runs them: comma-separated values of --threads, --prompt-tokens
and --steps, a run (of --repeat runs) per combination, a row each, written as a Markdown table,
CSV or JSON under llama-bench's column names where they mean the same (n_threads, n_prompt,
n_gen, avg_ts, stddev_ts; pp_ for prompt processing, tg_ for text generation), and a warning when
the machine's load would distort the numbers."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import statistics
from dataclasses import dataclass

from .result import BenchResult

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


def values_of(value: int | tuple[int, ...] | None) -> tuple:
    """The values an option of counts() holds: one (None included: the default) or several."""
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class Point:
    """One combination of a sweep."""

    threads: int
    prompt_tokens: int
    steps: int | None  # None: bench's default for the board and context


def points(threads, prompt_tokens, steps) -> list[Point]:
    """Every combination, threads slowest, then prompt lengths, then steps (llama-bench's order)."""
    return [
        Point(t, p, s) for t, p, s in itertools.product(values_of(threads), values_of(prompt_tokens), values_of(steps))
    ]


def is_sweep(threads, prompt_tokens, steps) -> bool:
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
