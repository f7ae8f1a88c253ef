"""The UART of a firmware a test starts itself under qemu-system (links.start_emulator), for tests
that talk to it byte by byte: its TCP socket, opened with pyserial as soon as the emulator accepts."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import serial

from generator.device.links import start_emulator


def open_uart(port: int, seconds: float = 30) -> serial.SerialBase:
    """The emulator's UART on 127.0.0.1:port (read timeout 0.1 s), tried until it accepts or seconds pass."""
    link = serial.serial_for_url(f"socket://127.0.0.1:{port}", timeout=0.1, do_not_open=True)
    deadline = time.monotonic() + seconds
    while True:
        try:
            link.open()
            return link
        except serial.SerialException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def emulated_uart(board, art) -> Iterator[serial.SerialBase]:
    """art's firmware started under the board's emulator, and its UART open; both closed after."""
    qemu, port = start_emulator(board.runner, art.program, art.flash_image, stderr=subprocess.PIPE)
    try:
        link = open_uart(port)
        try:
            yield link
        finally:
            link.close()
    finally:
        qemu.kill()
        qemu.wait()
        qemu.stderr.close()
