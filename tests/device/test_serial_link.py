"""SerialLink under fault injection, against real pseudo-terminals: a fake board thread writes to
the pty master what a board would print (ROM banner noise, frames) and reads the request frame
the link sends after the hello. Plus the real thing: qemu-rv32 firmware read through SerialLink,
compared with the NumPy reference."""

from __future__ import annotations

import fcntl
import os
import random
import select
import threading
import time
import tty

import pytest
from conftest import DEFAULT_MODEL

import generator.device.serial_link as serial_link
from generator.device.protocol import encode_frame, f32_bits, parse_frame
from generator.device.runner import run_on_board
from generator.device.serial_link import SerialLink, Timeouts
from generator.device.session import RunRequest, Session
from generator.errors import ColibriError
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

MODEL = "ab" * 32
OTHER_MODEL = "cd" * 32
BANNER = [
    b"ESP-ROM:esp32p4-eco2-20240710\r\n",
    b"Build:Jul 10 2024\r\n",
    b"rst:0x1 (POWERON),boot:0x30f (SPI_FAST_FLASH_BOOT)\r\n",
    b"SPI mode:DIO, clock div:1\r\n",
]
FAST = Timeouts(boot=1.0, per_token=0.5, silence=1.0)
SLACK = 1.0  # no wait may exceed its stated timeout by more than this


def token_id(step: int) -> int:
    return 100 + 7 * step


def digest(step: int) -> str:
    return f"{step * 2654435761 % 2**64:064x}"


# What the fake board's hello frame says before its model.
HELLO_FIELDS = {
    "proto": 1,
    "fw": "0.1.0",
    "board": "fake-p4",
    "arch": "llama",
    "quant": "q8_0",
    "ctx": 64,
    "vocab": 512,
    "kernels": "scalar",
}


def hello(seq: int = 0, model: str = MODEL) -> bytes:
    return encode_frame(seq, "hello", {**HELLO_FIELDS, "model": model})


def token(seq: int, step: int) -> bytes:
    return encode_frame(seq, "token", {"step": step, "id": token_id(step), "logits": digest(step)})


def answer(steps: int) -> list[bytes]:
    """The frames after the hello: tokens, stats, done (sequence numbers from 1)."""
    frames = [token(1 + i, i) for i in range(steps)]
    frames.append(
        encode_frame(
            steps + 1, "stats", {"prompt": 3, "prefill_us": 10, "decode": steps - 1, "decode_us": 40, "forward_us": 30}
        )
    )
    frames.append(encode_frame(steps + 2, "done", {"tokens": steps, "reason": "length"}))
    return frames


class PtyBoard:
    """The far end of a pseudo-terminal, played by a thread."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        fcntl.fcntl(self.master, fcntl.F_SETFL, fcntl.fcntl(self.master, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.path = os.ttyname(self.slave)
        self.stop = threading.Event()
        self.request = None  # the parsed request frame, once one arrived
        self.request_line = b""
        self.failure = None
        self.thread = None
        self._pending = bytearray()

    def write(self, data: bytes, piece: int = 0, delay: float = 0.0) -> None:
        step = piece or max(1, len(data))
        for i in range(0, len(data), step):
            view = memoryview(data[i : i + step])
            while view and not self.stop.is_set():
                try:
                    view = view[os.write(self.master, view) :]
                except BlockingIOError:
                    select.select([], [self.master], [], 0.05)
            if delay:
                time.sleep(delay)

    def read_request(self, timeout: float = 3.0):
        """Wait for one line from the host; keep it parsed in self.request."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending and not self.stop.is_set() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self._pending += os.read(self.master, 4096)
                except BlockingIOError:
                    pass
        if b"\n" not in self._pending:
            return None
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        self.request_line = line
        self.request = parse_frame(line)
        return self.request

    def idle(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def start(self, script) -> "PtyBoard":
        def body():
            try:
                script(self)
            except Exception as e:  # reported by close()
                self.failure = e

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(5)
        os.close(self.master)
        os.close(self.slave)
        if self.failure:
            raise self.failure


@pytest.fixture
def board():
    b = PtyBoard()
    yield b
    b.close()


def standard(steps: int, banner=True, noise=None, piece=0, delay=0.0, model=MODEL, after_hello=None):
    """A board script: banner, hello, wait for the request, then tokens, stats and done."""

    def script(b: PtyBoard):
        if banner:
            b.write(b"".join(BANNER), piece, delay)
        b.write(hello(model=model), piece, delay)
        if b.read_request() is None:
            return
        if after_hello:
            after_hello(b)
            return
        for frame in answer(steps):
            if noise:
                frame = noise(frame)
            b.write(frame, piece, delay)

    return script


REQUEST = RunRequest([1, 2, 3], 6, SamplingParams(0.8, 40, 0.9, 0.05, 7), stop_at_eos=False)


def run_link(b: PtyBoard, script, request=REQUEST, timeouts=FAST, expected=MODEL):
    """Open the pty, start the board, run; return (result or raised ColibriError, seconds)."""
    link = SerialLink.open(b.path)  # before the board speaks: opening a port flushes its input
    b.start(script)
    start = time.monotonic()
    try:
        return link.run(request, Session(expected), timeouts), time.monotonic() - start
    except ColibriError as e:
        return e, time.monotonic() - start
    finally:
        link.close()


def assert_clean(result, steps=REQUEST.steps):
    assert not isinstance(result, Exception), result
    assert result.tokens == [token_id(i) for i in range(steps)]
    assert result.digests == [digest(i) for i in range(steps)]
    assert result.stop_reason == "length"
    assert result.hello["board"] == "fake-p4"


def assert_request_parses(b: PtyBoard, request=REQUEST):
    f = b.request
    assert f is not None and f.kind == "request", b.request_line
    assert f.fields["prompt"] == ",".join(map(str, request.prompt))
    assert f.int("steps") == request.steps
    s = request.sampling.as_f32()
    assert [f.fields[k] for k in ("temperature", "top_p", "min_p")] == [
        f32_bits(s.temperature),
        f32_bits(s.top_p),
        f32_bits(s.min_p),
    ]
    assert (f.int("top_k"), f.int("seed"), f.int("eos")) == (s.top_k, s.seed, int(request.stop_at_eos))


# ---- runs that must succeed ------------------------------------------------------------------


def test_clean_run_sends_a_valid_request_and_keeps_the_banner(board):
    result, elapsed = run_link(board, standard(REQUEST.steps))
    assert_clean(result)
    assert_request_parses(board)
    assert result.log[: len(BANNER)] == [line.decode().rstrip("\r\n") for line in BANNER]
    assert result.stats["decode"] == str(REQUEST.steps - 1)
    assert elapsed < 1.0


def test_random_noise_between_and_inside_lines_is_skipped(board):
    rng = random.Random(5)

    def junk(n):  # no newline and no '@' so it cannot end a line or start a frame
        return bytes(b for b in (rng.randrange(256) for _ in range(n)) if b not in b"\n@")

    def noisy(frame: bytes) -> bytes:
        # noise on its own line, noise in front of the frame on its line, noise inside a log line
        return junk(40) + b"\n" + junk(10) + frame + b"I (123) app: log " + junk(20) + b" line\r\n"

    def script(b):
        b.write(junk(200) + b"\r\n" + b"".join(BANNER) + noisy(hello()))
        b.read_request()
        for frame in answer(REQUEST.steps):
            b.write(noisy(frame))

    link_result, elapsed = run_link(board, script)
    assert_clean(link_result)
    assert_request_parses(board)
    assert sum("app: log" in line for line in link_result.log) == REQUEST.steps + 3
    assert elapsed < 1.0


def test_frames_split_into_single_byte_writes_with_delays(board):
    steps = 3
    result, elapsed = run_link(
        board, standard(steps, banner=False, piece=1, delay=0.0005), RunRequest([1, 2, 3], steps)
    )
    assert_clean(result, steps)
    assert_request_parses(board, RunRequest([1, 2, 3], steps))


def test_frames_of_an_earlier_run_before_the_hello_are_ignored(board):
    def script(b):
        b.write(token(5, 4) + encode_frame(6, "done", {"tokens": 5, "reason": "length"}) + b"".join(BANNER))
        standard(REQUEST.steps, banner=False)(b)

    result, _ = run_link(board, script)
    assert_clean(result)


def paced_board(steps: int, seconds_per_token: float):
    """A board that answers a request of `steps` tokens, one token frame every seconds_per_token."""

    def slow(b):
        b.write(hello())
        b.read_request()
        for frame in answer(steps):
            b.write(frame)
            b.idle(seconds_per_token)

    return slow


def test_timeouts_scale_with_the_tokens_asked_for(board):
    """A board that takes 0.1 s per token: within the budget of 0.25 s per token it completes,
    though the whole run takes longer than the boot timeout plus the silence timeout."""
    steps = 10
    request = RunRequest([1, 2, 3], steps)
    timeouts = Timeouts(boot=0.3, per_token=0.25, silence=0.3)
    result, elapsed = run_link(board, paced_board(steps, 0.1), request, timeouts)
    assert_clean(result, steps)
    assert elapsed > timeouts.boot + timeouts.silence
    assert timeouts.total(request) == pytest.approx(0.3 + 0.25 * 13)


def test_the_whole_result_must_arrive_within_the_total_timeout(board):
    steps = 12
    request = RunRequest([1, 2, 3], steps)
    timeouts = Timeouts(boot=0.5, per_token=0.05, silence=0.5)  # total 1.25 s; the board needs ~2 s
    err, elapsed = run_link(board, paced_board(steps, 0.15), request, timeouts)
    assert isinstance(err, ColibriError)
    assert "no complete result within 1.25 s" in str(err) and f"of {steps} tokens received" in str(err)
    assert timeouts.total(request) <= elapsed <= timeouts.total(request) + SLACK


# ---- runs that must fail clearly, never with a wrong answer ---------------------------------


@pytest.mark.parametrize("step,byte", [(0, 20), (2, 5), (2, -12), (3, -1), (REQUEST.steps - 1, 30)])
def test_a_bit_flip_in_a_token_frame_loses_the_step_and_fails_the_run(board, step, byte):
    """The corrupted frame is rejected (CRC), so its step is missing: the run must say so.
    byte -1 flips the newline, which merges the frame with the next one."""
    bit = random.Random(step * 100 + byte).randrange(8)

    def flip(frame: bytes) -> bytes:
        f = parse_frame(frame.strip())
        if f.kind == "token" and f.int("step") == step:
            damaged = bytearray(frame)
            damaged[byte] ^= 1 << bit
            return bytes(damaged)
        return frame

    err, elapsed = run_link(board, standard(REQUEST.steps, noise=flip))
    assert isinstance(err, ColibriError), f"a corrupted token frame gave a result: {err}"
    msg = str(err)
    assert "lost before frame" in msg and "the result would be incomplete" in msg, msg
    if step < REQUEST.steps - 1:
        assert f"when step {step} was expected" in msg, msg
    if byte != -1:
        assert "1 corrupted frame(s) rejected" in msg, msg
    assert elapsed < 1.0


def test_a_lost_stats_frame_fails_the_run(board):
    def drop_stats(frame):
        return b"" if b" stats " in frame else frame

    err, _ = run_link(board, standard(REQUEST.steps, noise=drop_stats))
    assert isinstance(err, ColibriError)
    assert f"1 frame(s) lost before frame {REQUEST.steps + 2} (done)" in str(err)


def test_done_must_count_the_tokens_that_arrived(board):
    def script(b):
        b.write(hello())
        b.read_request()
        frames = answer(REQUEST.steps)
        frames[-1] = encode_frame(REQUEST.steps + 2, "done", {"tokens": REQUEST.steps + 1, "reason": "length"})
        b.write(b"".join(frames))

    err, _ = run_link(board, script)
    assert isinstance(err, ColibriError)
    assert f"reports {REQUEST.steps + 1} tokens but {REQUEST.steps} arrived" in str(err)


def test_a_reset_in_the_middle_of_the_decode(board):
    def reset_after_3(b):
        for frame in answer(REQUEST.steps)[:3]:
            b.write(frame)
        b.write(b"".join(BANNER).replace(b"POWERON", b"SW_CPU_RESET") + hello(0))
        b.idle(5)

    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=reset_after_3))
    assert isinstance(err, ColibriError)
    msg = str(err)
    assert "the board reset during the run" in msg and f"after 3 of {REQUEST.steps} tokens" in msg, msg
    assert "SPI mode:DIO" in msg, msg  # what it printed before the new hello
    assert elapsed < 0.5  # at once, not after a timeout


def test_a_silent_device_ends_at_the_boot_timeout(board):
    err, elapsed = run_link(board, lambda b: b.idle(5))
    assert isinstance(err, ColibriError)
    assert str(err) == (
        f"{board.path}: no hello frame from the board within 1 s (nothing at all was received; "
        f"a board that booted before the port was opened has already sent its hello: reset it); "
        f"check the port, the baud rate and that the firmware is flashed"
    )
    assert FAST.boot <= elapsed <= FAST.boot + SLACK


def test_no_hello_names_the_last_line_the_board_printed(board):
    def rom_only(b):
        b.write(b"".join(BANNER) + b"waiting for download\r\n\r\n")
        b.idle(5)

    err, elapsed = run_link(board, rom_only)
    assert isinstance(err, ColibriError)
    assert "no hello frame from the board within 1 s" in str(err)
    assert "last line 'waiting for download'" in str(err)
    assert FAST.boot <= elapsed <= FAST.boot + SLACK


def test_garbage_without_newlines_hints_at_the_baud_rate(board):
    def wrong_baud(b):
        b.write(bytes(random.Random(3).randrange(128, 256) for _ in range(300)))
        b.idle(5)

    err, elapsed = run_link(board, wrong_baud)
    assert isinstance(err, ColibriError)
    assert "300 bytes received, no complete line (wrong baud rate?)" in str(err)
    assert elapsed <= FAST.boot + SLACK


def test_a_device_that_stops_after_some_tokens_ends_at_the_silence_timeout(board):
    def stop_after_3(b):
        b.write(b"".join(answer(REQUEST.steps)[:3]) + b"E (4411) task_wdt: Task watchdog got triggered\r\n")
        b.idle(5)

    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=stop_after_3))
    assert isinstance(err, ColibriError)
    msg = str(err)
    assert f"the board has been silent for 1 s after 3 of {REQUEST.steps} tokens" in msg, msg
    assert "task_wdt" in msg, msg
    assert FAST.silence <= elapsed <= FAST.silence + SLACK


PREFILL = Timeouts(boot=1.0, per_token=0.1, silence=1.0)  # 1.3 s from the hello to the first token


def test_noise_is_not_progress(board):
    """A board that keeps printing log lines but no frame is 'silent' for the protocol."""

    def chatter(b):
        for i in range(100):
            b.write(f"D (12{i}) still alive\r\n".encode())
            b.idle(0.05)

    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=chatter), timeouts=PREFILL)
    assert isinstance(err, ColibriError)
    msg = str(err)
    assert "no token followed within 1.3 s" in msg and "still alive" in msg, msg  # silence + 3 prompt tokens
    assert PREFILL.first_token(REQUEST) <= elapsed <= PREFILL.first_token(REQUEST) + SLACK


def test_a_hello_without_any_answer_to_the_request(board):
    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=lambda b: b.idle(5)), timeouts=PREFILL)
    assert isinstance(err, ColibriError)
    assert "the board sent its hello but no token followed within 1.3 s" in str(err)
    assert PREFILL.first_token(REQUEST) <= elapsed <= PREFILL.first_token(REQUEST) + SLACK


def test_firmware_for_another_model_is_refused_before_any_request(board):
    err, elapsed = run_link(board, standard(REQUEST.steps, model=OTHER_MODEL))
    assert isinstance(err, ColibriError)
    assert f"runs firmware for model {OTHER_MODEL[:16]}…, expected {MODEL[:16]}…" in str(err)
    board.stop.wait(0.2)  # give a (wrongly) sent request time to arrive
    assert board.request is None and not board.request_line
    assert elapsed < 1.0


def test_an_error_frame_ends_the_run(board):
    def fail(b):
        b.write(encode_frame(1, "error", {"code": 4, "msg": "weight image: model hash mismatch"}))
        b.idle(5)

    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=fail))
    assert isinstance(err, ColibriError)
    assert "firmware reported error 4: weight image: model hash mismatch" in str(err)
    assert elapsed < 1.0


def test_a_port_that_vanishes_mid_run(board):
    def unplug(b):
        b.write(b"".join(answer(REQUEST.steps)[:2]))
        b.idle(0.3)
        os.close(b.master)  # the USB adapter is gone
        b.master = os.open("/dev/null", os.O_RDONLY)  # so close() has something to close

    err, elapsed = run_link(board, standard(REQUEST.steps, after_hello=unplug))
    assert isinstance(err, ColibriError)
    assert "read failed" in str(err) and "unplugged" in str(err)
    assert "Traceback" not in str(err) and "\n" not in str(err)
    assert elapsed < 1.0


def test_opening_a_nonexistent_port_is_one_clear_error():
    start = time.monotonic()
    with pytest.raises(ColibriError, match=r"^cannot open serial port /dev/ttyCOLIBRI-none: .*No such file"):
        SerialLink.open("/dev/ttyCOLIBRI-none")
    assert time.monotonic() - start < 1.0


def test_opening_a_port_twice_is_refused(board):
    link = SerialLink.open(board.path)
    try:
        with pytest.raises(ColibriError, match="another program"):
            SerialLink.open(board.path)
    finally:
        link.close()


def test_opening_does_not_assert_dtr_or_rts(board):
    link = SerialLink.open(board.path)
    try:
        assert link.port.dtr is False and link.port.rts is False
    finally:
        link.close()


class RecordingPort:
    """Stands in for a pyserial port and records what is done to its control lines."""

    dtr = rts = exclusive = None

    def __init__(self, url, **kwargs):
        self.events = [("created", url)]
        self.kwargs = kwargs

    def __setattr__(self, name, value):
        if name in ("dtr", "rts", "exclusive"):
            self.events.append((name, value))
        object.__setattr__(self, name, value)

    def open(self):
        self.events.append(("open", None))

    def reset_input_buffer(self):
        self.events.append(("flush", None))

    def close(self):
        pass


def test_control_lines_are_released_before_opening_and_pulsed_only_on_reset(monkeypatch):
    monkeypatch.setattr(serial_link.serial, "serial_for_url", RecordingPort)
    port = SerialLink.open("/dev/ttyUSB9").port
    assert port.events == [
        ("created", "/dev/ttyUSB9"),
        ("dtr", False),
        ("rts", False),
        ("exclusive", True),
        ("open", None),
    ]
    port = SerialLink.open("/dev/ttyUSB9", reset=True).port
    opened = port.events.index(("open", None))
    assert ("rts", True) not in port.events[:opened]
    assert port.events[opened + 1 :] == [("dtr", False), ("rts", True), ("flush", None), ("rts", False)]
    port = SerialLink.open("socket://127.0.0.1:1").port
    assert ("exclusive", True) not in port.events


def test_a_port_without_modem_lines_cannot_reset(board):
    with pytest.raises(ColibriError, match="cannot reset the board through RTS"):
        SerialLink.open(board.path, reset=True)


# ---- the real firmware: qemu-rv32 through SerialLink ------------------------------------------


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(0.9, 40, 0.95, 0.02, 1234)], ids=["greedy", "sampled"]
)
@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_qemu_rv32_through_serial_link_matches_the_reference(builder, sampling):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, board="qemu-rv32")
    request = RunRequest([1, 45, 300, 7], 20, sampling, stop_at_eos=False)
    result = run_on_board(board, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image)
    ref = Reference(plan, art.weights.read_bytes()).generate(request.prompt, request.steps, sampling, False)
    assert result.hello["board"] == "qemu-rv32" and result.hello["model"] == art.model_hash()
    assert len(result.tokens) == request.steps
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests
    assert int(result.stats["decode_instret"]) > 0  # -icount: exact instruction counts arrive in stats


def test_a_reset_while_the_request_line_is_arriving(board):
    # A board that acknowledges pieces of the request (protocol 2) resets after reading the first
    # piece: the host says so at once, in one line, instead of waiting for an ack that never comes.
    def reset_mid_request(b):
        b.write(b"".join(BANNER))
        b.write(encode_frame(0, "hello", {**parse_frame(hello()).fields, "proto": 2}))
        deadline = time.monotonic() + 3
        got = b""
        while len(got) < 64 and time.monotonic() < deadline:  # the first piece only
            ready, _, _ = select.select([b.master], [], [], 0.05)
            if ready:
                got += os.read(b.master, 4096)
        assert got.startswith(b"@CLB 0 request") and b"\n" not in got, got
        b.write(b"".join(BANNER).replace(b"POWERON", b"SW_CPU_RESET") + hello(0))
        b.idle(5)

    long_request = RunRequest(list(range(1, 60)), 6, stop_at_eos=False)  # several 64-byte pieces
    err, elapsed = run_link(board, reset_mid_request, request=long_request)
    assert isinstance(err, ColibriError), err
    msg = str(err)
    assert "\n" not in msg and "the board reset during the run" in msg and "after 0 of 6 tokens" in msg, msg
    assert elapsed < 0.5  # at once, not after a timeout
