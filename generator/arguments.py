"""The command line's options that several commands share, and the types that check their values:
a model and a board to build for, a prompt and its decoding, and what a board may take (threads,
a serial port, --remote, MPI ranks' hosts, a memory budget), one group for every command that runs firmware."""

from __future__ import annotations

import argparse
from pathlib import Path

from .boards import KV_TYPES, available_boards
from .errors import ColibriError
from .files import DEFAULT_MODEL
from .model.hub import HubReference
from .model.load import model_value
from .numerics.quantize import QUANTS
from .numerics.sampling import DEFAULT_REPEAT_LAST_N


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


def counts(low: int, high: float = float("inf"), what: str = "a positive integer"):
    """An argparse type: one count (an int) or several, comma-separated (a tuple, in the order
    given), each within [low, high]: --threads 1,2 as llama-bench's -t 1,2."""
    one = number(int, low, high, what)

    def parse(text: str) -> int | tuple[int, ...]:
        try:
            values = [one(part) for part in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {what}, or several comma-separated, got {text!r}") from None
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} names a value twice")
        return values[0] if len(values) == 1 else tuple(values)

    return parse


positive_int = number(int, 1, what="a positive integer")
non_negative_int = number(int, 0, what="a non-negative integer")
unit_float = number(float, 0.0, 1.0, what="a number between 0 and 1")
non_negative_float = number(float, 0.0, what="a finite number >= 0")


def model_argument(text: str) -> Path | HubReference:
    """--model: a path, or a model on the hub (hf:ORG/NAME...), fetched once the command runs."""
    try:
        return model_value(text)
    except ColibriError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", default="host", help=f"target board (available: {', '.join(available_boards())})")
    p.add_argument(
        "--model",
        type=model_argument,
        default=DEFAULT_MODEL,
        help="Hugging Face model directory or GGUF file, or a model on the hub: hf:ORG/NAME[@REVISION][:QUANT|:FILE.gguf] "
        "(fetched into huggingface_hub's cache; HF_HUB_OFFLINE=1 uses only the cache) (default: the bundled models/kjv-tiny)",
    )
    p.add_argument(
        "--quant",
        choices=QUANTS,
        help="weight format (default: gguf for a GGUF file, keeping its own block types; q8_0 otherwise)",
    )
    p.add_argument(
        "--ctx",
        type=positive_int,
        help="context length the firmware is built for (default: the board's default, capped by the model)",
    )


def out_dir(text: str) -> Path:
    """An argparse type for --out: refused at once (before any model is read) when it cannot be a
    directory to write in (compile.build.check_out_dir's ColibriError, the CLI's one line)."""
    from .compile.build import check_out_dir

    return check_out_dir(text)


def add_target_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument(
        "--kv-type",
        choices=KV_TYPES,
        help="how the KV cache holds keys and values: f32, f16 (binary16) or q8_0 (default: the board's, f16)",
    )
    p.add_argument("--out", type=out_dir, help="build directory (default build/<board>/<model>-<quant>-ctx<N>)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_port_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        help="serial port of a real board (e.g. /dev/ttyUSB0), for boards run over serial "
        "(default: the only port that looks like an ESP32 board's)",
    )
    p.add_argument("--reset", action="store_true", help="reset the board through RTS after opening its port")


class PortList(argparse.Action):
    """--port given again and again: a list of ports. A single port from colibri.toml is a default,
    replaced (not extended) by the first --port on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest, (given if isinstance(given, list) else []) + [values])


def ports_given(value: str | list[str] | None) -> list[str]:
    """The ports a PortList option holds: none, one (from colibri.toml or the command line) or several."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def add_remote_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        metavar="[USER@]HOST[:PORT]",
        help="run on a Linux board reached over SSH (an ~/.ssh/config alias works); default: "
        "$COLIBRI_REMOTE, else the board's entry in ~/.config/colibri/config.toml [remote]; "
        "--remote '' runs here",
    )


def add_hosts_args(p: argparse.ArgumentParser) -> None:
    """Where a board's MPI ranks run, in mpirun's own syntax (checked by device/hosts.py)."""
    ranks = p.add_argument_group(
        "MPI ranks (boards that run them: host-mpi, linux-aarch64-mpi; docs/several-boards.md)"
    )
    ranks.add_argument(
        "--hosts",
        metavar="HOST[:SLOTS],...",
        help="the hosts the ranks run on, as mpirun's --host (localhost:4: four ranks here; other hosts "
        "over SSH, the build at the same path); default: one rank here",
    )
    ranks.add_argument("--hostfile", type=Path, metavar="FILE", help="an mpirun hostfile (HOST slots=N per line)")
    ranks.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help="an Ansible inventory as the host list: each host's ansible_host (else its name), colibri_slots ranks "
        "(default 1)",
    )


def add_ranks_arg(p: argparse.ArgumentParser) -> None:
    """build and report: the MPI ranks a build splits the weights over (run, verify, ... take them from --hosts)."""
    p.add_argument(
        "--ranks",
        type=positive_int,
        metavar="N",
        help="boards that run MPI ranks (host-mpi): split the weights over N ranks, one weight image each "
        "(weights.rankR.img); run, verify, bench, chat and eval build for as many ranks as --hosts gives",
    )


def memory_size(text: str):
    """--memory-budget: bytes (an int) or compile.cache_plan.AutoBudget."""
    from .compile.cache_plan import parse_budget

    try:
        return parse_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_budget_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--memory-budget",
        type=memory_size,
        metavar="SIZE",
        help="Linux boards: RAM the firmware may use, e.g. 512M or 6G (binary units) or bytes; the "
        "dense part stays resident and routed experts are read into a pool of slots "
        "(default: the board file's memory_budget; 0: unlimited, the mapped image read in place). "
        "auto: the smaller of the firmware's memory cgroup limit and MemAvailable where it runs, "
        "less a margin of 128 MiB (auto-512M: that margin); unlimited when that holds the whole model",
    )


def add_decode_args(p: argparse.ArgumentParser, steps: int) -> None:
    p.add_argument(
        "--prompt", help="prompt text (needs the model's tokenizer: tokenizer.json, or a GGUF file's vocabulary)"
    )
    p.add_argument(
        "--prompt-file",
        type=Path,
        metavar="FILE",
        help="read the prompt text from FILE (- for standard input); one final newline is dropped",
    )
    p.add_argument("--prompt-ids", help="prompt as comma-separated token ids")
    p.add_argument("--steps", type=positive_int, default=steps, help=f"tokens to generate (default {steps})")
    add_sampling_args(p)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")


def add_board_args(p: argparse.ArgumentParser, threads_sweep: bool = False) -> None:
    """What a board may take, the same for every command that runs firmware (option_checks refuses
    those the board in use cannot take); threads_sweep: --threads takes several counts (bench)."""
    add_threads_arg(p, threads_sweep)
    add_port_arg(p)
    add_remote_arg(p)
    add_hosts_args(p)
    add_budget_arg(p)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--temperature", type=non_negative_float, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-k", type=non_negative_int, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=unit_float, help="keep the smallest set with this total probability")
    p.add_argument("--min-p", type=unit_float, help="drop tokens below min-p times the top probability")
    p.add_argument("--seed", type=non_negative_int, help="sampling seed (default 0)")
    p.add_argument(
        "--repeat-penalty",
        type=number(float, 1e-6, 1e6, what="a penalty from 0.000001 to 1000000 (1 = off)"),
        default=1.0,
        metavar="P",
        help="llama.cpp's repetition penalty: the logit of a token among the last --repeat-last-n is divided "
        "by P when positive, multiplied by it otherwise (default 1.0: off; greedy decoding too)",
    )
    p.add_argument(
        "--repeat-last-n",
        type=number(int, -1, what="a token count, 0 (off) or -1 (the whole context)"),
        default=DEFAULT_REPEAT_LAST_N,
        metavar="N",
        help=f"the tokens of the conversation the penalty looks back over (default {DEFAULT_REPEAT_LAST_N}; "
        "0: off; -1: the whole context)",
    )


def add_speculate_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculate",
        type=number(int, 0, 64, what="a count of drafted tokens from 0 to 64"),
        default=0,
        metavar="N",
        help="exact speculative decoding: check up to N tokens drafted from the context (prompt lookup) "
        "in each forward pass; the same tokens and logits as without it (default 0: off; a model or "
        "board that cannot keep the bits decodes plainly, and says why)",
    )


def add_compiled_args(p: argparse.ArgumentParser) -> None:
    """What every command that compiles a firmware takes: the target (board, model, quantization,
    context, KV type, build directory), --jobs and --cache-dir."""
    add_target_args(p)
    add_jobs_arg(p)
    add_cache_arg(p)


def add_jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        type=number(int, 1, 1024, what="a process count from 1 to 1024"),
        help="worker processes that quantize the weights when the weight image is generated "
        "(default: two per core) and that compile the firmware (default: one per core); the same "
        "bytes at any count",
    )


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the build cache: compiled objects kept by their inputs, so the same firmware is never "
        "compiled twice (default $COLIBRI_CACHE_DIR, else ~/.cache/colibri/build-cache; off: none)",
    )


def add_threads_arg(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    if sweep:
        p.add_argument(
            "--threads",
            type=counts(1, 64, what="a thread count from 1 to 64"),
            default=1,
            help="threads on Linux boards, or several, comma-separated (1,2,4): a row each (default 1)",
        )
        return
    p.add_argument(
        "--threads",
        type=number(int, 1, 64, what="a thread count from 1 to 64"),
        default=1,
        help="threads on Linux boards (default 1; the same bits at any count)",
    )
