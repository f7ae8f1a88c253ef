"""The result protocol: encode <-> decode, split reads, noise, corruption, resets."""

import random

import pytest

from generator.device.protocol import FrameReader, encode_frame, parse_frame
from generator.device.session import Session
from generator.errors import ColibriError


def session_bytes():
    frames = [encode_frame(0, "hello", {"proto": 1, "model": "ab" * 32})]
    frames += [encode_frame(i + 1, "token", {"step": i, "id": 100 + i, "logits": f"{i:064x}"}) for i in range(5)]
    frames += [
        encode_frame(6, "stats", {"prompt": 3, "prefill_us": 10, "decode": 4, "decode_us": 40}),
        encode_frame(7, "done", {"tokens": 5, "reason": "length"}),
    ]
    return frames


def test_encode_decode_round_trip_with_escaped_text():
    raw = encode_frame(3, "error", {"code": 7, "msg": 'bad image: 50% * = "ok"\nnext'})
    frame = parse_frame(raw.rstrip(b"\n"))
    assert frame.seq == 3 and frame.kind == "error"
    assert frame.fields == {"code": "7", "msg": 'bad image: 50% * = "ok"\nnext'}


def test_reader_survives_any_split_and_keeps_non_frame_lines_as_log():
    stream = b"ESP-ROM:esp32p4 boot banner\r\n" + b"".join(session_bytes()) + b"trailing log\n"
    for seed in range(20):
        r = random.Random(seed)
        reader = FrameReader()
        i = 0
        while i < len(stream):
            n = r.randint(1, 17)
            reader.feed(stream[i : i + n])
            i += n
        assert [f.kind for f in reader.frames] == ["hello"] + ["token"] * 5 + ["stats", "done"]
        assert reader.log == ["ESP-ROM:esp32p4 boot banner", "trailing log"]
        assert reader.rejected == 0


def test_reader_rejects_every_single_bit_flip():
    frame = session_bytes()[1]
    for bit in range(8 * (len(frame) - 1)):  # every bit but the newline's
        corrupted = bytearray(frame)
        corrupted[bit // 8] ^= 1 << (bit % 8)
        reader = FrameReader()
        reader.feed(bytes(corrupted) + b"\n")
        assert reader.frames == [], f"flip of bit {bit} accepted"


def test_reader_finds_frames_amid_noise_and_counts_rejected_ones():
    noise = bytes(random.Random(1).randrange(256) for _ in range(300)).replace(b"\n", b"")
    good = session_bytes()
    bad = bytearray(good[2])
    bad[20] ^= 0x04
    reader = FrameReader()
    reader.feed(noise + b"\n" + good[0] + noise + good[1] + bytes(bad) + b"".join(good[3:]))
    assert [f.seq for f in reader.frames] == [0, 1, 3, 4, 5, 6, 7]
    assert reader.rejected >= 1


def test_reader_notices_a_reset():
    reader = FrameReader()
    frames = session_bytes()
    reader.feed(b"".join(frames[:3]) + frames[0])
    assert reader.resets == 1


def test_session_rejects_a_reset_midway_and_a_missing_step():
    session = Session()
    reader = FrameReader()
    frames = session_bytes()
    for f in reader.feed(b"".join(frames[:3])):
        session.handle(f)
    with pytest.raises(ColibriError, match="reset"):
        for f in reader.feed(frames[0]):
            session.handle(f)
    session = Session()
    for f in FrameReader().feed(frames[0] + frames[1]):
        session.handle(f)
    with pytest.raises(ColibriError, match="step 2 arrived when step 1"):
        session.handle(parse_frame(encode_frame(2, "token", {"step": 2, "id": 1, "logits": "0"}).strip()))


def test_session_refuses_firmware_for_another_model():
    session = Session(expected_model="cd" * 32)
    with pytest.raises(ColibriError, match="expected cdcd"):
        session.handle(parse_frame(session_bytes()[0].strip()))


def test_runaway_line_without_newline_is_dropped_not_buffered_forever():
    reader = FrameReader()
    reader.feed(b"x" * 10000)
    reader.feed(b"\n" + session_bytes()[0])
    assert [f.kind for f in reader.frames] == ["hello"]
