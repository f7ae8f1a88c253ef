"""bench's figures of one run (speeds, the read bandwidth share, the expert cache) and their
summaries over the runs (medians, the probes' range, the in-RAM comparison, the bound a budgeted
token could reach, the bytes sent to a board over SSH)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, TypeVar

from ..boards import Board
from ..device.session import CacheStats, RemoteRun, RunRequest, RunResult, cache_stats
from ..documents import JsonDocument, json_meta
from ..verify import RunRates, rates, run_stats
from .plain import PlainFigures

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ..compile.plan import Plan


@dataclass(frozen=True)
class Latencies(PlainFigures):
    """Milliseconds between consecutive tokens."""

    p50: float
    p90: float
    p99: float
    max: float


def latency_percentiles(token_us: list[int]) -> Latencies | None:
    """The gaps between consecutive tokens' percentiles; None for a run of fewer than two tokens."""
    gaps = [(b - a) / 1000.0 for a, b in zip(token_us, token_us[1:])]
    if not gaps:
        return None
    q = statistics.quantiles(gaps, n=100, method="inclusive") if len(gaps) > 1 else gaps * 99
    # The interpolation between equal gaps can round a hair off them (0.027000000000000003 or
    # 0.026999999999999996 from gaps of 0.027): the percentiles are kept in order, none above the
    # largest gap.
    top = max(gaps)
    p50 = min(q[49], top)
    p90 = min(max(q[89], p50), top)
    p99 = min(max(q[98], p90), top)
    return Latencies(p50, p90, p99, top)


@dataclass(frozen=True)
class CacheFigures(JsonDocument):
    """One run's expert cache over its decode (or the median over the runs: cache_summary): the
    stats frame's counters, the hit rate, bytes read from storage and time waiting on reads per
    decoded token, the storage bandwidth the firmware measured just before, and the decode speed
    that bandwidth allows if a token only waited on its reads (bytes per token / bandwidth)."""

    stats: CacheStats = field(metadata=json_meta(flatten=True))
    hit_rate: float | None  # None: no expert was used
    read_bytes_per_token: float
    read_wait_ms_per_token: float
    storage_read_bytes_s: int | None  # None: no storage probe
    storage_direct: bool | None  # the probe read with O_DIRECT (else buffered, the page cache dropped)
    storage_bound_tok_s: float | None
    of_storage_bound: float | None


@dataclass(frozen=True)
class RunFigures(JsonDocument):
    """One run's speeds (labelled as verify.run_stats labels them when the board and request are
    known) and, where the firmware probed the read bandwidth just before it, that figure and the
    share of it the decode's weight reads took; its expert cache under a memory budget."""

    run: RunRates = field(metadata=json_meta(flatten=True))
    read_bandwidth_bytes_s: int | None
    bandwidth_fraction: float | None
    cache: CacheFigures | None


def run_figures(
    result: RunResult,
    weight_bytes: int,
    board: Board | None = None,
    request: RunRequest | None = None,
    plan: Plan | None = None,
) -> RunFigures:
    """One run's figures. The bandwidth share: weight bytes per token x this run's decode tok/s /
    this run's own probe (never another run's: the machine's bandwidth moves)."""
    r = run_stats(result, board, request, plan) if board is not None and request is not None else rates(result)
    bandwidth = int(result.bandwidth["read_bw"]) if result.bandwidth else None
    fraction = weight_bytes * r.decode_tok_s / bandwidth if bandwidth and r.decode_tok_s else None
    return RunFigures(r, bandwidth, fraction, cache_figures(result, r))


def cache_figures(result: RunResult, r: RunRates) -> CacheFigures | None:
    """One run's expert cache figures, or None when the board sent no cache fields."""
    c = cache_stats(result)
    if c is None:
        return None
    passes = int(result.stats.get("decode", 0))
    uses = c.expert_uses
    per_token = (c.read_bytes or 0) / passes if passes else 0.0
    storage = int(result.storage["read_bw"]) if result.storage else None
    return CacheFigures(
        stats=c,
        hit_rate=(c.cache_hits or 0) / uses if uses else None,
        read_bytes_per_token=per_token,
        read_wait_ms_per_token=(c.read_wait_us or 0) / 1000 / passes if passes else 0.0,
        storage_read_bytes_s=storage,
        storage_direct=bool(int(result.storage["direct"])) if result.storage else None,
        storage_bound_tok_s=storage / per_token if storage and per_token else None,
        of_storage_bound=(r.decode_tok_s * per_token / storage) if storage and per_token and r.decode_tok_s else None,
    )


Figures = TypeVar("Figures", bound="DataclassInstance")


def medians(items: list[Figures]) -> Figures:
    """Each numeric field's median over `items`; any other field (a flag, a name, absent) the last
    item's. A median of an even count of counters may be a half."""
    values: dict[str, object] = {}
    for f in fields(items[0]):
        numbers = [v for i in items if isinstance(v := getattr(i, f.name), (int, float)) and not isinstance(v, bool)]
        values[f.name] = statistics.median(numbers) if numbers else getattr(items[-1], f.name)
    return replace(items[-1], **values)


@dataclass(frozen=True)
class BoundFigures(PlainFigures):
    """Under a memory budget: the speed a token could reach at the measured hit rate, the storage
    bound (bandwidth / bytes read per token, if compute cost nothing) or the in-RAM speed (if reads
    cost nothing), whichever is lower and which one that is ("storage", "compute"); the in-RAM
    comparison's figures; the runs' median decode speed and its share of the bound."""

    bound_tok_s: float | None
    limited_by: str | None
    in_ram_tok_s: float | None
    of_in_ram: float | None
    decode_tok_s: float | None
    of_bound: float | None


@dataclass(frozen=True)
class CacheSummary(JsonDocument):
    """The expert cache over the runs: the median of each figure, and under a budget its bounds."""

    medians: CacheFigures = field(metadata=json_meta(flatten=True))
    bound: BoundFigures | None = field(metadata=json_meta(flatten=True))  # None: no budget


def cache_summary(runs: list[RunFigures]) -> CacheFigures | None:
    """The median over the runs of each cache figure (the counters included)."""
    figures = [r.cache for r in runs if r.cache]
    if not figures:
        return None
    return replace(medians(figures), stats=medians([f.stats for f in figures]))


@dataclass(frozen=True)
class ProbeRange(PlainFigures):
    """The read bandwidth probes' bytes/s over the runs."""

    min: int
    median: float
    max: int


@dataclass(frozen=True)
class BandwidthFigures(PlainFigures):
    """Over the runs: the probes' range, the median of the runs' own shares, and the decode speed
    the median bandwidth would allow if a token only read its weights (None: no probe)."""

    read_bandwidth_bytes_s: ProbeRange | None
    bandwidth_fraction: float | None
    bandwidth_limit_tok_s: float | None


def bandwidth_summary(weight_bytes: int, runs: list[RunFigures]) -> BandwidthFigures:
    """The runs' bandwidth figures summed up: the probes' min, median and max, the median share."""
    probes = [r.read_bandwidth_bytes_s for r in runs if r.read_bandwidth_bytes_s]
    shares = [r.bandwidth_fraction for r in runs if r.bandwidth_fraction is not None]
    if not probes:
        return BandwidthFigures(None, None, None)
    median = statistics.median(probes)
    return BandwidthFigures(
        ProbeRange(min(probes), median, max(probes)),
        statistics.median(shares) if shares else None,
        median / weight_bytes,
    )


def remote_summary(results: list[RunResult]) -> RemoteRun | None:
    """For runs on a board over SSH: the last run's board facts, and the bytes all the runs sent
    (the first run copies what the board lacks; the others send only their requests)."""
    last = results[-1].remote
    if not last:
        return None
    sent: dict[str, int] = {}
    for r in results:
        assert r.remote is not None  # every run of a bench goes to the same board
        for key, n in r.remote.bytes_sent.items():
            sent[key] = sent.get(key, 0) + n
    return replace(last, bytes_sent=sent)


@dataclass(frozen=True)
class InRamFigures(PlainFigures):
    """The same stream without a budget, run after each budgeted run: its median decode tok/s,
    each run's, the budgeted runs' share of it (the median of each pair's ratio), and what it is
    (or why it was skipped)."""

    decode_tok_s: float | None
    runs: list[float | None]
    of_in_ram: float | None
    note: str


def in_ram_summary(runs: list[RunFigures], ram_runs: list[RunFigures], skipped: str | None) -> InRamFigures | None:
    """The in-RAM comparison's figures; None when it did not run (no budget, or --no-in-ram)."""
    if skipped:
        return InRamFigures(None, [], None, skipped)
    if not ram_runs:
        return None
    speeds = [r.run.decode_tok_s for r in ram_runs]
    pairs = [
        a.run.decode_tok_s / b.run.decode_tok_s
        for a, b in zip(runs, ram_runs)
        if a.run.decode_tok_s and b.run.decode_tok_s
    ]
    measured = [s for s in speeds if s]
    return InRamFigures(
        statistics.median(measured) if measured else None,
        speeds,
        statistics.median(pairs) if pairs else None,
        "the same stream and build without a memory budget (the mapped image read in place), "
        "run after each budgeted run",
    )


def bound_figures(cache: CacheFigures, in_ram: InRamFigures | None, runs: list[RunFigures]) -> BoundFigures:
    """The bound a budgeted token could reach (the lower of the storage bound and the in-RAM
    speed), and the runs' median decode speed against it."""
    storage, ram = cache.storage_bound_tok_s, in_ram.decode_tok_s if in_ram else None
    limits = [(v, name) for v, name in ((storage, "storage"), (ram, "compute")) if v]
    bound, limited_by = min(limits) if limits else (None, None)
    measured = [s for r in runs if (s := r.run.decode_tok_s)]
    speed = statistics.median(measured) if measured else None
    return BoundFigures(
        bound_tok_s=bound,
        limited_by=limited_by,
        in_ram_tok_s=in_ram.decode_tok_s if in_ram else None,
        of_in_ram=in_ram.of_in_ram if in_ram else None,
        decode_tok_s=speed,
        of_bound=speed / bound if speed and bound else None,
    )
