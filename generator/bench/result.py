"""bench's result (BenchResult, the --json document): what ran where, each run's figures, and
either an emulated MCU's exact instruction counts (CountedFigures) or wall-clock speeds
(ClockedFigures)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ..boards import Board
from ..compile.cache_plan import CachePlan
from ..compile.plan import Plan
from ..device.session import RemoteRun, RunResult
from ..documents import JsonDocument, json_field, json_meta
from ..verify import RunRates, RunStats
from .cost import PredictedSpeed, decode_attention_macs, macs_per_token, predict_speed, predicted_timing
from .figures import (
    BandwidthFigures,
    CacheSummary,
    InRamFigures,
    Latencies,
    RunFigures,
    bandwidth_summary,
    latency_percentiles,
)
from .plain import PlainFigures
from .stream import StreamFigures

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class CountedFigures(PlainFigures):
    """An emulated MCU's exact instruction counts (an emulator's clock is not the board's): per
    decoded token, per prompt token, per multiply-accumulate two ways (of the matrices alone, fixed
    per token, and with attention's, which grow with the context: averaged over the run's decode
    passes), and the speed they predict on an ESP32-P4."""

    instructions_counted: str | None  # what a token's count includes
    decode_instructions_per_token: float
    prefill_instructions_per_token: float | None
    instructions_per_mac: float
    attention_macs_per_token: float
    mean_context: float
    instructions_per_mac_with_attention: float
    predicted_esp32p4: PredictedSpeed


@dataclass(frozen=True)
class BandwidthProbe:
    """How the firmware probed the read bandwidth (the first run's probe)."""

    mib: int
    threads: int
    passes: int
    huge_pages: bool  # its buffer in 2 MiB pages, as the weights are when the firmware reads them into memory


@dataclass(frozen=True)
class ClockedFigures(JsonDocument):
    """Wall-clock figures (boards that do not count instructions): the medians over the runs,
    the middle run's latencies, the peak RSS, and the read bandwidth the firmware measured."""

    prefill_tok_s: float | None
    decode_tok_s: float | None
    forward_only_tok_s: float | None
    # None: a run of fewer than two tokens (in the document: {})
    ms_per_token: Latencies | None = field(
        metadata=json_meta(convert=lambda latencies: latencies.to_json() if latencies else {})
    )
    peak_rss_bytes: int
    bandwidth: BandwidthFigures = field(metadata=json_meta(flatten=True))
    read_bandwidth_probe: BandwidthProbe | None


@dataclass(frozen=True)
class BenchResult(JsonDocument):
    """bench's figures: what ran where, each run's, the stream, the expert cache, the in-RAM
    comparison, and either exact instruction counts (`counted`) or wall-clock speeds (`clocked`).
    to_json() is the --json document."""

    board: str
    model: str
    architecture: str
    quant: str
    n_ctx: int
    threads: int
    kernels: str
    prompt_tokens: int
    decode_steps: int
    repeat: int
    # Under an emulator, wall-clock figures are the emulator's on this machine, not the board's.
    emulated_by: str | None
    speed_note: str | None
    weight_bytes_per_token: int
    macs_per_token: int
    runs: list[RunFigures]
    # the expert cache as the firmware ran it
    memory_budget: CachePlan | None = field(metadata=json_meta(convert=lambda plan: plan.to_dict() if plan else None))
    stream: StreamFigures
    cache: CacheSummary | None
    in_ram: InRamFigures | None
    remote: RemoteRun | None  # remote_summary
    counted: CountedFigures | None = field(metadata=json_meta(flatten=True))
    clocked: ClockedFigures | None = field(metadata=json_meta(flatten=True))
    plot: str | None = json_field(default=None, omit_none=True)  # the PNG written


def counted_figures(
    plan: Plan, board: Board, first: RunRates, prompt_tokens: int, steps: int, weight_bytes: int
) -> CountedFigures:
    """An emulated MCU's figures from the first run's exact counts (every run counts the same)."""
    instructions = first.decode_instructions_per_token
    assert instructions  # a run that counts instructions
    macs = macs_per_token(plan)
    attention = decode_attention_macs(plan, prompt_tokens, steps)
    return CountedFigures(
        instructions_counted=first.instructions_counted if isinstance(first, RunStats) else None,
        decode_instructions_per_token=instructions,
        prefill_instructions_per_token=first.prefill_instructions_per_token,
        instructions_per_mac=instructions / macs,
        attention_macs_per_token=attention,
        mean_context=prompt_tokens + steps / 2,  # of contexts P+1 .. P+S-1
        instructions_per_mac_with_attention=instructions / (macs + attention),
        predicted_esp32p4=predict_speed(predicted_timing(board), instructions, weight_bytes),
    )


def clocked_figures(results: list[RunResult], runs: list[RunFigures], weight_bytes: int) -> ClockedFigures:
    """Wall-clock figures over the runs: the medians, the middle run's latencies, the peak RSS, the
    read bandwidth and how the first run's probe measured it."""
    latencies = [latency_percentiles(r.token_us) for r in results]
    first_probe = results[0].bandwidth
    return ClockedFigures(
        # A run without a figure gives None (one run) or fails to sort beside the others' numbers.
        prefill_tok_s=statistics.median(cast(list[float], [r.run.prefill_tok_s for r in runs])),
        decode_tok_s=statistics.median(cast(list[float], [r.run.decode_tok_s for r in runs])),
        forward_only_tok_s=statistics.median(cast(list[float], [r.run.forward_tok_s for r in runs])),
        ms_per_token=latencies[len(latencies) // 2],
        peak_rss_bytes=max(int(r.stats.get("peak_rss", 0)) for r in results),
        bandwidth=bandwidth_summary(weight_bytes, runs),
        read_bandwidth_probe=BandwidthProbe(
            int(first_probe["mib"]),
            int(first_probe["threads"]),
            int(first_probe["passes"]),
            first_probe.get("huge_pages") == "1",
        )
        if first_probe
        else None,
    )
