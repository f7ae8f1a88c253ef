"""`chat` on a board over a serial port, as `run` does: --port, or the port looked up. The board is a
pseudo-terminal whose far end decodes with the NumPy reference on the esp32p4 build's weight image
and says the hello of that build, so the conversation is checked end to end against chat on host."""

from __future__ import annotations

import io
import json
import os
import select
import threading
import time
import tty

import pytest
from esp_rom_pty import pty_reads
from test_chat_and_eval import MESSAGES, chat_model  # noqa: F401 (a fixture)
from test_cli_commands import P4_PORT, PLAIN

from generator import cli
from generator.compile.image import map_image
from generator.device import ports
from generator.device.protocol import FrameReader, encode_frame, f32_bits
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference
from generator.verify import firmware_identity

pytestmark = pytest.mark.slow  # chat over a pseudo-terminal board decoding with the reference

CTX = 128


class DecodingPtyBoard:
    """An esp32p4 board on a pty: once the command opens the port, it says this build's hello and
    answers every request frame as the firmware would, the conversation kept in the reference's KV
    cache (protocol 1: the request arrives whole, unacknowledged)."""

    def __init__(self, board, art, plan):
        self.identity = firmware_identity(board, art, plan)
        self.reference = Reference(plan, map_image(art.weights))
        self.vocab = plan.spec.vocab_size
        self.master, slave = os.openpty()
        tty.setraw(slave)
        self.path = os.ttyname(slave)
        os.close(slave)  # the command is the only one to open it, so its opening is seen (no POLLHUP)
        self.requests: list[dict[str, str]] = []
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.master, view) :]

    def _opened(self) -> bool:
        poller = select.poll()
        poller.register(self.master, select.POLLIN | select.POLLHUP)
        while not self.stop.is_set():
            if not any(ev & select.POLLHUP for _, ev in poller.poll(50)):
                return True
        return False

    def _serve(self) -> None:
        try:
            if not self._opened():
                return
            time.sleep(0.3)  # pyserial flushes its input when it opens the port
            hello = {
                "proto": 1,
                "fw": "0.1.0",
                "arch": "llama",
                "vocab": self.vocab,
                "kernels": "scalar",
                **self.identity.fields(),
            }
            self._write(encode_frame(0, "hello", hello))
            seq, reader = 1, FrameReader()
            for data in pty_reads(self.master, self.stop, 4096):  # until the command closes the port
                reader.feed(data)
                for frame in reader.frames[len(self.requests) :]:
                    self.requests.append(frame.fields)
                    seq = self._answer(frame.fields, seq)
        except BaseException as e:  # reported by close()
            self.failure = e

    def _answer(self, fields: dict[str, str], seq: int) -> int:
        assert fields["temperature"] == f32_bits(0.0), "the fake board decodes greedily"
        prompt = [int(t) for t in fields["prompt"].split(",")]
        gen = self.reference.generate(
            prompt, int(fields["steps"]), SamplingParams(), fields["eos"] == "1", start=int(fields.get("start", "0"))
        )
        frames = [
            encode_frame(seq + i, "token", {"step": i, "id": t, "logits": d})
            for i, (t, d) in enumerate(zip(gen.tokens, gen.digests))
        ]
        seq += len(frames)
        frames.append(
            encode_frame(
                seq,
                "stats",
                {
                    "prompt": len(prompt),
                    "prefill_us": 10,
                    "decode": len(gen.tokens) - 1,
                    "decode_us": 40,
                    "forward_us": 30,
                },
            )
        )
        frames.append(
            encode_frame(seq + 1, "done", {"tokens": len(gen.tokens), "reason": gen.stop_reason, "held": gen.held})
        )
        self._write(b"".join(frames))
        return seq + 2

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        os.close(self.master)
        if self.failure:
            raise self.failure


@pytest.fixture
def p4_on_pty(builder, chat_model):  # noqa: F811 (the fixture imported above)
    board, art, plan = builder.build(chat_model, "q8_0", CTX, board="esp32p4")
    fake = DecodingPtyBoard(board, art, plan)
    yield fake, art
    fake.close()


def chat_json(monkeypatch, capsys, *args) -> list[dict]:
    """`colibri chat --json` with MESSAGES on standard input, one JSON turn per line."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(("\n".join(MESSAGES) + "\n").encode())))
    code = cli.main(["chat", "--ctx", str(CTX), "--steps", "6", "--greedy", "--json", *map(str, args)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return [json.loads(line) for line in out.out.splitlines()]


@pytest.mark.parametrize("port_given", [True, False], ids=["--port", "looked-up"])
def test_chat_over_a_serial_port_answers_as_chat_on_host(
    p4_on_pty,
    chat_model,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
    port_given,
):
    fake, art = p4_on_pty
    on_host = chat_json(monkeypatch, capsys, "--model", chat_model, "--out", tmp_path / "host")
    if port_given:
        where = ["--port", fake.path]
    else:
        monkeypatch.setattr(
            ports,
            "list_ports",
            lambda: [
                PLAIN,
                ports.Port(fake.path, P4_PORT.description, P4_PORT.vid, P4_PORT.pid, None, P4_PORT.esp_bridge),
            ],
        )
        where = []
    on_board = chat_json(monkeypatch, capsys, "--model", chat_model, "--board", "esp32p4", "--out", art.out_dir, *where)
    assert [t["user"] for t in on_board] == MESSAGES and len(fake.requests) == len(MESSAGES)
    assert [int(r.get("start", "0")) for r in fake.requests] == [t["start"] for t in on_board]
    assert on_board[1]["start"] == on_board[0]["held"] > 0  # the conversation continued in the board's cache
    same = ("reply", "prompt", "tokens", "logits_sha256", "start", "held", "stop_reason")
    assert [{k: t[k] for k in same} for t in on_board] == [{k: t[k] for k in same} for t in on_host]


def test_chat_without_a_port_looks_it_up_as_run_does(chat_model, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(ports, "list_ports", lambda: [PLAIN])  # a port, but none like an ESP32 board's
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"And God said\n")))
    said = {}
    for command, extra in (("run", ["--prompt-ids", "1,2,3", "--steps", "4"]), ("chat", [])):
        code = cli.main(
            [command, "--board", "esp32p4", "--model", str(chat_model), "--out", str(tmp_path / command), *extra]
        )
        said[command] = (code, capsys.readouterr().err)
        assert not (tmp_path / command).exists()  # refused before building
    assert said["chat"] == said["run"]
    assert said["run"][0] == 2 and "none looks like an ESP32 board (found only /dev/ttyS0)" in said["run"][1]
