"""The colibri command line: build, run, verify, report, bench, flash, monitor, release and
verify-release for a board and a model; clean, boards and devices around them.

Every check that needs no compiler comes first (the model, its fit, options the board does not
take, contradictions, the prompt against the context, the serial port), so a refused command
compiles nothing and leaves no build directory. colibri.toml (project_file.py) supplies defaults;
flags override it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, fields
from pathlib import Path

from . import __version__, job
from .arguments import (
    PortList,
    add_board_args,
    add_budget_arg,
    add_decode_args,
    add_jobs_arg,
    add_model_args,
    add_sampling_args,
    add_speculate_arg,
    add_target_args,
    non_negative_float,
    non_negative_int,
    ports_given,
    positive_int,
    unit_float,
)
from .boards import Board, available_boards, load_board
from .compile.build import build_dirs, remove_builds
from .console import TextStream, progress, user_messages
from .device.remote import ran_on
from .errors import ColibriError
from .files import REPO
from .job import (
    JobOptions,
    Ran,
    compile_build,
    plan_build,
    prompt_text,  # noqa: F401 (the CLI's --prompt-file reading, tested through it)
)
from .model.tokenizer import Tokenizer
from .project_file import apply_project_file, find_project_file, load_project_file
from .report import format_report, report_problem
from .verify import FirmwareMismatch, budget_text, compare, reference_run, run_stats, speed_text


def decode_text(tokenizer: Tokenizer | None, ids: list[int]) -> str | None:
    return tokenizer.decode(ids) if tokenizer else None


# ---- commands -------------------------------------------------------------------------------


def cmd_build(args) -> int:
    planned = plan_build(job_options(args))
    art = compile_build(planned, quiet=False, jobs=args.jobs)
    board, plan = planned.board, planned.plan
    info = {
        "board": board.name,
        "program": str(art.program),
        "weights": str(art.weights),
        "plan": str(art.plan_json),
        "generated": str(art.generated),
        "model_hash": art.model_hash(),
        "quant": plan.quant,
        "n_ctx": plan.n_ctx,
    }
    idf = board.idf
    if idf is not None:
        info["idf_project"] = str(art.out_dir / idf.project_dir)
        info["idf_built"] = art.program.exists()
    if args.json:
        print(json.dumps(info, indent=2))
    elif idf is not None and not art.program.exists():
        print(
            f"generated the ESP-IDF project {info['idf_project']} for {board.name} ({plan.spec.architecture}, "
            f"{plan.quant}, context {plan.n_ctx}); ESP-IDF is not installed here, so build it with "
            f"`idf.py build` in that directory (ESP-IDF >= {idf.min_version}), then `./colibri flash`"
        )
    else:
        print(f"built {art.program} for {board.name} ({plan.spec.architecture}, {plan.quant}, context {plan.n_ctx})")
        print(
            f"weight image {art.weights} ({art.weights.stat().st_size:,} bytes, model hash {info['model_hash'][:16]})"
        )
    return 0


def job_options(args) -> JobOptions:
    """The run-like options out of argparse's namespace (by dest), with what the command line set."""
    taken = {
        f.name: getattr(args, f.name)
        for f in fields(JobOptions)
        if hasattr(args, f.name) and f.name not in ("quiet", "given", "defaults")
    }
    return JobOptions(**taken, quiet=getattr(args, "json", False), given=args.given, defaults=args.parser_defaults)


def _run(args, stream: bool) -> Ran:
    return _run_prepared(args, stream)[2]


def _run_prepared(args, stream: bool):
    """(prepared, built, ran): the run, and what made it (verify asks the same firmware again)."""
    options = job_options(args)
    prepared = job.prepare_run(options)
    built = job.build(prepared)
    text_out = TextStream(prepared.tokenizer, enabled=stream and not args.json, echo=prepared.inputs.text)
    try:
        return prepared, built, job.run_built(prepared, built, on_token=text_out)
    finally:
        text_out.end_line()


def cmd_run(args) -> int:
    ran = _run(args, stream=True)
    result = ran.result
    stats = run_stats(result, ran.board, ran.request)
    if args.json:
        print(
            json.dumps(
                {
                    "board": ran.board.name,
                    "prompt": ran.request.prompt,
                    "tokens": result.tokens,
                    "text": decode_text(ran.tokenizer, result.tokens),
                    "logits_sha256": result.digests,
                    "stop_reason": result.stop_reason,
                    "stats": stats.to_json(),
                    "remote": result.remote.to_json() if result.remote else None,
                },
                indent=2,
            )
        )
    else:
        speed = f"; decode {speed_text(stats)}" if speed_text(stats) else ""
        print(
            f"[{len(result.tokens)} tokens on {ran_on(ran.board, result)}{budget_text(stats)}, stopped by "
            f"{result.stop_reason}{speed}]",
            file=sys.stderr,
        )
    return 0


def cmd_verify(args) -> int:
    try:
        prepared, built, ran = _run_prepared(args, stream=True)
    except FirmwareMismatch as e:
        # Another firmware answered: a verdict about what is on the board, not a broken link.
        if args.json:
            print(
                json.dumps(
                    {
                        "board": args.board,
                        "model": str(args.model),
                        "pass": False,
                        "firmware_identity": {"differences": e.differences, "hello": e.hello},
                    },
                    indent=2,
                )
            )
        else:
            print(f"FAIL: {e}")
        return 1
    board, plan, request, result = ran.board, ran.plan, ran.request, ran.result
    stats = run_stats(result, board, request)
    if not args.json:
        speed = f" at {speed_text(stats)}" if speed_text(stats) else ""
        progress(
            f"firmware on {ran_on(board, result)}{budget_text(stats)} (its hello names this build: board, context, "
            f"quantization, weight image, build id): {len(result.tokens)} tokens{speed}, stopped by {result.stop_reason}; "
            f"running the NumPy reference on the same weight image"
        )
    ref = reference_run(plan, ran.art.weights, request)
    comparison = compare(result, ref)
    # The firmware's own check (golden vectors inside it): its boot run on MCU boards, else asked.
    selftest = job.selftest_built(prepared, built, result.selftest) if board.runner.runs_here or prepared.port else None
    mode = "greedy" if request.sampling.temperature == 0 else f"sampled, seed {request.sampling.seed}"
    summary = {
        "board": board.name,
        "model": str(args.model),
        "quant": plan.quant,
        "n_ctx": plan.n_ctx,
        "prompt": request.prompt,
        "sampling": asdict(request.sampling),
        "firmware_identity": {"expected": ran.identity.fields(), "differences": []},
        "firmware": {"tokens": result.tokens, "logits_sha256": result.digests, "stop_reason": result.stop_reason},
        "reference": {"tokens": ref.tokens, "logits_sha256": ref.digests, "stop_reason": ref.stop_reason},
        "text": decode_text(ran.tokenizer, result.tokens),
        "pass": comparison.passed and (selftest is None or selftest.passed),
        "selftest": {"pass": selftest.passed, **selftest.fields} if selftest else None,
        "expert_counts": {"firmware": result.expert_counts, "reference": ref.expert_counts}
        if ref.expert_counts
        else None,
        "first_divergent_step": comparison.first_divergent_step,
        "stats": stats.to_json(),
        "remote": result.remote.to_json() if result.remote else None,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        if selftest is not None and not selftest.passed:
            progress(comparison.verdict(board.name, plan.quant, mode))
            print(f"FAIL: the {board.name} firmware's {selftest.line()}")
        else:
            if selftest is not None:
                progress(selftest.line())
            print(comparison.verdict(board.name, plan.quant, mode))
    return 0 if summary["pass"] else 1


def cmd_chat(args) -> int:
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
        planned, result = turn.planned, turn.result
        if args.json:
            print(
                json.dumps(
                    {
                        "turn": index,
                        "user": turn.user,
                        "reply": turn.reply,
                        "prompt": planned.prompt,
                        "tokens": result.tokens,
                        "logits_sha256": result.digests,
                        "start": planned.start,
                        "prefilled": len(planned.prompt),
                        "reprefilled": planned.reprefilled,
                        "held": result.held,
                        "stop_reason": result.stop_reason,
                        "stats": run_stats(result, board, turn.request).to_json(),
                    }
                ),
                flush=True,
            )
        elif planned.reprefilled:
            progress("(the chat template rewrote earlier turns: the whole conversation was prefilled again)")
    return 0


def cmd_eval(args) -> int:
    prepared = job.prepare_eval(job_options(args), args.text)
    board, plan = prepared.board, prepared.plan
    ev = job.evaluate_built(prepared, job.build(prepared), args.check, args.chunks)
    r = ev.result
    if args.json:
        print(
            json.dumps(
                {
                    "board": board.name,
                    "model": str(args.model),
                    "quant": plan.quant,
                    "n_ctx": plan.n_ctx,
                    "text": str(args.text),
                    "text_tokens": len(prepared.inputs),
                    "chunks": ev.chunks,
                    "tokens_scored": r.tokens,
                    "ppl": r.ppl,
                    "ppl_error": r.error,
                    "seconds": ev.seconds,
                    "tokens_per_second": ev.tokens_per_second,
                    "reference_checked": ev.reference_checked,
                },
                indent=2,
            )
        )
    else:
        checked = "; every score bit-identical to the NumPy reference's" if ev.reference_checked else ""
        print(
            f"PPL = {r.ppl:.4f} +/- {r.error:.5f} ({r.tokens} tokens scored in {ev.chunks} chunks of {plan.n_ctx} "
            f"on {board.name}, {plan.quant}; {ev.tokens_per_second:.1f} tok/s{checked})"
        )
    return 0


def cmd_report(args) -> int:
    rep = job.report(job_options(args))
    if args.json:
        print(json.dumps(rep.to_json(), indent=2))
    else:
        print(format_report(rep))
    if not rep.fits:
        raise ColibriError(report_problem(rep))
    return 0


def cmd_bench(args) -> int:
    from .bench import bench_line

    bench = job.BenchOptions(
        args.stream, args.text, args.prompt_tokens, args.steps, args.repeat, args.plot, in_ram=not args.no_in_ram
    )
    prepared = job.prepare_bench(job_options(args), bench)
    out = job.bench_built(prepared, job.build(prepared, quiet=True), bench)
    if args.json:
        print(json.dumps(out.to_json(), indent=2))
    else:
        print(bench_line(out, prepared.plan.spec.name))
    return 0


def flash_part(args) -> str | None:
    """What --app-only / --model-only ask flash to write (None: everything)."""
    return "app" if args.app_only else "model" if args.model_only else None


def cmd_flash(args) -> int:
    ports = ports_given(args.port)
    if args.all_ports or len(ports) > 1:
        return _flash_fleet(args, ports)
    if args.report is not None or args.no_selftest:
        raise ColibriError(
            "--report and --no-selftest are for several boards at once (--port P1 --port P2 …, or --all-ports)"
        )
    options = job_options(args)
    options.port = ports[0] if ports else None
    flashed = job.flash(
        options, args.baud, args.before, no_reset=args.no_reset, then_monitor=args.monitor, only=flash_part(args)
    )
    board, port, images, art = flashed.board, flashed.port, flashed.images, flashed.art
    summary = {
        "board": board.name,
        "port": port,
        "images": [{"offset": o, "file": str(p)} for o, p in images],
        "model_hash": art.model_hash(),
    }
    if args.json and not args.monitor:
        print(json.dumps(summary, indent=2))
    else:
        progress(
            f"flashed {len(images)} image(s) to {board.name} on {port} and verified them; "
            f"model hash {summary['model_hash'][:16]}"
        )
    if not args.monitor:
        return 0
    from .device.monitor import monitor

    uart_baud = board.idf.uart_baud if board.idf is not None else 115200
    return monitor(
        port,
        uart_baud,
        reset=True,
        expected_model=art.model_hash(),
        json_lines=args.json,
        tokenizer=Tokenizer.for_model(args.model),
    )


def _flash_fleet(args, ports: list[str]) -> int:
    from .device.flash_many import format_table

    if args.monitor:
        raise ColibriError("--monitor watches one board: flash several without it, or give one --port")
    options = job_options(args)
    options.port = None  # each board's port is in `ports`
    flashed = job.flash_fleet(
        options,
        ports,
        all_ports=args.all_ports,
        baud=args.baud,
        before=args.before,
        no_reset=args.no_reset,
        selftest=not args.no_selftest,
        report_path=args.report,
        only=flash_part(args),
    )
    report = flashed.report
    print(json.dumps(report.to_json(), indent=2) if args.json else format_table(report))
    progress(f"report written to {flashed.path}")
    if report.interrupted:
        print("colibri: interrupted", file=sys.stderr)
        return 130
    failed = [b for b in report.boards if b.result != "PASS"]
    if failed:
        print(f"colibri: error: {len(failed)} of {len(report.boards)} boards failed", file=sys.stderr)
        return 1
    return 0


def cmd_ota(args) -> int:
    updated = job.ota(job_options(args), args.baud, args.before, no_reset=args.no_reset, file=args.file)
    board, done = updated.board, updated.update
    if done is None:
        assert updated.file is not None
        summary = {"board": board.name, "file": str(updated.file), "bytes": updated.file.stat().st_size}
        message = (
            f"wrote {updated.file} ({summary['bytes']:,} B): the app image an esp_https_ota server serves; "
            "no board was touched"
        )
    else:
        summary = {
            "board": board.name,
            "port": done.port,
            "running_slot": f"ota_{done.running_slot}",
            "slot": f"ota_{done.slot}",
            "seq": done.seq,
            "bytes": done.app_bytes,
            "model_hash": updated.art.model_hash(),
        }
        message = (
            f"updated {board.name} on {done.port}: the new app is in ota_{done.slot} and selected; "
            f"it confirms itself if its self-test passes, else the board goes back to ota_{done.running_slot}"
        )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        progress(message)
    return 0


def cmd_monitor(args) -> int:
    from .device.monitor import monitor

    port = args.port or job.look_up_port("monitor")
    tokenizer = None
    if args.model is not None:
        tokenizer = Tokenizer.for_model(args.model)
        if tokenizer is None:
            raise ColibriError(f"{args.model}: no tokenizer.json, so --model cannot decode the text")
    return monitor(
        port,
        args.baud,
        args.reset,
        duration=args.duration,
        expected_model=args.expect_model,
        json_lines=args.json,
        tokenizer=tokenizer,
    )


def cmd_release(args) -> int:
    from .release.artifacts import check_artifact_options, write_mender, write_rauc
    from .release.deploy import payload_of
    from .release.make import make_release

    if args.out is None:
        raise ColibriError("release needs --out DIR: the directory for the bundle and its tarball")
    check_artifact_options(args.format, args.artifact_key, args.artifact_cert)
    if args.format is not None and not load_board(args.board).runner.takes_remote:
        raise ColibriError(f"--format {args.format} is for Linux boards (host, linux-aarch64), not {args.board}")
    release = make_release(
        args.board,
        args.model,
        args.quant,
        args.ctx,
        args.out,
        sign_key=args.sign,
        progress=None if args.json else progress,
        jobs=args.jobs,
    )
    summary = release.summary()
    if args.format is not None:
        payload = payload_of(release.bundle)
        if args.format == "mender":
            artifact = write_mender(payload, release.bundle.parent, args.artifact_key)
        else:
            artifact = write_rauc(payload, release.bundle.parent, args.artifact_key, args.artifact_cert)
        summary[args.format] = str(artifact)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(release.describe())
        if args.format is not None:
            print(f"  {args.format} {summary[args.format]} (slot {payload.slot}, through colibri-slot on the board)")
    return 0


def cmd_deploy(args) -> int:
    from .device.remote import parse_remote
    from .release.deploy import DEFAULT_ROOT, deploy_inventory, deploy_remote, payload_of

    if (args.remote is None) == (args.inventory is None):
        both = ", not both" if args.remote is not None else ""
        raise ColibriError(f"deploy needs --remote HOST (one board) or --inventory FILE (an Ansible inventory){both}")
    payload = payload_of(args.bundle)
    if args.remote is not None:
        outcomes = [deploy_remote(parse_remote(args.remote), payload, args.root or DEFAULT_ROOT)]
    else:
        outcomes = deploy_inventory(args.inventory, payload, args.root)
    if args.json:
        print(
            json.dumps(
                {"release": payload.name, "slot": payload.slot, "hosts": [o.to_json() for o in outcomes]}, indent=2
            )
        )
    else:
        for o in outcomes:
            print(o.line())
    return 0 if all(o.passed for o in outcomes) else 1


def cmd_rollback(args) -> int:
    from .device.remote import parse_remote
    from .release.deploy import rollback_remote

    current = rollback_remote(parse_remote(args.remote), args.root)
    print(json.dumps({"host": args.remote, "current": current}) if args.json else f"{args.remote}: current {current}")
    return 0


def cmd_verify_release(args) -> int:
    from .release.check import check_release

    if args.no_rebuild and args.release_model is not None:
        raise ColibriError(
            "--model names the model files for the rebuild, and --no-rebuild skips it: give one or the other"
        )
    result = check_release(
        args.bundle,
        verify_key=args.verify_key,
        model_dir=args.release_model,
        rebuild=not args.no_rebuild,
        progress=None if args.json else progress,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        for note in result.notes:
            progress(f"note: {note}")
        print(result.describe())
    return 0 if result.ok else 1


def cmd_clean(args) -> int:
    from .compile import build

    root = build.BUILD_ROOT
    dirs = build_dirs(args.only_board, args.only_model)
    what = " and ".join(
        part
        for part in (
            f"board {args.only_board}" if args.only_board else "",
            f"model {Path(args.only_model).name}" if args.only_model else "",
        )
        if part
    )
    if not dirs:
        message = f"nothing to clean under {root}" + (f" for {what}" if what else "")
        print(json.dumps({"removed": [], "bytes": 0}) if args.json else message)
        return 0
    freed = remove_builds(dirs)
    shown = [f"{root.name}/{d.relative_to(root)}" for d in dirs]
    if args.json:
        print(json.dumps({"removed": shown, "bytes": freed}, indent=2))
    else:
        print(f"removed {', '.join(shown)} ({freed / 1e6:.1f} MB)")
    return 0


def board_summary(board: Board) -> dict[str, object]:
    regions = [{"name": r.name, "kind": r.kind, "bytes": r.size or None, "holds": list(r.holds)} for r in board.memory]
    return {
        "name": board.name,
        "description": board.description,
        "isa": board.isa,
        "runs_here": board.runner.how_it_runs(),
        "emulated_by": board.runner.emulated_by(),
        "memory": regions,
        "default_ctx": board.default_ctx,
        "flashed": board.is_flashed,
    }


def _size(n: int | None) -> str:
    if not n:
        return "no fixed budget"
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def cmd_boards(args) -> int:
    boards = [board_summary(load_board(name)) for name in available_boards()]
    if args.json:
        print(json.dumps(boards, indent=2))
        return 0
    width = max(len(b["name"]) for b in boards)
    for b in boards:
        memory = ", ".join(f"{r['name']} {_size(r['bytes'])}" for r in b["memory"])
        print(
            f"{b['name']:<{width}}  {b['description']}; runs {b['runs_here']}; memory: {memory}; "
            f"default context {b['default_ctx']}"
        )
    return 0


def cmd_devices(args) -> int:
    from .device.ports import describe, list_ports

    ports = list_ports()
    if args.json:
        print(json.dumps([p.to_dict() for p in ports], indent=2))
    elif not ports:
        print("no serial ports found (is the board plugged in, and its USB-serial driver loaded?)")
    else:
        for port in ports:
            print(describe(port))
    return 0


def cmd_test(args) -> int:
    # ./colibri test installs the test dependencies first and never reaches here; run directly
    # (python -m generator.cli test) it is the same suite with the environment at hand.
    python = sys.executable
    argv = [
        python,
        "-m",
        "generator.device.setup_toolchain",
        "--all",
        "--packages",
        "tests/apt-packages.txt",
        "--",
        python,
        "-m",
        "pytest",
        "-q",
        "tests",
        *args.pytest_args,
    ]
    os.chdir(REPO)
    sys.stdout.flush()
    os.execv(python, argv)
    return 0  # not reached


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"colibri: error: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """--version: the generator, its git commit and the toolchains found here."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .release.provenance import version_report

        print("\n".join(version_report()))
        parser.exit(0)


def make_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each command's own (colibri.toml sets the commands' defaults)."""
    parser = Parser(prog="colibri", description="Hugging Face checkpoints to verified C firmware.")
    parser.add_argument(
        "--version",
        action=VersionAction,
        help=f"show colibri's version ({__version__}), git commit and the toolchains found",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    commands: dict[str, argparse.ArgumentParser] = {}

    def command(name, func, help):
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        commands[name] = p
        return p

    p = command("build", cmd_build, "generate the sources and build the firmware for a board")
    add_target_args(p)
    add_jobs_arg(p)

    p = command("run", cmd_run, "build, run the firmware on a prompt and print the text")
    add_target_args(p)
    add_jobs_arg(p)
    add_decode_args(p, steps=64)
    add_speculate_arg(p)
    add_board_args(p)

    p = command(
        "verify",
        cmd_verify,
        "run the firmware and the NumPy reference; PASS only if bit-identical and the firmware is this build",
    )
    add_target_args(p)
    add_jobs_arg(p)
    add_decode_args(p, steps=64)
    add_speculate_arg(p)
    add_board_args(p)

    p = command(
        "chat",
        cmd_chat,
        "chat with the model on a board: its chat template, the KV cache kept "
        "between turns (messages from standard input when it is not a terminal)",
    )
    add_target_args(p)
    add_jobs_arg(p)
    p.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    p.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="a Jinja2 chat template file (as tokenizer_config.json's chat_template), used instead of the model's own",
    )
    p.add_argument(
        "--steps", type=positive_int, help="the most tokens a reply may have (default: what is left of the context)"
    )
    add_sampling_args(p)
    add_speculate_arg(p)
    add_board_args(p)

    p = command(
        "eval",
        cmd_eval,
        "perplexity of a text, scored by the firmware on a board (llama.cpp's "
        "protocol: chunks of the context, second halves scored)",
    )
    add_target_args(p)
    add_jobs_arg(p)
    p.add_argument("--text", type=Path, required=True, metavar="FILE", help="UTF-8 text to score")
    p.add_argument("--chunks", type=positive_int, help="score at most this many chunks (default: all)")
    p.add_argument(
        "--check",
        action="store_true",
        help="also score with the NumPy reference and require every score to be bit-identical",
    )
    add_board_args(p)

    p = command("report", cmd_report, "where every byte goes, per memory region, checked against the ELF")
    add_target_args(p)
    add_jobs_arg(p)
    add_budget_arg(p)

    p = command("bench", cmd_bench, "measure prefill and decode speed (instructions on emulated MCUs)")
    add_target_args(p)
    add_jobs_arg(p)
    p.add_argument(
        "--steps",
        type=positive_int,
        help="decoded tokens per run (default 128, or fewer so that "
        "the prompt and the steps fit the firmware's context)",
    )
    p.add_argument("--prompt-tokens", type=positive_int, default=8, help="prompt length (default 8)")
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
    add_board_args(p)

    p = command("flash", cmd_flash, "write a board's images with esptool, verify them, reset the board")
    add_target_args(p)
    add_jobs_arg(p)
    p.add_argument(
        "--port",
        action=PortList,
        help="serial port of the board (default: the only port that looks like an ESP32 board's); "
        "given several times, those boards are flashed at once and each runs its self-test",
    )
    p.add_argument(
        "--all-ports",
        action="store_true",
        help="flash every port that looks like an ESP32 board's at once (./colibri devices lists them)",
    )
    p.add_argument(
        "--no-selftest",
        action="store_true",
        help="several boards: skip the self-test after flashing (each board is reset instead)",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="several boards: where the JSON report goes (default flash-report.json in the build directory)",
    )
    p.add_argument("--baud", type=positive_int, help="flashing baud rate (default: the board file's, or 460800)")
    p.add_argument(
        "--before",
        default="default-reset",
        choices=("default-reset", "usb-reset", "no-reset", "no-reset-no-sync"),
        help="how esptool puts the chip in its bootloader (esptool --before; no-reset: hold BOOT "
        "and press RESET yourself)",
    )
    p.add_argument(
        "--no-reset",
        action="store_true",
        help="leave the board in the bootloader afterwards (esptool --after no-reset)",
    )
    p.add_argument(
        "--monitor",
        action="store_true",
        help="then reset the board and monitor it (like idf.py flash monitor; Ctrl-C to stop)",
    )

    only = p.add_mutually_exclusive_group()
    only.add_argument(
        "--app-only",
        action="store_true",
        help="write the bootloader, partition table, otadata and app, and leave the weights partition alone",
    )
    only.add_argument("--model-only", action="store_true", help="write only the weights partition")

    p = command(
        "ota",
        cmd_ota,
        "A/B update of an ESP-IDF board: the app into the slot not running, verified, then selected in otadata",
    )
    add_target_args(p)
    add_jobs_arg(p)
    p.add_argument("--port", help="serial port of the board (default: the only port that looks like an ESP32 board's)")
    p.add_argument("--baud", type=positive_int, help="flashing baud rate (default: the board file's, or 460800)")
    p.add_argument(
        "--before",
        default="default-reset",
        choices=("default-reset", "usb-reset", "no-reset", "no-reset-no-sync"),
        help="how esptool puts the chip in its bootloader (esptool --before)",
    )
    p.add_argument("--no-reset", action="store_true", help="leave the board in its bootloader afterwards")
    p.add_argument(
        "--file",
        type=Path,
        help="write the app image an esp_https_ota server would serve to FILE instead of updating a board",
    )

    p = command("monitor", cmd_monitor, "show what a board prints: logs and decoded frames (Ctrl-C to stop)")
    p.add_argument(
        "--port",
        help="serial device or pyserial URL (e.g. socket://127.0.0.1:4444; default: the "
        "only port that looks like an ESP32 board's)",
    )
    p.add_argument("--baud", type=positive_int, default=115200, help="baud rate (default 115200)")
    p.add_argument(
        "--reset", action="store_true", help="reset the board through RTS after opening (default: leave it alone)"
    )
    p.add_argument("--duration", type=non_negative_float, help="stop after this many seconds")
    p.add_argument("--expect-model", metavar="HASH", help="model hash (or a prefix) the firmware must carry")
    p.add_argument("--model", type=Path, help="model directory whose tokenizer turns token frames into text")
    p.add_argument("--json", action="store_true", help="one JSON object per frame or log line")

    p = command("release", cmd_release, "build, verify and bundle a reproducible firmware release")
    add_model_args(p)
    add_jobs_arg(p)
    p.add_argument(
        "--out", type=Path, help="directory for the bundle, its .tar.gz and <bundle>.measurements.json (required)"
    )
    p.add_argument(
        "--sign",
        type=Path,
        metavar="KEY",
        help="sign manifest.json with this ed25519 private key "
        "(PEM, e.g. from `openssl genpkey -algorithm ed25519`, or OpenSSH)",
    )
    p.add_argument(
        "--format",
        choices=("mender", "rauc"),
        help="also write a Mender artifact (mender-artifact) or a RAUC bundle (rauc) of it, beside the bundle",
    )
    p.add_argument(
        "--artifact-key",
        type=Path,
        metavar="KEY",
        help="sign the Mender artifact or RAUC bundle with this RSA or ECDSA P-256 private key (PEM)",
    )
    p.add_argument(
        "--artifact-cert", type=Path, metavar="CERT", help="--format rauc: the X.509 certificate of --artifact-key"
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command(
        "verify-release",
        cmd_verify_release,
        "check a release's hashes and signature, rebuild it from its manifest and compare byte for byte",
    )
    p.add_argument(
        "bundle",
        type=Path,
        help="the release bundle directory, its .tar.gz, or the release --out directory holding one bundle",
    )
    p.add_argument(
        "--verify-key", type=Path, metavar="KEY", help="ed25519 public key manifest.json must be signed with"
    )
    # Its own dest: a colibri.toml's model is a default for building, not the release's files.
    p.add_argument(
        "--model",
        dest="release_model",
        type=Path,
        metavar="DIR",
        help="directory holding the release's model files (default: models/<the release's model name>)",
    )
    p.add_argument("--no-rebuild", action="store_true", help="check hashes and the signature only")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command(
        "deploy",
        cmd_deploy,
        "install a release on Linux boards into a new slot, run its self-test there, switch only on PASS",
    )
    p.add_argument("bundle", type=Path, help="the release bundle directory (./colibri release's output)")
    p.add_argument("--remote", metavar="[USER@]HOST[:PORT]", help="the board, over SSH")
    p.add_argument(
        "--inventory", type=Path, metavar="FILE", help="an Ansible inventory: every host, by ansible-playbook"
    )
    p.add_argument(
        "--root",
        help="the slots' directory on the boards (default /opt/colibri; with --inventory: each host's colibri_root)",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command("rollback", cmd_rollback, "point a Linux board's current slot back at the one it replaced")
    p.add_argument("--remote", required=True, metavar="[USER@]HOST[:PORT]", help="the board, over SSH")
    p.add_argument("--root", default="/opt/colibri", help="the slots' directory on the board (default /opt/colibri)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command("clean", cmd_clean, "remove builds under build/: all of them, or one board's or one model's")
    # Own dests: a colibri.toml's board and model are defaults for building, not what to delete.
    p.add_argument("--board", dest="only_board", metavar="BOARD", help="only this board's builds")
    p.add_argument("--model", dest="only_model", type=Path, metavar="DIR", help="only this model's builds")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command("boards", cmd_boards, "list the boards: what each is, how it runs here, its memory")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command("devices", cmd_devices, "list serial ports, marking those that look like ESP32 boards")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    p = command(
        "test",
        cmd_test,
        "install the test dependencies and run the whole test suite "
        "(arguments after it go to pytest, as with ./colibri test)",
    )
    # Declared for --help only: everything after `test` goes to pytest, where tests/conftest.py
    # defines --fast.
    p.add_argument("--fast", action="store_true", help="the fast tier: leave out the tests marked slow")
    return parser, commands


def _options(parser: argparse.ArgumentParser) -> dict[str, object]:
    return {a.dest: a.default for a in parser._actions if a.option_strings and a.dest != "help"}


def parse_args(argv: list[str] | None = None):
    """Parse the command line over colibri.toml's defaults. args.given: the options the command
    line itself set (option_checks refuses those a board cannot take; a file's defaults that do
    not apply to the board in use are skipped)."""
    parser, commands = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-")), None)  # the top level has only options
    applied: dict = {}
    defaults: dict = {}
    if name in commands:
        defaults = _options(commands[name])
        path = find_project_file()
        if path is not None:
            applied = apply_project_file(load_project_file(path, set(commands)), name, commands)
            if applied:
                shown = ", ".join(f"{k.replace('_', '-')} = {v}" for k, v in applied.items())
                progress(f"colibri: settings from {path}: {shown}")
    if name == "test":
        # Everything after `test` is pytest's, options included (argparse would claim them).
        at = argv.index("test") + 1
        args = parser.parse_args(argv[:at])
        args.pytest_args = argv[at:]
    else:
        args = parser.parse_args(argv)
    args.given = {
        dest for dest, default in defaults.items() if getattr(args, dest, default) != applied.get(dest, default)
    }
    args.parser_defaults = defaults
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        return args.func(args)
    except ColibriError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("colibri: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`./colibri run ... | head`): stop quietly, as a shell tool does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
