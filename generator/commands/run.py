"""run, verify, selftest, chat, eval and bench: the commands that run firmware, each through job.py's
prepare -> build -> link, printing what it answered (text, or a --json document)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import job
from ..arguments import (
    add_board_args,
    add_compiled_args,
    add_decode_args,
    add_port_arg,
    add_remote_arg,
    add_sampling_args,
    add_speculate_arg,
    counts,
    non_negative_float,
    non_negative_int,
    positive_int,
    unit_float,
)
from ..chat import DEFAULT_REPLY_STEPS
from ..console import TextStream, counted, progress, user_messages, warn
from ..device.remote import ran_on
from ..device.session import RemoteRun
from ..documents import JsonDocument, json_field
from ..errors import ColibriError
from ..job import Ran
from ..model.tokenizer import Tokenizer
from ..numerics.sampling import SamplingParams
from ..selftest import SelftestCheck, selftest_checks
from ..verify import (
    FirmwareMismatch,
    RunStats,
    Verified,
    budget_text,
    planned_stack,
    record_margins,
    run_stats,
    speed_text,
)
from ..verify_localise import Localisation, write_trace
from .common import Command, job_options, print_json


def decode_text(tokenizer: Tokenizer | None, ids: list[int]) -> str | None:
    return tokenizer.decode(ids) if tokenizer else None


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """run's and verify's options."""
    add_compiled_args(p)
    add_decode_args(p, steps=64)
    add_speculate_arg(p)
    add_board_args(p)


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    """verify's options: run's, and where to keep a localised divergence's checkpoints."""
    add_run_arguments(p)
    p.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="on a mismatch, write every checkpoint of the replayed divergent step (board and reference, "
        "one JSON object a line) to FILE, for a diff",
    )


def _run_prepared(args: argparse.Namespace, stream: bool) -> tuple[job.Prepared[job.PromptInputs], job.Built, Ran]:
    """(prepared, built, ran): the run, and what made it (verify asks the same firmware again)."""
    options = job_options(args)
    prepared = job.prepare_run(options)
    built = job.build(prepared)
    text_out = TextStream(prepared.tokenizer, enabled=stream and not args.json, echo=prepared.inputs.text)
    try:
        return prepared, built, job.run_built(prepared, built, on_token=text_out)
    finally:
        text_out.end_line()


@dataclass(frozen=True)
class RunDocument(JsonDocument):
    """run --json's document: the prompt, the tokens and their text, the per-step logits hashes,
    why it stopped, the run's figures and, over SSH, where it ran."""

    board: str
    prompt: list[int]
    tokens: list[int]
    text: str | None
    logits_sha256: list[str]
    stop_reason: str
    stats: RunStats
    remote: RemoteRun | None


def run(args: argparse.Namespace) -> int:
    ran: Ran = _run_prepared(args, stream=True)[2]
    result = ran.result
    stats = run_stats(result, ran.board, ran.request, ran.plan)
    if args.json:
        print_json(
            RunDocument(
                ran.board.name,
                ran.request.prompt,
                result.tokens,
                decode_text(ran.tokenizer, result.tokens),
                result.digests,
                result.stop_reason,
                stats,
                result.remote,
            ).to_json()
        )
    else:
        speed = f"; decode {speed_text(stats)}" if speed_text(stats) else ""
        print(
            f"[{len(result.tokens)} tokens on {ran_on(ran.board, result)}{budget_text(stats)}, stopped by "
            f"{result.stop_reason}{speed}]",
            file=sys.stderr,
        )
    return 0


@dataclass(frozen=True)
class IdentityMismatch(JsonDocument):
    differences: list[str]
    hello: dict[str, str]


@dataclass(frozen=True)
class NotThisBuild(JsonDocument):
    """verify --json's document when another firmware answered (refused at its hello frame)."""

    board: str
    model: Path
    passed: bool = json_field(key="pass")
    firmware_identity: IdentityMismatch = json_field()


@dataclass(frozen=True)
class Decoded(JsonDocument):
    """A decode's tokens, per-step logits hashes and why it stopped."""

    tokens: list[int]
    logits_sha256: list[str]
    stop_reason: str


@dataclass(frozen=True)
class VerifyDocument(JsonDocument):
    """verify --json's document: the build and the request, the firmware's decode and the
    reference's, the self-test's frame, the verdict and the run's figures."""

    board: str
    model: Path
    quant: str
    n_ctx: int
    prompt: list[int]
    sampling: SamplingParams
    firmware_identity: dict[str, object]
    firmware: Decoded
    reference: Decoded
    text: str | None
    passed: bool = json_field(key="pass")
    selftest: dict[str, object] | None = json_field()
    expert_counts: dict[str, dict[int, list[int]]] | None = json_field()
    first_divergent_step: int | None = json_field()
    # Where the divergent step first differs (verify_localise.Localisation), or why it could not be said.
    localisation: Localisation | str | None = json_field()
    stats: RunStats = json_field()
    remote: RemoteRun | None = json_field()

    @classmethod
    def of(cls, verified: Verified, model: Path, text: str | None) -> VerifyDocument:
        plan, request, result, ref = verified.plan, verified.request, verified.result, verified.reference
        selftest = verified.selftest
        return cls(
            verified.board.name,
            model,
            plan.quant,
            plan.n_ctx,
            request.prompt,
            request.sampling,
            {"expected": verified.identity.fields(), "differences": verified.identity_problems},
            Decoded(result.tokens, result.digests, result.stop_reason),
            Decoded(ref.tokens, ref.digests, ref.stop_reason),
            text,
            verified.passed,
            {"pass": selftest.passed, **selftest.fields} if selftest else None,
            {"firmware": result.expert_counts, "reference": ref.expert_counts} if ref.expert_counts else None,
            verified.comparison.first_divergent_step,
            verified.localisation,
            verified.stats,
            result.remote,
        )


def verify(args: argparse.Namespace) -> int:
    if args.trace is not None and args.trace.is_dir():
        raise ColibriError(f"--trace {args.trace} is a directory: give the file to write the checkpoints to")
    try:
        prepared, built, ran = _run_prepared(args, stream=True)
    except FirmwareMismatch as e:
        # Another firmware answered: a verdict about what is on the board, not a broken link.
        if args.json:
            print_json(NotThisBuild(args.board, args.model, False, IdentityMismatch(e.differences, e.hello)).to_json())
        else:
            print(f"FAIL: {e}")
        return 1
    board, request, result = ran.board, ran.request, ran.result
    stats = run_stats(result, board, request, ran.plan)
    if not args.json:
        speed = f" at {speed_text(stats)}" if speed_text(stats) else ""
        progress(
            f"firmware on {ran_on(board, result)}{budget_text(stats)} (its hello names this build: board, context, "
            f"quantization, weight image, build id): {len(result.tokens)} tokens{speed}, stopped by {result.stop_reason}; "
            f"running the NumPy reference on the same weight image"
        )
    verified = job.verify_ran(prepared, built, ran)
    margins = stats.margins
    if margins is not None:
        # An MCU's stack and heap at their most, against the stack its linked ELF reserves; kept for report.
        planned = planned_stack(board, built.art.program)
        record_margins(built.art.out_dir, built.identity.build, margins)
        if not args.json:
            progress(margins.line(planned))
        for warning in margins.warnings(planned):
            warn(warning)
    selftest, quant = verified.selftest, verified.plan.quant
    localisation = verified.localisation
    if args.trace is not None and isinstance(localisation, Localisation):
        write_trace(args.trace, board.name, localisation)
    mode = "greedy" if request.sampling.temperature == 0 else f"sampled, seed {request.sampling.seed}"
    if args.json:
        print_json(VerifyDocument.of(verified, args.model, decode_text(ran.tokenizer, result.tokens)).to_json())
    elif selftest is not None and not selftest.passed:
        progress(verified.comparison.verdict(board.name, quant, mode))
        print(f"FAIL: the {board.name} firmware's {selftest.line()}")
    else:
        if selftest is not None:
            progress(selftest.line())
        print(verified.comparison.verdict(board.name, quant, mode))
    if not args.json and localisation is not None:
        print(localisation.line() if isinstance(localisation, Localisation) else f"not localised: {localisation}")
        if args.trace is not None and isinstance(localisation, Localisation):
            progress(f"every checkpoint of step {localisation.step} written to {args.trace}")
    return 0 if verified.passed else 1


# ---- selftest: the firmware's own verdict on itself (app/selftest.c), no host reference ----


def add_selftest_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    add_port_arg(p)
    add_remote_arg(p)


@dataclass(frozen=True)
class SelftestDocument(JsonDocument):
    """selftest --json's document: the build, the verdict, each check, and the frame's own fields."""

    board: str
    model: Path
    quant: str
    n_ctx: int
    passed: bool = json_field(key="pass")
    checks: list[SelftestCheck] = json_field()
    frame: dict[str, str] = json_field()


def selftest(args: argparse.Namespace) -> int:
    prepared, frame = job.selftest(job_options(args))
    board, plan = prepared.board, prepared.plan
    checks = selftest_checks(frame, plan, board.selftest.steps)
    if args.json:
        print_json(
            SelftestDocument(
                board.name, args.model, plan.quant, plan.n_ctx, frame.passed, checks, frame.fields
            ).to_json()
        )
    else:
        for check in checks:
            verdict = "ok  " if check.passed else "FAIL"
            print(
                f"  {verdict} {check.name}: {check.checked}" + (f"\n       {check.differed}" if check.differed else "")
            )
        print(f"{board.name}: {frame.line()}")
    return 0 if frame.passed else 1


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    p.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    p.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="a Jinja2 chat template file (as tokenizer_config.json's chat_template), used instead of the model's own",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULT_REPLY_STEPS,
        help=f"the most tokens a reply may have; it also ends at the model's end-of-turn token "
        f"(default {DEFAULT_REPLY_STEPS}, and never past the context)",
    )
    add_sampling_args(p)
    add_speculate_arg(p)
    add_board_args(p)


@dataclass(frozen=True)
class ChatTurnDocument(JsonDocument):
    """chat --json's line for one turn: the messages, what was prefilled from where (`start`: the
    KV cache's tokens kept), the reply's tokens and logits hashes, the tokens held back."""

    turn: int
    user: str
    reply: str
    prompt: list[int]
    tokens: list[int]
    logits_sha256: list[str]
    start: int
    prefilled: int
    reprefilled: bool
    held: int
    stop_reason: str
    stats: RunStats

    @classmethod
    def of(cls, index: int, turn: job.ChatTurn, stats: RunStats) -> ChatTurnDocument:
        planned, result = turn.planned, turn.result
        return cls(
            index,
            turn.user,
            turn.reply,
            planned.prompt,
            result.tokens,
            result.digests,
            planned.start,
            len(planned.prompt),
            planned.reprefilled,
            result.held,
            result.stop_reason,
            stats,
        )


def chat(args: argparse.Namespace) -> int:
    prepared = job.prepare_chat(job_options(args))
    board, plan = prepared.board, prepared.plan
    built = job.build(prepared)
    state = job.chat_state(prepared, args.steps, args.system)
    interactive = sys.stdin.isatty() and not args.json
    if interactive:
        progress(f"chatting with {args.model} on {board.name} (context {plan.n_ctx}); Ctrl-D ends")
    turns = job.converse(
        prepared,
        built,
        state,
        user_messages(interactive),
        digests=args.json,
        stream=lambda: TextStream(prepared.tokenizer, enabled=not args.json),
    )
    for index, turn in enumerate(turns):
        if args.json:
            stats = run_stats(turn.result, board, turn.request, plan)
            print_json(ChatTurnDocument.of(index, turn, stats).to_json(), indent=None, flush=True)
        elif turn.planned.reprefilled:
            progress("(the chat template rewrote earlier turns: the whole conversation was prefilled again)")
    return 0


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    p.add_argument("--text", type=Path, required=True, metavar="FILE", help="UTF-8 text to score")
    p.add_argument("--chunks", type=positive_int, help="score at most this many chunks (default: all)")
    p.add_argument(
        "--check",
        action="store_true",
        help="also score with the NumPy reference and require every score to be bit-identical",
    )
    add_board_args(p)


@dataclass(frozen=True)
class EvalDocument(JsonDocument):
    """eval --json's document: the text's perplexity on the board and how it was scored."""

    board: str
    model: Path
    quant: str
    n_ctx: int
    text: Path
    text_tokens: int
    chunks: int
    tokens_scored: int
    ppl: float
    ppl_error: float
    seconds: float
    tokens_per_second: float
    reference_checked: bool


def evaluate(args: argparse.Namespace) -> int:
    prepared = job.prepare_eval(job_options(args), args.text)
    board, plan = prepared.board, prepared.plan
    ev = job.evaluate_built(prepared, job.build(prepared), args.check, args.chunks)
    r = ev.result
    if args.json:
        print_json(
            EvalDocument(
                board.name,
                args.model,
                plan.quant,
                plan.n_ctx,
                args.text,
                len(prepared.inputs),
                ev.chunks,
                r.tokens,
                r.ppl,
                r.error,
                ev.seconds,
                ev.tokens_per_second,
                ev.reference_checked,
            ).to_json()
        )
    else:
        checked = "; every score bit-identical to the NumPy reference's" if ev.reference_checked else ""
        print(
            f"PPL = {r.ppl:.4f} +/- {r.error:.5f} ({counted(r.tokens, 'token')} scored in {counted(ev.chunks, 'chunk')} of {plan.n_ctx} "
            f"on {board.name}, {plan.quant}; {ev.tokens_per_second:.1f} tok/s{checked})"
        )
    return 0


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    p.add_argument(
        "--steps",
        type=counts(1),
        help="decoded tokens per run (default 128, or fewer so that "
        "the prompt and the steps fit the firmware's context); several, comma-separated: a row each",
    )
    p.add_argument(
        "--prompt-tokens",
        type=counts(1),
        default=8,
        help="prompt length (default 8); several, comma-separated (64,512): a row each",
    )
    p.add_argument(
        "--output",
        choices=("md", "csv", "json"),
        help="a table of a row per combination of --threads, --prompt-tokens and --steps, with llama-bench's "
        "column names: md (Markdown), csv or json (default: md for a sweep, else bench's line of text)",
    )
    p.add_argument(
        "--repeat",
        type=positive_int,
        help="runs; the median is reported (default 3; 1 on boards whose instruction counts are exact)",
    )
    p.add_argument("--plot", type=Path, metavar="PNG", help="also draw decode tok/s against context length into PNG")
    p.add_argument(
        "--stream",
        choices=("text", "sampled", "synthetic"),
        help="the tokens decoded: text (a text teacher-forced, one token per forward pass), sampled "
        "(sampled decoding, fixed seed) or synthetic (a fixed prompt, then greedy: it repeats); "
        "default: text on MoE models (sampled without a tokenizer), synthetic on dense ones",
    )
    p.add_argument(
        "--text",
        type=Path,
        metavar="FILE",
        help="UTF-8 text of the text stream (default: docs/texts/ruth-kjv.txt, the Book of Ruth, public domain)",
    )
    p.add_argument(
        "--temperature",
        type=non_negative_float,
        help="the sampled stream's temperature (default: the model's generation_config.json if it samples, else 1.0)",
    )
    p.add_argument("--top-p", type=unit_float, help="the sampled stream's top-p (default: the model's, else 0.95)")
    p.add_argument("--seed", type=non_negative_int, help="the sampled stream's seed (default 0)")
    add_speculate_arg(p)
    p.add_argument(
        "--no-in-ram",
        action="store_true",
        help="under --memory-budget, skip the runs of the same "
        "stream without a budget that bench alternates with the budgeted ones on MoE models",
    )
    add_board_args(p, threads_sweep=True)


def bench(args: argparse.Namespace) -> int:
    from ..bench import bench_line
    from ..bench.text import format_rows, is_sweep, load_warning, machine_load, points, row

    sweep = is_sweep(args.threads, args.prompt_tokens, args.steps)
    if sweep and args.plot:
        raise ColibriError("--plot draws one run: give one --threads, --prompt-tokens and --steps with it")
    # Every combination checked before anything is compiled; one build serves them all.
    combinations = []
    for point in points(args.threads, args.prompt_tokens, args.steps):
        one = argparse.Namespace(**{**vars(args), "threads": point.threads, "steps": point.steps})
        options = job.BenchOptions(
            args.stream, args.text, point.prompt_tokens, point.steps, args.repeat, args.plot, in_ram=not args.no_in_ram
        )
        combinations.append((options, job.prepare_bench(job_options(one), options)))
    built = job.build(combinations[0][1], quiet=True)
    before = machine_load()
    results = [job.bench_built(prepared, built, options) for options, prepared in combinations]
    name = combinations[0][1].plan.spec.name
    warning = load_warning(before, machine_load(), os.cpu_count() or 1, max(r.threads for r in results))
    if warning:
        warn(warning)
    if args.output or (sweep and not args.json):
        print(format_rows([row(r, name) for r in results], args.output or "md"))
    elif sweep:
        print_json([r.to_json() for r in results])
    elif args.json:
        print_json(results[0].to_json())
    else:
        print(bench_line(results[0], name))
    return 0


COMMANDS = [
    Command("run", "build, run the firmware on a prompt and print the text", add_run_arguments, run),
    Command(
        "verify",
        "run the firmware and the NumPy reference; PASS only if bit-identical and the firmware is this build",
        add_verify_arguments,
        verify,
    ),
    Command(
        "selftest",
        "build the firmware and run its own self-test on the board (the golden vectors in the artifact, "
        "no host reference): PASS or FAIL, its checks listed",
        add_selftest_arguments,
        selftest,
    ),
    Command(
        "chat",
        "chat with the model on a board: its chat template, the KV cache kept "
        "between turns (messages from standard input when it is not a terminal)",
        add_chat_arguments,
        chat,
    ),
    Command(
        "eval",
        "perplexity of a text, scored by the firmware on a board (llama.cpp's "
        "protocol: chunks of the context, second halves scored)",
        add_eval_arguments,
        evaluate,
    ),
    Command("bench", "measure prefill and decode speed (instructions on emulated MCUs)", add_bench_arguments, bench),
]
