"""`verify` passes only the firmware this build produced: board, build id, weight image, context
and quantization from the hello frame, not the model hash alone. Checked against real qemu-rv32
firmware behind a pseudo-terminal (another board's firmware on "the ESP32-P4's port") and against a
fake board on a pty whose hello names another build."""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
import tty

import pytest
from cli_runs import cli_options
from conftest import DEFAULT_MODEL, run_cli
from test_serial_link import FAST, HELLO_FIELDS, MODEL, REQUEST, PtyBoard, answer

from generator.compile.firmware_id import elf_build_id
from generator.device.links import start_emulator
from generator.device.protocol import encode_frame
from generator.device.serial_link import SerialLink
from generator.device.session import Session
from generator.verify import FirmwareIdentity, FirmwareMismatch, hello_check, identity_differences

pytestmark = pytest.mark.slow  # builds firmware whose identity is checked


class QemuOnPty:
    """qemu-rv32 firmware as a board on a serial port: qemu's UART is a TCP socket, bridged to a
    pseudo-terminal whose path a command opens. qemu boots the firmware when the bridge connects,
    which it does once the command has opened the pty, as a board reset by opening its port."""

    def __init__(self, board, art):
        self.proc, port = start_emulator(board.runner, art.program, art.flash_image)
        self.master, slave = os.openpty()
        tty.setraw(slave)
        self.path = os.ttyname(slave)
        os.close(slave)  # the command under test is the only one to open it
        self.tcp_port = port
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._bridge, daemon=True)
        self.thread.start()

    def _wait_for_opener(self) -> bool:
        poller = select.poll()
        poller.register(self.master, select.POLLIN | select.POLLHUP)
        while not self.stop.is_set():
            events = poller.poll(50)
            if not any(ev & select.POLLHUP for _, ev in events):
                return True  # the slave side is open
        return False

    def _bridge(self) -> None:
        if not self._wait_for_opener():
            return
        time.sleep(0.3)  # let the opener flush its input buffer (pyserial does on open)
        deadline = time.monotonic() + 10
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", self.tcp_port), timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or self.stop.is_set():
                    return
                time.sleep(0.05)
        sock.setblocking(False)
        with sock:
            while not self.stop.is_set():
                ready, _, _ = select.select([sock, self.master], [], [], 0.05)
                try:
                    if sock in ready:
                        data = sock.recv(4096)
                        if not data:
                            return
                        os.write(self.master, data)
                    if self.master in ready:
                        sock.sendall(os.read(self.master, 4096))
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


@pytest.fixture
def rv32_on_pty(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, board="qemu-rv32")
    bridge = QemuOnPty(board, art)
    yield bridge, art
    bridge.close()


def test_verify_refuses_another_boards_firmware_on_the_port_and_says_what_differs(rv32_on_pty, tmp_path):
    bridge, rv32 = rv32_on_pty
    options = cli_options(board="esp32p4", port=bridge.path, prompt="And God", steps=8, out=tmp_path / "p4")
    done = run_cli("verify", *options, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("FAIL: ") and "PASS" not in done.stdout, done.stdout
    assert "not this build" in verdict
    assert "board qemu-rv32 (this build: esp32p4)" in verdict
    assert "context 64 (this build: 128)" in verdict
    assert f"build id {elf_build_id(rv32.program)[:16]}…" in verdict
    assert "model hash" not in verdict  # the same model: that is why the hash alone was not enough
    assert "Traceback" not in done.stderr


def test_verify_json_names_the_differences(rv32_on_pty, tmp_path):
    bridge, _ = rv32_on_pty
    options = cli_options(
        board="esp32p4", port=bridge.path, prompt_ids="1,2,3", steps=4, out=tmp_path / "p4", json=True
    )
    done = run_cli("verify", *options, timeout=120)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["pass"] is False
    differences = result["firmware_identity"]["differences"]
    assert any(d.startswith("board qemu-rv32") for d in differences)
    assert result["firmware_identity"]["hello"]["board"] == "qemu-rv32"


IDENTITY = FirmwareIdentity("fake-p4", "q8_0", "64", MODEL, "ee" * 32, "aa" * 20)


def hello_with(**fields) -> bytes:
    return encode_frame(
        0, "hello", {**HELLO_FIELDS, "model": MODEL, "weights": "ee" * 32, "build": "aa" * 20, **fields}
    )


@pytest.fixture
def board():
    b = PtyBoard()
    yield b
    b.close()


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("build", "bb" * 20, "build id bbbbbbbbbbbbbbbb… (this build: aaaaaaaaaaaaaaaa…)"),
        ("weights", "ff" * 32, "weight image SHA-256 ffffffffffffffff…"),
        ("ctx", 128, "context 128 (this build: 64)"),
        ("quant", "q4_0", "quantization q4_0 (this build: q8_0)"),
        ("board", "qemu-rv32", "board qemu-rv32 (this build: fake-p4)"),
    ],
)
def test_the_link_refuses_another_build_before_sending_the_request(board, field, value, words):
    def script(b):
        b.write(hello_with(**{field: value}))
        b.read_request(timeout=1.0)

    link = SerialLink.open(board.path)
    board.start(script)
    try:
        with pytest.raises(FirmwareMismatch) as e:
            link.run(REQUEST, Session(MODEL, check_hello=hello_check(IDENTITY)), FAST)
    finally:
        link.close()
    assert words in str(e.value) and str(e.value).startswith(board.path)
    board.stop.wait(0.2)
    assert board.request is None  # nothing was decoded for the wrong firmware


def test_the_same_build_passes_the_check(board):
    def script(b):
        b.write(hello_with())
        b.read_request()
        for frame in answer(REQUEST.steps):
            b.write(frame)

    link = SerialLink.open(board.path)
    board.start(script)
    try:
        result = link.run(REQUEST, Session(MODEL, check_hello=hello_check(IDENTITY)), FAST)
    finally:
        link.close()
    assert len(result.tokens) == REQUEST.steps


def test_a_hello_without_a_build_id_is_not_this_build():
    hello = {"board": "fake-p4", "quant": "q8_0", "ctx": "64", "model": MODEL, "weights": "ee" * 32}
    assert identity_differences(hello, IDENTITY) == ["no build id reported (this build: aaaaaaaaaaaaaaaa…)"]
    assert identity_differences({**hello, "build": "AA" * 20}, IDENTITY) == []
