"""The link between host and board, defect by defect (each test failed before its fix): what a
CRC-valid frame may still carry, frames that do not fit, runaway output, and a chatty stderr."""

from __future__ import annotations

import sys

import pytest

from generator.device.process import run_process
from generator.device.protocol import MAX_LINE, FrameReader, encode_frame, parse_frame
from generator.device.session import Session
from generator.errors import ColibriError

HELLO = encode_frame(0, "hello", {"proto": 1, "vocab": 100})


def frames(*raw: bytes):
    return [parse_frame(r.rstrip(b"\n")) for r in raw]


def run_session(*raw: bytes) -> Session:
    session = Session()
    for frame in frames(*raw):
        session.handle(frame)
    return session


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"step": 0, "id": -5}, "id=-5 is below 0"),
        ({"step": 0}, "no 'id' field"),
        ({"step": 0, "id": "1_0"}, "is not an integer"),
        ({"step": 0, "id": "١٢"}, "is not an integer"),  # Arabic-Indic digits: int() would take them
        ({"step": 0, "id": 100}, "outside its vocabulary"),
    ],
)
def test_fields_of_a_crc_valid_frame_are_parsed_strictly(fields, message):
    with pytest.raises(ColibriError, match=message):
        run_session(HELLO, encode_frame(1, "token", fields))


def test_a_layers_expert_counts_may_span_frames_and_must_add_up():
    session = run_session(
        HELLO,
        encode_frame(1, "experts", {"layer": 2, "first": 0, "of": 5, "counts": "1,2,3"}),
        encode_frame(2, "experts", {"layer": 2, "first": 3, "of": 5, "counts": "4,5"}),
        encode_frame(3, "done", {"tokens": 0, "reason": "length"}),
    )
    assert session.result.expert_counts == {2: [1, 2, 3, 4, 5]}
    with pytest.raises(ColibriError, match="sent only 3 of 5 expert counts for layer 2"):
        run_session(
            HELLO,
            encode_frame(1, "experts", {"layer": 2, "first": 0, "of": 5, "counts": "1,2,3"}),
            encode_frame(2, "done", {"tokens": 0, "reason": "length"}),
        )
    with pytest.raises(ColibriError, match="do not follow"):
        run_session(HELLO, encode_frame(1, "experts", {"layer": 2, "first": 3, "of": 5, "counts": "4,5"}))


def test_the_reader_resyncs_on_the_last_start_marker_of_a_line():
    """A frame cut by a reset, then the new hello on the same line: the hello is kept."""
    reader = FrameReader()
    cut = encode_frame(7, "token", {"step": 3, "id": 5})[:20]
    got = reader.feed(cut + HELLO)
    assert [f.kind for f in got] == ["hello"]


def test_runaway_output_without_newlines_keeps_the_buffer_bounded():
    reader = FrameReader()
    for _ in range(100):
        reader.feed(b"x" * 65536)
    assert len(reader._buffer) <= MAX_LINE
    assert reader.feed(b"\n" + HELLO)[0].kind == "hello"


def test_a_firmware_writing_much_to_stderr_still_finishes(tmp_path):
    """Its stderr pipe used to stay unread until the end: 256 KiB of it stalled the run."""
    fake = tmp_path / "firmware.py"
    frames_out = b"".join(
        [
            HELLO,
            encode_frame(1, "token", {"step": 0, "id": 7}),
            encode_frame(2, "stats", {"prompt": 1, "decode": 0}),
            encode_frame(3, "done", {"tokens": 1, "reason": "length"}),
        ]
    )
    fake.write_text(
        "import sys\n"
        "sys.stdin.buffer.read()\n"
        "sys.stderr.buffer.write(b'noise ' * 50000); sys.stderr.flush()\n"
        f"sys.stdout.buffer.write({frames_out!r}); sys.stdout.flush()\n"
    )
    result = run_process([sys.executable, str(fake)], b"request\n", Session(), timeout=20)
    assert result.tokens == [7]


@pytest.fixture(scope="module")
def protocol_harness(tmp_path_factory):
    from c_builds import gcc
    from conftest import REPO

    out = tmp_path_factory.mktemp("protocol") / "protocol_harness"
    app, runtime = REPO / "firmware_src" / "app", REPO / "firmware_src" / "runtime"
    return gcc(
        out, f"-I{app}", REPO / "tests" / "c" / "protocol_harness.c", app / "protocol.c", runtime / "checksum.c",
        optimize="-O1",
    )  # fmt: skip


def harness_frames(harness, *args):
    import subprocess

    done = subprocess.run([str(harness), *map(str, args)], capture_output=True, check=True)
    reader = FrameReader()
    reader.feed(done.stdout)
    return reader


def test_hundreds_of_expert_counts_arrive_whole_in_several_frames(protocol_harness):
    """512 counts used to be cut to 502 under a CRC computed over the shortened line."""
    reader = harness_frames(protocol_harness, "experts", 512)
    session = Session()
    for frame in reader.frames:
        session.handle(frame)
    assert session.finished and session.result.expert_counts == {3: [i * 7 for i in range(512)]}
    assert len([f for f in reader.frames if f.kind == "experts"]) == 4 and reader.rejected == 0


def test_a_frame_that_does_not_fit_becomes_an_error_frame_never_a_cut_one(protocol_harness):
    reader = harness_frames(protocol_harness, "long", 5000)
    assert [f.kind for f in reader.frames] == ["error", "done"]
    assert reader.frames[0].fields["code"] == "101" and "did not fit" in reader.frames[0].fields["msg"]
    assert reader.frames[1].seq == 1  # the error took the frame's place in the sequence


def test_fuzzing_the_host_reader_and_session_yields_clear_errors_only():
    """A bounded, seeded fuzz of what a board's link can deliver: valid runs, the defect cases
    above, then byte mutations and random splits. The reader must stay bounded and accept only
    CRC-valid frames; the Session may refuse a run only with a ColibriError (never a traceback)."""
    import random

    run = b"".join(
        [
            HELLO,
            encode_frame(1, "token", {"step": 0, "id": 7, "logits": "ab"}),
            encode_frame(2, "experts", {"layer": 0, "first": 0, "of": 3, "counts": "1,0,2"}),
            encode_frame(3, "stats", {"prompt": 1, "decode": 0}),
            encode_frame(4, "done", {"tokens": 1, "reason": "length"}),
        ]
    )
    corpus = [
        run,
        run.replace(b"id=7", b"id=-5"),
        encode_frame(1, "token", {"step": 0}),
        encode_frame(1, "token", {"step": 0, "id": "1_0"}),
        encode_frame(7, "token", {"step": 3})[:20] + HELLO,
        b"x" * 5000 + run,
        encode_frame(1, "experts", {"layer": 0, "first": 2, "of": 3, "counts": "9"}),
    ]
    rng = random.Random(14)
    for i in range(4000):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randrange(0, 6)):
            op = rng.randrange(3)
            at = rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif op == 1:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            else:
                del data[at : at + rng.randrange(1, 8)]
        reader, session = FrameReader(), Session()
        pos = 0
        try:
            while pos < len(data):
                step = rng.randrange(1, 300)
                for frame in reader.feed(bytes(data[pos : pos + step])):
                    assert parse_frame(encode_frame(frame.seq, frame.kind, frame.fields).rstrip(b"\n")) == frame
                    if not session.finished:
                        session.handle(frame)
                pos += step
        except ColibriError:
            pass
        assert len(reader._buffer) <= MAX_LINE


def test_a_selftest_request_is_given_the_time_of_its_golden_decode():
    # A 4.8 GB image read through the expert cache decodes the self-test's golden prompt as slowly
    # as any prompt; the allowance once counted 0 tokens for it (20 s) and cut such a self-test off.
    from generator.boards.board import SelftestSettings
    from generator.device.links import default_timeout
    from generator.device.session import RunRequest

    image = 4_800_000_000
    golden = SelftestSettings(prompt_tokens=4, steps=4)
    same_work = RunRequest([1, 2, 3, 4], 4)
    assert default_timeout(RunRequest.selftest_of(golden), image) == default_timeout(same_work, image)
    assert default_timeout(RunRequest.selftest_of(golden), image) > 20 + 8 * 200
