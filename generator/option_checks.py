"""Options a command was given that it cannot honour are refused, not dropped: an option the board
does not take (--port on a board that runs here), options that contradict each other (--greedy
with a temperature). All of it before anything is compiled. A thread count above this machine's
cores is legal but slow, so it is a warning.

`given` is the set of options (argparse dests) the user wrote on the command line: a colibri.toml
value that does not apply to the board in use (its `port` while running on host) is skipped, not
refused, because the file holds a project's defaults for every board.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from .boards import Board, available_boards, load_board
from .errors import ColibriError


@dataclass(frozen=True)
class BoardOption:
    dest: str
    flag: str
    applies: Callable[[Board], bool]
    meant_for: str  # which boards take it, as a phrase


def _serial(board: Board) -> bool:
    return board.runner.needs_port


def _boards_where(applies: Callable[[Board], bool]) -> str:
    names = []
    for name in available_boards():
        try:
            if applies(load_board(name)):
                names.append(name)
        except ColibriError:
            continue  # a malformed board file is reported when that board is used
    return ", ".join(names) or "none"


# Options only some boards take. A new board-specific option (e.g. one for Linux boards reached
# over SSH) is one more row.
BOARD_OPTIONS = [
    BoardOption("port", "--port", _serial, "boards on a serial port"),
    BoardOption("reset", "--reset", _serial, "boards on a serial port"),
    BoardOption("threads", "--threads", lambda b: b.parallel != "none", "multi-threaded (Linux) boards"),
    BoardOption("remote", "--remote", lambda b: b.runner.takes_remote, "Linux boards reached over SSH"),
    BoardOption("hosts", "--hosts", lambda b: b.runner.runs_ranks, "boards that run MPI ranks"),
    BoardOption("hostfile", "--hostfile", lambda b: b.runner.runs_ranks, "boards that run MPI ranks"),
    BoardOption("inventory", "--inventory", lambda b: b.runner.runs_ranks, "boards that run MPI ranks"),
    BoardOption(
        "memory_budget",
        "--memory-budget",
        lambda b: b.runner.takes_memory_budget,
        "Linux boards, whose weights are a file (MCUs read theirs from flash)",
    ),
]


def check_board_options(board: Board, args, given: set[str], defaults: dict | None = None, rules=None) -> None:
    """Refuse an option given on the command line that `board` does not take. One that came from
    colibri.toml is set back to its default (`defaults`: the parser's) instead: skipped, not used."""
    for rule in BOARD_OPTIONS if rules is None else rules:
        if not hasattr(args, rule.dest) or rule.applies(board):
            continue
        if rule.dest in given:
            raise ColibriError(
                f"{rule.flag} is for {rule.meant_for} ({_boards_where(rule.applies)}); "
                f"board {board.name} runs {board.runner.how_it_runs()}"
            )
        if defaults is not None and rule.dest in defaults:
            setattr(args, rule.dest, defaults[rule.dest])


SAMPLING = (
    ("temperature", "--temperature"),
    ("top_k", "--top-k"),
    ("top_p", "--top-p"),
    ("min_p", "--min-p"),
    ("seed", "--seed"),
)


def check_sampling_options(args, given: set[str]) -> None:
    """--greedy (or --temperature 0) with a sampling setting: one of them would be ignored."""

    def shown(dest, flag):
        return f"{flag} {getattr(args, dest)}"

    if args.greedy and "greedy" not in given and any(d in given for d, _ in SAMPLING):
        args.greedy = False  # colibri.toml's greedy, overridden by sampling settings on the command line
    if "greedy" in given and args.greedy:
        others = [shown(d, f) for d, f in SAMPLING if d in given]
        if others:
            raise ColibriError(
                f"--greedy contradicts {', '.join(others)}: greedy decoding always takes the "
                f"most likely token, so sampling settings would be ignored; give one or the other"
            )
    if "temperature" in given and args.temperature == 0:
        others = [shown(d, f) for d, f in SAMPLING if d in given and d != "temperature"]
        if others:
            raise ColibriError(
                f"--temperature 0 is greedy decoding, so {', '.join(others)} would have no effect: "
                f"drop {'it' if len(others) == 1 else 'them'} or give a temperature above 0"
            )


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_warning(board: Board, threads: int, cores: int | None = None) -> str | None:
    """Why `threads` will be slow here, or None: more threads than cores share them, and each
    forward pass waits for the slowest (the bits stay the same at any count)."""
    cores = available_cores() if cores is None else cores
    if not board.runner.runs_threads or threads <= cores:
        return None
    emulator = board.runner.emulated_by()
    where = f" (under {emulator})" if emulator else ""
    return (
        f"--threads {threads} on a machine with {cores} core(s){where}: the threads take turns on the "
        f"cores and every forward pass waits for the slowest, so decoding is slower than with "
        f"--threads {cores} (the bits are the same)"
    )
