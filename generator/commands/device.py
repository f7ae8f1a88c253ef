"""flash, ota, monitor and devices: a board on a serial port (its images written with esptool, an
A/B update, what it prints, the ports there are)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import flash_job, job
from ..arguments import (
    PortList,
    add_compiled_args,
    non_negative_float,
    ports_given,
    positive_int,
)
from ..console import progress
from ..documents import JsonDocument
from ..errors import ColibriError
from ..model.tokenizer import Tokenizer
from .common import Command, add_json_arg, job_options, print_json

if TYPE_CHECKING:
    from ..device.flash import ProbedChip
    from ..device.setup_toolchain import BoardNeeds

BEFORE = ("default-reset", "usb-reset", "no-reset", "no-reset-no-sync")


def add_baud_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baud", type=positive_int, help="flashing baud rate (default: the board file's, or 460800)")


def add_flash_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
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
    add_baud_arg(p)
    p.add_argument(
        "--before",
        default="default-reset",
        choices=BEFORE,
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


def flash_part(args: argparse.Namespace) -> str | None:
    """What --app-only / --model-only ask flash to write (None: everything)."""
    return "app" if args.app_only else "model" if args.model_only else None


@dataclass(frozen=True)
class FlashedImage(JsonDocument):
    offset: int
    file: Path


@dataclass(frozen=True)
class FlashDocument(JsonDocument):
    """flash --json's document (one board): the images written where, the model hash."""

    board: str
    port: str
    images: list[FlashedImage]
    model_hash: str


def flash(args: argparse.Namespace) -> int:
    ports = ports_given(args.port)
    if args.all_ports or len(ports) > 1:
        return _flash_fleet(args, ports)
    if args.report is not None or args.no_selftest:
        raise ColibriError(
            "--report and --no-selftest are for several boards at once (--port P1 --port P2 …, or --all-ports)"
        )
    options = job_options(args)
    options.port = ports[0] if ports else None
    flashed = flash_job.flash(
        options, args.baud, args.before, no_reset=args.no_reset, then_monitor=args.monitor, only=flash_part(args)
    )
    board, port, images, art = flashed.board, flashed.port, flashed.images, flashed.art
    summary = FlashDocument(board.name, port, [FlashedImage(o, p) for o, p in images], art.model_hash())
    if args.json and not args.monitor:
        print_json(summary.to_json())
    else:
        progress(
            f"flashed {len(images)} image(s) to {board.name} on {port} and verified them; "
            f"model hash {summary.model_hash[:16]}"
        )
    if not args.monitor:
        return 0
    from ..device.monitor import PanicDecoder, monitor

    uart_baud = board.idf.uart_baud if board.idf is not None else 115200
    return monitor(
        port,
        uart_baud,
        reset=True,
        expected_model=art.model_hash(),
        json_lines=args.json,
        tokenizer=Tokenizer.for_model(args.model),
        decoder=PanicDecoder(art.program, board.cc) if art.program.exists() else None,
    )


def _flash_fleet(args: argparse.Namespace, ports: list[str]) -> int:
    from ..device.flash_many import format_table

    if args.monitor:
        raise ColibriError("--monitor watches one board: flash several without it, or give one --port")
    options = job_options(args)
    options.port = None  # each board's port is in `ports`
    flashed = flash_job.flash_fleet(
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
    if args.json:
        print_json(report.to_json())
    else:
        print(format_table(report))
    progress(f"report written to {flashed.path}")
    if report.interrupted:
        print("colibri: interrupted", file=sys.stderr)
        return 130
    failed = [b for b in report.boards if b.result != "PASS"]
    if failed:
        print(f"colibri: error: {len(failed)} of {len(report.boards)} boards failed", file=sys.stderr)
        return 1
    return 0


def add_ota_arguments(p: argparse.ArgumentParser) -> None:
    add_compiled_args(p)
    p.add_argument("--port", help="serial port of the board (default: the only port that looks like an ESP32 board's)")
    add_baud_arg(p)
    p.add_argument(
        "--before",
        default="default-reset",
        choices=BEFORE,
        help="how esptool puts the chip in its bootloader (esptool --before)",
    )
    p.add_argument("--no-reset", action="store_true", help="leave the board in its bootloader afterwards")
    p.add_argument(
        "--file",
        type=Path,
        help="write the app image an esp_https_ota server would serve to FILE instead of updating a board",
    )


@dataclass(frozen=True)
class OtaFileDocument(JsonDocument):
    """ota --file --json's document: the update file written, no board touched."""

    board: str
    file: Path
    bytes: int


@dataclass(frozen=True)
class OtaDocument(JsonDocument):
    """ota --json's document: the slot written and selected, the one running before, otadata's
    sequence number, the app's size."""

    board: str
    port: str
    running_slot: str
    slot: str
    seq: int
    bytes: int
    model_hash: str


def ota(args: argparse.Namespace) -> int:
    updated = flash_job.ota(job_options(args), args.baud, args.before, no_reset=args.no_reset, file=args.file)
    board, done = updated.board, updated.update
    summary: OtaFileDocument | OtaDocument
    if done is None:
        assert updated.file is not None
        summary = OtaFileDocument(board.name, updated.file, updated.file.stat().st_size)
        message = (
            f"wrote {updated.file} ({summary.bytes:,} B): the app image an esp_https_ota server serves; "
            "no board was touched"
        )
    else:
        summary = OtaDocument(
            board.name,
            done.port,
            f"ota_{done.running_slot}",
            f"ota_{done.slot}",
            done.seq,
            done.app_bytes,
            updated.art.model_hash(),
        )
        message = (
            f"updated {board.name} on {done.port}: the new app is in ota_{done.slot} and selected; "
            f"it confirms itself if its self-test passes, else the board goes back to ota_{done.running_slot}"
        )
    if args.json:
        print_json(summary.to_json())
    else:
        progress(message)
    return 0


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--elf",
        type=Path,
        metavar="FILE",
        help="the build's ELF (e.g. build/esp32p4/<model>/firmware.elf): code addresses in the log (a panic's "
        "MEPC and RA, its stack dump, a backtrace) are decoded to function, file and line, as idf.py monitor does",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per frame or log line")


def monitor(args: argparse.Namespace) -> int:
    from ..device.monitor import PanicDecoder, monitor

    decoder = PanicDecoder(args.elf) if args.elf is not None else None  # a bad --elf is said before the port
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
        decoder=decoder,
    )


def add_devices_arguments(p: argparse.ArgumentParser) -> None:
    add_json_arg(p)
    p.add_argument(
        "--probe",
        action="store_true",
        help="read each ESP32 port's chip through esptool (chip, revision, flash size, PSRAM where the chip "
        "says, MAC) and check the board files against it, one line per problem; with no board plugged in, "
        "list the toolchains, emulators and ESP-IDF installed and what each board needs",
    )
    p.add_argument(
        "--port",
        action=PortList,
        help="--probe: this port (again for several; default: every port that looks like an ESP32 board's)",
    )
    p.add_argument(
        "--board",
        help="--probe: check this board file (a name of targets/ or a path; default: every board of targets/ "
        "flashed over a serial port for the chip found)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="--probe: the build directory whose images are weighed against the chip's flash "
        "(default: every build of the board under build/)",
    )
    p.add_argument(
        "--before",
        default="default-reset",
        choices=BEFORE,
        help="--probe: how esptool puts the chip in its ROM loader (no-reset: hold BOOT and press RESET "
        "yourself; the chip is then left there)",
    )


@dataclass(frozen=True)
class ProbeDocument(JsonDocument):
    """devices --probe --json's document: each chip found and the problems of the board files
    checked against it; the programs of every board on this machine."""

    chips: list[ProbedChip]
    problems: list[str]
    boards: list[BoardNeeds]


def probe(args: argparse.Namespace) -> int:
    from ..boards import available_boards, load_board
    from ..compile.build import BUILD_ROOT
    from ..device.flash import board_problems, probe_chip
    from ..device.ports import list_ports
    from ..device.setup_toolchain import every_board_needs

    given = [load_board(args.board)] if args.board else None
    ports = ports_given(args.port) or [str(p.device) for p in list_ports() if p.esp_bridge]
    chips, problems = [], []
    for port in ports:
        chip = probe_chip(port, args.before)
        chips.append(chip)
        for_chip = [
            b
            for b in (load_board(name) for name in available_boards())
            if b.runner.needs_port and b.flash is not None and b.flash.chip == chip.name.replace("-", "").lower()
        ]
        boards = given or for_chip
        if not boards:
            problems.append(f"{port}: no board of targets/ is for the {chip.name} (give one with --board FILE)")
        for board in boards:
            builds = [args.out] if args.out else sorted(p for p in (BUILD_ROOT / board.name).glob("*") if p.is_dir())
            problems += board_problems(board, chip, builds)
    needs = every_board_needs()
    if args.json:
        print_json(ProbeDocument(chips, problems, needs).to_json())
        return 1 if problems else 0
    for chip in chips:
        print(chip.line())
    for problem in problems:
        print(f"PROBLEM {problem}")
    if chips and not problems:
        print(f"the board file{'s' if len(chips) > 1 else ''} hold{'' if len(chips) > 1 else 's'} for every chip found")
    if not chips:
        print("no board plugged in (no port looks like an ESP32 board's); on this machine:")
        for need in needs:
            print(f"  {need.line()}")
    return 1 if problems else 0


def devices(args: argparse.Namespace) -> int:
    from ..device.ports import describe, list_ports

    if args.probe:
        return probe(args)
    if args.port or args.board or args.out:
        raise ColibriError("--port, --board and --out go with --probe (./colibri devices --probe)")
    ports = list_ports()
    if args.json:
        print_json([p.to_dict() for p in ports])
    elif not ports:
        print("no serial ports found (is the board plugged in, and its USB-serial driver loaded?)")
    else:
        for port in ports:
            print(describe(port))
    return 0


COMMANDS = [
    Command("flash", "write a board's images with esptool, verify them, reset the board", add_flash_arguments, flash),
    Command(
        "ota",
        "A/B update of an ESP-IDF board: the app into the slot not running, verified, then selected in otadata",
        add_ota_arguments,
        ota,
    ),
    Command(
        "monitor", "show what a board prints: logs and decoded frames (Ctrl-C to stop)", add_monitor_arguments, monitor
    ),
    Command(
        "devices",
        "list serial ports, marking those that look like ESP32 boards; --probe: each chip against its board file",
        add_devices_arguments,
        devices,
    ),
]
