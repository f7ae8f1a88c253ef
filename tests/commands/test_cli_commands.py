"""What PlatformIO, idf.py and llama.cpp users reach for: clean, boards, devices (and the port
found when exactly one looks like an ESP32 board's), flash --monitor, --version, and `test` in
--help."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from conftest import DEFAULT_MODEL, REPO, run_cli

from generator import cli
from generator.boards import load_board
from generator.commands import suite
from generator.compile import build
from generator.device import ports
from generator.device.ports import Port, detect_port, esp_bridge

P4_PORT = Port("/dev/ttyACM0", "USB JTAG/serial debug unit", 0x303A, 0x1001, "60:55:F9", esp_bridge(0x303A, 0x1001))
CP2102 = Port(
    "/dev/ttyUSB0", "CP2102N USB to UART Bridge Controller", 0x10C4, 0xEA60, "0001", esp_bridge(0x10C4, 0xEA60)
)
PLAIN = Port("/dev/ttyS0", "")


def test_help_lists_every_command_the_readme_opens_with_and_the_new_ones():
    done = run_cli("--help")
    assert done.returncode == 0
    for name in (
        "build",
        "run",
        "verify",
        "report",
        "bench",
        "flash",
        "monitor",
        "release",
        "verify-release",
        "clean",
        "boards",
        "devices",
        "test",
    ):
        assert re.search(rf"^\s+{re.escape(name)}\s", done.stdout, re.M), name


def test_a_commands_options_before_it_are_its_own_and_alone_are_one_line(capsys):
    args = cli.parse_args(["--board", "qemu-rv32", "--steps", "3", "run", "--prompt", "And God"])
    assert (args.command, args.board, args.steps, args.prompt) == ("run", "qemu-rv32", 3, "And God")
    assert cli.main(["--board", "qemu-rv32"]) == 2
    assert capsys.readouterr().err.startswith("colibri: error: --board is an option of a command: give the command")


def test_version_names_the_commit_and_the_toolchains():
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.match(r"colibri \d+\.\d+\.\d+ \(git ([0-9a-f]{40}|not a git checkout)", lines[0]), lines[0]
    assert "toolchains:" in lines
    assert any(line.split()[0] == "gcc" and "[host]" in line for line in lines if line.startswith("  "))
    assert any("qemu-system-riscv32" in line and "[qemu-rv32]" in line for line in lines)


def test_boards_lists_what_each_is_how_it_runs_here_and_its_memory():
    done = run_cli("boards")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert set(lines) == {
        "esp32p4",
        "esp32p4-idf",
        "host",
        "host-mpi",
        "linux-aarch64",
        "linux-aarch64-mpi",
        "qemu-rv32",
    }
    assert "runs natively, as a process" in lines["host"] and "ram no fixed budget" in lines["host"]
    assert "on the real board, over its serial port" in lines["esp32p4"] and "l2mem 384 KiB" in lines["esp32p4"]
    assert "under qemu-system-riscv32" in lines["qemu-rv32"] and "flash 16 MiB" in lines["qemu-rv32"]
    assert "runs as MPI ranks started by mpirun" in lines["host-mpi"]
    assert "runs as MPI ranks started by mpirun" in lines["linux-aarch64-mpi"]
    boards = json.loads(run_cli("boards", "--json").stdout)
    assert {b["name"]: b["default_ctx"] for b in boards}["esp32p4"] == 128


def test_devices_lists_ports_and_marks_the_esp_ones(monkeypatch, capsys):
    monkeypatch.setattr(ports, "list_ports", lambda: [P4_PORT, PLAIN])
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("/dev/ttyACM0  303a:1001  USB JTAG/serial debug unit  (looks like an ESP32 board")
    assert out[1] == "/dev/ttyS0"
    assert cli.main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["usb_id"] == "303a:1001" and listed[1]["esp_bridge"] is None
    monkeypatch.setattr(ports, "list_ports", lambda: [])
    assert cli.main(["devices"]) == 0
    assert capsys.readouterr().out.startswith("no serial ports found")


def test_list_ports_reads_pyserial_and_puts_usb_ports_first(monkeypatch):
    from serial.tools import list_ports

    infos = [
        SimpleNamespace(device="/dev/ttyS0", description="n/a", vid=None, pid=None, serial_number=None),
        SimpleNamespace(device="/dev/ttyUSB0", description="CP2102N", vid=0x10C4, pid=0xEA60, serial_number="0001"),
    ]
    monkeypatch.setattr(list_ports, "comports", lambda: infos)
    found = ports.list_ports()
    assert [p.device for p in found] == ["/dev/ttyUSB0", "/dev/ttyS0"]
    assert found[0].esp_bridge == "Silicon Labs CP210x USB-UART" and found[1].description == ""


def test_the_port_is_found_when_exactly_one_looks_like_an_esp32_board():
    assert detect_port("board esp32p4", [PLAIN, P4_PORT]) == P4_PORT
    with pytest.raises(
        Exception,
        match=r"2 look like ESP32 boards \(/dev/ttyACM0, /dev/ttyUSB0\): choose one "
        r"with --port",
    ):
        detect_port("board esp32p4", [P4_PORT, CP2102])
    with pytest.raises(Exception, match=r"none looks like an ESP32 board \(found only /dev/ttyS0\)"):
        detect_port("monitor", [PLAIN])


@pytest.fixture
def flashed(monkeypatch):
    """flash's esptool and monitor steps recorded instead of run (the build is real)."""
    from generator.device import flash, monitor

    calls = []
    monkeypatch.setattr(flash, "flash_images", lambda board, port, images, **kw: calls.append(("flash", port, kw)))
    monkeypatch.setattr(monitor, "monitor", lambda port, baud, **kw: calls.append(("monitor", port, baud, kw)) or 0)
    monkeypatch.setattr(ports, "list_ports", lambda: [PLAIN, P4_PORT])
    return calls


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_flash_then_monitor_in_one_command_on_the_detected_port(flashed, tmp_path, capsys):
    assert cli.main(["flash", "--board", "esp32p4", "--monitor", "--out", str(tmp_path / "p4")]) == 0
    (kind, port, flash_kw), (kind2, port2, baud, monitor_kw) = flashed
    assert (kind, kind2) == ("flash", "monitor") and port == port2 == "/dev/ttyACM0"
    # The board stays in its bootloader until the monitor, listening, resets it: the hello is not lost.
    assert flash_kw["reset"] is False and monitor_kw["reset"] is True and baud == 115200
    assert monitor_kw["tokenizer"] is not None and len(monitor_kw["expected_model"]) == 64
    assert "using serial port /dev/ttyACM0" in capsys.readouterr().err


def test_flash_refuses_monitor_with_no_reset(flashed, tmp_path):
    assert cli.main(["flash", "--board", "esp32p4", "--monitor", "--no-reset", "--out", str(tmp_path / "p4")]) == 2
    assert flashed == [] and not (tmp_path / "p4").exists()


def test_clean_removes_all_builds_or_one_boards_or_one_models(monkeypatch, tmp_path, capsys):
    root = tmp_path / "build"
    for rel in (
        "host/kjv-tiny-q8_0-ctx256",
        "host/kjv-tiny-q4_0-ctx64",
        "host/other-q8_0-ctx64",
        "qemu-rv32/kjv-tiny-q8_0-ctx256",
        "esp32p4/kjv-q8_0-ctx128",
    ):
        (root / rel / "generated").mkdir(parents=True)
        (root / rel / "generated" / "weights.img").write_bytes(b"w" * 1000)
    (root / "compile_commands.json").symlink_to("qemu-rv32/kjv-tiny-q8_0-ctx256/compile_commands.json")
    monkeypatch.setattr(build, "BUILD_ROOT", root)

    assert cli.main(["clean", "--board", "host", "--model", str(DEFAULT_MODEL)]) == 0
    assert "removed build/host/kjv-tiny-q4_0-ctx64, build/host/kjv-tiny-q8_0-ctx256" in capsys.readouterr().out
    assert sorted(p.name for p in (root / "host").iterdir()) == ["other-q8_0-ctx64"]
    assert cli.main(["clean", "--model", str(DEFAULT_MODEL)]) == 0  # "kjv" is another model: kept
    capsys.readouterr()
    assert not (root / "qemu-rv32").exists() and (root / "esp32p4" / "kjv-q8_0-ctx128").is_dir()
    assert not (root / "compile_commands.json").is_symlink()  # it pointed into a removed build
    assert cli.main(["clean", "--json"]) == 0
    cleaned = json.loads(capsys.readouterr().out)
    assert cleaned["removed"] == ["build/esp32p4", "build/host"] and cleaned["bytes"] == 2000
    assert root.is_dir() and not any(root.iterdir())
    assert cli.main(["clean"]) == 0
    assert "nothing to clean" in capsys.readouterr().out


def test_a_gguf_files_build_directory_names_its_model_once(monkeypatch, tmp_path, capsys):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = build.default_out_dir(load_board("host"), gguf, "gguf", 512)
    assert out == build.BUILD_ROOT / "host" / "SmolLM2-135M-Instruct.Q4_1-gguf-ctx512"
    root = tmp_path / "build"
    (root / "host" / "SmolLM2-135M-Instruct.Q4_1-gguf-ctx512").mkdir(parents=True)
    monkeypatch.setattr(build, "BUILD_ROOT", root)
    assert build.build_dirs("host", gguf) == [root / "host" / "SmolLM2-135M-Instruct.Q4_1-gguf-ctx512"]


def test_clean_never_reaches_outside_build(tmp_path):
    with pytest.raises(Exception, match="not a build directory"):
        build.remove_builds([tmp_path], root=tmp_path / "build")
    assert tmp_path.is_dir()
    assert REPO.is_dir()


@pytest.mark.parametrize(
    ("board", "words"),
    [("", "--board is empty"), ("hots", "did you mean host?"), ("../host", "unknown board"), (".", "unknown board")],
)
def test_clean_refuses_an_empty_or_unknown_board_and_removes_nothing(monkeypatch, tmp_path, capsys, board, words):
    root = tmp_path / "build"
    for rel in ("host/kjv-tiny-q8_0-ctx256", "mine/kjv-tiny-q8_0-ctx64"):
        (root / rel).mkdir(parents=True)
    monkeypatch.setattr(build, "BUILD_ROOT", root)
    assert cli.main(["clean", "--board", board]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert (
        len(lines) == 1
        and words in lines[0]
        and "esp32p4, esp32p4-idf, host, host-mpi, linux-aarch64, linux-aarch64-mpi, mine" in lines[0]
    )
    assert (root / "host" / "kjv-tiny-q8_0-ctx256").is_dir() and (root / "mine" / "kjv-tiny-q8_0-ctx64").is_dir()
    # a board of one's own (a board file elsewhere) is known by its builds
    assert cli.main(["clean", "--board", "mine"]) == 0 and not (root / "mine").exists()


def test_everything_after_test_goes_to_pytest():
    args = cli.parse_args(["test", "-k", "boards", "-x"])
    assert args.func is suite.run and args.pytest_args == ["-k", "boards", "-x"]
