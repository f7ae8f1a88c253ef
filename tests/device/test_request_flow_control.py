"""The request reaches an ESP32-P4-class board whole, however long it is and however slowly the
board loads: the board says hello only once it can read, and the request travels in pieces the
board acknowledges. Tested on qemu-rv32, whose UART input behaves like the P4's: a 128-byte receive
FIFO that drops what arrives while it is full (firmware_src/bsp/qemu-rv32/main.c)."""

from __future__ import annotations

import time

import pytest
from conftest import DEFAULT_MODEL
from emulated_uart import emulated_uart

from generator.boards import load_board
from generator.compile.build import prepare, run_scons
from generator.device.protocol import FrameReader
from generator.device.runner import run_on_board
from generator.device.serial_link import ACK_BYTES
from generator.device.session import RunRequest, request_frame
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # streams requests to built firmware

SLOW_LOAD_US = 300_000  # 0.3 s of emulated time checking the image: a large image on a real P4 takes seconds
PROMPT = [1] + [(37 * i) % 200 + 3 for i in range(199)]  # 200 tokens: a request line of ~1 KB


@pytest.fixture(scope="module")
def slow_board(tmp_path_factory):
    board = load_board("qemu-rv32")
    req, plan = prepare(board, DEFAULT_MODEL, "q8_0", 256, tmp_path_factory.mktemp("slow") / "build")
    return board, plan, run_scons(req, defines=(f"COLIBRI_TEST_LOAD_DELAY_US={SLOW_LOAD_US}",))


def test_a_200_token_prompt_arrives_whole_through_the_p4_sized_fifo(slow_board):
    board, plan, art = slow_board
    request = RunRequest(PROMPT, 8, stop_at_eos=False)
    assert len(request_frame(request)) > 6 * 128  # six times what the FIFO holds
    result = run_on_board(
        board, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image, timeout=120
    )
    acks = [line for line in result.log if "ack" in line]
    assert not acks  # acks are frames, not log lines
    assert compare(result, reference_run(plan, art.weights, request)).passed
    assert int(result.hello["proto"]) >= 2


def test_bytes_sent_while_the_board_cannot_read_are_lost_as_on_the_p4(slow_board):
    """The control: a host that sends the whole request at once, before the hello (as the host did
    when the hello came before the load), gets only what the FIFO held through: the board reads
    128 bytes, acknowledges them, and never sees the rest of the line."""
    board, plan, art = slow_board
    with emulated_uart(board, art) as link:
        link.write(request_frame(RunRequest(PROMPT, 8, stop_at_eos=False)))  # all at once, no hello yet
        reader = FrameReader()
        deadline = time.monotonic() + 90
        while not any(f.kind == "hello" for f in reader.frames) and time.monotonic() < deadline:
            reader.feed(link.read(4096))
        quiet_until = time.monotonic() + 3  # then whatever else the board sends
        while time.monotonic() < quiet_until:
            reader.feed(link.read(4096))
    kinds = [f.kind for f in reader.frames]
    # The boot self-test's frame ([selftest] boot = true), then 128 bytes read and acknowledged, then nothing.
    assert kinds == ["hello", "selftest", "ack", "ack"], kinds
    assert [f.int("bytes") for f in reader.frames[2:]] == [ACK_BYTES, 2 * ACK_BYTES]


def test_the_host_sends_pieces_of_the_acknowledged_size():
    assert ACK_BYTES <= 128 // 2  # half the P4's FIFO: a piece never fills it
