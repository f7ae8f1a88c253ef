"""flash, flash to several boards at once, and ota: a flashed board's firmware built through
job.py's plan and build, then written over its serial port with esptool and checked (device/flash.py,
device/flash_many.py, device/ota.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .boards import Board
from .compile.build import Artifacts
from .console import progress
from .device.links import LinkOptions, open_firmware
from .device.session import RunRequest, Selftest
from .errors import ColibriError
from .files import write_atomic
from .job import JobOptions, Planned, board_port, built_firmware, compile_build, plan_build

if TYPE_CHECKING:
    from .device.flash_many import FleetReport, SelftestOn
    from .device.ota import OtaUpdate


def plan_flashed(options: JobOptions) -> Planned:
    """job.plan_build for a board that is flashed (refused on the others)."""
    planned = plan_build(options)
    board = planned.board
    if not board.is_flashed:
        raise ColibriError(f"board {board.name} is not flashed (it runs with ./colibri run --board {board.name})")
    return planned


@dataclass(frozen=True)
class Flashed:
    board: Board
    port: str
    images: list[tuple[int, Path]]  # (offset, file)
    art: Artifacts


def flash(
    options: JobOptions,
    baud: int | None = None,
    before: str = "default-reset",
    no_reset: bool = False,
    then_monitor: bool = False,
    only: str | None = None,
) -> Flashed:
    """Build and write a flashed board's images with esptool and verify them; reset the board after,
    unless no_reset or then_monitor (the monitor resets it once its port is open, so the hello of the
    new firmware is not lost before anyone listens). only="app" leaves the weights partition as it
    is on the board, only="model" writes the weights alone (device.flash.select_images)."""
    from .device.flash import check_part, flash_images, flash_plan, select_images

    planned = plan_flashed(options)
    board = planned.board
    if then_monitor and no_reset:
        raise ColibriError(
            "--no-reset leaves the board in its bootloader, so --monitor would show nothing: give one or the other"
        )
    if only is not None:
        check_part(board, only)  # a board whose weights are in its app has no --app-only: said before building
    port = board_port(options, board)
    assert port is not None and board.flash is not None  # a flashed board is on a serial port
    art = compile_build(planned, quiet=options.quiet, jobs=options.jobs, cache_dir=options.cache_dir)
    images, skipped = select_images(board, flash_plan(board, art.out_dir), only)
    for left in skipped:
        progress(f"--{only}-only: leaving {left} as it is on the board")
    flash_images(
        board,
        port,
        images,
        baud=baud or board.flash.baud,
        progress=progress,
        reset=not no_reset and not then_monitor,
        before=before,
    )
    return Flashed(board, port, images, art)


def fleet_ports(ports: list[str], all_ports: bool) -> list[str]:
    """The ports `flash` writes to: those given, or with all_ports every port that looks like an
    ESP32 board's (device/ports.py)."""
    from .device.ports import list_ports

    if not all_ports:
        return ports
    if ports:
        raise ColibriError("give the boards' ports with --port or take them all with --all-ports, not both")
    found = list_ports()
    likely = [p.device for p in found if p.esp_bridge]
    if not likely:
        others = f" (found only {', '.join(p.device for p in found)})" if found else " (no serial ports found)"
        raise ColibriError(f"--all-ports found no serial port that looks like an ESP32 board{others}")
    return likely


@dataclass(frozen=True)
class FleetFlashed:
    report: FleetReport
    path: Path  # where the JSON report was written


def flash_fleet(
    options: JobOptions,
    ports: list[str],
    *,
    all_ports: bool = False,
    baud: int | None = None,
    before: str = "default-reset",
    no_reset: bool = False,
    selftest: bool = True,
    report_path: Path | None = None,
    selftest_on: SelftestOn | None = None,
    only: str | None = None,
) -> FleetFlashed:
    """Build once, then flash every board on `ports` (or all_ports) in parallel, verify each and run
    its self-test (device/flash_many.py); the report goes to report_path (default
    flash-report.json in the build directory), whole or not at all. selftest_on(port) replaces
    the self-test over the port itself (a board reset through RTS, then a selftest request); only
    as flash()'s (--app-only, --model-only) for every board."""
    from .device.flash import check_part, flash_plan, select_images
    from .device.flash_many import check_ports, flash_many

    planned = plan_flashed(options)
    board = planned.board
    if selftest and no_reset:
        raise ColibriError(
            "--no-reset leaves the boards in their bootloader, so their self-test cannot run: add --no-selftest"
        )
    ports = fleet_ports(ports, all_ports)
    check_ports(ports)
    assert board.flash is not None  # a flashed board has a [flash] section
    if only is not None:
        check_part(board, only)  # a board whose weights are in its app has no --app-only: said before building
    art = compile_build(planned, quiet=options.quiet, jobs=options.jobs, cache_dir=options.cache_dir)
    images, skipped = select_images(board, flash_plan(board, art.out_dir), only)
    if skipped:
        progress(f"--{only}-only: leaving {', '.join(skipped)} as it is on every board")
    firmware = built_firmware(planned, art).firmware

    def over_the_port(port: str) -> Selftest:
        with open_firmware(board, firmware, LinkOptions(port=port, reset=True)) as link:
            result = link.turn(RunRequest.selftest_of(board.selftest))
        if result.selftest is None:
            raise ColibriError(f"{port}: the firmware answered a selftest request without a selftest frame")
        return result.selftest

    report = flash_many(
        board,
        ports,
        images,
        art.model_hash(),
        baud=baud or board.flash.baud,
        before=before,
        reset=not no_reset,
        selftest=(selftest_on or over_the_port) if selftest else None,
        progress=progress,
    )
    path = report_path or art.out_dir / "flash-report.json"
    write_atomic(path, json.dumps(report.to_json(), indent=2) + "\n")
    return FleetFlashed(report, path)


@dataclass(frozen=True)
class Updated:
    board: Board
    app: Path  # the app image written (or served)
    art: Artifacts
    update: OtaUpdate | None  # None when only the update file was written
    file: Path | None = None


def ota(
    options: JobOptions,
    baud: int | None = None,
    before: str = "default-reset",
    no_reset: bool = False,
    file: Path | None = None,
) -> Updated:
    """Build and write the app into the inactive A/B slot of an ESP-IDF board over its serial port,
    then select it (device.ota); with `file`, write the image an esp_https_ota server would serve
    there instead, and touch no board."""
    from .device.flash import flash_plan
    from .device.ota import ota_update, write_update_file

    planned = plan_build(options)
    board = planned.board
    if board.idf is None or not board.idf.ota_slots:
        raise ColibriError(f"board {board.name} has no A/B app slots: ota updates ESP-IDF boards such as esp32p4-idf")
    port = None if file is not None else board_port(options, board)
    art = compile_build(planned, quiet=options.quiet, jobs=options.jobs, cache_dir=options.cache_dir)
    flash_plan(board, art.out_dir)  # the idf.py build exists and matches the partition table
    app = art.out_dir / board.idf.images["app"].file
    if file is not None:
        write_update_file(board, app, file)
        return Updated(board, app, art, None, Path(file))
    assert port is not None and board.flash is not None
    weights = art.out_dir / board.idf.images["weights"].file  # the board must hold them: checked first
    done = ota_update(
        board,
        port,
        app,
        baud=baud or board.flash.baud,
        progress=progress,
        reset=not no_reset,
        before=before,
        weights=weights,
    )
    return Updated(board, app, art, done)
