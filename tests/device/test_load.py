"""Load: one Linux firmware serving 10,000 chat-turn requests in a row (each continuing in the KV
cache it holds) without its resident memory growing by more than a page per thousand requests,
and a conversation of 1,000 turns that keeps the context rules (the firmware holds exactly what
the turns sent; a full context is refused before a request is sent, and the next chat starts at 0)."""

from __future__ import annotations

import os
import re
import subprocess
import zlib

import pytest
from conftest import DEFAULT_MODEL

from generator.chat import ChatState
from generator.device.protocol import FrameReader
from generator.errors import ColibriError
from generator.model.chat_template import ChatTemplate
from generator.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # builds and drives the host firmware for tens of thousands of requests

CTX = 64
REQUESTS = 10_000
WARM_UP = 1_000  # every page the firmware will touch is touched by then (its context filled many times)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Firmware:
    """The host firmware on pipes: one request line in, its frames out until done or error."""

    def __init__(self, art):
        self.proc = subprocess.Popen(
            [str(art.program), "--weights", str(art.weights)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.reader, self.seq = FrameReader(), 0

    def request(self, body: str):
        line = f"@CLB {self.seq} request {body}"
        self.seq += 1
        self.proc.stdin.write(f"{line} *{zlib.crc32(line.encode()):08x}\n".encode())
        self.proc.stdin.flush()
        frames = []
        while not frames or frames[-1].kind not in ("done", "error"):
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, "the firmware ended"
            frames += [f for f in self.reader.feed(chunk) if f.kind != "hello"]
        return frames

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def test_ten_thousand_chat_turns_do_not_grow_the_firmwares_memory(builder):
    _, art, _ = builder.build(DEFAULT_MODEL, "q8_0", CTX)
    firmware = Firmware(art)
    held, pending, rss = 0, None, {}
    for i in range(REQUESTS):
        new = [5 + i % 400, 9 + i % 300]
        prompt = ([pending] if pending is not None else []) + new
        if held + len(prompt) + 3 > CTX:  # the context is full: a new conversation from 0
            held, prompt = 0, new
        frames = firmware.request(f"prompt={','.join(map(str, prompt))} steps=3 start={held}")
        done = frames[-1]
        assert done.kind == "done", done.fields
        tokens = [int(f.fields["id"]) for f in frames if f.kind == "token"]
        assert int(done.fields["held"]) == held + len(prompt) + len(tokens) - 1
        held, pending = int(done.fields["held"]), tokens[-1]
        if i + 1 in (WARM_UP, REQUESTS):
            rss[i + 1] = rss_bytes(firmware.proc.pid)
    assert firmware.close() == 0
    growth = rss[REQUESTS] - rss[WARM_UP]
    print(f"RSS after {WARM_UP:,} requests {rss[WARM_UP]:,} B, after {REQUESTS:,} {rss[REQUESTS]:,} B")
    assert growth <= PAGE * (REQUESTS - WARM_UP) // 1000, f"RSS grew by {growth:,} B"


class Echo:
    """A board that answers every turn with two fixed tokens: what the context rules need of it."""

    def __init__(self):
        self.held = 0

    def turn(self, plan, reply=(11, 12)):
        assert plan.start == self.held or plan.start == 0  # continues where it holds, or from 0
        self.held = plan.start + len(plan.prompt) + len(reply) - 1
        return list(reply), self.held


def test_a_thousand_turns_keep_the_context_rules():
    template = ChatTemplate(
        "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tokenizer = Tokenizer.for_model(DEFAULT_MODEL)
    board, state, turns, refused = Echo(), ChatState(template, tokenizer, 512, 2), 0, 0
    while turns < 1000:
        try:
            plan = state.plan_turn(f"turn {turns}")
        except ColibriError as e:  # full: said before anything is sent; the user starts a new chat
            need = re.search(r"the conversation would need (\d+) of the 512 positions", str(e))
            assert need and int(need.group(1)) > 512 and int(need.group(1)) > state.held
            refused += 1
            board, state = Echo(), ChatState(template, tokenizer, 512, 2)
            continue
        assert plan.start + len(plan.prompt) + plan.steps - 1 <= 512 and not plan.reprefilled
        reply, held = board.turn(plan)
        state.finish_turn(plan, reply, held)
        assert state.held == held <= 512
        turns += 1
    assert refused >= 10  # the context filled and was refused many times over the 1,000 turns
