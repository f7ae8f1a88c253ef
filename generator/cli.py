"""The colibri command line: build, run, verify, report, bench, flash, monitor, release and
verify-release, for a board and a model."""

from __future__ import annotations

import argparse
from dataclasses import asdict
import json
import sys
from pathlib import Path

from . import __version__
from .compile.build import Artifacts, prepare, run_scons
from .files import REPO
from .compile.elfsize import read_elf
from .errors import ColibriError
from .model.hf_import import parse_config, read_json
from .numerics.quantize import QUANTS
from .compile.plan import plan_for_board
from .report import format_report, planned_report_dict, report_dict
from .device.remote import ran_on, remote_for
from .device.runner import run_on_board
from .verify import compare, rates, reference_run, speed_text
from .device.session import RunRequest, check_fits_context
from .numerics.sampling import SamplingParams
from .device.setup_toolchain import ensure_toolchain
from .compile.targets import available_boards, load_board
from .model.tokenizer import Tokenizer, parse_prompt_ids

DEFAULT_MODEL = REPO / "models" / "kjv-tiny"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- argument helpers -----------------------------------------------------------------------

def number(kind, low: float, high: float = float("inf"), what: str = ""):
    """An argparse type: `kind` (int or float) within [low, high], finite."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not (low <= value <= high) or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


positive_int = number(int, 1, what="a positive integer")
non_negative_int = number(int, 0, what="a non-negative integer")
unit_float = number(float, 0.0, 1.0, what="a number between 0 and 1")
non_negative_float = number(float, 0.0, what="a finite number >= 0")


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", default="host", help=f"target board (available: {', '.join(available_boards())})")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="Hugging Face model directory "
                   "(default: the bundled models/kjv-tiny)")
    p.add_argument("--quant", default="q8_0", choices=QUANTS, help="weight format (default q8_0)")
    p.add_argument("--ctx", type=positive_int, help="context length the firmware is built for "
                   "(default: the board's default, capped by the model)")
    p.add_argument("--out", type=Path, help="build directory (default build/<board>/<model>-<quant>-ctx<N>)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_port_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", help="serial port of a real board (e.g. /dev/ttyUSB0), for boards run over serial")
    p.add_argument("--reset", action="store_true", help="reset the board through RTS after opening its port")


def add_remote_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", metavar="[USER@]HOST[:PORT]",
                   help="run on a Linux board reached over SSH (an ~/.ssh/config alias works); default: "
                        "$COLIBRI_REMOTE, else the board's entry in ~/.config/colibri/config.toml [remote]; "
                        "--remote '' runs here")


def add_decode_args(p: argparse.ArgumentParser, steps: int) -> None:
    p.add_argument("--prompt", help="prompt text (needs the model's tokenizer.json)")
    p.add_argument("--prompt-ids", help="prompt as comma-separated token ids")
    p.add_argument("--steps", type=positive_int, default=steps, help=f"tokens to generate (default {steps})")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--temperature", type=non_negative_float, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-k", type=non_negative_int, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=unit_float, help="keep the smallest set with this total probability")
    p.add_argument("--min-p", type=unit_float, help="drop tokens below min-p times the top probability")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=number(int, 1, 64, what="a thread count from 1 to 64"), default=1,
                   help="threads on Linux boards (default 1; the same bits at any count)")


# ---- shared steps ---------------------------------------------------------------------------

def build_for(args, quiet: bool) -> tuple[Artifacts, object]:
    board = load_board(args.board)
    ensure_toolchain(board)
    req, plan = prepare(board, args.model, args.quant, args.ctx, args.out)
    if plan.kept_f32 and not quiet:
        progress(f"note: {plan.kept_f32_summary()}")
    echo = None if quiet else progress
    return run_scons(req, echo), (board, plan)


def sampling_from(args, model_dir: Path) -> SamplingParams:
    """generation_config.json's defaults, overridden by the command line."""
    gen_path = Path(model_dir) / "generation_config.json"
    gen = read_json(gen_path) if gen_path.is_file() else {}
    temperature, top_k, top_p, min_p = 0.0, 0, 1.0, 0.0
    if gen.get("do_sample") is True:
        temperature = float(gen.get("temperature") or 1.0)
        top_k = int(gen.get("top_k") if gen.get("top_k") is not None else 50)
        top_p = float(gen.get("top_p") if gen.get("top_p") is not None else 1.0)
        min_p = float(gen.get("min_p") or 0.0)
    if args.temperature is not None:
        temperature = args.temperature
    if args.greedy:
        temperature = 0.0
    if args.top_k is not None:
        top_k = args.top_k
    if args.top_p is not None:
        if args.top_p <= 0.0:
            raise ColibriError("--top-p must be greater than 0")
        top_p = args.top_p
    if args.min_p is not None:
        min_p = args.min_p
    return SamplingParams(temperature, top_k, top_p, min_p, args.seed)


def prompt_from(args, tokenizer: Tokenizer | None, vocab: int) -> list[int]:
    if args.prompt is not None and args.prompt_ids is not None:
        raise ColibriError("give --prompt or --prompt-ids, not both")
    if args.prompt_ids is not None:
        ids = parse_prompt_ids(args.prompt_ids)
    elif args.prompt is not None:
        if tokenizer is None:
            raise ColibriError(f"{args.model}: no tokenizer.json, so --prompt cannot be used; give --prompt-ids")
        ids = tokenizer.encode(args.prompt)
        if not ids:
            raise ColibriError("the prompt encodes to no tokens")
    else:
        raise ColibriError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3")
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise ColibriError(f"prompt token id {bad[0]} is outside the vocabulary ({vocab})")
    return ids


class TextStream:
    """Prints generated text as tokens arrive (decoding the whole suffix each time keeps
    multi-token characters and spacing right)."""

    def __init__(self, tokenizer: Tokenizer | None, enabled: bool):
        self.tokenizer, self.enabled = tokenizer, enabled
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, step: int, token: int) -> None:
        self.ids.append(token)
        if not self.enabled:
            return
        if self.tokenizer is None:
            print(f"{token} ", end="", flush=True)
            return
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.shown):
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text


def decode_text(tokenizer: Tokenizer | None, ids: list[int]) -> str | None:
    return tokenizer.decode(ids) if tokenizer else None


# ---- commands -------------------------------------------------------------------------------

def cmd_build(args) -> int:
    art, (board, plan) = build_for(args, quiet=False)
    info = {"board": board.name, "program": str(art.program), "weights": str(art.weights),
            "plan": str(art.plan_json), "generated": str(art.generated), "model_hash": art.model_hash(),
            "quant": plan.quant, "n_ctx": plan.n_ctx}
    idf = board.idf
    if idf:
        info["idf_project"] = str(art.out_dir / idf["project_dir"])
        info["idf_built"] = art.program.exists()
    if args.json:
        print(json.dumps(info, indent=2))
    elif idf and not art.program.exists():
        print(f"generated the ESP-IDF project {info['idf_project']} for {board.name} ({plan.spec.architecture}, "
              f"{plan.quant}, context {plan.n_ctx}); ESP-IDF is not installed here, so build it with "
              f"`idf.py build` in that directory (ESP-IDF >= {idf['min_version']}), then `./colibri flash`")
    else:
        print(f"built {art.program} for {board.name} ({plan.spec.architecture}, {plan.quant}, context {plan.n_ctx})")
        print(f"weight image {art.weights} ({art.weights.stat().st_size:,} bytes, model hash {info['model_hash'][:16]})")
    return 0


def _run(args, stream: bool):
    remote = remote_for(load_board(args.board), args.remote)  # a bad --remote is said before building
    art, (board, plan) = build_for(args, quiet=args.json)
    tokenizer = Tokenizer.for_model(args.model)
    prompt = prompt_from(args, tokenizer, plan.spec.vocab_size)
    check_fits_context(prompt, args.steps, plan.n_ctx)
    request = RunRequest(prompt, args.steps, sampling_from(args, args.model), not args.ignore_eos, args.threads)
    text_out = TextStream(tokenizer, enabled=stream and not args.json)
    if stream and not args.json and tokenizer is not None and args.prompt is not None:
        print(args.prompt, end="", flush=True)
    result = run_on_board(board, art.program, art.weights, request, art.model_hash(), on_token=text_out,
                          flash_image=art.flash_image, port=getattr(args, "port", None),
                          reset=getattr(args, "reset", False), remote=remote, progress=None if args.json else progress)
    if stream and not args.json:
        print()
    return art, board, plan, tokenizer, request, result


def cmd_run(args) -> int:
    art, board, plan, tokenizer, request, result = _run(args, stream=True)
    r = rates(result)
    if args.json:
        print(json.dumps({"board": board.name, "prompt": request.prompt, "tokens": result.tokens,
                          "text": decode_text(tokenizer, result.tokens), "logits_sha256": result.digests,
                          "stop_reason": result.stop_reason, "stats": r, "remote": result.remote}, indent=2))
    else:
        speed = f", {speed_text(r)} decode" if speed_text(r) else ""
        print(f"[{len(result.tokens)} tokens on {ran_on(board, result)}, stopped by {result.stop_reason}{speed}]",
              file=sys.stderr)
    return 0


def cmd_verify(args) -> int:
    art, board, plan, tokenizer, request, result = _run(args, stream=True)
    if not args.json:
        r = rates(result)
        speed = f" at {speed_text(r)}" if speed_text(r) else ""
        progress(f"firmware on {ran_on(board, result)}: {len(result.tokens)} tokens{speed}, "
                 f"stopped by {result.stop_reason}; running the NumPy reference on the same weight image")
    ref = reference_run(plan, art.weights, request)
    comparison = compare(result, ref)
    mode = "greedy" if request.sampling.temperature == 0 else f"sampled, seed {request.sampling.seed}"
    summary = {
        "board": board.name, "model": str(args.model), "quant": plan.quant, "n_ctx": plan.n_ctx,
        "prompt": request.prompt, "sampling": asdict(request.sampling),
        "firmware": {"tokens": result.tokens, "logits_sha256": result.digests, "stop_reason": result.stop_reason},
        "reference": {"tokens": ref.tokens, "logits_sha256": ref.digests, "stop_reason": ref.stop_reason},
        "text": decode_text(tokenizer, result.tokens),
        "pass": comparison.passed,
        "expert_counts": {"firmware": result.expert_counts, "reference": ref.expert_counts} if ref.expert_counts else None,
        "first_divergent_step": comparison.first_divergent_step,
        "stats": rates(result),
        "remote": result.remote,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(comparison.verdict(board.name, plan.quant, mode))
    return 0 if comparison.passed else 1


def has_weights(model_dir: Path) -> bool:
    return (Path(model_dir) / "model.safetensors").is_file() or (Path(model_dir) / "model.safetensors.index.json").is_file()


def cmd_report(args) -> int:
    if not has_weights(args.model) and (Path(args.model) / "config.json").is_file():
        # A configuration alone (no hub here to fetch weights): plan it, nothing to build or link.
        board = load_board(args.board)
        spec = parse_config(read_json(Path(args.model) / "config.json"), Path(args.model).resolve().name)
        n_ctx = args.ctx or min(board.default_ctx, spec.max_position_embeddings)
        rep = planned_report_dict(board, plan_for_board(spec, board, args.quant, n_ctx))
    else:
        art, (board, plan) = build_for(args, quiet=args.json)
        if art.program.exists():
            rep = report_dict(board, plan, read_elf(art.program))
        else:  # an ESP-IDF project that idf.py has not built here
            rep = planned_report_dict(board, plan)
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(format_report(rep))
    if not rep["fits"]:
        over = [r for r in rep["regions"] if r["over_budget"]]
        raise ColibriError(f"{rep['model']} ({rep['quant']}, context {rep['n_ctx']}) does not fit board "
                           f"{rep['board']}: " + "; ".join(f"region {r['name']} needs {r['used']:,} B but has "
                                                           f"{r['budget']:,} B" for r in over))
    return 0


def cmd_bench(args) -> int:
    from . import bench

    remote = remote_for(load_board(args.board), args.remote)  # a bad --remote is said before building
    art, (board, plan) = build_for(args, quiet=True)
    out = bench.run_bench(board, plan, art, model=str(args.model), prompt_tokens=args.prompt_tokens, steps=args.steps,
                          repeat=args.repeat, threads=args.threads, plot=args.plot, port=getattr(args, "port", None),
                          reset=getattr(args, "reset", False), remote=remote, progress=None if args.json else progress)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(bench.bench_line(out, plan.spec.name))
    return 0


def cmd_flash(args) -> int:
    from .device.flash import flash_images, flash_plan

    art, (board, plan) = build_for(args, quiet=args.json)
    if "flash" not in board.data:
        raise ColibriError(f"board {board.name} is not flashed (it runs with ./colibri run --board {board.name})")
    images = flash_plan(board, art.out_dir)
    baud = args.baud or board.flash.baud
    flash_images(board, args.port, images, baud=baud, progress=progress, reset=not args.no_reset)
    summary = {"board": board.name, "port": args.port, "images": [{"offset": o, "file": str(p)} for o, p in images],
               "model_hash": art.model_hash()}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"flashed {len(images)} image(s) to {board.name} on {args.port} and verified them; "
              f"model hash {summary['model_hash'][:16]}")
    return 0


def cmd_monitor(args) -> int:
    from .device.monitor import monitor

    return monitor(args.port, args.baud, args.reset, duration=args.duration, expected_model=args.expect_model,
                   json_lines=args.json)


def cmd_release(args) -> int:
    from .release.make import make_release

    release = make_release(args.board, args.model, args.quant, args.ctx, args.out, sign_key=args.sign,
                           progress=None if args.json else progress)
    print(json.dumps(release.summary(), indent=2) if args.json else release.describe())
    return 0


def cmd_verify_release(args) -> int:
    from .release.check import check_release

    result = check_release(args.bundle, verify_key=args.verify_key, model_dir=args.model,
                           rebuild=not args.no_rebuild, progress=None if args.json else progress)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        for note in result.notes:
            progress(f"note: {note}")
        print(result.describe())
    return 0 if result.ok else 1


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"colibri: error: {message} (see {self.prog} --help)\n")


def make_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="colibri", description="Hugging Face checkpoints to verified C firmware.")
    parser.add_argument("--version", action="version", version=f"colibri {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("build", help="generate the sources and build the firmware for a board")
    add_target_args(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("run", help="build, run the firmware on a prompt and print the text")
    add_target_args(p)
    add_decode_args(p, steps=64)
    add_port_arg(p)
    add_remote_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("verify", help="run the firmware and the NumPy reference; PASS only if bit-identical")
    add_target_args(p)
    add_decode_args(p, steps=64)
    add_port_arg(p)
    add_remote_arg(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("report", help="where every byte goes, per memory region, checked against the ELF")
    add_target_args(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("bench", help="measure prefill and decode speed")
    add_target_args(p)
    p.add_argument("--steps", type=positive_int, default=128, help="decoded tokens per run (default 128)")
    p.add_argument("--prompt-tokens", type=positive_int, default=8, help="prompt length (default 8)")
    p.add_argument("--repeat", type=positive_int, default=3, help="runs; the median is reported (default 3)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="also draw decode tok/s against context length into PNG")
    add_threads_arg(p)
    add_port_arg(p)
    add_remote_arg(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("flash", help="write a board's images with esptool, verify them, reset the board")
    add_target_args(p)
    p.add_argument("--port", required=True, help="serial port of the board (e.g. /dev/ttyUSB0)")
    p.add_argument("--baud", type=positive_int, help="flashing baud rate (default: the board file's, or 460800)")
    p.add_argument("--no-reset", action="store_true", help="leave the board in the bootloader afterwards")
    p.set_defaults(func=cmd_flash)

    p = sub.add_parser("monitor", help="show what a board prints: logs and decoded frames (Ctrl-C to stop)")
    p.add_argument("--port", required=True, help="serial device or pyserial URL (e.g. socket://127.0.0.1:4444)")
    p.add_argument("--baud", type=positive_int, default=115200, help="baud rate (default 115200)")
    p.add_argument("--reset", action="store_true", help="reset the board through RTS after opening (default: leave it alone)")
    p.add_argument("--duration", type=non_negative_float, help="stop after this many seconds")
    p.add_argument("--expect-model", metavar="HASH", help="model hash (or a prefix) the firmware must carry")
    p.add_argument("--json", action="store_true", help="one JSON object per frame or log line")
    p.set_defaults(func=cmd_monitor)

    p = sub.add_parser("release", help="build, verify and bundle a reproducible firmware release")
    p.add_argument("--board", default="host", help=f"target board (available: {', '.join(available_boards())})")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="Hugging Face model directory "
                   "(default: the bundled models/kjv-tiny)")
    p.add_argument("--quant", default="q8_0", choices=QUANTS, help="weight format (default q8_0)")
    p.add_argument("--ctx", type=positive_int, help="context length the firmware is built for "
                   "(default: the board's default, capped by the model)")
    p.add_argument("--out", type=Path, required=True,
                   help="directory for the bundle, its .tar.gz and measurements.json")
    p.add_argument("--sign", type=Path, metavar="KEY", help="sign manifest.json with this ed25519 private key "
                   "(PEM, e.g. from `openssl genpkey -algorithm ed25519`, or OpenSSH)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("verify-release", help="check a release's hashes and signature, rebuild it from its "
                       "manifest and compare byte for byte")
    p.add_argument("bundle", type=Path, help="the release bundle directory or its .tar.gz")
    p.add_argument("--verify-key", type=Path, metavar="KEY", help="ed25519 public key manifest.json must be signed with")
    p.add_argument("--model", type=Path, help="directory holding the release's model files "
                   "(default: models/<the release's model name>)")
    p.add_argument("--no-rebuild", action="store_true", help="check hashes and the signature only")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    p.set_defaults(func=cmd_verify_release)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except ColibriError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("colibri: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
