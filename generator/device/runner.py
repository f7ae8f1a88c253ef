"""Run stage: a run is one turn on a link to the firmware (device/links.py): the request sent, its
frames read back into the result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..boards import Board
from ..errors import ColibriError
from .links import Firmware, HelloCheck, LinkOptions, OnToken, Progress, open_firmware
from .remote import Remote
from .session import RunRequest, RunResult


def check_request(board: Board, request: RunRequest) -> None:
    """Refuse what a request asks of the firmware that `board` cannot do."""
    if request.threads > 1 and board.parallel == "none":
        raise ColibriError(f"board {board.name} runs single-threaded (--threads {request.threads} is for Linux boards)")
    if request.probe_bandwidth_mib is not None and not board.runner.probes_bandwidth:
        raise ColibriError(f"board {board.name} cannot measure its read bandwidth (only Linux boards can)")
    if request.firmware_options() and not board.runner.takes_memory_budget:
        raise ColibriError(
            f"board {board.name} keeps its weights in flash: a memory budget and storage probes are for Linux boards"
        )


def run_firmware(
    board: Board,
    firmware: Firmware,
    how: LinkOptions,
    request: RunRequest,
    on_token: OnToken | None = None,
    timeout: float | None = None,
) -> RunResult:
    """Run `request` on `firmware`, built for `board`: here, or on the Linux board how.remote reached
    over SSH (how.progress hears about copies to it); the request's own firmware options added."""
    check_request(board, request)
    with open_firmware(board, firmware, replace(how, options=tuple(request.firmware_options()))) as link:
        return link.turn(request, on_token, timeout)


def run_on_board(
    board: Board,
    program: Path,
    weights: Path,
    request: RunRequest,
    expected_model: str,
    on_token: OnToken | None = None,
    logits_out: Path | None = None,
    timeout: float | None = None,
    flash_image: Path | None = None,
    port: str | None = None,
    reset: bool = False,
    check_hello: HelloCheck | None = None,
    remote: Remote | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """run_firmware() with the firmware and the link options given one by one; check_hello: see
    Session."""
    firmware = Firmware(Path(program), Path(weights), expected_model, flash_image, check_hello)
    how = LinkOptions(logits_out=logits_out, remote=remote, progress=progress, port=port, reset=reset)
    return run_firmware(board, firmware, how, request, on_token, timeout)
