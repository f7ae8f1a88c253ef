"""What bench decodes (the Stream): on a MoE model a token stream a user's could be, because the
stream decides the routing and so the expert cache's hits: a text teacher-forced one token per
forward pass (the bundled Book of Ruth, or --text), or sampled decoding with a fixed seed. On a
dense model every token reads every weight whatever it is, so the default stays the fixed synthetic
prompt and greedy decoding (the numbers stay comparable with earlier ones and with llama-bench's).
And what the decode was fed, measured (StreamFigures)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..compile.plan import Plan
from ..device.session import RunRequest, RunResult
from ..documents import JsonDocument, json_meta
from ..errors import ColibriError
from ..files import REPO, TEXT_BYTES, read_limited
from ..numerics.sampling import SamplingParams

if TYPE_CHECKING:
    from ..model.tokenizer import Tokenizer


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
    data = read_limited(Path(path), TEXT_BYTES, f"--text {path}")
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

    per_token: int = field(metadata=json_meta(key="experts_per_token"))
    n_experts: int
    used_per_layer: dict[str, int] = field(metadata=json_meta(key="experts_used_per_layer"))


@dataclass(frozen=True)
class StreamFigures(JsonDocument):
    """What the decode was fed and how varied it was."""

    kind: str
    text: str | None  # the text file
    text_tokens: int | None
    sampling: SamplingParams | None  # the sampled stream's settings
    prompt_tokens: int
    decoded_tokens_fed: int
    distinct_tokens: int
    # the share of its NGRAM-grams that occurred earlier in it
    repeated_ngrams: float | None = field(metadata=json_meta(key=f"repeated_{NGRAM}grams"))
    description: str
    experts: StreamExperts | None = field(metadata=json_meta(flatten=True))  # None: a dense model


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


DEFAULT_STEPS = 128


DEFAULT_PROMPT_TOKENS = 8


def default_steps(plan: Plan, prompt_tokens: int) -> int:
    """DEFAULT_STEPS, or fewer when the firmware's context cannot hold them after the prompt (the
    esp32p4's default context of 128 holds an 8-token prompt and 121 steps)."""
    return max(1, min(DEFAULT_STEPS, plan.n_ctx - prompt_tokens + 1))
