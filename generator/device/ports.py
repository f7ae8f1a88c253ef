"""Serial ports as a user meets them: the ports this machine has (`./colibri devices`), the one to
use when a command needs a board's port and none was given (the only one that looks like an ESP32
board), and one wording for a port that cannot be opened, whichever command opens it.
"""

from __future__ import annotations

import errno as errno_codes
import os
from dataclasses import asdict, dataclass

from ..errors import ColibriError

# USB bridges found on ESP32 boards, by USB vendor (and product) id. Espressif's own vendor id
# covers the chips' built-in USB-Serial/JTAG (ESP32-P4, -S3, -C3, -C6, -H2).
ESP_BRIDGES = {
    (0x303A, None): "Espressif USB (built-in USB-Serial/JTAG)",
    (0x10C4, 0xEA60): "Silicon Labs CP210x USB-UART",
    (0x1A86, 0x7523): "WCH CH340 USB-UART",
    (0x1A86, 0x55D4): "WCH CH9102 USB-UART",
    (0x1A86, 0x55D3): "WCH CH343 USB-UART",
    (0x0403, 0x6001): "FTDI FT232R USB-UART",
    (0x0403, 0x6010): "FTDI FT2232 (ESP-Prog)",
    (0x0403, 0x6014): "FTDI FT232H USB-UART",
    (0x0403, 0x6015): "FTDI FT-X USB-UART",
}


@dataclass(frozen=True)
class Port:
    device: str
    description: str
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    esp_bridge: str | None = None  # why it looks like an ESP32 board's port, or None

    def usb_id(self) -> str:
        return f"{self.vid:04x}:{self.pid:04x}" if self.vid is not None and self.pid is not None else ""

    def to_dict(self) -> dict:
        return {**asdict(self), "usb_id": self.usb_id() or None}


def esp_bridge(vid: int | None, pid: int | None) -> str | None:
    if vid is None:
        return None
    return ESP_BRIDGES.get((vid, pid)) or ESP_BRIDGES.get((vid, None))


def list_ports() -> list[Port]:
    """The serial ports pyserial finds (USB ones first), each marked when it looks like an ESP32
    board's."""
    from serial.tools import list_ports

    found = []
    for info in list_ports.comports():
        description = info.description if info.description and info.description != "n/a" else ""
        found.append(
            Port(info.device, description, info.vid, info.pid, info.serial_number, esp_bridge(info.vid, info.pid))
        )
    return sorted(found, key=lambda p: (p.vid is None, p.device))


def describe(port: Port) -> str:
    parts = [port.device]
    if port.usb_id():
        parts.append(port.usb_id())
    if port.description:
        parts.append(port.description)
    if port.esp_bridge:
        parts.append(f"(looks like an ESP32 board: {port.esp_bridge})")
    return "  ".join(parts)


def detect_port(who: str, ports: list[Port] | None = None) -> Port:
    """The port to use when none was given (`who` needs it: "board esp32p4", "monitor"): the only
    one that looks like an ESP32 board's. Several, or none, is an error that lists what there is."""
    ports = list_ports() if ports is None else ports
    likely = [p for p in ports if p.esp_bridge]
    if len(likely) == 1:
        return likely[0]
    if likely:
        raise ColibriError(
            f"{who} needs a serial port and {len(likely)} look like ESP32 boards "
            f"({', '.join(p.device for p in likely)}): choose one with --port"
        )
    others = f" (found only {', '.join(p.device for p in ports)})" if ports else " (no serial ports found)"
    raise ColibriError(
        f"{who} needs a serial port and none looks like an ESP32 board{others}: connect the "
        f"board, or give its port with --port (./colibri devices lists them)"
    )


def open_error(port: str, e: BaseException) -> ColibriError:
    """Why `port` could not be opened, and what to do, in one line: the same words whether `run`,
    `verify`, `monitor` or `flash` opened it."""
    code = getattr(e, "errno", None)
    if isinstance(code, int) and code > 0:
        reason = os.strerror(code)
    else:
        reason = " ".join(str(e).split()) or type(e).__name__
    lowered = reason.lower() + " " + str(e).lower()
    if code == errno_codes.ENOENT or "no such file" in lowered:
        hint = "is the board plugged in? ./colibri devices lists the serial ports"
    elif code in (errno_codes.EACCES, errno_codes.EPERM):
        hint = "add yourself to the dialout group: sudo usermod -aG dialout $USER, then log in again"
    elif code in (errno_codes.EAGAIN, errno_codes.EBUSY) or "lock" in lowered:
        hint = "is another program, e.g. a serial monitor, using it?"
    else:
        hint = "is the board connected, and is the port free?"
    return ColibriError(f"cannot open serial port {port}: {reason} ({hint})")
