"""A fake ESP32-P4 in download mode on a pseudo-terminal, far enough for the real esptool (the one
pinned in the venv) to sync, detect the chip, read its revision and MAC from the eFuses, upload
and start its flasher stub, change the baud rate, attach the flash, write compressed images and
check them with the stub's MD5 command.

    chip = FakeChip(mac=bytes.fromhex("60550f000001"))
    with chip:
        esptool.cmds.detect_chip(chip.port, connect_mode="no-reset")  # ...
    chip.flash[0x2000:...]  # what was written

There are no DTR/RTS lines on a pseudo-terminal: esptool connects with --before no-reset and the
board is left in its loader afterwards. Knobs that make one board fail the way real ones do:
`silent` (it never answers), `cut_after` (nothing comes back once that many bytes of flash data
were written, as with a pulled cable), `corrupt_at` (the byte written at that flash address comes out with one bit
flipped: the MD5 differs) and `chip_id` (another chip, e.g. 9 for an ESP32-S3).
"""

from __future__ import annotations

import hashlib
import os
import select
import struct
import threading
import tty
import zlib
from collections.abc import Iterator

ESP32P4_ID = 18
EFUSE_BASE = 0x5012D000
MAC_REG = EFUSE_BASE + 0x044  # EFUSE_BLOCK1: MAC (two words), then the chip revision in word 2
REVISION_REG = MAC_REG + 8
SPI_BASE = 0x5008D000  # SPIMEM1, the flash's SPI controller
SPI_CMD_REG, SPI_USR2_REG, SPI_W0_REG = SPI_BASE, SPI_BASE + 0x20, SPI_BASE + 0x58
SPI_CMD_USR = 1 << 18  # start the user command set up in USR2 (its opcode in the low byte)
# What the flash answers to the SPI commands esptool sends: its JEDEC id (RDID), the SFDP
# signature; anything else (the status register) reads 0.
SPI_ANSWERS = {0x9F: 0x1840EF, 0x5A: 0x50444653}  # a 16 MB Winbond part

SYNC, READ_REG, WRITE_REG, SECURITY_INFO = 0x08, 0x0A, 0x09, 0x14
MEM_BEGIN, MEM_END, MEM_DATA = 0x05, 0x06, 0x07
FLASH_BEGIN, FLASH_DATA, FLASH_END = 0x02, 0x03, 0x04
DEFL_BEGIN, DEFL_DATA, DEFL_END = 0x10, 0x11, 0x12
SPI_SET_PARAMS, SPI_ATTACH, CHANGE_BAUD, FLASH_MD5 = 0x0B, 0x0D, 0x0F, 0x13


def revision_word(revision: int) -> int:
    """eFuse BLOCK1 word 2 for a revision MAJOR * 100 + MINOR (esptool's ESP32P4ROM reads it back)."""
    major, minor = divmod(revision, 100)
    return ((major >> 2) & 1) << 23 | (major & 3) << 4 | (minor & 0xF)


def slip(packet: bytes) -> bytes:
    return b"\xc0" + packet.replace(b"\xdb", b"\xdb\xdd").replace(b"\xc0", b"\xdb\xdc") + b"\xc0"


def pty_reads(master: int, stop: threading.Event, size: int = 65536) -> Iterator[bytes]:
    """What arrives on the pseudo-terminal `master`, chunk by chunk, until `stop` is set or the
    other side closes the port."""
    while not stop.is_set():
        ready, _, _ = select.select([master], [], [], 0.05)
        if not ready:
            continue
        try:
            chunk = os.read(master, size)
        except OSError:  # the other side closed the port
            return
        yield chunk


class FakeChip:
    def __init__(
        self,
        *,
        mac: bytes = bytes.fromhex("60550f000001"),
        revision: int = 301,
        chip_id: int = ESP32P4_ID,
        flash_size: int = 16 << 20,
        silent: bool = False,
        cut_after: int | None = None,
        corrupt_at: int | None = None,
    ):
        self.mac, self.revision, self.chip_id = mac, revision, chip_id
        self.silent, self.cut_after, self.corrupt_at = silent, cut_after, corrupt_at
        self.flash = bytearray(b"\xff" * flash_size)
        # the JEDEC id's last byte is log2 of the flash chip's size (0x18: 16 MB)
        self.spi_answers = {**SPI_ANSWERS, 0x9F: SPI_ANSWERS[0x9F] & 0xFFFF | (flash_size.bit_length() - 1) << 16}
        self.written = 0  # bytes of flash data written so far
        self.commands: list[int] = []  # every command's opcode, in order
        self.stub = False
        self.regs = {
            MAC_REG: int.from_bytes(mac[2:], "big"),
            MAC_REG + 4: int.from_bytes(mac[:2], "big"),
            REVISION_REG: revision_word(revision),
        }
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # no echo, no line discipline: bytes as they are
        self.port = os.ttyname(self._slave)
        self._stop = threading.Event()
        self._dead = False
        self._writing: tuple[int, object] | None = None  # (flash address, decompressor or None)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeChip:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._master >= 0:
            os.close(self._master)
            os.close(self._slave)
            self._master = self._slave = -1

    # ---- the line ---------------------------------------------------------------------------

    def _serve(self) -> None:
        packet, escaped, inside = bytearray(), False, False
        for chunk in pty_reads(self._master, self._stop):
            if self.silent or self._dead:
                continue
            for byte in chunk:
                if byte == 0xC0:
                    if inside and packet:
                        self._command(bytes(packet))
                    packet, escaped, inside = bytearray(), False, True
                elif not inside:
                    continue
                elif escaped:
                    packet.append({0xDC: 0xC0, 0xDD: 0xDB}.get(byte, byte))
                    escaped = False
                elif byte == 0xDB:
                    escaped = True
                else:
                    packet.append(byte)
                if self._dead:
                    return

    def _send(self, packet: bytes) -> None:
        os.write(self._master, slip(packet))

    def _reply(self, op: int, value: int = 0, data: bytes = b"", status: int = 0) -> None:
        body = data + (bytes([status, 0]) if self.stub else bytes([status, 0, 0, 0]))
        self._send(struct.pack("<BBHI", 1, op, len(body), value) + body)

    # ---- the commands -----------------------------------------------------------------------

    def _command(self, packet: bytes) -> None:
        if len(packet) < 8 or packet[0] != 0:
            return
        _, op, size, _checksum = struct.unpack_from("<BBHI", packet)
        data = packet[8 : 8 + size]
        self.commands.append(op)
        if op == SYNC:
            for _ in range(8):  # the ROM answers a sync eight times; the stub's value is 0
                self._reply(op, 0 if self.stub else 0x20120707)
        elif op == SECURITY_INFO:
            self._reply(op, data=struct.pack("<IBBBBBBBBII", 0, 0, *bytes(7), self.chip_id, 0))
        elif op == READ_REG:
            (addr,) = struct.unpack_from("<I", data)
            self._reply(op, self.regs.get(addr, 0))
        elif op == WRITE_REG:
            addr, value, mask, _ = struct.unpack_from("<IIII", data)
            if addr == SPI_CMD_REG and value & mask & SPI_CMD_USR:  # done at once: the bit reads 0
                self.regs[SPI_W0_REG] = self.spi_answers.get(self.regs.get(SPI_USR2_REG, 0) & 0xFF, 0)
            else:
                self.regs[addr] = (self.regs.get(addr, 0) & ~mask) | (value & mask)
            self._reply(op)
        elif op in (MEM_BEGIN, MEM_DATA, SPI_SET_PARAMS, SPI_ATTACH, CHANGE_BAUD):
            self._reply(op)
        elif op == MEM_END:
            self._reply(op)
            if struct.unpack_from("<II", data)[0] == 0:  # run the uploaded stub: it says hello
                self.stub = True
                self._send(b"OHAI")
        elif op in (FLASH_BEGIN, DEFL_BEGIN):
            _, _, _, offset = struct.unpack_from("<IIII", data)
            self._writing = (offset, zlib.decompressobj() if op == DEFL_BEGIN else None)
            self._reply(op)
        elif op in (FLASH_DATA, DEFL_DATA):
            self._write(op, data[16:])
        elif op in (FLASH_END, DEFL_END):
            self._writing = None
            self._reply(op)
        elif op == FLASH_MD5:
            addr, length, _, _ = struct.unpack_from("<IIII", data)
            digest = hashlib.md5(self.flash[addr : addr + length]).digest()
            self._reply(op, data=digest if self.stub else digest.hex().encode())
        else:
            self._reply(op, status=1)  # what a ROM says to a command it does not know

    def _write(self, op: int, block: bytes) -> None:
        if self._writing is None:
            self._reply(op, status=1)
            return
        address, inflate = self._writing
        raw = inflate.decompress(block) if inflate is not None else block
        if self.cut_after is not None and self.written + len(raw) > self.cut_after:
            keep = self.cut_after - self.written
            self.flash[address : address + keep] = raw[:keep]
            self.written += keep
            self._dead = True  # a pulled cable: nothing more comes back
            return
        self.flash[address : address + len(raw)] = raw
        if self.corrupt_at is not None and address <= self.corrupt_at < address + len(raw):
            self.flash[self.corrupt_at] ^= 0x01
        self.written += len(raw)
        self._writing = (address + len(raw), inflate)
        self._reply(op)
