"""Many boards flashed at once (device/flash_many.py): the real esptool talks to fake ESP32-P4s on
pseudo-terminals (tests/esp_rom_pty.py: ROM, stub loader, eFuses, flash and its MD5), one
thread per port. One board failing (a cut line, a flash that reads back wrong, another chip, no
answer, a self-test FAIL) is that board's line in the report: the others pass with their flash
intact. The self-test runs on qemu-rv32 instances booted from what each fake board holds."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL
from esp_rom_pty import FakeChip

from generator import cli, flash_job, job
from generator.boards import load_board
from generator.device import ports
from generator.device.flash_many import FAIL, INTERRUPTED, PASS, flash_many, format_table
from generator.device.ports import Port, esp_bridge
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, Selftest
from generator.errors import ColibriError
from generator.flash_job import fleet_ports

MACS = [bytes.fromhex(f"60550f0000{i:02x}") for i in range(1, 7)]


@pytest.fixture(scope="module")
def board():
    return load_board("esp32p4")


@pytest.fixture
def images(tmp_path):
    """An app that compresses (written deflated) and data that does not (written as it is)."""
    app = tmp_path / "firmware.bin"
    app.write_bytes(bytes(range(256)) * 300)
    data = tmp_path / "data.bin"
    data.write_bytes(random.Random(5).randbytes(40000))
    return [(0x2000, app), (0x100000, data)]


@pytest.fixture
def ctrl_c():
    """Ctrl-C as a terminal delivers it: Python's KeyboardInterrupt handler installed and SIGINT not
    blocked in this thread, whatever an earlier test in this worker process left behind (the two
    Ctrl-C tests once saw no KeyboardInterrupt in a full run, and pass alone)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def chips():
    """chips(**knobs, ...) -> started FakeChips, closed after the test."""
    made: list[FakeChip] = []

    def make(*knobs: dict) -> list[FakeChip]:
        for i, k in enumerate(knobs):
            made.append(FakeChip(mac=MACS[len(made) % len(MACS)], **k).__enter__())
        return made[-len(knobs) :]

    yield make
    for chip in made:
        chip.close()


def holds(chip: FakeChip, images) -> bool:
    return all(bytes(chip.flash[o : o + p.stat().st_size]) == p.read_bytes() for o, p in images)


def flash(board, chips, images, lines=None, **kw):
    kw.setdefault("before", "no-reset")  # a pseudo-terminal has no DTR/RTS to reset the chip with
    kw.setdefault("reset", False)
    said = [] if lines is None else lines
    return flash_many(board, [c.port for c in chips], images, "f" * 64, baud=460800, progress=said.append, **kw)


@pytest.mark.slow
def test_boards_are_flashed_in_parallel_and_a_cut_one_does_not_touch_the_others(board, chips, images):
    good1, cut, good2 = chips({}, {"cut_after": 20000}, {})
    lines: list[str] = []
    report = flash(board, [good1, cut, good2], images, lines)
    by_port = {b.port: b for b in report.boards}
    for chip in (good1, good2):
        outcome = by_port[chip.port]
        assert outcome.result == PASS and outcome.stage == "done" and outcome.selftest == "skipped"
        assert (outcome.chip, outcome.revision, outcome.mac) == ("ESP32-P4", "v3.1", chip.mac.hex(":"))
        assert holds(chip, images)
    bad = by_port[cut.port]
    assert bad.result == FAIL and bad.stage == "flash" and bad.mac == cut.mac.hex(":")
    assert "firmware.bin at 0x2000" in bad.failed and "partly written, run flash again" in bad.failed
    assert "\n" not in bad.failed and not holds(cut, images) and cut.written == 20000
    assert not report.passed
    # Every line says its port; each board's own lines arrive in its order.
    assert all(line.split(": ", 1)[0] in by_port for line in lines)
    mine = [line for line in lines if line.startswith(good1.port + ": ")]
    steps = ["connecting", "found", "[1/2]", "[1/2]", "[2/2]", "[2/2]", "PASS"]  # [i/n]: writing, verified
    assert [m.split(": ", 1)[1].split(" ")[0] for m in mine] == steps


def test_a_flash_that_reads_back_wrong_and_another_chip_are_their_boards_lines(board, chips, images):
    good, corrupt, s3 = chips({}, {"corrupt_at": 0x100000 + 123}, {"chip_id": 9})
    report = flash(board, [good, corrupt, s3], images)
    outcome = {b.port: b for b in report.boards}
    assert outcome[good.port].result == PASS and holds(good, images)
    assert outcome[corrupt.port].result == FAIL and "MD5" in outcome[corrupt.port].failed
    assert "; data.bin at 0x100000, image 2 of 2 reads back different from its file: run flash again" in (
        outcome[corrupt.port].failed
    )
    assert outcome[s3.port].failed == f"found ESP32-S3 on {s3.port}; board esp32p4 needs an ESP32-P4"
    assert outcome[s3.port].chip == "ESP32-S3"  # the odd board out, named in its row
    assert s3.flash == bytearray(b"\xff" * len(s3.flash))  # refused before anything was written


def test_the_report_as_json_and_as_a_table(board, chips, images):
    good, corrupt = chips({}, {"corrupt_at": 0x2000})
    report = flash(board, [good, corrupt], images)
    data = json.loads(json.dumps(report.to_json()))
    assert (data["board"], data["passed"], data["failed"], data["interrupted"]) == ("esp32p4", 1, 1, False)
    assert data["images"] == [{"offset": o, "file": str(p)} for o, p in images]
    rows = {row["port"]: row for row in data["boards"]}
    assert rows[good.port] | {"seconds": 0} == {
        "port": good.port,
        "result": "PASS",
        "chip": "ESP32-P4",
        "revision": "v3.1",
        "mac": good.mac.hex(":"),
        "seconds": 0,
        "stage": "done",
        "failed": None,
        "selftest": "skipped",
    }
    assert rows[corrupt.port]["result"] == "FAIL" and "MD5" in rows[corrupt.port]["failed"]
    table = format_table(report).splitlines()
    assert table[0].split() == ["port", "chip", "MAC", "result", "seconds", "what", "failed"]
    assert table[1].split()[:5] == [good.port, "ESP32-P4", "v3.1", good.mac.hex(":"), "PASS"]
    assert table[2].split()[4] == "FAIL" and "MD5" in table[2]
    assert table[-1].startswith("1 of 2 boards passed in ")


def test_ports_are_checked_before_anything_is_flashed(board, images):
    with pytest.raises(ColibriError, match="port /dev/pts/77 is given twice"):
        flash_many(board, ["/dev/pts/77", "/dev/pts/77"], images, "", baud=460800)
    with pytest.raises(ColibriError, match="--all-ports"):
        flash_many(board, [], images, "", baud=460800)


def test_all_ports_takes_every_port_that_looks_like_an_esp32_boards(monkeypatch):
    def port(device, vid=None, pid=None):
        return Port(device, "", vid, pid, None, esp_bridge(vid, pid))

    found = [port("/dev/ttyACM0", 0x303A, 0x1001), port("/dev/ttyS0"), port("/dev/ttyUSB1", 0x10C4, 0xEA60)]
    monkeypatch.setattr(ports, "list_ports", lambda: found)
    assert fleet_ports([], all_ports=True) == ["/dev/ttyACM0", "/dev/ttyUSB1"]
    assert fleet_ports(["/dev/ttyS0"], all_ports=False) == ["/dev/ttyS0"]
    with pytest.raises(ColibriError, match="--port or take them all with --all-ports, not both"):
        fleet_ports(["/dev/ttyACM0"], all_ports=True)
    found[:] = [port("/dev/ttyS0")]
    with pytest.raises(ColibriError, match=r"no serial port that looks like an ESP32 board \(found only /dev/ttyS0\)"):
        fleet_ports([], all_ports=True)


def test_a_port_that_does_not_exist_fails_alone(board, chips, images):
    (good,) = chips({})
    ports = [good.port, "/dev/ttyCOLIBRI_NONE"]
    report = flash_many(board, ports, images, "", baud=460800, before="no-reset", reset=False, progress=print)
    assert [b.result for b in report.boards] == [PASS, FAIL]
    assert report.boards[1].failed.startswith("cannot open serial port /dev/ttyCOLIBRI_NONE")


def test_ctrl_c_reports_what_finished_and_the_rest_as_interrupted(board, chips, images, ctrl_c):
    """A silent board keeps esptool trying to connect for seconds; Ctrl-C meanwhile stops the wait."""
    good, silent = chips({}, {"silent": True})
    lines: list[str] = []
    passed = threading.Event()

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith(good.port) and "PASS" in line:
            passed.set()

    def interrupt() -> None:
        if passed.wait(20):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    report = flash_many(
        board, [good.port, silent.port], images, "", baud=460800, before="no-reset", reset=False, progress=say
    )
    assert report.interrupted and not report.passed
    assert [b.result for b in report.boards] == [PASS, INTERRUPTED]
    assert report.boards[1].failed == "interrupted during flash: its flash may be partly written, run flash again"
    assert "(interrupted)" in format_table(report).splitlines()[-1]


@pytest.mark.slow
def test_a_silent_board_is_reported_and_the_others_pass(board, chips, images):
    good, silent = chips({}, {"silent": True})
    report = flash(board, [good, silent], images)
    assert [b.result for b in report.boards] == [PASS, FAIL]
    assert "No serial data received" in report.boards[1].failed and report.boards[1].mac == ""


# ---- The self-test on every board: qemu-rv32 instances booted from each fake board's flash ----


@pytest.mark.slow
def test_each_board_runs_its_self_test_and_a_damaged_one_says_fail(board, builder, chips, tmp_path):
    """Each fake board gets the qemu-rv32 firmware's flash image written and verified; its
    self-test then runs on a qemu-rv32 started from the bytes that board holds. One board's
    flash loses a bit after the write (as decaying flash would): its firmware refuses the image."""
    qemu, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    image = art.flash_image or art.weights
    size = image.stat().st_size
    boards = chips({}, {}, {})
    damaged = boards[1]
    offset = 0x10000

    def selftest_on(port: str):
        chip = next(c for c in boards if c.port == port)
        held = bytearray(chip.flash[offset : offset + size])
        if chip is damaged:
            held[size // 2] ^= 0x10
        booted = tmp_path / f"{Path(port).name}.img"
        booted.write_bytes(bytes(held))
        result = run_on_board(
            qemu, art.program, art.weights, RunRequest([], 0, selftest=True), art.model_hash(), flash_image=booted
        )
        assert result.selftest is not None
        return result.selftest

    report = flash(board, boards, [(offset, image)], selftest=selftest_on)
    results = {b.port: b for b in report.boards}
    for chip in boards:
        outcome = results[chip.port]
        assert holds(chip, [(offset, image)])  # every write verified, the damaged board's too
        if chip is damaged:
            assert outcome.result == FAIL and outcome.stage == "selftest"
            assert outcome.selftest.startswith("self-test FAIL: weight image refused")
            assert "CRC-32" in outcome.failed
        else:
            assert outcome.result == PASS and outcome.selftest.startswith("self-test PASS")


@pytest.mark.slow
def test_flash_several_ports_from_the_command_line_and_the_api(chips, tmp_path, capsys, monkeypatch, ctrl_c):
    """./colibri flash --board esp32p4 --port P1 --port P2: the build's firmware.bin on each board,
    the table on stdout, the JSON report where --report says; --json prints the JSON instead."""
    good, bad = chips({}, {"cut_after": 4096})
    out, report = tmp_path / "build", tmp_path / "flash-report.json"
    argv = ["flash", "--board", "esp32p4", "--out", str(out), "--before", "no-reset", "--no-reset", "--no-selftest"]
    argv += ["--port", good.port, "--port", bad.port]
    assert cli.main([*argv, "--report", str(report)]) == 1
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[1].split()[:5] == [good.port, "ESP32-P4", "v3.1", good.mac.hex(":"), "PASS"]
    assert table[2].split()[4] == "FAIL" and table[-1].startswith("1 of 2 boards passed")
    assert "colibri: error: 1 of 2 boards failed" in captured.err
    written = json.loads(report.read_text())
    assert [b["result"] for b in written["boards"]] == ["PASS", "FAIL"]
    firmware = (out / "firmware.bin").read_bytes()
    assert bytes(good.flash[0x2000 : 0x2000 + len(firmware)]) == firmware

    again = chips({}, {})  # the same build on two more boards, the JSON on stdout
    argv = argv[:-4] + ["--port", again[0].port, "--port", again[1].port]
    assert cli.main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["passed"] == 2 and json.loads((out / "flash-report.json").read_text()) == printed

    # Ctrl-C while a silent board is still being connected to: the report of what finished, exit 130.
    good, silent = chips({}, {"silent": True})
    argv = argv[:-4] + ["--port", good.port, "--port", silent.port]

    def interrupt_once_the_good_board_is_verified() -> None:
        for _ in range(400):
            if good.commands.count(0x13) >= 2:  # write_flash's MD5 check and verify_flash's
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_once_the_good_board_is_verified, daemon=True).start()
    assert cli.main([*argv, "--report", str(report)]) == 130
    captured = capsys.readouterr()
    assert "colibri: interrupted" in captured.err and "(interrupted)" in captured.out.splitlines()[-1]
    rows = json.loads(report.read_text())["boards"]
    assert [r["result"] for r in rows] == ["PASS", "interrupted"]

    # The API under the command: the self-test step after each board's flash (here a verdict per
    # port instead of a reset over RTS, which a pseudo-terminal cannot do), the report beside the build.
    ok, failing = chips({}, {})
    verdicts = {
        ok.port: Selftest(True, {"kernels_checked": "9", "kernels": "rv32", "steps": "3"}),
        failing.port: Selftest(False, {"image": "CRC-32 of tensor 3 differs", "kernels_checked": "9", "steps": "3"}),
    }
    flashed = flash_job.flash_fleet(
        job.JobOptions(board="esp32p4", out=out, quiet=True),
        [ok.port, failing.port],
        before="no-reset",
        selftest_on=verdicts.__getitem__,
    )
    assert flashed.path == out / "flash-report.json"
    rows = json.loads(flashed.path.read_text())["boards"]
    assert [(r["result"], r["stage"]) for r in rows] == [("PASS", "done"), ("FAIL", "selftest")]
    assert rows[0]["selftest"].startswith("self-test PASS: 9 kernel checks (rv32)")
    assert rows[1]["failed"].startswith("self-test FAIL: weight image refused: CRC-32 of tensor 3 differs")
    with pytest.raises(ColibriError, match="--no-reset leaves the boards in their bootloader"):
        flash_job.flash_fleet(job.JobOptions(board="esp32p4", out=out), [ok.port, failing.port], no_reset=True)


def test_several_boards_take_app_only_where_the_model_has_its_own_partition(chips, tmp_path):
    ok, other = chips({}, {})
    with pytest.raises(ColibriError, match="board esp32p4 has no weights partition.*--app-only needs a board"):
        flash_job.flash_fleet(job.JobOptions(board="esp32p4", out=tmp_path / "b"), [ok.port, other.port], only="app")
    assert not (tmp_path / "b").exists()  # refused before anything was built
