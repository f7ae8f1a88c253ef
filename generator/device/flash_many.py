"""Many boards flashed at once: one thread per serial port over flash_images(), each board then
asked for its self-test, and one report of them all (JSON and a table).

A board's failure (no answer, a write cut, the wrong chip, a digest that differs, a self-test
FAIL) is that board's line in the report, never the others' problem: every thread has its own
port and catches its own errors. Ctrl-C stops the wait: the boards that finished are reported as
they ended, the others as interrupted (their flash may be partly written).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..boards import Board
from ..documents import JsonDocument, json_field
from ..errors import ColibriError
from .flash import Chip, flash_images
from .session import Selftest

PASS, FAIL, INTERRUPTED = "PASS", "FAIL", "interrupted"
SelftestOn = Callable[[str], Selftest]  # port -> the firmware's self-test verdict there


def _or_null(text: str) -> str | None:
    return text or None


def _hundredths(seconds: float) -> float:
    return round(seconds, 2)


@dataclass
class BoardOutcome(JsonDocument):
    """One port's board: what was found on it and how it ended (in its document, an empty text is
    null and the seconds are rounded to hundredths)."""

    port: str
    result: str = INTERRUPTED
    chip: str = json_field(default="", convert=_or_null)
    revision: str = json_field(default="", convert=_or_null)
    mac: str = json_field(default="", convert=_or_null)
    seconds: float = json_field(default=0.0, convert=_hundredths)
    stage: str = "connect"  # where it is, or ended: connect, flash, selftest, done
    failed: str = json_field(default="", convert=_or_null)  # why, in one line
    selftest: str = json_field(default="", convert=_or_null)  # the self-test's line, "skipped" under --no-selftest


@dataclass
class FleetReport:
    board: str
    model_hash: str
    images: list[tuple[int, Path]]
    boards: list[BoardOutcome] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        return not self.interrupted and all(b.result == PASS for b in self.boards)

    def to_json(self) -> dict[str, object]:
        return {
            "board": self.board,
            "model_hash": self.model_hash,
            "images": [{"offset": offset, "file": str(path)} for offset, path in self.images],
            "passed": sum(b.result == PASS for b in self.boards),
            "failed": sum(b.result == FAIL for b in self.boards),
            "interrupted": self.interrupted,
            "seconds": _hundredths(self.seconds),
            "boards": [b.to_json() for b in self.boards],
        }


def check_ports(ports: list[str]) -> None:
    if not ports:
        raise ColibriError("no serial ports to flash: give them with --port P1 --port P2 …, or --all-ports")
    seen: set[str] = set()
    for port in ports:
        if port in seen:
            raise ColibriError(f"port {port} is given twice: each board is flashed once")
        seen.add(port)


def _flash_one(
    board: Board,
    outcome: BoardOutcome,
    images: list[tuple[int, Path]],
    *,
    baud: int,
    before: str,
    reset: bool,
    selftest: SelftestOn | None,
    say: Callable[[str], None],
    stop: threading.Event,
) -> None:
    start = time.monotonic()
    try:
        outcome.stage = "flash"

        def found(chip: Chip) -> None:
            outcome.chip, outcome.revision, outcome.mac = chip.name, chip.revision_text, chip.mac

        flash_images(board, outcome.port, images, baud=baud, progress=say, reset=reset, before=before, found=found)
        if selftest is None:
            outcome.selftest = "skipped"
        elif not stop.is_set():
            outcome.stage = "selftest"
            say("running the firmware's self-test")
            verdict = selftest(outcome.port)
            outcome.selftest = verdict.line()
            if not verdict.passed:
                raise ColibriError(verdict.line())
        if stop.is_set():
            return  # interrupted before its self-test: not a verdict
        outcome.stage, outcome.result = "done", PASS
    except ColibriError as e:
        failed = getattr(e, "selftest", None)
        if isinstance(failed, Selftest) and not outcome.selftest:
            outcome.selftest = failed.line()
        text = " ".join(str(e).split())
        said = f"flashing board {board.name} on {outcome.port} failed: "  # the port has its column
        outcome.result, outcome.failed = FAIL, text.removeprefix(said)
    except Exception as e:  # noqa: BLE001 - one board's surprise must not stop the others
        outcome.result, outcome.failed = FAIL, f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
    finally:
        outcome.seconds = time.monotonic() - start
        if outcome.result != INTERRUPTED:
            say(f"{outcome.result}{': ' + outcome.failed if outcome.failed else ''} ({outcome.seconds:.1f} s)")


def _quiet_esptool() -> Callable[[], None]:
    """Silence esptool's own printing (its progress bars would interleave); returns the undo."""
    from esptool.logger import log

    before = getattr(log, "_verbosity", None)
    log.set_verbosity("silent")

    def undo() -> None:
        if before is not None:
            log.set_verbosity(before)

    return undo


def flash_many(
    board: Board,
    ports: list[str],
    images: list[tuple[int, Path]],
    model_hash: str,
    *,
    baud: int,
    before: str = "default-reset",
    reset: bool = True,
    selftest: SelftestOn | None = None,
    progress: Callable[[str], None] = print,
) -> FleetReport:
    """Flash `images` to the boards on `ports` in parallel, verify them (esptool's MD5 read-back),
    then, with `selftest`, ask each board for its self-test (selftest(port) resets the board and
    reads its verdict; the flash then leaves it in its loader); else reset each unless reset=False.
    Every progress line is prefixed with its port."""
    check_ports(ports)
    lock = threading.Lock()
    stop = threading.Event()

    def speaker(port: str) -> Callable[[str], None]:
        def say(line: str) -> None:
            with lock:
                if not stop.is_set():  # after Ctrl-C a board still running says nothing more
                    progress(f"{port}: {line}")

        return say

    report = FleetReport(board.name, model_hash, list(images), [BoardOutcome(port) for port in ports])
    start = time.monotonic()
    undo = _quiet_esptool()
    threads = [
        threading.Thread(
            target=_flash_one,
            args=(board, outcome, images),
            kwargs=dict(
                baud=baud,
                before=before,
                reset=reset and selftest is None,
                selftest=selftest,
                say=speaker(outcome.port),
                stop=stop,
            ),
            name=f"flash {outcome.port}",
            daemon=True,  # an interrupted board's esptool call cannot be cut short: it must not hold the exit
        )
        for outcome in report.boards
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.1)
    except KeyboardInterrupt:
        with lock:
            stop.set()
        report.interrupted = True
        # The boards still running keep their threads (an esptool call cannot be cut short): the
        # report holds copies, so what those threads do later cannot change it.
        report.boards = [replace(outcome) for outcome in report.boards]
        for outcome in report.boards:
            if outcome.result == INTERRUPTED:
                outcome.seconds = time.monotonic() - start
                outcome.failed = f"interrupted during {outcome.stage}" + (
                    ": its flash may be partly written, run flash again" if outcome.stage == "flash" else ""
                )
    finally:
        undo()
    report.seconds = time.monotonic() - start
    return report


def format_table(report: FleetReport) -> str:
    """The report as a table on stdout: one row per board, then a summary line."""
    head = ("port", "chip", "MAC", "result", "seconds", "what failed")
    rows = [
        (
            b.port,
            f"{b.chip} {b.revision}".strip() or "-",
            b.mac or "-",
            b.result,
            f"{b.seconds:.1f}",
            b.failed,
        )
        for b in report.boards
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:5], widths)) + "  " + r[5] for r in [head, *rows]]
    passed = sum(b.result == PASS for b in report.boards)
    summary = f"{passed} of {len(report.boards)} boards passed in {report.seconds:.1f} s"
    if report.interrupted:
        summary += " (interrupted)"
    return "\n".join([line.rstrip() for line in lines] + [summary])
