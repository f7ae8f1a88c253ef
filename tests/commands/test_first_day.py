"""A newcomer's first day, on a terminal, from a directory outside the checkout: run, chat, a bench
sweep and report through ./colibri, each on a pseudo-terminal as a user's shell gives it (so the
progress lines, chat's prompt and colours take their terminal paths), each ending with exit 0 and
no Python traceback anywhere in what the user saw."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # four commands through the wrapper, each starting the CLI and a firmware


def on_a_terminal(cwd, *args: str, typed: bytes = b"", timeout: float = 300) -> tuple[int, str]:
    """./colibri ARGS run in cwd with a pseudo-terminal as stdin, stdout and stderr; `typed` is
    written once the command has printed something (a user answering its prompt), then end-of-file
    (Ctrl-D). Returns the exit code and everything the terminal showed."""
    main, side = pty.openpty()
    process = subprocess.Popen(
        [str(REPO / "colibri"), *args], cwd=cwd, stdin=side, stdout=side, stderr=side, close_fds=True
    )
    os.close(side)
    shown, pending, deadline = b"", typed + b"\x04" if typed else b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other side closed: the command has ended
                break
            if not chunk:
                break
            shown += chunk
            if pending:
                os.write(main, pending)
                pending = b""
        elif process.poll() is not None:
            break
    else:
        process.kill()
        raise AssertionError(
            f"./colibri {' '.join(args)} did not end in {timeout} s:\n{shown.decode(errors='replace')}"
        )
    os.close(main)
    return process.wait(timeout=30), shown.decode(errors="replace")


def test_a_first_day_on_a_terminal_outside_the_checkout(tmp_path):
    (tmp_path / "colibri.toml").write_text("[run]\nsteps = 6\n")
    # The default model is a plain-text model: the user brings a chat template of their own.
    (tmp_path / "plain.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    day = [
        (("run", "--prompt", "In the beginning"), b""),
        (("chat", "--chat-template", "plain.jinja", "--steps", "6", "--greedy"), b"And God said\n"),
        (("bench", "--threads", "1,2", "--steps", "4", "--prompt-tokens", "4", "--repeat", "1"), b""),
        (("report",), b""),
    ]
    for args, typed in day:
        code, shown = on_a_terminal(tmp_path, *args, typed=typed)
        assert code == 0 and "Traceback" not in shown, f"./colibri {' '.join(args)} (exit {code}):\n{shown}"
    assert not (REPO / "colibri.toml").exists()
