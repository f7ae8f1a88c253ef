"""bench: runs the firmware --repeat times and measures what decoding costs and achieves: prefill
and decode tokens per second, latencies, peak memory, the weight bytes one token reads against the
memory read bandwidth the firmware measures next to each run (Linux boards), and for an emulated MCU
exact instruction counts and a prediction of an ESP32-P4's speed.

What it decodes (the Stream): on a MoE model a token stream a user's could be, because the stream
decides the routing and so the expert cache's hits: a text teacher-forced one token per forward pass
(the bundled Book of Ruth, or --text), or sampled decoding with a fixed seed. On a dense model every
token reads every weight whatever it is, so the default stays the fixed synthetic prompt and greedy
decoding (the numbers stay comparable with earlier ones and with llama-bench's)."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar, cast

from .boards import Board, TimingModel, load_board
from .compile.build import Artifacts
from .compile.cache_plan import AutoElsewhere, CachePlan
from .compile.plan import Plan
from .device.remote import Remote, remote_prefix
from .device.runner import run_on_board
from .device.session import CacheStats, RemoteRun, RunRequest, RunResult, cache_stats, check_fits_context
from .errors import ColibriError
from .files import REPO
from .numerics.sampling import SamplingParams
from .verify import RunRates, RunStats, rates, run_stats, speed_text

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from .model.tokenizer import Tokenizer


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


@dataclass(frozen=True)
class Latencies:
    """Milliseconds between consecutive tokens."""

    p50: float
    p90: float
    p99: float
    max: float

    def to_json(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max}


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
class PredictedSpeed:
    """A board's speed predicted from exact instruction counts (seconds per token each way)."""

    tok_s: float
    compute_s: float
    memory_s: float
    model: str  # the timing model, described

    def to_json(self) -> dict[str, float | str]:
        return {"tok_s": self.tok_s, "compute_s": self.compute_s, "memory_s": self.memory_s, "model": self.model}


def predict_speed(timing: TimingModel, instructions_per_token: float, bytes_per_token: int) -> PredictedSpeed:
    """A token takes whichever is longer: its instructions at the board's clock, or its weight reads."""
    compute = instructions_per_token * timing.cycles_per_instruction / timing.clock_hz
    memory = bytes_per_token / timing.weight_bytes_per_s
    return PredictedSpeed(1.0 / max(compute, memory), compute, memory, timing.describe())


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

    from .files import write_atomic

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


# The firmware sizes the probe's buffer itself, from the caches of the machine it runs on: twice the
# largest, at least 256 MiB (firmware_src/bsp/linux/read_probe.c).
PROBE_MIB = 0


def synthetic_prompt(plan: Plan, n: int) -> list[int]:
    """A fixed prompt of n tokens: the BOS token, then ids spread over the vocabulary."""
    vocab = plan.spec.vocab_size
    start = plan.spec.bos_token_id if plan.spec.bos_token_id is not None else 1
    return [start] + [(7919 * (i + 1)) % vocab for i in range(n - 1)]


# ---- the token stream ------------------------------------------------------------------------

DEFAULT_TEXT = REPO / "docs" / "texts" / "ruth-kjv.txt"  # public domain (docs/texts/README.md)
STREAMS = ("text", "sampled", "synthetic")
# The sampled stream's settings when the model's generation_config.json does not ask for sampling.
SAMPLED = SamplingParams(temperature=1.0, top_p=0.95)
NGRAM = 4  # the stream's repetition: the share of its 4-grams that occurred earlier in it


@dataclass(frozen=True)
class Stream:
    """The tokens bench feeds the model. `prompt` is prefilled in batches, as a user's prompt is;
    then every decode step is one forward pass, as a user's decode is. kind "text": each step's
    token is the text's next one (`forced`, teacher forcing: the request's decode_from), not the
    model's; "sampled": sampled from the logits with `sampling` (a fixed seed); "synthetic": the
    fixed prompt of ids spread over the vocabulary, then greedy decoding (which settles into a loop
    on most models, so its routing repeats)."""

    kind: str
    prompt: list[int]
    forced: list[int] = field(default_factory=list)
    sampling: SamplingParams = SamplingParams()
    source: str | None = None  # the text file
    text_tokens: int | None = None  # the text's length in the model's tokens

    def request_prompt(self, steps: int) -> list[int]:
        """The request's prompt: the prefilled part, then the text tokens fed by the first steps - 1
        decode steps (the last step's token is never fed back, so it need not be sent: the request
        then fits a context of prompt + steps - 1, as any decode's does)."""
        return self.prompt + self.forced[: max(0, steps - 1)]

    def decode_from(self, steps: int) -> int | None:
        return len(self.prompt) if self.forced and steps > 1 else None

    def describe(self, steps: int) -> str:
        if self.kind == "text":
            return (
                f"{Path(self.source or '').name} teacher-forced: {len(self.prompt)} prompt tokens prefilled, then "
                f"{steps - 1} of its tokens decoded one per forward pass"
            )
        if self.kind == "sampled":
            s = self.sampling
            return (
                f"sampled decoding (temperature {s.temperature:g}"
                + (f", top-p {s.top_p:g}" if s.top_p < 1 else "")
                + (f", top-k {s.top_k}" if s.top_k else "")
                + (f", min-p {s.min_p:g}" if s.min_p else "")
                + f", seed {s.seed}) after a {len(self.prompt)}-token synthetic prompt"
            )
        return f"synthetic {len(self.prompt)}-token prompt, greedy decoding"


def read_text(path: Path) -> str:
    """--text's file as text: missing, unreadable, empty or binary is one clear error."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ColibriError(f"--text {path}: {e.strerror or e}") from None
    if b"\0" in data:
        raise ColibriError(f"--text {path}: a binary file (it holds NUL bytes), not a text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ColibriError(f"--text {path}: not UTF-8 text (a binary file?)") from None
    if not text.strip():
        raise ColibriError(f"--text {path}: the file is empty: bench needs a text to feed the model")
    return text


def default_stream(plan: Plan, has_tokenizer: bool) -> str:
    """A MoE model's routing follows its tokens, so it gets a user-like stream: the bundled text
    (or sampling, without a tokenizer to read it); a dense model, whose every token reads every
    weight, keeps the synthetic stream."""
    if not plan.spec.n_experts:
        return "synthetic"
    return "text" if has_tokenizer else "sampled"


def make_stream(
    plan: Plan,
    tokenizer: Tokenizer | None,
    kind: str | None,
    text: Path | None,
    sampling: SamplingParams,
    prompt_tokens: int,
    steps: int | None,
    sampling_flags: Sequence[str] = (),
) -> tuple[Stream, int]:
    """The stream bench decodes and its steps (default_steps, or fewer when the text is shorter).
    kind None: --text's, the sampled one if sampling_flags (the flags that set `sampling`) were
    given, else default_stream's. Everything is checked here, before anything is built."""
    if text is not None and kind not in (None, "text"):
        raise ColibriError(f"--text feeds a text, and --stream {kind} does not: give one or the other")
    if sampling_flags and (kind not in (None, "sampled") or text is not None):
        raise ColibriError(
            f"{' and '.join(sampling_flags)} set the sampled stream, not "
            f"{'--text' if text is not None else f'--stream {kind}'}'s: give one or the other"
        )
    kind = kind or (
        "text" if text is not None else "sampled" if sampling_flags else default_stream(plan, tokenizer is not None)
    )
    chosen = steps if steps is not None else default_steps(plan, prompt_tokens)
    if kind == "synthetic":
        return Stream("synthetic", synthetic_prompt(plan, prompt_tokens)), chosen
    if kind == "sampled":
        return Stream("sampled", synthetic_prompt(plan, prompt_tokens), sampling=sampling), chosen
    path = Path(text) if text is not None else DEFAULT_TEXT
    if tokenizer is None:
        raise ColibriError(
            f"the text stream needs the model's tokenizer (tokenizer.json) to tokenize {path}; use --stream sampled"
        )
    tokens = tokenizer.encode(read_text(path))
    if not tokens:
        raise ColibriError(f"--text {path}: encodes to no tokens")
    bad = [t for t in tokens if t >= plan.spec.vocab_size]
    if bad:
        raise ColibriError(
            f"--text {path}: the tokenizer gives id {bad[0]}, outside the model's vocabulary ({plan.spec.vocab_size})"
        )
    if steps is None:
        chosen = min(chosen, len(tokens) - prompt_tokens + 1)
    if len(tokens) < prompt_tokens + chosen - 1 or chosen < 1:
        raise ColibriError(
            f"--text {path} is {len(tokens)} tokens, and a {prompt_tokens}-token prompt and "
            f"{max(chosen, 1)} steps need {prompt_tokens + max(chosen, 1) - 1}: give a longer text, "
            f"fewer --steps or fewer --prompt-tokens"
        )
    return Stream(
        "text",
        tokens[:prompt_tokens],
        tokens[prompt_tokens : prompt_tokens + chosen - 1],
        source=str(path),
        text_tokens=len(tokens),
    ), chosen


def repetition(tokens: list[int], n: int = NGRAM) -> float | None:
    """The share of the n-grams of `tokens` that occurred earlier in it: 0 for a stream that never
    repeats itself, near 1 for one stuck in a loop."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return None
    return 1 - len(set(grams)) / len(grams)


def fed_tokens(stream: Stream, request: RunRequest, result: RunResult) -> list[int]:
    """The tokens the decode passes fed the model: the text's (teacher forcing) or the ones
    sampled, all but the last step's (never fed back)."""
    if stream.forced:
        return request.prompt[len(stream.prompt) :]
    return result.tokens[:-1]


@dataclass(frozen=True)
class StreamExperts:
    """On a MoE model: the experts a token takes, of how many, and the distinct experts each MoE
    layer used over the run (keys: the layer, as a string, as the JSON names it)."""

    per_token: int
    n_experts: int
    used_per_layer: dict[str, int]


@dataclass(frozen=True)
class StreamFigures:
    """What the decode was fed and how varied it was."""

    kind: str
    text: str | None  # the text file
    text_tokens: int | None
    sampling: SamplingParams | None  # the sampled stream's settings
    prompt_tokens: int
    decoded_tokens_fed: int
    distinct_tokens: int
    repeated_ngrams: float | None  # the share of its NGRAM-grams that occurred earlier in it
    description: str
    experts: StreamExperts | None  # None: a dense model

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": self.kind,
            "text": self.text,
            "text_tokens": self.text_tokens,
            "sampling": asdict(self.sampling) if self.sampling else None,
            "prompt_tokens": self.prompt_tokens,
            "decoded_tokens_fed": self.decoded_tokens_fed,
            "distinct_tokens": self.distinct_tokens,
            f"repeated_{NGRAM}grams": self.repeated_ngrams,
            "description": self.description,
        }
        if self.experts:
            out["experts_per_token"] = self.experts.per_token
            out["n_experts"] = self.experts.n_experts
            out["experts_used_per_layer"] = self.experts.used_per_layer
        return out


def stream_figures(stream: Stream, request: RunRequest, result: RunResult, plan: Plan, steps: int) -> StreamFigures:
    """What the decode was fed and how varied it was: its repetition, its distinct tokens and, on
    a MoE model, the distinct experts each MoE layer used (over the prompt and the decode) against
    the top-k a token takes."""
    fed = fed_tokens(stream, request, result)
    experts = (
        StreamExperts(
            plan.spec.experts_per_token,
            plan.spec.n_experts,
            {str(layer): sum(1 for c in counts if c) for layer, counts in sorted(result.expert_counts.items())},
        )
        if result.expert_counts
        else None
    )
    return StreamFigures(
        kind=stream.kind,
        text=stream.source,
        text_tokens=stream.text_tokens,
        sampling=stream.sampling if stream.kind == "sampled" else None,
        prompt_tokens=len(stream.prompt),
        decoded_tokens_fed=len(fed),
        distinct_tokens=len(set(fed)),
        repeated_ngrams=repetition(fed),
        description=stream.describe(steps),
        experts=experts,
    )


def check_forced(stream: Stream, request: RunRequest, result: RunResult) -> None:
    """A teacher-forced run's token frames name the text's tokens: else the board did not decode
    the stream it was sent."""
    n = len(request.prompt) - len(stream.prompt)
    if n and result.tokens[:n] != request.prompt[len(stream.prompt) :]:
        raise ColibriError(
            "the board decoded other tokens than the text's: its firmware does not teacher-force "
            "(decode_from, protocol 4); build and flash this version"
        )


def in_ram_fits(image: Path) -> str | None:
    """Why the in-RAM comparison cannot run here (the image exceeds the memory available), or None."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
    except (OSError, ValueError):
        return None
    available, size = info.get("MemAvailable"), os.path.getsize(image)
    if available is not None and size > available:
        return (
            f"skipped: the weight image ({size / 1e9:.2f} GB) exceeds the memory available here "
            f"({available / 1e9:.2f} GB), so a run without a budget would not run in RAM"
        )
    return None


def probes_bandwidth(board: Board, remote: Remote | None = None) -> bool:
    """Whether bench has the firmware measure the read bandwidth next to each run: on Linux boards
    that run natively, here or on a board reached over SSH (the probe runs in the firmware, so on
    the board). Under an emulator (linux-aarch64 on this x86 machine, or a remote prefix) the figure
    would be the emulator's, not the board's; MCUs report instruction counts instead."""
    if not board.runner.probes_bandwidth:
        return False
    return not remote_prefix(board) if remote is not None else not board.runner.needs_emulator()


@dataclass(frozen=True)
class CacheFigures:
    """One run's expert cache over its decode (or the median over the runs: cache_summary): the
    stats frame's counters, the hit rate, bytes read from storage and time waiting on reads per
    decoded token, the storage bandwidth the firmware measured just before, and the decode speed
    that bandwidth allows if a token only waited on its reads (bytes per token / bandwidth)."""

    stats: CacheStats
    hit_rate: float | None  # None: no expert was used
    read_bytes_per_token: float
    read_wait_ms_per_token: float
    storage_read_bytes_s: int | None  # None: no storage probe
    storage_direct: bool | None  # the probe read with O_DIRECT (else buffered, the page cache dropped)
    storage_bound_tok_s: float | None
    of_storage_bound: float | None

    def to_json(self) -> dict[str, object]:
        return {
            **self.stats.to_json(),
            "hit_rate": self.hit_rate,
            "read_bytes_per_token": self.read_bytes_per_token,
            "read_wait_ms_per_token": self.read_wait_ms_per_token,
            "storage_read_bytes_s": self.storage_read_bytes_s,
            "storage_direct": self.storage_direct,
            "storage_bound_tok_s": self.storage_bound_tok_s,
            "of_storage_bound": self.of_storage_bound,
        }


@dataclass(frozen=True)
class RunFigures:
    """One run's speeds (labelled as verify.run_stats labels them when the board and request are
    known) and, where the firmware probed the read bandwidth just before it, that figure and the
    share of it the decode's weight reads took; its expert cache under a memory budget."""

    run: RunRates
    read_bandwidth_bytes_s: int | None
    bandwidth_fraction: float | None
    cache: CacheFigures | None

    def to_json(self) -> dict[str, object]:
        return {
            **self.run.to_json(),
            "read_bandwidth_bytes_s": self.read_bandwidth_bytes_s,
            "bandwidth_fraction": self.bandwidth_fraction,
            "cache": self.cache.to_json() if self.cache else None,
        }


def run_figures(
    result: RunResult, weight_bytes: int, board: Board | None = None, request: RunRequest | None = None
) -> RunFigures:
    """One run's figures. The bandwidth share: weight bytes per token x this run's decode tok/s /
    this run's own probe (never another run's: the machine's bandwidth moves)."""
    r = run_stats(result, board, request) if board is not None and request is not None else rates(result)
    bandwidth = int(result.bandwidth["read_bw"]) if result.bandwidth else None
    fraction = weight_bytes * r.decode_tok_s / bandwidth if bandwidth and r.decode_tok_s else None
    return RunFigures(r, bandwidth, fraction, cache_figures(result, r))


STORAGE_PROBE_MIB = 256  # of the image file, at most: read with O_DIRECT (or after dropping it from the page cache)


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
class BoundFigures:
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

    def to_json(self) -> dict[str, object]:
        return {
            "bound_tok_s": self.bound_tok_s,
            "limited_by": self.limited_by,
            "in_ram_tok_s": self.in_ram_tok_s,
            "of_in_ram": self.of_in_ram,
            "decode_tok_s": self.decode_tok_s,
            "of_bound": self.of_bound,
        }


@dataclass(frozen=True)
class CacheSummary:
    """The expert cache over the runs: the median of each figure, and under a budget its bounds."""

    medians: CacheFigures
    bound: BoundFigures | None  # None: no budget

    def to_json(self) -> dict[str, object]:
        return {**self.medians.to_json(), **(self.bound.to_json() if self.bound else {})}


def cache_summary(runs: list[RunFigures]) -> CacheFigures | None:
    """The median over the runs of each cache figure (the counters included)."""
    figures = [r.cache for r in runs if r.cache]
    if not figures:
        return None
    return replace(medians(figures), stats=medians([f.stats for f in figures]))


@dataclass(frozen=True)
class ProbeRange:
    """The read bandwidth probes' bytes/s over the runs."""

    min: int
    median: float
    max: int

    def to_json(self) -> dict[str, float]:
        return {"min": self.min, "median": self.median, "max": self.max}


@dataclass(frozen=True)
class BandwidthFigures:
    """Over the runs: the probes' range, the median of the runs' own shares, and the decode speed
    the median bandwidth would allow if a token only read its weights (None: no probe)."""

    read_bandwidth_bytes_s: ProbeRange | None
    bandwidth_fraction: float | None
    bandwidth_limit_tok_s: float | None

    def to_json(self) -> dict[str, object]:
        probes = self.read_bandwidth_bytes_s
        return {
            "read_bandwidth_bytes_s": probes.to_json() if probes else None,
            "bandwidth_fraction": self.bandwidth_fraction,
            "bandwidth_limit_tok_s": self.bandwidth_limit_tok_s,
        }


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


DEFAULT_STEPS = 128
DEFAULT_PROMPT_TOKENS = 8
DEFAULT_REPEAT = 3


def default_steps(plan: Plan, prompt_tokens: int) -> int:
    """DEFAULT_STEPS, or fewer when the firmware's context cannot hold them after the prompt (the
    esp32p4's default context of 128 holds an 8-token prompt and 121 steps)."""
    return max(1, min(DEFAULT_STEPS, plan.n_ctx - prompt_tokens + 1))


def default_repeat(board: Board) -> int:
    """Runs to take the median of: one where the count is exact (the same on every run)."""
    return 1 if board.runner.counts_instructions_exactly() else DEFAULT_REPEAT


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
class InRamFigures:
    """The same stream without a budget, run after each budgeted run: its median decode tok/s,
    each run's, the budgeted runs' share of it (the median of each pair's ratio), and what it is
    (or why it was skipped)."""

    decode_tok_s: float | None
    runs: list[float | None]
    of_in_ram: float | None
    note: str

    def to_json(self) -> dict[str, object]:
        return {"decode_tok_s": self.decode_tok_s, "runs": self.runs, "of_in_ram": self.of_in_ram, "note": self.note}


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


@dataclass(frozen=True)
class CountedFigures:
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

    def to_json(self) -> dict[str, object]:
        return {
            "instructions_counted": self.instructions_counted,
            "decode_instructions_per_token": self.decode_instructions_per_token,
            "prefill_instructions_per_token": self.prefill_instructions_per_token,
            "instructions_per_mac": self.instructions_per_mac,
            "attention_macs_per_token": self.attention_macs_per_token,
            "mean_context": self.mean_context,
            "instructions_per_mac_with_attention": self.instructions_per_mac_with_attention,
            "predicted_esp32p4": self.predicted_esp32p4.to_json(),
        }


@dataclass(frozen=True)
class BandwidthProbe:
    """How the firmware probed the read bandwidth (the first run's probe)."""

    mib: int
    threads: int
    passes: int
    huge_pages: bool  # its buffer in 2 MiB pages, as the weights are when the firmware reads them into memory


@dataclass(frozen=True)
class ClockedFigures:
    """Wall-clock figures (boards that do not count instructions): the medians over the runs,
    the middle run's latencies, the peak RSS, and the read bandwidth the firmware measured."""

    prefill_tok_s: float | None
    decode_tok_s: float | None
    forward_only_tok_s: float | None
    ms_per_token: Latencies | None  # None: a run of fewer than two tokens
    peak_rss_bytes: int
    bandwidth: BandwidthFigures
    read_bandwidth_probe: BandwidthProbe | None

    def to_json(self) -> dict[str, object]:
        probe = self.read_bandwidth_probe
        return {
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "forward_only_tok_s": self.forward_only_tok_s,
            "ms_per_token": self.ms_per_token.to_json() if self.ms_per_token else {},
            "peak_rss_bytes": self.peak_rss_bytes,
            **self.bandwidth.to_json(),
            "read_bandwidth_probe": asdict(probe) if probe else None,
        }


@dataclass(frozen=True)
class BenchResult:
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
    memory_budget: CachePlan | None  # the expert cache as the firmware ran it
    stream: StreamFigures
    cache: CacheSummary | None
    in_ram: InRamFigures | None
    remote: RemoteRun | None  # remote_summary
    counted: CountedFigures | None
    clocked: ClockedFigures | None
    plot: str | None = None  # the PNG written

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "board": self.board,
            "model": self.model,
            "architecture": self.architecture,
            "quant": self.quant,
            "n_ctx": self.n_ctx,
            "threads": self.threads,
            "kernels": self.kernels,
            "prompt_tokens": self.prompt_tokens,
            "decode_steps": self.decode_steps,
            "repeat": self.repeat,
            "emulated_by": self.emulated_by,
            "speed_note": self.speed_note,
            "weight_bytes_per_token": self.weight_bytes_per_token,
            "macs_per_token": self.macs_per_token,
            "runs": [r.to_json() for r in self.runs],
            "memory_budget": self.memory_budget.to_dict() if self.memory_budget else None,
            "stream": self.stream.to_json(),
            "cache": self.cache.to_json() if self.cache else None,
            "in_ram": self.in_ram.to_json() if self.in_ram else None,
            "remote": self.remote.to_json() if self.remote else None,
        }
        if self.counted:
            out.update(self.counted.to_json())
        if self.clocked:
            out.update(self.clocked.to_json())
        if self.plot is not None:
            out["plot"] = self.plot
        return out


def run_bench(
    board: Board,
    plan: Plan,
    art: Artifacts,
    *,
    model: str,
    prompt_tokens: int,
    steps: int,
    repeat: int,
    threads: int = 1,
    plot: Path | None = None,
    port: str | None = None,
    reset: bool = False,
    remote: Remote | None = None,
    progress: Callable[[str], None] | None = None,
    check_hello: Callable[[dict[str, str]], None] | None = None,
    cache: CachePlan | AutoElsewhere | None = None,
    stream: Stream | None = None,
    in_ram: bool = True,
    speculate: int = 0,
) -> BenchResult:
    """Run the built firmware `art` `repeat` times and return bench's figures. On Linux boards run
    natively, each run first has the firmware probe the read bandwidth with the same threads:
    probe, decode, probe, decode... Under an emulator every wall-clock figure is labelled as the
    emulator's (`emulated_by`), and there is no bandwidth share.
    `stream`: what is decoded (default: the synthetic one). A MoE model under a budget also runs the
    same stream without one after each run (`in_ram`), for the speed the budget costs."""
    stream = stream or Stream("synthetic", synthetic_prompt(plan, prompt_tokens))
    prompt = stream.prompt
    check_fits_context(prompt, steps, plan.n_ctx)
    check_plot(board, plot, steps)
    # No logits hashes: the bench measures decoding, not verification.
    budget = cache.firmware_budget if cache is not None else 0
    probes = probes_bandwidth(board, remote)
    # Under a budget the firmware measures how fast its image file reads instead, just before
    # decoding: the memory probe's buffer (256 MiB or more) would break the budget it runs under.
    request = RunRequest(
        stream.request_prompt(steps),
        steps,
        stream.sampling,
        stop_at_eos=False,
        threads=threads,
        digests=False,
        probe_bandwidth_mib=PROBE_MIB if probes and not budget else None,
        memory_budget=budget,
        probe_storage_mib=STORAGE_PROBE_MIB if budget and probes else None,
        decode_from=stream.decode_from(steps),
        speculate=speculate,
    )
    compare = bool(budget and plan.spec.n_experts and in_ram)
    skipped = in_ram_fits(art.weights) if compare and remote is None else None
    ram_request = replace(request, memory_budget=0, probe_storage_mib=None) if compare and not skipped else None
    weight_bytes = weight_bytes_per_token(plan)
    macs = macs_per_token(plan)
    results, ram_results = [], []

    def run(req: RunRequest) -> RunResult:
        result = run_on_board(
            board,
            art.program,
            art.weights,
            req,
            art.model_hash(),
            flash_image=art.flash_image,
            port=port,
            reset=reset,
            remote=remote,
            progress=progress,
            check_hello=check_hello,
        )
        check_forced(stream, req, result)
        return result

    for i in range(repeat):
        result = run(request)
        results.append(result)
        if progress:
            r = run_figures(result, weight_bytes, board, request)
            probe = (
                f", read bandwidth {r.read_bandwidth_bytes_s / 1e9:.1f} GB/s just before"
                if r.read_bandwidth_bytes_s
                else ""
            )
            c = r.cache
            cached = (
                f"; expert cache {100 * c.hit_rate:.0f}% hits, {c.read_bytes_per_token / 1e6:.2f} MB read per token"
                if c and c.hit_rate is not None and budget
                else ""
            )
            progress(f"  run {i + 1}/{repeat}: {speed_text(r.run)}{probe}{cached}")
        if ram_request is not None:
            ram_results.append(run(ram_request))
            if progress:
                progress(
                    f"  run {i + 1}/{repeat} without the budget: "
                    f"{speed_text(run_figures(ram_results[-1], weight_bytes, board, ram_request).run)}"
                )
    runs = [run_figures(r, weight_bytes, board, request) for r in results]
    ram_runs = [run_figures(r, weight_bytes, board, ram_request) for r in ram_results if ram_request is not None]
    kernels = results[-1].hello.get("kernels", "?")
    # Under an emulator here, or on a board over SSH behind a prefix (an emulator, in the tests).
    emulator = (remote_prefix(board)[0] if remote_prefix(board) else None) if remote else board.runner.emulated_by()
    in_ram_figures = in_ram_summary(runs, ram_runs, skipped)
    cache_medians = cache_summary(runs)
    last_stats = cache_stats(results[-1])
    counted, clocked = None, None
    instructions = runs[0].run.decode_instructions_per_token
    if instructions:
        first = runs[0].run
        attention = decode_attention_macs(plan, len(prompt), steps)
        counted = CountedFigures(
            instructions_counted=first.instructions_counted if isinstance(first, RunStats) else None,
            decode_instructions_per_token=instructions,
            prefill_instructions_per_token=first.prefill_instructions_per_token,
            instructions_per_mac=instructions / macs,
            attention_macs_per_token=attention,
            mean_context=len(prompt) + steps / 2,  # of contexts P+1 .. P+S-1
            instructions_per_mac_with_attention=instructions / (macs + attention),
            predicted_esp32p4=predict_speed(predicted_timing(board), instructions, weight_bytes),
        )
    else:
        latencies = [latency_percentiles(r.token_us) for r in results]
        first_probe = results[0].bandwidth
        clocked = ClockedFigures(
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
    out = BenchResult(
        board=board.name,
        model=model,
        architecture=plan.spec.architecture,
        quant=plan.quant,
        n_ctx=plan.n_ctx,
        threads=threads,
        kernels=kernels,
        prompt_tokens=len(prompt),
        decode_steps=steps,
        repeat=repeat,
        emulated_by=emulator,
        speed_note=f"measured under {emulator}: the emulator's speed, not the board's" if emulator else None,
        weight_bytes_per_token=weight_bytes,
        macs_per_token=macs,
        runs=runs,
        memory_budget=cache.as_run(last_stats.auto_ran() if last_stats else None) if cache is not None else None,
        stream=stream_figures(stream, request, results[-1], plan, steps),
        cache=CacheSummary(cache_medians, bound_figures(cache_medians, in_ram_figures, runs) if budget else None)
        if cache_medians is not None
        else None,
        in_ram=in_ram_figures,
        remote=remote_summary(results),
        counted=counted,
        clocked=clocked,
    )
    if plot is not None:
        contexts, per_token = rate_by_context(len(prompt), [r.token_us for r in results])
        plot_rate_vs_context(
            plot,
            contexts,
            per_token,
            f"{plan.spec.name} on {board.name}: {plan.quant}, {kernels} kernels, "
            f"{threads} thread(s), median of {repeat} runs",
        )
        out = replace(out, plot=str(plot))
        if progress:
            progress(f"wrote {plot}: decode tok/s against context length {contexts[0]}..{contexts[-1]}")
    return out


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
