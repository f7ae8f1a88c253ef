"""A request line cut short and then sent again whole (a host killed mid-send, a cable pulled and
plugged back, an SSH channel dropped): the board drops the fragment at the new frame's start marker
and serves the whole request, decoding what the reference decodes, instead of refusing the two as
one malformed line. On a Linux firmware's stdin and on qemu-rv32's UART (where the request travels
in acknowledged pieces, counted again from the new frame's start)."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import DEFAULT_MODEL
from emulated_uart import emulated_uart

from generator.device.protocol import FrameReader
from generator.device.serial_link import ACK_BYTES
from generator.device.session import RunRequest, request_frame
from generator.verify import reference_run

pytestmark = pytest.mark.slow  # requests to built firmware

CUT = RunRequest([1, 5, 9, 33, 7, 12, 40, 41], 6, stop_at_eos=False)
WHOLE = RunRequest([1, 5, 9, 2], 5, stop_at_eos=False)


def tokens(frames):
    return [int(f.fields["id"]) for f in frames if f.kind == "token"]


@pytest.mark.parametrize("cut_at", [7, 40, 77])
def test_a_cut_line_then_a_whole_request_on_a_linux_firmware(builder, cut_at):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64)
    expected = reference_run(plan, art.weights, WHOLE).tokens
    fragment = request_frame(CUT)[:cut_at]
    assert b"\n" not in fragment
    # As the first line, and after a request served (the conversation the board holds unchanged).
    for lines in (fragment + request_frame(WHOLE), request_frame(CUT) + fragment + request_frame(WHOLE)):
        done = subprocess.run(
            [str(art.program), "--weights", str(art.weights)], input=lines, capture_output=True, timeout=60
        )
        frames = FrameReader().feed(done.stdout)
        assert done.returncode == 0 and "error" not in [f.kind for f in frames], (done.stderr, frames)
        answers = [f for f in frames if f.kind == "done"]
        assert len(answers) == lines.count(b"\n")
        assert tokens(frames)[-WHOLE.steps :] == expected
        assert b"cut request line dropped" in done.stderr


def test_a_cut_line_then_a_whole_request_on_qemu_rv32(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, "qemu-rv32")
    expected = reference_run(plan, art.weights, WHOLE).tokens
    reader = FrameReader()
    with emulated_uart(board, art) as link:

        def wait_for(pred, seconds=60):
            end = time.monotonic() + seconds
            while not pred() and time.monotonic() < end:
                reader.feed(link.read(4096))
            assert pred(), reader.frames

        wait_for(lambda: any(f.kind == "hello" for f in reader.frames))
        # A fragment shorter than one acknowledged piece, then the whole request in pieces, each
        # sent once the board acknowledged the one before (counted from the new frame's start).
        link.write(request_frame(CUT)[: ACK_BYTES - 10])
        time.sleep(0.3)
        line = request_frame(WHOLE)
        for at in range(0, len(line), ACK_BYTES):
            link.write(line[at : at + ACK_BYTES])
            if at + ACK_BYTES < len(line):
                want = at + ACK_BYTES
                wait_for(lambda: any(f.kind == "ack" and int(f.fields["bytes"]) == want for f in reader.frames), 10)
        wait_for(lambda: any(f.kind in ("done", "error") for f in reader.frames))
    kinds = [f.kind for f in reader.frames]
    assert "error" not in kinds and kinds[-1] == "done", reader.frames
    acks = [int(f.fields["bytes"]) for f in reader.frames if f.kind == "ack"]
    assert acks == list(range(ACK_BYTES, len(request_frame(WHOLE)), ACK_BYTES))  # none for the fragment
    assert tokens(reader.frames) == expected
