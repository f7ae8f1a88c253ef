"""`colibri monitor` (generator.monitor.monitor) against a fake board on a pseudo-terminal."""

from __future__ import annotations

import io
import json
import os
import re
import time

import pytest
from test_serial_link import BANNER, MODEL, OTHER_MODEL, PtyBoard, answer, hello, token

from generator.device.monitor import describe, monitor, printable
from generator.device.protocol import Frame, encode_frame, parse_frame
from generator.device.serial_link import SerialLink
from generator.errors import ColibriError

SLACK = 1.0


@pytest.fixture
def board():
    b = PtyBoard()
    yield b
    b.close()


def start_board_on_open(monkeypatch, board: PtyBoard, script) -> None:
    """Start the fake board once the port is open (opening a port flushes what came before)."""
    original = SerialLink.open

    def open_then_start(*args, **kw):
        link = original(*args, **kw)
        board.start(script)
        return link

    monkeypatch.setattr(SerialLink, "open", staticmethod(open_then_start))


@pytest.fixture
def watch(board, monkeypatch):
    def run(script, duration=0.6, **kwargs):
        """Monitor the fake board; return (exit code, output lines, seconds)."""
        out = io.StringIO()
        start_board_on_open(monkeypatch, board, script)
        start = time.monotonic()
        code = monitor(board.path, 115200, out=out, duration=duration, **kwargs)
        return code, out.getvalue().splitlines(), time.monotonic() - start

    return run


def corrupt(frame: bytes, at: int = 25) -> bytes:
    damaged = bytearray(frame)
    damaged[at] ^= 0x10
    return bytes(damaged)


def test_monitor_shows_the_banner_decoded_frames_and_counts_rejected_ones(board, watch):
    frames = answer(4)
    stream = b"".join(BANNER) + hello() + frames[0] + corrupt(frames[1]) + b"".join(frames[2:])
    code, lines, elapsed = watch(lambda b: b.write(stream))
    assert code == 0
    assert lines[0].startswith(f"-- monitoring {board.path} at 115200 baud")
    assert lines[1 : 1 + len(BANNER)] == ["| " + line.decode().rstrip("\r\n") for line in BANNER]
    assert lines[1 + len(BANNER)] == (
        "[0] hello: board fake-p4, firmware 0.1.0, llama q8_0, ctx 64, vocab 512, "
        f"kernels scalar, proto 1, model {MODEL[:16]}…"
    )
    assert "[1] token: step 0, id 100, logits 0000000000000000…" in lines
    assert any(
        line.startswith("!! corrupted frame rejected (CRC or format): @CLB 2 token step=1 id=10' ") for line in lines
    )
    assert "!! 1 frame(s) lost before frame 3" in lines
    assert "[3] token: step 2, id 114, logits " + parse_frame(frames[2].strip()).fields["logits"][:16] + "…" in lines
    assert "[6] done: 4 tokens, reason length" in lines
    assert any(line.startswith("[5] stats: prompt=3 prefill_us=10") for line in lines)
    assert re.fullmatch(
        r"-- stopped after 0\.[67] s \(duration\): 6 frames, 1 rejected \(corrupted\), 1 lost, "
        r"0 resets, 0 error frames",
        lines[-1],
    ), lines[-1]
    assert 0.6 <= elapsed <= 0.6 + SLACK


def test_monitor_exits_non_zero_on_an_error_frame(board, watch):
    stream = hello() + encode_frame(1, "error", {"code": 3, "msg": "weight image: bad magic"})
    code, lines, _ = watch(lambda b: b.write(stream))
    assert code == 1
    assert "[1] ERROR 3: weight image: bad magic" in lines
    assert "1 error frames" in lines[-1]


def test_monitor_reports_a_reset(board, watch):
    frames = answer(3)
    stream = hello() + frames[0] + frames[1] + b"".join(BANNER) + hello() + frames[0]
    code, lines, _ = watch(lambda b: b.write(stream))
    assert code == 0
    reset = lines.index("!! the board reset (a new hello with sequence number 0)")
    assert lines[reset - 1] == "| " + BANNER[-1].decode().strip()
    assert lines[reset + 1].startswith("[0] hello: board fake-p4")
    assert "1 resets" in lines[-1] and "0 lost" in lines[-1]


def test_monitor_names_firmware_for_another_model(board, watch):
    code, lines, _ = watch(lambda b: b.write(hello(model=OTHER_MODEL)), expected_model=MODEL[:16])
    assert code == 1
    assert (
        f"!! this firmware is for model {OTHER_MODEL[:16]}…, expected {MODEL[:16]} (flash the matching build)" in lines
    )
    assert "1 hello(s) for another model" in lines[-1]


def test_monitor_accepts_the_expected_model(board, watch):
    code, lines, _ = watch(lambda b: b.write(hello()), expected_model=MODEL)
    assert code == 0
    assert not any(line.startswith("!!") for line in lines)
    assert "0 hello(s) for another model" in lines[-1]


def test_monitor_json_lines(board, watch):
    stream = b"ESP-ROM:esp32p4\r\n" + hello() + corrupt(token(1, 0)) + token(2, 1) + b"\x1b[0;32mI (5) ok\x1b[0m\n"
    code, lines, _ = watch(lambda b: b.write(stream), json_lines=True)
    records = [json.loads(line) for line in lines]
    assert code == 0
    assert [r["type"] for r in records] == ["start", "log", "frame", "rejected", "lost", "frame", "log", "summary"]
    assert records[1]["text"] == "ESP-ROM:esp32p4"
    assert records[2]["kind"] == "hello" and records[2]["fields"]["model"] == MODEL and records[2]["seq"] == 0
    assert records[4] == {"type": "lost", "t": records[4]["t"], "count": 1, "before_seq": 2}
    assert records[5]["fields"] == {
        "step": "1",
        "id": "107",
        "logits": parse_frame(token(2, 1).strip()).fields["logits"],
    }
    assert records[6]["text"] == "\x1b[0;32mI (5) ok\x1b[0m"
    summary = records[-1]
    assert (summary["frames"], summary["rejected"], summary["lost"], summary["exit"]) == (2, 1, 1, 0)
    assert all(0 <= r["t"] <= 0.6 + SLACK for r in records)


def test_monitor_escapes_control_bytes_but_keeps_colours(board, watch):
    stream = b"\x1b[2Jclear screen\x07 \x1b[0;33mW (7) warn\x1b[0m\n"
    _, lines, _ = watch(lambda b: b.write(stream))
    assert lines[1] == "| \\x1b[2Jclear screen\\x07 \x1b[0;33mW (7) warn\x1b[0m"
    assert printable("a\tb\x00") == "a\tb\\x00"


def test_monitor_stops_on_ctrl_c_with_a_summary(board, watch, monkeypatch):
    polls = {"n": 0}
    original = SerialLink.poll

    def poll(self):
        events = original(self)
        if any(kind == "frame" for kind, _ in events) or polls["n"]:
            polls["n"] += 1
            if polls["n"] > 2:
                raise KeyboardInterrupt
        return events

    monkeypatch.setattr(SerialLink, "poll", poll)
    code, lines, elapsed = watch(lambda b: b.write(hello() + token(1, 0)), duration=None)
    assert code == 0
    assert lines[-1].startswith("-- stopped after") and "(Ctrl-C): 2 frames" in lines[-1]
    assert elapsed < 2.0


def unplug(b):
    """The board says hello, then its port vanishes (reads from then on fail)."""
    b.write(hello())
    b.idle(0.2)
    os.close(b.master)
    b.master = os.open("/dev/null", os.O_RDONLY)


def test_monitor_reports_a_vanished_port_in_one_line(board, watch):
    start = time.monotonic()
    with pytest.raises(ColibriError) as info:
        watch(unplug, duration=5.0)
    msg = str(info.value)
    assert msg.startswith(f"{board.path}: read failed") and "was the board unplugged or reset?" in msg
    assert "\n" not in msg
    assert time.monotonic() - start < 1.5


def test_monitor_summary_comes_before_the_port_error(board, monkeypatch):
    out = io.StringIO()
    start_board_on_open(monkeypatch, board, unplug)
    with pytest.raises(ColibriError):
        monitor(board.path, out=out, duration=5.0, json_lines=True)
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["type"] == "summary" and summary["reason"] == "port failed" and summary["exit"] == 2
    assert summary["frames"] == 1


def test_monitor_on_a_missing_port():
    with pytest.raises(ColibriError, match="^cannot open serial port /dev/ttyCOLIBRI-none"):
        monitor("/dev/ttyCOLIBRI-none", 115200, out=io.StringIO(), duration=1.0)


def test_monitor_on_a_silent_port_ends_after_the_duration(board, watch):
    code, lines, elapsed = watch(lambda b: b.idle(5), duration=0.5)
    assert code == 0
    assert len(lines) == 2 and "0 frames" in lines[-1]
    assert 0.5 <= elapsed <= 0.5 + SLACK


def test_describe_unknown_kinds_and_escaped_fields():
    frame = parse_frame(encode_frame(9, "stats", {"note": "two words\x1b"}).strip())
    assert describe(frame) == "[9] stats: note=two words\\x1b"


def test_monitor_with_the_model_prints_the_decoded_text(board, watch):
    from conftest import DEFAULT_MODEL

    from generator.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.for_model(DEFAULT_MODEL)
    ids = [tokenizer.encode(" And God said")[i] for i in range(3)]
    frames = [encode_frame(1 + i, "token", {"step": i, "id": t, "logits": "ab" * 32}) for i, t in enumerate(ids)]
    frames.append(encode_frame(4, "done", {"tokens": 3, "reason": "length"}))
    code, lines, _ = watch(lambda b: b.write(hello() + b"".join(frames)), tokenizer=tokenizer)
    assert code == 0
    token_lines = [line for line in lines if "] token:" in line]
    pieces = [json.loads(line.split(", text ", 1)[1]) for line in token_lines]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert f"-- text: {tokenizer.decode(ids)}" in lines


def test_every_command_words_a_missing_port_the_same_way():
    from generator.device.flash import _open_port

    messages = []
    for open_port in (SerialLink.open, _open_port, lambda p: monitor(p, 115200, out=io.StringIO(), duration=1.0)):
        with pytest.raises(ColibriError) as e:
            open_port("/dev/ttyCOLIBRI-none")
        messages.append(str(e.value))
    assert len(set(messages)) == 1, messages
    assert messages[0] == (
        "cannot open serial port /dev/ttyCOLIBRI-none: No such file or directory (is the board "
        "plugged in? ./colibri devices lists the serial ports)"
    )
    assert "Errno" not in messages[0]


def test_describe_says_what_a_selftest_found():
    good = Frame(
        3,
        "selftest",
        {"result": "pass", "kernels": "rv32", "kernels_checked": "33", "steps": "3", "instret": "5982954"},
    )
    assert (
        describe(good)
        == "[3] self-test PASS: 33 kernel checks (rv32), golden decode of 3 steps, 5,982,954 instructions"
    )
    bad = Frame(
        1,
        "selftest",
        {
            "result": "fail",
            "kernels": "avx2",
            "kernels_checked": "33",
            "steps": "4",
            "step": "2",
            "token": "17",
            "expected": "45",
            "logits": "differ",
        },
    )
    assert describe(bad).startswith("[1] self-test FAIL: golden decode step 2: token 17, expected 45")
