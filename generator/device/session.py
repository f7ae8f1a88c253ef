"""A run's request and its result, and the Session that turns a board's frames into the result:
the types every link (a process's stdin/stdout, a serial port, an emulator's socket) shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import ColibriError
from .protocol import Frame, encode_request
from ..numerics.sampling import SamplingParams


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


@dataclass
class RunResult:
    hello: dict[str, str] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    stats: dict[str, str] = field(default_factory=dict)
    bandwidth: dict[str, str] = field(default_factory=dict)  # read_bw (bytes/s), mib, threads, passes; if probed
    expert_counts: dict[int, list[int]] = field(default_factory=dict)  # MoE layer -> selections per expert
    token_us: list[int] = field(default_factory=list)  # per step: microseconds since the prompt was done
    stop_reason: str = ""
    log: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    remote: dict | None = None  # a run over SSH: where it ran and the bytes sent (device/remote.py)


class Session:
    """Interprets one run's frames: hello, token..., stats, done; or an error frame."""

    def __init__(self, expected_model: str | None = None, on_token: Callable[[int, int], None] | None = None):
        self.result = RunResult()
        self.expected_model = expected_model
        self.on_token = on_token
        self.finished = False

    def handle(self, frame: Frame) -> None:
        r = self.result
        if frame.kind == "hello":
            if r.hello and frame.seq == 0:
                raise ColibriError("the board reset during the run (a second hello frame arrived)")
            r.hello = frame.fields
            if self.expected_model and frame.fields.get("model") != self.expected_model:
                raise ColibriError(f"the board runs firmware for model {frame.fields.get('model', '?')[:16]}…, "
                                   f"expected {self.expected_model[:16]}… (flash the matching build)")
        elif frame.kind == "error":
            msg = frame.fields.get("msg", "unknown error")
            raise ColibriError(f"firmware reported error {frame.fields.get('code', '?')}: {msg}")
        elif frame.kind == "token":
            step = frame.int("step")
            if step != len(r.tokens):
                raise ColibriError(f"token frame for step {step} arrived when step {len(r.tokens)} was expected")
            r.tokens.append(frame.int("id"))
            r.digests.append(frame.fields.get("logits", ""))
            if "us" in frame.fields:
                r.token_us.append(frame.int("us"))
            if self.on_token:
                self.on_token(step, r.tokens[-1])
        elif frame.kind == "stats":
            r.stats = frame.fields
        elif frame.kind == "bandwidth":
            r.bandwidth = frame.fields
        elif frame.kind == "experts":
            try:
                r.expert_counts[frame.int("layer")] = [int(c) for c in frame.fields["counts"].split(",")]
            except (KeyError, ValueError):
                raise ColibriError("malformed experts frame from the board") from None
        elif frame.kind == "done":
            if "tokens" in frame.fields and frame.int("tokens") != len(r.tokens):
                raise ColibriError(f"the board reports {frame.fields['tokens']} tokens but {len(r.tokens)} arrived")
            r.stop_reason = frame.fields.get("reason", "")
            self.finished = True


def check_fits_context(prompt: list[int], steps: int, n_ctx: int) -> None:
    if len(prompt) + steps - 1 > n_ctx:
        raise ColibriError(f"prompt ({len(prompt)} tokens) + {steps} steps need a context of "
                           f"{len(prompt) + steps - 1}, the firmware is built for {n_ctx} (use --ctx or fewer --steps)")


def request_frame(request: RunRequest, seq: int = 0) -> bytes:
    """The request frame of `request`: what every board reads (firmware_src/app/request.c)."""
    s = request.sampling.as_f32()
    return encode_request(seq, request.prompt, request.steps, s.temperature, s.top_k, s.top_p, s.min_p, s.seed,
                          request.stop_at_eos, request.digests, request.threads, request.probe_bandwidth_mib)
