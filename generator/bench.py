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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from .boards import Board, TimingModel, load_board
from .compile.plan import Plan
from .device.remote import Remote, remote_prefix
from .device.runner import run_on_board
from .device.session import RunRequest, RunResult, cache_stats, check_fits_context
from .errors import ColibriError
from .files import REPO
from .numerics.sampling import SamplingParams
from .verify import rates, run_stats, speed_text


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


def latency_percentiles(token_us: list[int]) -> dict:
    """Milliseconds between consecutive tokens: p50, p90, p99 and max."""
    gaps = [(b - a) / 1000.0 for a, b in zip(token_us, token_us[1:])]
    if not gaps:
        return {}
    q = statistics.quantiles(gaps, n=100, method="inclusive") if len(gaps) > 1 else gaps * 99
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(gaps)}


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


def predict_speed(timing: TimingModel, instructions_per_token: float, bytes_per_token: int) -> dict:
    """A token takes whichever is longer: its instructions at the board's clock, or its weight reads."""
    compute = instructions_per_token * timing.cycles_per_instruction / timing.clock_hz
    memory = bytes_per_token / timing.weight_bytes_per_s
    return {"tok_s": 1.0 / max(compute, memory), "compute_s": compute, "memory_s": memory, "model": timing.describe()}


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


def plot_rate_vs_context(path, contexts: list[int], tok_s: list[float], title: str) -> None:
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
                f"{Path(self.source).name} teacher-forced: {len(self.prompt)} prompt tokens prefilled, then "
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
    tokenizer,
    kind: str | None,
    text: Path | None,
    sampling: SamplingParams,
    prompt_tokens: int,
    steps: int | None,
    sampling_flags: list[str] = (),
) -> tuple[Stream, int]:
    """The stream bench decodes and its steps (default_steps, or fewer when the text is shorter).
    kind None: --text's, the sampled one if sampling_flags (the flags that set `sampling`) were
    given, else default_stream's. Everything is checked here, before anything is built."""
    if text is not None and kind not in (None, "text"):
        raise ColibriError(f"--text feeds a text, and --stream {kind} does not: give one or the other")
    if sampling_flags and (kind not in (None, "sampled") or text is not None):
        raise ColibriError(
            f"{' and '.join(sampling_flags)} set the sampled stream, not "
            f"{'--text' if text is not None else '--stream ' + kind}'s: give one or the other"
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


def stream_figures(stream: Stream, request: RunRequest, result: RunResult, plan: Plan, steps: int) -> dict:
    """What the decode was fed and how varied it was: its repetition, its distinct tokens and, on
    a MoE model, the distinct experts each MoE layer used (over the prompt and the decode) against
    the top-k a token takes."""
    fed = fed_tokens(stream, request, result)
    out = {
        "kind": stream.kind,
        "text": stream.source,
        "text_tokens": stream.text_tokens,
        "sampling": asdict(stream.sampling) if stream.kind == "sampled" else None,
        "prompt_tokens": len(stream.prompt),
        "decoded_tokens_fed": len(fed),
        "distinct_tokens": len(set(fed)),
        f"repeated_{NGRAM}grams": repetition(fed),
        "description": stream.describe(steps),
    }
    if result.expert_counts:
        out["experts_per_token"] = plan.spec.experts_per_token
        out["n_experts"] = plan.spec.n_experts
        out["experts_used_per_layer"] = {
            str(layer): sum(1 for c in counts if c) for layer, counts in sorted(result.expert_counts.items())
        }
    return out


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


def run_figures(
    result: RunResult, weight_bytes: int, board: Board | None = None, request: RunRequest | None = None
) -> dict:
    """One run's speeds and, where the firmware probed the read bandwidth just before it, that
    figure and the share of it the decode's weight reads took: weight bytes per token x this run's
    decode tok/s / this run's own probe (never another run's: the machine's bandwidth moves).
    With the board and request, labelled as verify.run_stats labels them (emulator, what an
    instruction count includes)."""
    r = run_stats(result, board, request) if board is not None and request is not None else rates(result)
    bandwidth = int(result.bandwidth["read_bw"]) if result.bandwidth else None
    r["read_bandwidth_bytes_s"] = bandwidth
    r["bandwidth_fraction"] = weight_bytes * r["decode_tok_s"] / bandwidth if bandwidth and r["decode_tok_s"] else None
    r["cache"] = cache_figures(result, r)
    return r


STORAGE_PROBE_MIB = 256  # of the image file, at most: read with O_DIRECT (or after dropping it from the page cache)


def cache_figures(result: RunResult, r: dict) -> dict | None:
    """One run's expert cache over its decode: hit rate, bytes read from storage and time waiting on
    reads per decoded token, the storage bandwidth the firmware measured just before, and the decode
    speed that bandwidth allows if a token only waited on its reads (bytes per token / bandwidth)."""
    c = cache_stats(result)
    if c is None:
        return None
    passes = int(result.stats.get("decode", 0))
    uses = c.get("cache_hits", 0) + c.get("cache_misses", 0)
    per_token = c.get("read_bytes", 0) / passes if passes else 0.0
    storage = int(result.storage["read_bw"]) if result.storage else None
    return {
        **c,
        "hit_rate": c.get("cache_hits", 0) / uses if uses else None,
        "read_bytes_per_token": per_token,
        "read_wait_ms_per_token": c.get("read_wait_us", 0) / 1000 / passes if passes else 0.0,
        "storage_read_bytes_s": storage,
        "storage_direct": bool(int(result.storage["direct"])) if result.storage else None,
        "storage_bound_tok_s": storage / per_token if storage and per_token else None,
        "of_storage_bound": (r["decode_tok_s"] * per_token / storage)
        if storage and per_token and r["decode_tok_s"]
        else None,
    }


def cache_summary(runs: list[dict]) -> dict | None:
    """The median over the runs of each cache figure."""
    figures = [r["cache"] for r in runs if r.get("cache")]
    if not figures:
        return None
    out = {}
    for key in figures[0]:
        values = [f[key] for f in figures if isinstance(f.get(key), (int, float)) and not isinstance(f.get(key), bool)]
        out[key] = statistics.median(values) if values else figures[-1][key]
    return out


def bandwidth_summary(weight_bytes: int, runs: list[dict]) -> dict:
    """Over the runs: the probes' min, median and max, the median of the runs' own shares, and the
    decode speed the median bandwidth would allow if a token only read its weights."""
    probes = [r["read_bandwidth_bytes_s"] for r in runs if r["read_bandwidth_bytes_s"]]
    shares = [r["bandwidth_fraction"] for r in runs if r["bandwidth_fraction"] is not None]
    if not probes:
        return {"read_bandwidth_bytes_s": None, "bandwidth_fraction": None, "bandwidth_limit_tok_s": None}
    median = statistics.median(probes)
    return {
        "read_bandwidth_bytes_s": {"min": min(probes), "median": median, "max": max(probes)},
        "bandwidth_fraction": statistics.median(shares) if shares else None,
        "bandwidth_limit_tok_s": median / weight_bytes,
    }


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


def remote_summary(results: list[RunResult]) -> dict | None:
    """For runs on a board over SSH: the last run's board facts, and the bytes all the runs sent
    (the first run copies what the board lacks; the others send only their requests)."""
    if not results[-1].remote:
        return None
    sent: dict[str, int] = {}
    for r in results:
        for key, n in r.remote["bytes_sent"].items():
            sent[key] = sent.get(key, 0) + n
    return {**results[-1].remote, "bytes_sent": sent}


def in_ram_summary(runs: list[dict], ram_runs: list[dict], skipped: str | None) -> dict | None:
    """The same stream without a budget, run after each budgeted run: its median decode tok/s, and
    the budgeted runs' share of it (the median of each pair's ratio)."""
    if skipped:
        return {"decode_tok_s": None, "runs": [], "of_in_ram": None, "note": skipped}
    if not ram_runs:
        return None
    speeds = [r["decode_tok_s"] for r in ram_runs]
    pairs = [
        a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(runs, ram_runs) if a["decode_tok_s"] and b["decode_tok_s"]
    ]
    return {
        "decode_tok_s": statistics.median(s for s in speeds if s) if any(speeds) else None,
        "runs": speeds,
        "of_in_ram": statistics.median(pairs) if pairs else None,
        "note": "the same stream and build without a memory budget (the mapped image read in place), "
        "run after each budgeted run",
    }


def bound_figures(cache: dict, in_ram: dict | None) -> dict:
    """The speed a token under the budget could reach at the measured hit rate: the storage bound
    (bandwidth / bytes read per token, if compute cost nothing) or the in-RAM speed (if reads cost
    nothing), whichever is lower, and which one that is."""
    storage, ram = cache.get("storage_bound_tok_s"), (in_ram or {}).get("decode_tok_s")
    limits = [(v, name) for v, name in ((storage, "storage"), (ram, "compute")) if v]
    if not limits:
        return {"bound_tok_s": None, "limited_by": None}
    value, name = min(limits)
    return {"bound_tok_s": value, "limited_by": name}


def run_bench(
    board: Board,
    plan: Plan,
    art,
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
    check_hello=None,
    cache=None,
    stream: Stream | None = None,
    in_ram: bool = True,
) -> dict:
    """Run the built firmware `art` (build.Artifacts) `repeat` times and return bench's figures (the
    --json document). On Linux boards run natively, each run first has the firmware probe the read
    bandwidth with the same threads: probe, decode, probe, decode... Under an emulator every
    wall-clock figure is labelled as the emulator's (`emulated_by`), and there is no bandwidth share.
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
                f", read bandwidth {r['read_bandwidth_bytes_s'] / 1e9:.1f} GB/s just before"
                if r["read_bandwidth_bytes_s"]
                else ""
            )
            c = r["cache"]
            cached = (
                f"; expert cache {100 * c['hit_rate']:.0f}% hits, {c['read_bytes_per_token'] / 1e6:.2f} MB read "
                f"per token"
                if c and c["hit_rate"] is not None and budget
                else ""
            )
            progress(f"  run {i + 1}/{repeat}: {speed_text(r)}{probe}{cached}")
        if ram_request is not None:
            ram_results.append(run(ram_request))
            if progress:
                progress(
                    f"  run {i + 1}/{repeat} without the budget: "
                    f"{speed_text(run_figures(ram_results[-1], weight_bytes, board, ram_request))}"
                )
    runs = [run_figures(r, weight_bytes, board, request) for r in results]
    ram_runs = [run_figures(r, weight_bytes, board, ram_request) for r in ram_results]
    kernels = results[-1].hello.get("kernels", "?")
    # Under an emulator here, or on a board over SSH behind a prefix (an emulator, in the tests).
    emulator = (remote_prefix(board)[0] if remote_prefix(board) else None) if remote else board.runner.emulated_by()
    out = {
        "board": board.name,
        "model": model,
        "architecture": plan.spec.architecture,
        "quant": plan.quant,
        "n_ctx": plan.n_ctx,
        "threads": threads,
        "kernels": kernels,
        "prompt_tokens": len(prompt),
        "decode_steps": steps,
        "repeat": repeat,
        # Under an emulator, wall-clock figures are the emulator's on this machine, not the board's.
        "emulated_by": emulator,
        "speed_note": (f"measured under {emulator}: the emulator's speed, not the board's" if emulator else None),
        "weight_bytes_per_token": weight_bytes,
        "macs_per_token": macs,
        "runs": runs,
        "memory_budget": cache.as_run(cache_stats(results[-1])).to_dict() if cache is not None else None,
        "stream": stream_figures(stream, request, results[-1], plan, steps),
        "cache": cache_summary(runs),
        "in_ram": in_ram_summary(runs, ram_runs, skipped),
        "remote": remote_summary(results),
    }
    if out["cache"] is not None and budget:
        c = out["cache"]
        c.update(bound_figures(c, out["in_ram"]))
        c["in_ram_tok_s"] = out["in_ram"]["decode_tok_s"] if out["in_ram"] else None
        c["of_in_ram"] = out["in_ram"]["of_in_ram"] if out["in_ram"] else None
        speed = (
            statistics.median(r["decode_tok_s"] for r in runs if r["decode_tok_s"])
            if any(r["decode_tok_s"] for r in runs)
            else None
        )
        c["decode_tok_s"] = speed
        c["of_bound"] = speed / c["bound_tok_s"] if speed and c["bound_tok_s"] else None
    instructions = runs[0]["decode_instructions_per_token"]
    if instructions:
        out["instructions_counted"] = runs[0]["instructions_counted"]
        # An emulator's clock is not the board's: exact instruction counts are the measure there.
        # Per multiply-accumulate two ways: of the matrices alone (fixed per token), and with the
        # attention's, which grow with the context (averaged over this run's decode passes).
        attention = decode_attention_macs(plan, len(prompt), steps)
        out.update(
            decode_instructions_per_token=instructions,
            prefill_instructions_per_token=runs[0]["prefill_instructions_per_token"],
            instructions_per_mac=instructions / macs,
            attention_macs_per_token=attention,
            mean_context=len(prompt) + steps / 2,  # of contexts P+1 .. P+S-1
            instructions_per_mac_with_attention=instructions / (macs + attention),
            predicted_esp32p4=predict_speed(predicted_timing(board), instructions, weight_bytes),
        )
    else:
        latencies = [latency_percentiles(r.token_us) for r in results]
        probe = results[0].bandwidth
        out.update(
            prefill_tok_s=statistics.median(r["prefill_tok_s"] for r in runs),
            decode_tok_s=statistics.median(r["decode_tok_s"] for r in runs),
            forward_only_tok_s=statistics.median(r["forward_tok_s"] for r in runs),
            ms_per_token=latencies[len(latencies) // 2],
            peak_rss_bytes=max(int(r.stats.get("peak_rss", 0)) for r in results),
            **bandwidth_summary(weight_bytes, runs),
            read_bandwidth_probe={
                "mib": int(probe["mib"]),
                "threads": int(probe["threads"]),
                "passes": int(probe["passes"]),
            }
            if probe
            else None,
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
        out["plot"] = str(plot)
        if progress:
            progress(f"wrote {plot}: decode tok/s against context length {contexts[0]}..{contexts[-1]}")
    return out


def bench_line(out: dict, name: str) -> str:
    """bench's one line of text for a run_bench() result; `name` is the model's."""
    emulator = out.get("emulated_by")
    at = f" at {out['remote']['host']}" if out.get("remote") else ""
    where = f"on {out['board']}{at}" + (f" EMULATED by {emulator}" if emulator else "")
    head = f"bench {name} {where} ({out['quant']}, {out['kernels']} kernels, "
    if "decode_instructions_per_token" in out:
        instructions = out["decode_instructions_per_token"]
        p4 = out["predicted_esp32p4"]
        runs = "one run: the count is exact" if out["repeat"] == 1 else f"median of {out['repeat']} identical runs"
        return (
            f"{head}{out['prompt_tokens']}-token prompt, {out['decode_steps']} steps, {runs}{stream_text(out)}): "
            f"{instructions / 1e6:.3f} M instructions per decoded token ({out['instructions_counted']}), "
            f"{out['instructions_per_mac_with_attention']:.2f} per multiply-accumulate: {out['macs_per_token']:,} in "
            f"the matrices + {out['attention_macs_per_token']:,.0f} in attention at this context (mean "
            f"{out['mean_context']:g} positions); {out['instructions_per_mac']:.2f} per matrix multiply-accumulate "
            f"alone; {out['prefill_instructions_per_token'] / 1e6:.3f} M per prompt token; predicted ESP32-P4: "
            f"{p4['tok_s']:.1f} tok/s ({p4['model']})"
        )
    ms = out["ms_per_token"]
    weights = f"{out['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token"
    bandwidth = out["read_bandwidth_bytes_s"]
    if bandwidth is None:
        share = (
            f"{weights} (no bandwidth figure: the emulator's reads are not the board's)"
            if emulator
            else f"{weights} (no memory bandwidth probe under a memory budget: its buffer would break it)"
            if out.get("memory_budget") and not out["memory_budget"]["unlimited"]
            else f"{weights} (no bandwidth figure)"
        )
    else:
        probe = out["read_bandwidth_probe"]
        share = (
            f"{weights} = {100 * out['bandwidth_fraction']:.0f}% of the read bandwidth the firmware measured "
            f"just before each run (median of the runs' shares; probes {bandwidth['min'] / 1e9:.1f}–"
            f"{bandwidth['max'] / 1e9:.1f} GB/s, median {bandwidth['median'] / 1e9:.1f}, {probe['threads']} "
            f"thread(s) over {probe['mib']} MiB; limit {out['bandwidth_limit_tok_s']:.0f} tok/s)"
        )
    label = ": the emulator's speed on this machine, not the board's" if emulator else ""
    return (
        f"{head}{out['threads']} thread(s), {out['prompt_tokens']}-token prompt, {out['decode_steps']} steps, "
        f"median of {out['repeat']}{stream_text(out)}): "
        f"prefill {out['prefill_tok_s']:.1f} tok/s, decode {out['decode_tok_s']:.1f} "
        f"tok/s (ms/token p50 {ms.get('p50', 0):.2f}, p99 {ms.get('p99', 0):.2f}){label}; {share}; "
        f"peak RSS {out['peak_rss_bytes'] / 2**20:.0f} MiB{cache_text(out)}"
    )


REPEATING = 0.5  # a stream with at least this share of repeated 4-grams is said to repeat


def stream_text(out: dict) -> str:
    """bench's words on what it decoded (nothing for a result without a stream)."""
    s = out.get("stream")
    return f"; stream: {s['description']}{stream_warning(out)}" if s else ""


def stream_warning(out: dict) -> str:
    """On a MoE model, a stream that repeats itself gives cache numbers no user sees: said so."""
    s = out.get("stream") or {}
    share = s.get(f"repeated_{NGRAM}grams")
    if not s.get("experts_per_token") or share is None or share < REPEATING:
        return ""
    return (
        f"; it REPEATS: {100 * share:.0f}% of its {NGRAM}-grams occurred before in it, so routing repeats and "
        f"the expert cache hits more than a user's stream would"
    )


def cache_text(out: dict) -> str:
    """bench's words on the expert cache: empty without a memory budget."""
    c, plan = out.get("cache"), out.get("memory_budget")
    if not c or not plan or plan["unlimited"]:
        return ""
    text = (
        f"; memory budget {plan['budget'] / 2**20:.0f} MiB: {plan['slots']} expert slots "
        f"({plan['slots_per_layer']:.2g} per MoE layer), "
        f"{100 * (c['hit_rate'] or 0):.1f}% hits ({c['prefetch_hits']:.0f} of them prefetched), "
        f"{c['read_bytes_per_token'] / 1e6:.2f} MB read per token, waiting {c['read_wait_ms_per_token']:.2f} ms "
        f"per token on reads" + ("" if c["locked"] and not c["lock_refused"] else ", resident weights NOT locked")
    )
    if c.get("storage_read_bytes_s"):
        how = "O_DIRECT" if c["storage_direct"] else "buffered, page cache dropped"
        text += (
            f"; storage reads {c['storage_read_bytes_s'] / 1e9:.2f} GB/s ({how}) in the same run: bound "
            f"{c['storage_bound_tok_s']:.1f} tok/s if a token only read, "
            f"{100 * c['of_storage_bound']:.0f}% of it reached"
        )
    ram = out.get("in_ram")
    if ram and ram.get("decode_tok_s"):
        text += (
            f"; in RAM (the same stream without the budget, alternating runs) {ram['decode_tok_s']:.1f} tok/s, "
            f"{100 * ram['of_in_ram']:.0f}% of it reached under the budget"
        )
    elif ram and ram.get("note"):
        text += f"; in-RAM comparison {ram['note']}"
    if c.get("bound_tok_s") and c.get("in_ram_tok_s") and c.get("storage_bound_tok_s"):
        text += (
            "; the storage bound is the tighter limit"
            if c["limited_by"] == "storage"
            else "; the in-RAM speed is the tighter limit (compute, not reads, bounds this budget)"
        )
    return text
