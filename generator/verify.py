"""Verify: a firmware's run against the NumPy reference on the same weight image. The comparison
(the firmware's identity, tokens, per-step logits hashes, MoE routing counts, the first divergent
step) and the rates a run reports are computed here, once, for `verify`, `release` and `bench`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .boards import Board
from .compile.firmware_id import firmware_build_id
from .compile.image import identity_sha256, map_image
from .compile.plan import Plan, speculation_notice
from .device.session import CacheStats, RunRequest, RunResult, Selftest, cache_stats
from .documents import JsonDocument, json_meta
from .errors import ColibriError
from .reference import Generation, Reference
from .verify_localise import Localisation, localise_step

if TYPE_CHECKING:
    from .compile.build import Artifacts

# ---- is the firmware that answers the one this build produced? ---------------------------------


@dataclass(frozen=True)
class FirmwareIdentity:
    """What a build's firmware says about itself in its hello frame. The model hash alone does not
    tell builds apart: another board's firmware, or another context or quantization of the same
    model, carries the same one."""

    board: str
    quant: str
    ctx: str
    model: str  # the model/config hash the image and the firmware share
    weights: str  # SHA-256 of the weight image the firmware accepts
    build: str | None  # GNU build-id of the ELF (ESP-IDF: SHA-256 of the app ELF); None: not built here

    def fields(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# How each field is named in "what differs"; hashes are shortened.
_FIELD_NAMES = {
    "board": "board",
    "quant": "quantization",
    "ctx": "context",
    "model": "model hash",
    "weights": "weight image SHA-256",
    "build": "build id",
}
_HASHES = ("model", "weights", "build")


def firmware_identity(board: Board, art: Artifacts, plan: Plan) -> FirmwareIdentity:
    """The identity of the firmware built as `art` (compile.build.Artifacts) for `plan`."""
    weights = identity_sha256(map_image(art.weights)).hex()
    return FirmwareIdentity(
        board.name, plan.quant, str(plan.n_ctx), art.model_hash(), weights, firmware_build_id(board, art.program)
    )


def identity_differences(hello: dict[str, str], identity: FirmwareIdentity) -> list[str]:
    """What differs between a hello frame and this build, one phrase per field ([] if nothing)."""

    def show(name: str, value: str) -> str:
        return value[:16] + "…" if name in _HASHES and len(value) > 16 else value

    out = []
    for name, expected in identity.fields().items():
        got = hello.get(name)
        if got is None:
            out.append(f"no {_FIELD_NAMES[name]} reported (this build: {show(name, expected)})")
        elif got.lower() != expected.lower():
            out.append(f"{_FIELD_NAMES[name]} {show(name, got)} (this build: {show(name, expected)})")
    return out


class FirmwareMismatch(ColibriError):
    """The board answered with firmware that is not this build (refused at its hello frame,
    before the request is sent)."""

    def __init__(self, message: str, differences: list[str], hello: dict[str, str]) -> None:
        super().__init__(message)
        self.differences, self.hello = differences, dict(hello)


def hello_check(identity: FirmwareIdentity) -> Callable[[dict[str, str]], None]:
    """A Session hello check (device.session.Session's check_hello) that refuses any firmware
    but this build's, saying what differs and how to put this build on the board."""

    def check(hello: dict[str, str]) -> None:
        differences = identity_differences(hello, identity)
        if differences:
            raise FirmwareMismatch(
                f"the firmware on the board is not this build: {'; '.join(differences)} "
                f"(flash this build: ./colibri flash --board {identity.board} "
                f"with the same --model, --quant and --ctx)",
                differences,
                hello,
            )

    return check


def reference_run(plan: Plan, weights: Path, request: RunRequest) -> Generation:
    """What the firmware must produce for `request`: the reference's decode of the same image."""
    return Reference(plan, map_image(weights)).generate(
        request.prompt, request.steps, request.sampling, request.stop_at_eos, decode_from=request.decode_from
    )


def first_divergence(
    fw_tokens: list[int], fw_digests: list[str], ref_tokens: list[int], ref_digests: list[str]
) -> int | None:
    """The first step whose token or logits hash differs, or where one side stopped earlier."""
    for i in range(max(len(fw_tokens), len(ref_tokens))):
        if i >= len(fw_tokens) or i >= len(ref_tokens):
            return i
        if fw_tokens[i] != ref_tokens[i] or fw_digests[i] != ref_digests[i]:
            return i
    return None


@dataclass(frozen=True)
class Comparison:
    firmware: RunResult
    reference: Generation
    first_divergent_step: int | None
    routing_layer: int | None  # the first MoE layer whose expert counts differ

    @property
    def passed(self) -> bool:
        return self.first_divergent_step is None and self.routing_layer is None

    def verdict(self, board: str, quant: str, mode: str) -> str:
        """The one line verify prints: PASS with what matched, or FAIL with where it first differs."""
        fw, ref = self.firmware, self.reference
        if self.passed:
            routing = f", expert routing of {len(ref.expert_counts)} MoE layers identical" if ref.expert_counts else ""
            return (
                f"PASS: {board} firmware matches the NumPy reference bit for bit: {len(fw.tokens)} tokens "
                f"and {len(fw.digests)} per-step logits SHA-256 identical{routing} ({quant}, {mode})"
            )
        if self.first_divergent_step is None:
            layer = self.routing_layer
            assert layer is not None  # it did not pass, and no step diverged: the routing did
            return (
                f"FAIL: expert routing differs in layer {layer}: firmware {fw.expert_counts.get(layer)}, "
                f"reference {ref.expert_counts.get(layer)}"
            )
        step = self.first_divergent_step

        def at(tokens: list[int], digests: list[str]) -> str:
            if step < len(tokens):
                return f"token {tokens[step]}, logits {digests[step][:16]}"
            return "no token (stopped earlier)"

        return (
            f"FAIL: first divergent step {step}: firmware {at(fw.tokens, fw.digests)}; "
            f"reference {at(ref.tokens, ref.digests)}"
        )


def compare(result: RunResult, ref: Generation) -> Comparison:
    layers = sorted(set(result.expert_counts) | set(ref.expert_counts))
    routing = next((i for i in layers if result.expert_counts.get(i) != ref.expert_counts.get(i)), None)
    return Comparison(result, ref, first_divergence(result.tokens, result.digests, ref.tokens, ref.digests), routing)


@dataclass(frozen=True)
class Verified:
    """A firmware's run checked against the NumPy reference on the same weight image: the
    comparison, what its hello frame says that differs from this build, and its self-test."""

    board: Board
    plan: Plan
    request: RunRequest
    result: RunResult
    reference: Generation
    comparison: Comparison
    identity: FirmwareIdentity
    identity_problems: list[str]  # what the hello frame says that differs from this build ([]: it is this build)
    selftest: Selftest | None  # None: not asked (a real board not reached here)
    # Where the first divergent step first differs (verify_localise.py): None when nothing diverged
    # or no replay was asked; a string when the replay could not be made (why).
    localisation: Localisation | str | None = None

    @property
    def passed(self) -> bool:
        selftest_ok = self.selftest is None or self.selftest.passed
        return self.comparison.passed and not self.identity_problems and selftest_ok

    @property
    def stats(self) -> RunStats:
        return run_stats(self.result, self.board, self.request, self.plan)


def verify_run(
    board: Board,
    plan: Plan,
    weights: Path,
    identity: FirmwareIdentity,
    request: RunRequest,
    result: RunResult,
    selftest: Callable[[], Selftest | None] | None,
    replay: Callable[[RunRequest], RunResult] | None = None,
) -> Verified:
    """The one verify, for `verify` and `release`: the firmware's `result` for `request` against the
    reference's decode of `weights`, its hello against this build's identity, and its own check
    (app/selftest.c): the selftest frame of its boot run (MCU boards), else what `selftest()` asks
    (None: not checked, a board not reached here). With `replay` (a run of another request on the
    same firmware), a divergent step is replayed with its checkpoints and localised."""
    reference = reference_run(plan, weights, request)
    comparison = compare(result, reference)
    problems = identity_differences(result.hello, identity)
    checked = None if selftest is None else result.selftest if result.selftest is not None else selftest()
    step = comparison.first_divergent_step
    localised: Localisation | str | None = None
    if replay is not None and step is not None and not problems:
        if step < len(result.tokens) and step < len(reference.tokens):
            try:
                localised = localise_step(plan, weights, request, step, reference.tokens[step], replay)
            except ColibriError as e:
                localised = f"the replay of step {step} with its checkpoints failed: {e}"
        else:
            localised = f"step {step} has no logits on one side (it stopped earlier): nothing to replay"
    return Verified(board, plan, request, result, reference, comparison, identity, problems, checked, localised)


@dataclass(frozen=True)
class RunRates(JsonDocument):
    """A run's speeds from its stats frame: tokens per second (wall clock) or instructions per
    token (boards that count them); None where the run has no such figure."""

    # Speculative decoding (None: not asked for, and not in the document): passes that checked a
    # draft, tokens drafted, taken.
    speculation: dict[str, float] | None = field(metadata=json_meta(omit_none=True))
    prompt_tokens: int
    prefill_seconds: float
    prefill_tok_s: float | None
    decode_forward_passes: int
    decode_seconds: float
    decode_tok_s: float | None
    forward_tok_s: float | None  # the forward passes alone, without sampling, logits hashing and frame output
    # Exact retired instructions, on boards that count them (qemu-rv32, esp32p4).
    prefill_instructions_per_token: float | None
    decode_instructions_per_token: float | None


def rates(result: RunResult) -> RunRates:
    """A run's speeds from its stats frame."""
    s = result.stats
    prefill_us, decode_us = int(s.get("prefill_us", 0)), int(s.get("decode_us", 0))
    forward_us = int(s.get("forward_us", 0))
    n_prompt, n_decode = int(s.get("prompt", 0)), int(s.get("decode", 0))
    passes = n_decode
    speculation = None
    if "drafted" in s:
        # A pass that checked a draft decodes its token and every drafted one taken: tokens, not passes.
        drafted, accepted, checked = int(s["drafted"]), int(s["accepted"]), int(s["spec_passes"])
        n_decode = passes + accepted
        speculation = {
            "passes_with_draft": checked,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_pass": n_decode / passes if passes else 0.0,
        }
    return RunRates(
        prompt_tokens=n_prompt,
        prefill_seconds=prefill_us / 1e6,
        prefill_tok_s=n_prompt / (prefill_us / 1e6) if prefill_us else None,
        decode_forward_passes=passes,
        decode_seconds=decode_us / 1e6,
        decode_tok_s=n_decode / (decode_us / 1e6) if decode_us and n_decode else None,
        forward_tok_s=n_decode / (forward_us / 1e6) if forward_us and n_decode else None,
        prefill_instructions_per_token=int(s["prefill_instret"]) / n_prompt
        if "prefill_instret" in s and n_prompt
        else None,
        decode_instructions_per_token=int(s["decode_instret"]) / n_decode
        if "decode_instret" in s and n_decode
        else None,
        speculation=speculation,
    )


# Under this share of a stack or heap left, verify and report warn.
MARGIN_WARNING = 0.10
# The build directory's record of the margins its firmware last reported (verify writes it, report
# reads it for the same build id).
MARGINS_FILE = "margins.json"


@dataclass(frozen=True)
class Margins(JsonDocument):
    """An MCU's memory margins from its stats frame (firmware_src/bsp/rv32-common): the most of its
    stack ever used (the high-water mark over the stack painted at start-up) and the stack's size,
    the largest heap use and the heap's size (0 and 0: no heap, the arenas are static)."""

    stack_used: int
    stack_size: int
    heap_peak: int
    heap_size: int

    @classmethod
    def of(cls, stats: dict[str, str]) -> Margins | None:
        names = ("stack_used", "stack_size", "heap_peak", "heap_size")
        if not all(stats.get(n, "").isdigit() for n in names):
            return None  # a board that does not measure them (Linux: its peak RSS instead)
        return cls(*(int(stats[n]) for n in names))

    def line(self, planned_stack: int | None = None) -> str:
        stack = planned_stack or self.stack_size
        left = stack - self.stack_used
        heap = "heap: none (static arenas)"
        if self.heap_size:
            heap_left = 100 * (self.heap_size - self.heap_peak) / self.heap_size
            heap = f"heap: {self.heap_peak:,} B of {self.heap_size:,} B at most ({heap_left:.0f}% left)"
        return f"stack: {self.stack_used:,} B of {stack:,} B at most ({100 * left / stack:.0f}% left); {heap}"

    def warnings(self, planned_stack: int | None = None) -> list[str]:
        """Under MARGIN_WARNING left of the stack (`planned_stack`: the linked ELF's .stack, else the
        frame's size) or of the heap; a stack used past its size overflowed into what lies below it."""
        out = []
        stack = planned_stack or self.stack_size
        if stack and stack - self.stack_used < MARGIN_WARNING * stack:
            out.append(
                f"the firmware used {self.stack_used:,} B of its {stack:,} B stack at most: "
                f"{100 * (stack - self.stack_used) / stack:.1f}% left (under {100 * MARGIN_WARNING:.0f}%); "
                "a longer context or another model may overflow it (the stack is the linker script's .stack; "
                "on ESP-IDF, the main task's: CONFIG_ESP_MAIN_TASK_STACK_SIZE)"
            )
        if self.heap_size and self.heap_size - self.heap_peak < MARGIN_WARNING * self.heap_size:
            out.append(
                f"the firmware used {self.heap_peak:,} B of its {self.heap_size:,} B heap at most: "
                f"{100 * (self.heap_size - self.heap_peak) / self.heap_size:.1f}% left (under {100 * MARGIN_WARNING:.0f}%)"
            )
        return out


def planned_stack(board: Board, program: Path | None) -> int | None:
    """The stack the plan gives the decode: on ESP-IDF the main task's, which runs app_main (the board
    file's CONFIG_ESP_MAIN_TASK_STACK_SIZE; ESP-IDF adds its TASK_EXTRA_STACK_SIZE, which the frame's
    stack_size counts), else the one the linked firmware reserves (its ELF's .stack section); None
    where there is neither."""
    if board.idf is not None:
        size = board.idf.sdkconfig.get("ESP_MAIN_TASK_STACK_SIZE")
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    if program is None:
        return None
    from .compile.elfsize import read_elf

    return read_elf(program).sections.get(".stack") or None


def record_margins(out_dir: Path, build_id: str | None, margins: Margins) -> None:
    """Keep the margins a run of this build measured, for report (MARGINS_FILE, by build id)."""
    from .files import write_atomic

    write_atomic(out_dir / MARGINS_FILE, json.dumps({"build_id": build_id, **margins.to_json()}, indent=2) + "\n")


def recorded_margins(out_dir: Path, build_id: str | None) -> Margins | None:
    """The margins a run of this very build measured (recorded by verify), else None."""
    try:
        found = json.loads((out_dir / MARGINS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("build_id") != build_id:
        return None  # none recorded, or for a build since replaced
    return Margins.of({k: str(v) for k, v in found.items()})


@dataclass(frozen=True)
class RunStats(RunRates):
    """rates() with what they are: the emulator they were measured under (None: the board itself),
    for instruction counts what a token's count includes, the budget the run was given, and how a
    Linux board held its weights (mapped, slots, the expert cache's counters; None: not said)."""

    emulated_by: str | None
    instructions_counted: str | None
    memory_budget: int | str  # bytes, or "auto"
    weights_held: CacheStats | None
    margins: Margins | None = field(default=None, metadata=json_meta(omit_none=True))  # an MCU's
    # --speculate asked of a plan without room for it: that it was off, and why (plan.speculation_notice).
    speculation_off: str | None = field(default=None, metadata=json_meta(omit_none=True))


def instructions_scope(request: RunRequest, result: RunResult) -> str:
    """What a decode's instructions per token count: each forward pass (attention grows with the
    context, so the contexts it ran at matter), and for each step the sampling, the logits'
    SHA-256 when the request asked for them, and the token frame. Verify (sampled, hashed), a
    release (greedy, hashed) and bench (greedy, no hashing, longer) count different things."""
    s = request.sampling
    sampling = (
        "greedy sampling"
        if s.temperature == 0
        else f"sampling at temperature {s.temperature:g}"
        + (f", top-k {s.top_k}" if s.top_k else "")
        + (f", top-p {s.top_p:g}" if s.top_p < 1 else "")
        + (f", min-p {s.min_p:g}" if s.min_p else "")
    ) + (f", repeat penalty {s.repeat_penalty:g} over {s.repeat_last_n} tokens" if s.penalizes else "")
    passes = int(result.stats.get("decode", 0))
    first = len(request.prompt) + 1
    contexts = f"context {first}" if passes <= 1 else f"contexts {first}-{first + passes - 1}"
    hashing = "the logits' SHA-256" if request.digests else "no logits hashing"
    return f"forward pass at {contexts}, {sampling}, {hashing}, the token frame"


def run_stats(result: RunResult, board: Board, request: RunRequest, plan: Plan | None = None) -> RunStats:
    """rates() labelled with the board and request they were measured with (and with the plan, why
    a --speculate it had no room for was off)."""
    r = rates(result)
    return RunStats(
        **{f.name: getattr(r, f.name) for f in fields(RunRates)},
        emulated_by=board.runner.emulated_by(),
        instructions_counted=instructions_scope(request, result) if r.decode_instructions_per_token else None,
        memory_budget=request.memory_budget if isinstance(request.memory_budget, int) else str(request.memory_budget),
        weights_held=cache_stats(result),
        margins=Margins.of(result.stats),
        speculation_off=speculation_notice(plan, board, request.speculate) if plan else None,
    )


def budget_text(r: RunStats) -> str:
    """How a Linux board held its weights, as a phrase for run and verify: empty without a budget."""
    c = r.weights_held
    auto = auto_text(c) if c else ""
    if not c or not c.budget:
        return f" with --memory-budget {auto}" if auto else ""
    uses = c.expert_uses
    hits = f", {100 * (c.cache_hits or 0) / uses:.0f}% expert cache hits while decoding" if uses else ""
    slots = f", {c.slots} expert slots" if c.slots else ""
    locked = "" if not c.lock_refused else ", resident weights NOT locked (mlock refused)"
    return f" under a memory budget of {c.budget:,} B{slots}{hits}{locked}" + (
        f" (--memory-budget {auto})" if auto else ""
    )


def auto_text(c: CacheStats) -> str:
    """How the board chose its budget under --memory-budget auto (its stats frame), or empty."""
    ran = c.auto_ran()
    if ran is None:
        return ""
    return f"auto on the board: {ran.choice.describe(ran.budget == 0)}"


def speed_text(r: RunRates) -> str:
    """A run's decode speed as one phrase, labelled (RunStats): exact instruction counts say what
    they count, and a wall-clock speed under an emulator says it is the emulator's."""
    labels = r if isinstance(r, RunStats) else None
    if r.decode_instructions_per_token:
        text = f"{r.decode_instructions_per_token / 1e6:.2f} M instructions per decoded token"
        if labels and labels.instructions_counted:
            text += f" ({labels.instructions_counted})"
        return text
    if not r.decode_tok_s:
        return ""
    text = f"{r.decode_tok_s:.1f} tok/s"
    if labels and labels.emulated_by:
        text += f" under {labels.emulated_by} emulation (the emulator's speed on this machine, not the board's)"
    return text
