"""A run's request and its result, and the Session that turns a board's frames into the result:
the types every link (a process's stdin/stdout, a serial port, an emulator's socket) shares."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from ..boards.board import SelftestSettings
from ..compile.cache_plan import AutoBudget, AutoChoice, AutoRan, MemoryFound
from ..documents import JsonDocument
from ..errors import ColibriError, NonFiniteLogits
from ..numerics.perplexity import Score
from ..numerics.sampling import SamplingParams
from .protocol import Frame, encode_frame, encode_request


@dataclass(frozen=True)
class RunRequest:
    prompt: list[int]
    steps: int
    sampling: SamplingParams = SamplingParams()
    stop_at_eos: bool = True
    threads: int = 1
    digests: bool = True  # hash every step's logits (verify needs them; bench does not)
    # Measure the read bandwidth first, in the firmware, with the same threads (Linux boards; bench):
    # None: no probe; 0: a buffer twice the largest cache (at least 256 MiB); else its size in MiB.
    probe_bandwidth_mib: int | None = None
    start: int = 0  # continue the conversation the firmware holds: the prompt goes at positions start...
    score_from: int | None = None  # score prompt tokens score_from + 1 ... (score frames; eval)
    # Teacher forcing (bench's text stream): the prompt before decode_from is prefilled in batches,
    # then prompt tokens decode_from... are decoded one per forward pass, as steps 0, 1, ..., each
    # step's token the prompt's next one instead of a sampled one (steps >= len(prompt) - decode_from;
    # the steps after them sample). Protocol 4.
    decode_from: int | None = None
    # Exact speculative decoding: check up to this many drafted tokens (prompt lookup) per forward
    # pass; the tokens and logits are plain decoding's (0: off; a plan without room decodes plainly).
    speculate: int = 0
    # Linux boards, given on the firmware's command line (not in the request frame: they decide how
    # the weights are held before the request is read): the RAM budget in bytes (0: unlimited, the
    # mapped image read in place; an AutoBudget: the firmware takes what it finds, less the margin,
    # compile/cache_plan.py), prefetching on the I/O thread, and a storage read probe of this
    # many MiB of the image file before decoding (None: none).
    memory_budget: int | AutoBudget = 0
    # None: the firmware chooses (bsp/linux/held_weights.c): LRU with top-k slots per MoE layer or more, else
    # LFU; no prefetch (measured slower, docs/performance.md).
    prefetch: bool | None = None
    probe_storage_mib: int | None = None
    eviction: str | None = None  # "lfu" | "lru"
    copy_weights: bool = False  # read the whole image into memory, as before mapping (for comparisons)
    # Protocol 5: run the firmware's self-test (app/selftest.c) instead of a decode; prompt and
    # steps are not sent (the golden ones are in the firmware).
    selftest: bool = False
    # A selftest request's golden decode (prompt tokens + steps, from the board file): not sent, but
    # the time a link allows counts them, as it counts a decode's (an image of gigabytes read from
    # storage through the expert cache takes as long per token in the self-test as in a run).
    golden_tokens: int = 0
    # Protocol 7: the step whose forward pass sends its checkpoints (checkpoint frames: verify's
    # localisation of a divergence, verify_localise.py); None: none.
    trace: int | None = None

    def tokens_of_work(self) -> int:
        """The forward passes this request asks for: what a link's time allowance is sized by."""
        return len(self.prompt) + self.steps + self.golden_tokens

    @classmethod
    def selftest_of(cls, golden: SelftestSettings) -> RunRequest:
        """The request for a firmware's self-test, its golden decode sized as the board file says."""
        return cls([], 0, selftest=True, golden_tokens=golden.prompt_tokens + golden.steps)

    def firmware_options(self) -> list[str]:
        """The Linux firmware's command-line options for this request (beyond --weights)."""
        out = []
        if isinstance(self.memory_budget, AutoBudget):
            out += ["--memory-budget", self.memory_budget.firmware_option()]
        elif self.memory_budget:
            out += ["--memory-budget", str(self.memory_budget)]
        if self.prefetch is not None:
            out += ["--prefetch", str(int(self.prefetch))]
        if self.eviction is not None:
            out += ["--evict", self.eviction]
        if self.copy_weights:
            out += ["--copy-weights"]
        if self.probe_storage_mib:
            out += ["--probe-storage", str(self.probe_storage_mib)]
        return out


@dataclass(frozen=True)
class RemoteRun(JsonDocument):
    """Where a run over SSH ran (device/remote.py's run_remote): the host, the board's cache directory and machine, the prefix
    the firmware ran under, what the firmware's hello said of the machine, and the bytes sent per
    kind (firmware, weights, request, total)."""

    host: str
    cache: str
    machine: str  # uname -m on the board
    prefix: list[str]
    firmware_machine: str | None
    cpu: str | None
    kernels: str | None
    bytes_sent: dict[str, int]


@dataclass
class RunResult:
    hello: dict[str, str] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    stats: dict[str, str] = field(default_factory=dict)
    bandwidth: dict[str, str] = field(default_factory=dict)  # read_bw (bytes/s), mib, threads, passes; if probed
    storage: dict[str, str] = field(default_factory=dict)  # the image file's read_bw (bytes/s), bytes, chunk, direct
    expert_counts: dict[int, list[int]] = field(default_factory=dict)  # MoE layer -> selections per expert
    token_us: list[int] = field(default_factory=list)  # per step: microseconds since the prompt was done
    stop_reason: str = ""
    log: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    remote: RemoteRun | None = None  # a run over SSH (device/remote.py): where it ran and the bytes sent
    scores: list[Score] = field(default_factory=list)  # scored prompt tokens, in order (score frames)
    held: int = 0  # positions the firmware's KV cache holds afterwards: where the next request may start
    selftest: Selftest | None = None  # the selftest frame: asked for, or sent at boot (MCU boards)
    checkpoints: list[Checkpoint] = field(default_factory=list)  # a traced step's, in the order sent


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint frame (runtime/checkpoint.h): an operation's output in the traced forward pass,
    as its SHA-256 and a few of its values (the float32s' bits, at indices i * n // len(values)).
    layer -1 is the embedding, n_layers the final norm and the logits."""

    layer: int
    op: str
    n: int
    sha256: str
    values: list[str]


@dataclass(frozen=True)
class Selftest:
    """A selftest frame (firmware_src/app/selftest.c): PASS, or FAIL with what differed."""

    passed: bool
    fields: dict[str, str]

    @property
    def what(self) -> str:
        """What differed, in words (empty for a PASS)."""
        f = self.fields
        parts = []
        if "kernel_failed" in f:
            parts.append(f"kernel {f['kernel_failed']} differs from the scalar kernel")
        if "image" in f:
            parts.append(f"weight image refused: {f['image']}")
        if "decode_error" in f:
            parts.append(f"the golden decode failed with error {f['decode_error']}")
        if "step" in f:
            logits = "its logits differ too" if f.get("logits") == "differ" else "its logits are the same"
            parts.append(
                f"golden decode step {f['step']}: token {f.get('token', '?')}, expected {f.get('expected', '?')}"
                if f.get("token") != f.get("expected")
                else f"golden decode step {f['step']}: token {f.get('token', '?')} as expected but the logits SHA-256 differs"
            )
            if f.get("token") != f.get("expected"):
                parts[-1] += f" ({logits})"
        return "; ".join(parts)

    def line(self) -> str:
        """The one line monitor and verify print."""
        f = self.fields
        checked = f"{f.get('kernels_checked', '?')} kernel checks ({f.get('kernels', '?')}), golden decode of {f.get('steps', '?')} steps"
        cost = f", {int(f['instret']):,} instructions" if f.get("instret", "").isdigit() else ""
        if self.passed:
            return f"self-test PASS: {checked}{cost}"
        return f"self-test FAIL: {self.what or 'no reason given'} ({checked})"


# Protocol 3's stats fields from a Linux board (firmware_src/app/decode.c): how it holds the weights
# and its expert cache's counters over the decode (prefill_* over the prompt). Older boards send none.
# Under --memory-budget auto also what the board found (auto_found, less auto_margin) and where
# (auto_source: cgroup-v2, cgroup-v1 or meminfo; auto_where: the file).
@dataclass(frozen=True)
class CacheStats:
    """The stats frame's cache fields, as integers. None: a field this firmware does not send (an
    older one sends fewer), so the JSON written from it (to_json) holds only the fields sent."""

    mapped: int
    budget: int | None = None
    slots: int | None = None
    locked: int | None = None
    resident: int | None = None  # bytes of the image read into the process's memory (in 2 MiB pages where it can)
    lock_refused: int | None = None
    direct_io: int | None = None
    prefetch: int | None = None
    lru: int | None = None
    cache_hits: int | None = None
    cache_misses: int | None = None
    prefetches: int | None = None
    prefetch_hits: int | None = None
    read_bytes: int | None = None
    read_wait_us: int | None = None
    read_time_us: int | None = None
    reads_in_flight: int | None = None
    reads_reordered: int | None = None
    prefill_read_bytes: int | None = None
    prefill_read_wait_us: int | None = None
    auto_found: int | None = None
    auto_margin: int | None = None
    auto_source: str | None = None  # sent with auto_found
    auto_where: str | None = None

    @property
    def expert_uses(self) -> int:
        """The decode's expert uses: each a hit or a miss of the cache."""
        return (self.cache_hits or 0) + (self.cache_misses or 0)

    def auto_ran(self) -> AutoRan | None:
        """What --memory-budget auto chose where the firmware ran, or None (no auto)."""
        if self.auto_found is None:
            return None
        found = MemoryFound(self.auto_found, self.auto_source or "", self.auto_where or "")
        return AutoRan(self.budget or 0, AutoChoice(AutoBudget(self.auto_margin or 0), found))

    def to_json(self) -> dict[str, int | str]:
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}


# Protocol 6: a token or score frame whose logits hold a NaN or an infinity carries this field, the
# first layer whose output was not finite, or HEAD when every layer's output was (app/decode.c).
NONFINITE, HEAD = "nonfinite", "head"

CACHE_STATS = tuple(f.name for f in fields(CacheStats) if f.name not in ("auto_source", "auto_where"))
AUTO_SOURCES = ("cgroup-v2", "cgroup-v1", "meminfo")


def cache_stats(result: RunResult) -> CacheStats | None:
    """The stats frame's cache fields, or None when the board sent none."""
    stats = result.stats
    if "mapped" not in stats:
        return None
    sent: dict[str, Any] = {key: int(stats[key]) for key in CACHE_STATS if key in stats}
    if "auto_found" in sent:
        sent.update(auto_source=stats["auto_source"], auto_where=stats.get("auto_where", ""))
    return CacheStats(**sent)


class FirmwareError(ColibriError):
    """An error frame from the firmware; `selftest`: the failed self-test that came before it (a
    board whose boot self-test failed refuses to run), else None."""

    def __init__(self, message: str, selftest: Selftest | None = None):
        super().__init__(message)
        self.selftest = selftest


class Session:
    """Interprets one run's frames: hello, token..., stats, done; or an error frame."""

    def __init__(
        self,
        expected_model: str | None = None,
        on_token: Callable[[int, int], None] | None = None,
        check_hello: Callable[[dict[str, str]], None] | None = None,
    ):
        """expected_model: the model hash the firmware must carry; check_hello: called with the
        hello frame's fields, raises ColibriError for firmware that is not the expected build
        (verify.hello_check compares board, build id, weights, context and quantization too)."""
        self.result = RunResult()
        self.expected_model = expected_model
        self.on_token = on_token
        self.check_hello = check_hello
        self.finished = False
        self._experts_of: dict[int, int] = {}  # MoE layer -> the count of experts its frames announce

    def handle(self, frame: Frame) -> None:
        r = self.result
        if frame.kind == "hello":
            if r.hello and frame.seq == 0:
                raise ColibriError("the board reset during the run (a second hello frame arrived)")
            r.hello = frame.fields
            if self.check_hello:
                self.check_hello(frame.fields)
            elif self.expected_model and frame.fields.get("model") != self.expected_model:
                raise ColibriError(
                    f"the board runs firmware for model {frame.fields.get('model', '?')[:16]}…, "
                    f"expected {self.expected_model[:16]}… (flash the matching build)"
                )
        elif frame.kind == "error":
            msg = frame.fields.get("msg", "unknown error")
            failed = r.selftest if r.selftest is not None and not r.selftest.passed else None
            said = f" ({failed.line()})" if failed is not None else ""
            raise FirmwareError(f"firmware reported error {frame.fields.get('code', '?')}: {msg}{said}", failed)
        elif frame.kind == "token":
            step = frame.int("step")
            if step != len(r.tokens):
                raise ColibriError(f"token frame for step {step} arrived when step {len(r.tokens)} was expected")
            token = frame.int("id", minimum=0)
            vocab = r.hello.get("vocab")
            if vocab is not None and vocab.isdigit() and token >= int(vocab):
                raise ColibriError(
                    f"malformed token frame from the board: id {token} is outside its vocabulary ({vocab})"
                )
            if NONFINITE in frame.fields:
                raise NonFiniteLogits("the firmware", f"step {step}", nonfinite_layer(frame))
            r.tokens.append(token)
            r.digests.append(frame.fields.get("logits", ""))
            if "us" in frame.fields:
                r.token_us.append(frame.int("us"))
            if self.on_token:
                self.on_token(step, r.tokens[-1])
        elif frame.kind == "score":
            index, token = frame.int("i", minimum=1), frame.int("id", minimum=0)
            if r.scores and index != r.scores[-1].index + 1:
                raise ColibriError(f"score frame for prompt token {index} arrived after token {r.scores[-1].index}")
            if NONFINITE in frame.fields:
                raise NonFiniteLogits("the firmware", f"prompt token {index}", nonfinite_layer(frame))
            r.scores.append(Score(index, token, frame.f32("lp"), frame.f32("z")))
        elif frame.kind == "stats":
            for key in CACHE_STATS:
                if key in frame.fields:  # protocol 3, Linux boards: how the weights are held
                    frame.int(key, minimum=0)
            if "auto_found" in frame.fields and frame.fields.get("auto_source") not in AUTO_SOURCES:
                raise ColibriError(
                    f"malformed stats frame from the board: auto_source="
                    f"{frame.fields.get('auto_source', '')[:24]!r} is none of {', '.join(AUTO_SOURCES)}"
                )
            r.stats = frame.fields
        elif frame.kind == "bandwidth":
            r.bandwidth = frame.fields
        elif frame.kind == "storage":
            for key in ("read_bw", "bytes", "chunk", "direct"):
                frame.int(key, minimum=0)
            r.storage = frame.fields
        elif frame.kind == "selftest":
            result = frame.fields.get("result")
            if result not in ("pass", "fail"):
                raise ColibriError(f"malformed selftest frame from the board: result={str(result)[:24]!r}")
            for key in ("kernels_checked", "steps", "us"):
                frame.int(key, minimum=0)
            r.selftest = Selftest(result == "pass", frame.fields)
        elif frame.kind == "checkpoint":
            sha = frame.fields.get("sha", "")
            if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise ColibriError("malformed checkpoint frame from the board: sha is not a SHA-256")
            layer, op = frame.int("layer", minimum=-1), frame.fields.get("op", "")
            r.checkpoints.append(Checkpoint(layer, op, frame.int("n", minimum=1), sha, frame.f32_list("values")))
        elif frame.kind == "ack":
            pass  # flow control of the request, the link's business (serial_link.py)
        elif frame.kind == "experts":
            # A layer's counts may come in several frames: each says where its part starts (first)
            # and how many counts the layer has (of); they must arrive in order and add up.
            layer, counts = frame.int("layer", minimum=0), frame.int_list("counts")
            first, total = frame.int("first", minimum=0), frame.int("of", minimum=1)
            have = r.expert_counts.setdefault(layer, [])
            if first != len(have) or self._experts_of.setdefault(layer, total) != total or first + len(counts) > total:
                raise ColibriError(
                    f"malformed experts frame from the board: layer {layer}'s counts "
                    f"{first}..{first + len(counts) - 1} of {total} do not follow the {len(have)} received"
                )
            have.extend(counts)
        elif frame.kind == "done":
            short = [layer for layer, total in self._experts_of.items() if len(r.expert_counts[layer]) != total]
            if short:
                raise ColibriError(
                    f"the board sent only {len(r.expert_counts[short[0]])} of "
                    f"{self._experts_of[short[0]]} expert counts for layer {short[0]}"
                )
            if "tokens" in frame.fields and frame.int("tokens") != len(r.tokens):
                raise ColibriError(f"the board reports {frame.fields['tokens']} tokens but {len(r.tokens)} arrived")
            r.stop_reason = frame.fields.get("reason", "")
            if "held" in frame.fields:
                r.held = frame.int("held", minimum=0)
            self.finished = True


def nonfinite_layer(frame: Frame) -> int | None:
    """A token or score frame's nonfinite field (protocol 6): the first layer whose output was not
    finite, or None for "head" (the final norm or the output matrix)."""
    if frame.fields[NONFINITE] == HEAD:
        return None
    return frame.int(NONFINITE, minimum=0)


def check_fits_context(prompt: list[int], steps: int, n_ctx: int, limit: int | None = None) -> None:
    """Refuse a request the firmware's context cannot hold, saying why the numbers add up as they
    do and which change works. `limit`: the largest context this board and model allow (None:
    no limit known), so the advice never names a --ctx that would itself be refused."""
    n_prompt = len(prompt)
    need = n_prompt + steps - 1
    if need <= n_ctx:
        return
    why = (
        f"the prompt's {n_prompt} tokens and {steps} steps need a context of {need}: {n_prompt} positions for "
        f"the prompt and {steps - 1} for the generated tokens fed back into the model (the last one never is)"
    )
    fixes = []
    if limit is None or need <= limit:
        fixes.append(f"--ctx {need}")
    if n_ctx - n_prompt + 1 >= 1:
        fixes.append(f"--steps {n_ctx - n_prompt + 1} or fewer")
    if limit is not None and need > limit and limit > n_ctx and limit - n_prompt + 1 >= 1:
        fixes.append(f"--ctx {limit} with --steps {limit - n_prompt + 1} or fewer")
    if not fixes:
        # Only a shorter prompt works: the longest one that leaves room for these steps (the
        # context less the steps, plus the last token that is never fed back), and for one step.
        largest = max(limit or n_ctx, n_ctx)
        with_ctx = f" (and --ctx {largest})" if largest > n_ctx else ""
        longest = largest - steps + 1
        fixes.append(
            f"a prompt of at most {longest} tokens with --steps {steps}, or of at most {largest} tokens with --steps 1"
            if longest >= 1
            else f"a prompt of at most {largest} tokens with --steps 1"
        )
        fixes[-1] += with_ctx
    allowed = f"; this board and model allow a context of at most {limit}" if limit is not None and need > limit else ""
    raise ColibriError(f"{why}, but the firmware is built for a context of {n_ctx}{allowed}: use {' or '.join(fixes)}")


def request_frame(request: RunRequest, seq: int = 0) -> bytes:
    """The request frame of `request`: what every board reads (firmware_src/app/request.c)."""
    if request.selftest:
        return encode_frame(seq, "selftest", {})
    s = request.sampling.as_f32()
    return encode_request(
        seq,
        request.prompt,
        request.steps,
        s.temperature,
        s.top_k,
        s.top_p,
        s.min_p,
        s.seed,
        request.stop_at_eos,
        request.digests,
        request.threads,
        request.probe_bandwidth_mib,
        request.start,
        request.score_from,
        request.decode_from,
        request.speculate,
        s.repeat_penalty,
        s.repeat_last_n,
        request.trace,
    )
