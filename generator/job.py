"""Prepare → build → open the link, once, for every command that runs firmware: run, verify, chat,
eval and bench (and the parts of it that build, report and flash need: flash and ota are in
flash_job.py). This is the Python API a
script would use (the CLI is argparse and printing around it):

    from generator.job import JobOptions, run
    ran = run(JobOptions(board="host", prompt_ids="1,5,9", steps=8, ignore_eos=True))
    print(ran.result.tokens, ran.result.digests)

Every check that needs no compiler comes first, in one order for every command (prepare()): the
board and the options it takes, the model, its plan and fit; --remote; the sampling options; the
tokenizer; the command's own inputs (a prompt, a chat template, a text, bench's stream) against the
context; the memory budget; the sampling; the serial port; the thread count. So a refused command
compiles nothing and leaves no build directory. Each command asks only for the parts it needs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .boards import Board, load_board
from .compile.build import Artifacts, BuildRequest, run_scons
from .compile.build import prepare as prepare_build
from .compile.cache_plan import AutoBudget, AutoElsewhere, CachePlan, RankBudget, check_rank_budget
from .compile.plan import Plan, largest_planned_ctx, speculation_notice
from .console import TextStream, progress, warn
from .device.hosts import hosts_for
from .device.links import Firmware, Link, LinkOptions, OnToken, open_firmware, ranks_for
from .device.remote import Remote, remote_for
from .device.runner import run_firmware
from .device.session import RunRequest, RunResult, Selftest, check_fits_context
from .device.setup_toolchain import ensure_toolchain
from .errors import ColibriError
from .files import (
    DEFAULT_MODEL,
    PROMPT_BYTES,
    TEXT_BYTES,
    checked_text,
    read_stream_limited,
    read_text_limited,
    utf8_text,
)
from .model.gguf import is_gguf
from .model.tokenizer import Tokenizer, parse_prompt_ids
from .numerics.sampling import DEFAULT_REPEAT_LAST_N, SamplingParams, generation_defaults
from .option_checks import check_board_options, check_sampling_options, threads_warning
from .verify import FirmwareIdentity, Verified, firmware_identity, hello_check, verify_run

if TYPE_CHECKING:  # imported where used, so a command that does not chat, score or bench loads none of them
    from .bench import BenchResult, BenchRuns
    from .chat import ChatState, TurnPlan
    from .evaluate import Evaluation
    from .model.chat_template import ChatTemplate
    from .report import MemoryReport

Progress = Callable[[str], None]


@dataclass
class JobOptions:
    """The options every run-like command shares (the CLI's flags, by argparse dest). Mutable: the
    option checks set a colibri.toml value the board does not take back to its default."""

    board: str = "host"
    model: Path = DEFAULT_MODEL
    quant: str | None = None  # None: the model's default (a GGUF file's own blocks, else q8_0)
    ctx: int | None = None
    kv_type: str | None = None  # None: the board's KV cache type
    out: Path | None = None
    jobs: int | None = None  # weight quantization workers
    cache_dir: str | None = None  # the build cache (--cache-dir): None the default one, "off" none
    quiet: bool = False  # no progress (the CLI's --json)
    prompt: str | None = None
    prompt_file: Path | None = None  # "-": standard input
    prompt_ids: str | None = None
    steps: int | None = 64
    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    repeat_penalty: float = 1.0  # llama.cpp's repetition penalty; 1: off
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N  # its window in tokens; 0: off, -1: the context
    ignore_eos: bool = False
    threads: int = 1
    speculate: int = 0  # drafted tokens checked per forward pass (exact speculative decoding); 0: off
    port: str | None = None
    reset: bool = False
    remote: str | None = None
    hosts: str | None = None  # MPI ranks' hosts, mpirun's --host syntax (device/hosts.py)
    hostfile: Path | None = None  # or an mpirun hostfile
    inventory: Path | None = None  # or an Ansible inventory's hosts
    ranks: int | None = None  # MPI ranks the weights are split over (build, report); None: as many as the hosts give
    memory_budget: int | AutoBudget | None = None
    chat_template: Path | None = None  # chat: a Jinja2 template file instead of the model's own
    # The options the command line itself set (refused if the board cannot take them), and the
    # parser's defaults (what a colibri.toml value the board cannot take is set back to).
    given: set[str] = field(default_factory=set)
    defaults: dict[str, Any] = field(default_factory=dict)


# ---- the steps, each once ------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """A build checked and planned, not compiled yet."""

    board: Board
    request: BuildRequest
    plan: Plan


def plan_build(options: JobOptions) -> Planned:
    """The board, the options it takes, the model, its plan and fit: no compiler involved."""
    board = load_board(options.board)
    check_board_options(board, options, options.given, options.defaults)
    return Planned(board, *prepare_for(board, options))


def prepare_for(board: Board, options: JobOptions, check_fit: bool = True) -> tuple[BuildRequest, Plan]:
    """The build's request and plan from the job's options (check_fit False: report's, unfitted)."""
    return prepare_build(
        board,
        options.model,
        options.quant,
        options.ctx,
        options.out,
        check_fit=check_fit,
        kv_type=options.kv_type,
        ranks=ranks_of(board, options),
    )


def ranks_of(board: Board, options: JobOptions) -> int:
    """The ranks a build splits the weights over (one image each: docs/several-boards.md)."""
    given = options.ranks
    return given if given is not None else ranks_for(board, options.hosts, options.hostfile, options.inventory)


def compile_build(
    planned: Planned,
    quiet: bool,
    jobs: int | None = None,
    echo: Progress | None = None,
    cache_dir: str | None = None,
) -> Artifacts:
    """Compile a planned build (quiet: no progress; echo: where SCons's lines go instead, a release's
    indented progress; cache_dir: run_scons's build cache, None the default one, "off" none)."""
    ensure_toolchain(planned.board)
    if planned.plan.kept_f32 and not quiet:
        progress(f"note: {planned.plan.kept_f32_summary()}")
    echo = echo if echo is not None else None if quiet else progress
    return run_scons(planned.request, echo, jobs=jobs, cache_dir=cache_dir)


def budget_plan(
    options: JobOptions, board: Board, plan: Plan, remote: Remote | None = None, here: bool = False
) -> CachePlan | AutoElsewhere | RankBudget | None:
    """The expert cache under --memory-budget (or the board file's default): refused here, with the
    numbers, when the budget cannot hold the resident weights, the arenas and top-k slots per MoE
    layer. None on boards that take no budget (MCUs: weights in flash). auto is resolved here when
    the firmware runs here (`here`: report's view of this machine); a firmware on a board over SSH
    (`remote`)
    or under COLIBRI_FIRMWARE_PREFIX (another cgroup) resolves, and refuses, it where it runs."""
    from .compile.cache_plan import auto_cache_plan, cache_constants, cache_plan, find_memory
    from .device.links import local_prefix

    if not board.runner.takes_memory_budget:
        return None
    budget = options.memory_budget if options.memory_budget is not None else board.memory_budget
    if plan.ranks > 1:  # each rank pages its own experts through its slots, or maps its whole share
        return check_rank_budget(plan, board.budget_reserve, budget)
    if not isinstance(budget, AutoBudget):
        return cache_plan(plan, board.budget_reserve, budget)
    if here or (remote is None and not local_prefix()):
        return auto_cache_plan(plan, board.budget_reserve, budget, find_memory())
    return AutoElsewhere(budget, cache_constants(plan, board.budget_reserve))


def check_context(prompt: list[int], steps: int, board: Board, plan: Plan) -> None:
    """prompt + steps against the firmware's context, with the largest context this board and
    model allow (searched only when the request does not fit)."""
    if len(prompt) + steps - 1 <= plan.n_ctx:
        return
    check_fits_context(prompt, steps, plan.n_ctx, largest_context(board, plan))


def largest_context(board: Board, plan: Plan) -> int:
    """The largest context this board's memory and the model allow, before compiling."""
    largest = largest_planned_ctx(board, plan)
    return plan.spec.max_position_embeddings if largest is None else min(largest, plan.spec.max_position_embeddings)


def board_port(options: JobOptions, board: Board) -> str | None:
    """The serial port for a board on one: --port, or the only port that looks like an ESP32
    board's (said on stderr). None for boards that run here."""
    if not board.runner.needs_port:
        return None
    return options.port or look_up_port(f"board {board.name}")


def look_up_port(what: str) -> str:
    """The only serial port that looks like an ESP32 board's (said on stderr), for `what` uses it."""
    from .device.ports import describe, detect_port

    found = detect_port(what)
    progress(f"using serial port {describe(found)}")
    return str(found.device)


def warn_threads(board: Board, threads: int) -> None:
    message = threads_warning(board, threads)
    if message:
        warn(message)


def sampling_from(options: JobOptions, model_dir: Path, n_ctx: int) -> SamplingParams:
    """generation_config.json's defaults, overridden by the command line; the repetition penalty's
    window (-1: the context) within the firmware's context of n_ctx, which it then covers whole."""
    gen = generation_defaults(model_dir)
    temperature, top_k, top_p, min_p = gen.temperature, gen.top_k, gen.top_p, gen.min_p
    if options.temperature is not None:
        temperature = options.temperature
    if options.greedy:
        temperature = 0.0
    if options.top_k is not None:
        top_k = options.top_k
    if options.top_p is not None:
        if options.top_p <= 0.0:
            raise ColibriError("--top-p must be greater than 0")
        top_p = options.top_p
    if options.min_p is not None:
        min_p = options.min_p
    last_n = n_ctx if options.repeat_last_n < 0 else min(options.repeat_last_n, n_ctx)
    seed = options.seed if options.seed is not None else 0
    return SamplingParams(temperature, top_k, top_p, min_p, seed, options.repeat_penalty, last_n)


def prompt_text(options: JobOptions) -> str | None:
    """--prompt, or the text of --prompt-file (standard input for -), UTF-8 within PROMPT_BYTES."""
    if options.prompt_file is None:
        return None if options.prompt is None else checked_text(options.prompt, "--prompt")
    path = options.prompt_file
    if str(path) == "-":
        where = "--prompt-file - (standard input)"
        text = utf8_text(read_stream_limited(sys.stdin.buffer, PROMPT_BYTES, where), where)
    else:
        text = read_text_limited(Path(path), PROMPT_BYTES, f"--prompt-file {path}")
    # An editor ends a file with a newline the user did not mean as part of the prompt.
    return text[:-1] if text.endswith("\n") else text


def flags_given(*flags: tuple[str, object]) -> list[str]:
    """The flags among (flag, value) pairs that the user set (value not None), in order."""
    return [flag for flag, value in flags if value is not None]


def prompt_from(options: JobOptions, tokenizer: Tokenizer | None, vocab: int, text: str | None) -> list[int]:
    given = flags_given(
        ("--prompt", options.prompt), ("--prompt-file", options.prompt_file), ("--prompt-ids", options.prompt_ids)
    )
    if len(given) > 1:
        raise ColibriError(f"give one of --prompt, --prompt-file and --prompt-ids, not {' and '.join(given)}")
    if options.prompt_ids is not None:
        ids = parse_prompt_ids(options.prompt_ids)
    elif text is not None:
        if tokenizer is None:
            raise ColibriError(f"{options.model}: no tokenizer.json, so {given[0]} cannot be used; give --prompt-ids")
        ids = tokenizer.encode(text)
        if not ids:
            raise ColibriError("the prompt encodes to no tokens")
    else:
        raise ColibriError("give a prompt: --prompt TEXT, --prompt-file FILE or --prompt-ids 1,2,3")
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise ColibriError(f"prompt token id {bad[0]} is outside the vocabulary ({vocab})")
    return ids


# ---- prepare: the steps in their one order --------------------------------------------------

Inputs = TypeVar("Inputs")


@dataclass(frozen=True)
class Decoded:
    """What a command decodes, checked against the firmware's context before anything is built."""

    prompt: list[int]
    steps: int


@dataclass(frozen=True)
class Prepared(Generic[Inputs]):
    """Everything checked and decided before compiling: the build's plan, where the firmware runs
    (remote, port), its tokenizer, the command's own inputs, the expert cache and the sampling."""

    options: JobOptions
    planned: Planned
    link: LinkOptions  # how the firmware is reached: --remote, the serial port, --reset, progress
    tokenizer: Tokenizer | None
    inputs: Inputs
    cache: CachePlan | AutoElsewhere | RankBudget | None
    sampling: SamplingParams | None

    @property
    def board(self) -> Board:
        return self.planned.board

    @property
    def remote(self) -> Remote | None:
        return self.link.remote

    @property
    def port(self) -> str | None:
        return self.link.port

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    @property
    def memory_budget(self) -> int | AutoBudget:
        """The firmware's RAM budget (0: unlimited, or a board that takes none)."""
        return self.cache.firmware_budget if self.cache else 0

    @property
    def progress(self) -> Progress | None:
        return self.link.progress


def prepare(
    options: JobOptions,
    inputs: Callable[[Planned, Tokenizer | None], Inputs],
    *,
    decoded: Callable[[Inputs], Decoded | None] = lambda _: None,
    sampling: bool = True,
    tokenizer_needed_for: str | None = None,
    after_budget: Callable[[Planned, Inputs], None] | None = None,
) -> Prepared[Inputs]:
    """Every check that needs no compiler, in one order. `inputs` makes the command's own inputs
    (with the tokenizer, None if the model has none; `tokenizer_needed_for` says why one is needed
    when it is); `decoded`: what of them is checked against the context; `sampling`: the command
    samples with the sampling flags."""
    planned = plan_build(options)
    board, plan = planned.board, planned.plan
    remote = remote_for(board, options.remote)  # a bad --remote is said before building
    hosts = hosts_for(board, options.hosts, options.hostfile, options.inventory)  # and bad --hosts
    if sampling:
        check_sampling_options(options, options.given)
    tokenizer = Tokenizer.for_model(options.model)
    if tokenizer is not None:
        tokenizer.check_covers(plan.spec.vocab_size, options.model)
    if tokenizer is None and tokenizer_needed_for is not None:
        raise ColibriError(f"{options.model}: {tokenizer_needed_for}")
    made = inputs(planned, tokenizer)
    context = decoded(made)
    if context is not None:
        check_context(context.prompt, context.steps, board, plan)
    cache = budget_plan(options, board, plan, remote)
    if after_budget is not None:
        after_budget(planned, made)
    params = sampling_from(options, options.model, plan.n_ctx) if sampling else None
    port = board_port(options, board)
    warn_threads(board, options.threads)
    speculation_off = speculation_notice(plan, board, options.speculate)
    if speculation_off:
        warn(f"--speculate {options.speculate}: {speculation_off}")
    link = LinkOptions(
        remote=remote, progress=None if options.quiet else progress, port=port, reset=options.reset, hosts=hosts
    )
    return Prepared(options, planned, link, tokenizer, made, cache, params)


@dataclass(frozen=True)
class Built:
    """The compiled firmware, the identity its hello frame must carry, and both packed as a link
    runs them (the image's model hash read once)."""

    art: Artifacts
    identity: FirmwareIdentity
    firmware: Firmware


def built_firmware(planned: Planned, art: Artifacts) -> Built:
    identity = firmware_identity(planned.board, art, planned.plan)
    firmware = Firmware(
        art.program, art.weights, identity.model, art.flash_image, hello_check(identity), art.rank_weights()
    )
    return Built(art, identity, firmware)


def build(prepared: Prepared[Any], quiet: bool | None = None) -> Built:
    """Compile what `prepared` planned (quiet: no progress; default: the options')."""
    options = prepared.options
    art = compile_build(
        prepared.planned,
        quiet=options.quiet if quiet is None else quiet,
        jobs=options.jobs,
        cache_dir=options.cache_dir,
    )
    return built_firmware(prepared.planned, art)


def run_turn(
    prepared: Prepared[Any],
    built: Built,
    request: RunRequest,
    on_token: OnToken | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """One request, one run of the built firmware (progress: hears about copies over SSH)."""
    return run_firmware(prepared.board, built.firmware, replace(prepared.link, progress=progress), request, on_token)


# ---- run and verify: a prompt, one turn ---------------------------------------------------


@dataclass(frozen=True)
class PromptInputs:
    prompt: list[int]
    text: str | None  # the prompt's text, when given as text


def prepare_run(options: JobOptions) -> Prepared[PromptInputs]:
    def inputs(planned: Planned, tokenizer: Tokenizer | None) -> PromptInputs:
        text = prompt_text(options)
        return PromptInputs(prompt_from(options, tokenizer, planned.plan.spec.vocab_size, text), text)

    return prepare(options, inputs, decoded=lambda made: Decoded(made.prompt, options.steps or 0))


def run_request(prepared: Prepared[PromptInputs]) -> RunRequest:
    options = prepared.options
    assert prepared.sampling is not None and options.steps is not None
    return RunRequest(
        prepared.inputs.prompt,
        options.steps,
        prepared.sampling,
        not options.ignore_eos,
        options.threads,
        memory_budget=prepared.memory_budget,
        speculate=options.speculate,
    )


@dataclass(frozen=True)
class Ran:
    """A run: what was built, asked and answered."""

    board: Board
    plan: Plan
    art: Artifacts
    tokenizer: Tokenizer | None
    request: RunRequest
    result: RunResult
    identity: FirmwareIdentity


def run_built(prepared: Prepared[PromptInputs], built: Built, on_token: OnToken | None = None) -> Ran:
    request = run_request(prepared)
    result = run_turn(prepared, built, request, on_token, prepared.progress)
    return Ran(prepared.board, prepared.plan, built.art, prepared.tokenizer, request, result, built.identity)


def selftest_built(prepared: Prepared[Any], built: Built, seen: Selftest | None = None) -> Selftest:
    """The firmware's own verdict on itself (app/selftest.c): the selftest frame `seen` already (an
    MCU board's boot run), else the answer to a selftest request."""
    if seen is not None:
        return seen
    result = run_turn(prepared, built, RunRequest.selftest_of(prepared.board.selftest))
    if result.selftest is None:
        raise ColibriError(
            f"the firmware on {prepared.board.name} answered a selftest request without a selftest frame"
        )
    return result.selftest


def prepare_selftest(options: JobOptions) -> Prepared[None]:
    """selftest's checks before compiling: the board, the model and its fit, where the firmware runs;
    no prompt, no sampling (the golden prompt is in the firmware)."""
    return prepare(options, lambda planned, tokenizer: None, sampling=False)


def selftest(options: JobOptions) -> tuple[Prepared[None], Selftest]:
    """Build the firmware and ask it for its own verdict (app/selftest.c), no host reference."""
    prepared = prepare_selftest(options)
    return prepared, selftest_built(prepared, build(prepared))


def verify_ran(prepared: Prepared[PromptInputs], built: Built, ran: Ran) -> Verified:
    """The one verify (verify.verify_run) of a run of the built firmware; its self-test asked where
    the firmware is reached (here, or over a serial port)."""
    board = prepared.board
    asked = board.runner.runs_here or prepared.port
    selftest = (lambda: selftest_built(prepared, built)) if asked else None
    return verify_run(
        board,
        prepared.plan,
        built.art.weights,
        built.identity,
        ran.request,
        ran.result,
        selftest,
        replay=lambda request: run_turn(prepared, built, request),
    )


def run(options: JobOptions, on_token: OnToken | None = None) -> Ran:
    """Prepare, build and run a prompt on the board (verify.reference_run gives what it must equal)."""
    prepared = prepare_run(options)
    return run_built(prepared, build(prepared), on_token)


# ---- chat: several turns on one link ------------------------------------------------------


def prepare_chat(options: JobOptions) -> Prepared[ChatTemplate]:
    from .model.chat_template import ChatTemplate

    def template(planned: Planned, tokenizer: Tokenizer | None) -> ChatTemplate:
        found = (
            ChatTemplate.from_file(options.chat_template, options.model)
            if options.chat_template is not None
            else ChatTemplate.for_model(options.model)
        )
        if found is not None:  # a template that fails or goes past its budgets is said before building
            found.render([{"role": "user", "content": "hello"}], add_generation_prompt=True)
            return found
        where = (
            "the GGUF file has no tokenizer.chat_template"
            if is_gguf(options.model)
            else "no chat template (tokenizer_config.json's chat_template or chat_template.jinja)"
        )
        raise ColibriError(
            f"{options.model}: {where}; give one with --chat-template FILE, or use ./colibri run for plain text"
        )

    return prepare(options, template, tokenizer_needed_for="chat needs the model's tokenizer.json")


def open_chat(prepared: Prepared[ChatTemplate], built: Built) -> Link:
    """One firmware kept running for the whole conversation, its KV cache kept between turns."""
    firmware_options = RunRequest([], 1, memory_budget=prepared.memory_budget).firmware_options()
    return open_firmware(
        prepared.board, built.firmware, replace(prepared.link, options=tuple(firmware_options), keep_open=True)
    )


def chat_state(prepared: Prepared[ChatTemplate], max_steps: int, system: str | None) -> ChatState:
    """The conversation so far (a system message, if given); a reply is at most max_steps tokens
    (and what is left of the context)."""
    from .chat import ChatState

    assert prepared.tokenizer is not None
    state = ChatState(prepared.inputs, prepared.tokenizer, prepared.plan.n_ctx, max_steps)
    state.largest_ctx = largest_context(prepared.board, prepared.plan)
    if system:
        state.messages.append({"role": "system", "content": system})
    return state


@dataclass(frozen=True)
class ChatTurn:
    user: str
    planned: TurnPlan
    request: RunRequest
    result: RunResult
    reply: str


def converse(
    prepared: Prepared[ChatTemplate],
    built: Built,
    state: ChatState,
    messages: Iterable[str],
    stream: Callable[[], TextStream],
    digests: bool = False,
) -> Iterator[ChatTurn]:
    """Each message a turn on one link to the built firmware, its reply streamed to a new `stream()`."""
    assert prepared.sampling is not None
    with open_chat(prepared, built) as conversation:
        for user in messages:
            planned = state.plan_turn(user)
            request = RunRequest(
                planned.prompt,
                planned.steps,
                prepared.sampling,
                True,
                prepared.options.threads,
                digests=digests,
                start=planned.start,
                speculate=prepared.options.speculate,
            )
            shown = stream()
            try:
                result = conversation.turn(request, on_token=shown)
            finally:
                shown.end_line()
            yield ChatTurn(user, planned, request, result, state.finish_turn(planned, result.tokens, result.held))


# ---- eval: a text scored chunk by chunk -----------------------------------------------------


def prepare_eval(options: JobOptions, text: Path) -> Prepared[list[int]]:
    def tokens(planned: Planned, tokenizer: Tokenizer | None) -> list[int]:
        assert tokenizer is not None
        content = read_text_limited(text, TEXT_BYTES, f"--text {text}")
        if not content.strip():
            raise ColibriError(f"--text {text}: the text is empty: give a file with the text to score")
        return tokenizer.encode(content)

    return prepare(
        options, tokens, sampling=False, tokenizer_needed_for="eval needs the model's tokenizer.json to tokenize --text"
    )


def evaluate_built(prepared: Prepared[list[int]], built: Built, check: bool, chunks: int | None) -> Evaluation:
    """The text's perplexity on the board; `check`: the NumPy reference scores it too, bit for bit."""
    from .evaluate import evaluate

    options = prepared.options

    def score(request: RunRequest) -> RunResult:
        request = RunRequest(
            request.prompt,
            request.steps,
            request.sampling,
            threads=options.threads,
            digests=False,
            score_from=request.score_from,
            memory_budget=prepared.memory_budget,
        )
        return run_turn(prepared, built, request)

    assert prepared.tokenizer is not None
    return evaluate(
        prepared.inputs,
        prepared.plan,
        prepared.tokenizer.bos_id(),
        score,
        built.art.weights if check else None,
        chunks,
        prepared.progress,
    )


# ---- bench: its own stream ------------------------------------------------------------------


@dataclass(frozen=True)
class BenchOptions:
    """bench's own options (the sampled stream's settings are JobOptions' temperature, top_p, seed)."""

    stream: str | None = None  # text, sampled or synthetic; None: the model's default
    text: Path | None = None
    prompt_tokens: int = 8
    steps: int | None = None
    repeat: int | None = None
    plot: Path | None = None
    in_ram: bool = True


def bench_sampling(options: JobOptions) -> tuple[SamplingParams, list[str]]:
    """The sampled stream's settings, and the flags among --temperature, --top-p and --seed given:
    those flags over the model's generation_config.json if it samples, else over bench.SAMPLED."""
    from .bench import SAMPLED

    given = flags_given(("--temperature", options.temperature), ("--top-p", options.top_p), ("--seed", options.seed))
    gen = generation_defaults(options.model)
    base = gen if gen.temperature > 0 else SAMPLED
    temperature = options.temperature if options.temperature is not None else base.temperature
    if temperature <= 0:
        raise ColibriError(
            "--temperature 0 is greedy decoding, which repeats: the sampled stream needs a "
            "temperature above 0 (--stream synthetic is the greedy one)"
        )
    if options.top_p is not None and options.top_p <= 0:
        raise ColibriError("--top-p must be greater than 0")
    return SamplingParams(
        temperature,
        base.top_k,
        options.top_p if options.top_p is not None else base.top_p,
        base.min_p,
        options.seed if options.seed is not None else 0,
    ), given


def prepare_bench(options: JobOptions, bench: BenchOptions) -> Prepared[BenchRuns]:
    from . import bench as benchmark

    def inputs(planned: Planned, tokenizer: Tokenizer | None) -> BenchRuns:
        # Defaults that fit the board: the steps the context holds after the prompt, one run where
        # the instruction count is exact.
        sampling, sampling_flags = bench_sampling(options)
        stream, steps = benchmark.make_stream(
            planned.plan,
            tokenizer,
            bench.stream,
            bench.text,
            sampling,
            bench.prompt_tokens,
            bench.steps,
            sampling_flags,
        )
        repeat = bench.repeat if bench.repeat is not None else benchmark.default_repeat(planned.board)
        return benchmark.BenchRuns(stream, steps, repeat, options.threads, options.speculate)

    def plot(planned: Planned, made: BenchRuns) -> None:
        benchmark.check_plot(planned.board, bench.plot, made.steps)

    return prepare(
        options, inputs, decoded=lambda made: Decoded(made.stream.prompt, made.steps), sampling=False, after_budget=plot
    )


def bench_built(prepared: Prepared[BenchRuns], built: Built, bench: BenchOptions) -> BenchResult:
    """bench's figures for the built firmware."""
    from . import bench as benchmark

    options = prepared.options
    return benchmark.run_bench(
        prepared.board,
        prepared.plan,
        built.firmware,
        prepared.link,
        prepared.inputs,
        model=str(options.model),
        plot=bench.plot,
        cache=prepared.cache,
        in_ram=bench.in_ram,
    )


# ---- report and flash: prepared and built, no link ------------------------------------------


def report_budget(options: JobOptions, board: Board, plan: Plan) -> CachePlan | RankBudget | None:
    """report's expert cache: shown when --memory-budget is given or the board file sets one (over
    ranks, each rank's share always)."""
    if options.memory_budget is None and not board.memory_budget and plan.ranks == 1:
        return None
    cache = budget_plan(options, board, plan, here=True)
    assert not isinstance(cache, AutoElsewhere)  # report sees this machine: auto is resolved here
    return cache


def report(options: JobOptions) -> MemoryReport:
    """Where every byte goes (report.linked_report, with the expert cache if any): from
    the linked ELF, or planned only when there is nothing to link (a configuration alone, a model
    that does not fit, an ESP-IDF project not built here)."""
    from .compile.elfsize import read_elf
    from .compile.plan import plan_for_board, planned_use
    from .model.load import config_only_held_types, config_only_spec
    from .report import linked_report, planned_report, with_margins

    board = load_board(options.board)
    spec = config_only_spec(options.model)
    if spec is not None:
        # A configuration alone (no hub here to fetch weights): plan it, nothing to build or link.
        n_ctx = options.ctx or min(board.default_ctx, spec.max_position_embeddings)
        # A config is plain floats, but for the tensors its quantization_config says are packed.
        held = config_only_held_types(options.model)
        plan = plan_for_board(spec, board, options.quant or "q8_0", n_ctx, held_types=held, kv_type=options.kv_type)
        cache = report_budget(options, board, plan)
        rep = planned_report(board, plan)
    else:
        request, plan = prepare_for(board, options, check_fit=False)
        cache = report_budget(options, board, plan)  # a budget too small is said before building
        if any(use.over_budget for use in planned_use(board, plan)):
            # It would be refused before compiling: show where the bytes would go, then say so.
            rep = planned_report(board, plan)
        else:
            planned = Planned(board, request, plan)
            art = compile_build(planned, quiet=options.quiet, jobs=options.jobs, cache_dir=options.cache_dir)
            if art.program.exists():
                rep = linked_report(board, plan, read_elf(art.program))
                rep = with_margins(rep, board, art)
            else:  # an ESP-IDF project that idf.py has not built here
                rep = planned_report(board, plan)
    if isinstance(cache, RankBudget):  # report_budget checked the budget against each rank's share
        return replace(rep, ranks=cache.shares, rank_budget=cache.budget)
    return replace(rep, memory_budget=cache) if cache is not None else rep
