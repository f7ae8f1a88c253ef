"""Every file a model or a user gives is read within a size limit checked before its first byte,
as a regular file (a named pipe or a device is refused, not waited on or read forever), and JSON
and TOML nested no deeper than files.MAX_NESTING (Python's parsers recurse): each case is one
line, exit status 2 and nothing built, before any build (docs/errors.md#file-limits)."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL

from generator import files
from generator.errors import ColibriError
from generator.files import MAX_NESTING, MiB
from generator.model import vocab_limits

DEEP = "[" * 100_000 + "]" * 100_000  # the depth that ended in a RecursionError
NESTED = f"nested more than {MAX_NESTING} deep"
PIPE = "is a named pipe, not a regular file"
DEVICE = "is a character device, not a regular file"


def sparse(path: Path, size: int) -> None:
    """A file of `size` bytes that takes no disk space (a 20 GB config.json)."""
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def replace_header(model: Path, text: bytes) -> None:
    blob = (model / "model.safetensors").read_bytes()
    (n,) = struct.unpack_from("<Q", blob)
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n :])


def sharded(model: Path, index: str) -> None:
    (model / "model.safetensors").rename(model / "shard.safetensors")
    (model / "model.safetensors.index.json").write_text(index)


def with_template(model: Path) -> None:
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")


RUN = ["run", "--prompt", "In the beginning", "--steps", "2"]
CHAT = ["chat", "--steps", "2"]

# case: (what is done to the model directory (model, tmp_path) -> None, the command's arguments
# after --model (formatted with tmp=tmp_path), standard input, a pattern of the error line)
CASES = {
    "config.json nested 100,000 deep": (
        lambda m, t: (m / "config.json").write_text(DEEP),
        ["build"],
        None,
        "config.json: JSON " + NESTED,
    ),
    "config.json of 20 GB (sparse)": (
        lambda m, t: sparse(m / "config.json", 20 << 30),
        ["build"],
        None,
        "config.json: 21,474,836,480 bytes exceed the limit of 16,777,216",
    ),
    "config.json a named pipe": (lambda m, t: fifo(m / "config.json"), ["build"], None, "config.json: " + PIPE),
    "generation_config.json nested 100,000 deep": (
        lambda m, t: (m / "generation_config.json").write_text(DEEP),
        ["build"],
        None,
        "generation_config.json: JSON " + NESTED,
    ),
    "generation_config.json a named pipe": (
        lambda m, t: fifo(m / "generation_config.json"),
        RUN,
        None,
        "generation_config.json: " + PIPE,
    ),
    "the safetensors header nested 100,000 deep": (
        lambda m, t: replace_header(m, DEEP.encode()),
        ["build"],
        None,
        "model.safetensors: safetensors header: JSON " + NESTED,
    ),
    "the shard index nested 100,000 deep": (
        lambda m, t: sharded(m, '{"weight_map": ' + DEEP + "}"),
        ["build"],
        None,
        "model.safetensors.index.json: JSON " + NESTED,
    ),
    "the shard index of 100 MB (sparse)": (
        lambda m, t: sharded(m, "") or sparse(m / "model.safetensors.index.json", 100 * MiB),
        ["build"],
        None,
        "index.json: 104,857,600 bytes exceed the limit of 67,108,864",
    ),
    "tokenizer.json nested 100,000 deep": (
        lambda m, t: (m / "tokenizer.json").write_text('{"model": ' + DEEP + "}"),
        RUN,
        None,
        "tokenizer.json: JSON " + NESTED,
    ),
    "tokenizer.json a named pipe": (lambda m, t: fifo(m / "tokenizer.json"), RUN, None, "tokenizer.json: " + PIPE),
    "tokenizer.json over its limit (sparse)": (
        lambda m, t: sparse(m / "tokenizer.json", vocab_limits.MAX_TOKENIZER_JSON_BYTES + 1),
        RUN,
        None,
        "tokenizer.json: 134,217,729 bytes exceed the limit of 134,217,728",
    ),
    "tokenizer_config.json nested 100,000 deep": (
        lambda m, t: (m / "tokenizer_config.json").write_text('{"chat_template": ' + DEEP + "}"),
        CHAT,
        "hello\n",
        "tokenizer_config.json: JSON " + NESTED,
    ),
    "chat_template.jinja not UTF-8": (
        lambda m, t: (m / "chat_template.jinja").write_bytes(b"{{ messages[0].content }}\xff"),
        CHAT,
        "hello\n",
        "chat_template.jinja: not UTF-8 text$",
    ),
    "chat_template.jinja a named pipe": (
        lambda m, t: fifo(m / "chat_template.jinja"),
        CHAT,
        "hello\n",
        "chat_template.jinja: " + PIPE,
    ),
    "chat_template.jinja of 2 MB (sparse)": (
        lambda m, t: sparse(m / "chat_template.jinja", 2 * MiB),
        CHAT,
        "hello\n",
        "chat_template.jinja: 2,097,152 bytes exceed the limit of 1,048,576",
    ),
    "--chat-template /dev/zero": (lambda m, t: None, [*CHAT, "--chat-template", "/dev/zero"], "hi\n", DEVICE),
    "--prompt-file /dev/zero": (
        lambda m, t: None,
        ["run", "--prompt-file", "/dev/zero", "--steps", "2"],
        None,
        "--prompt-file /dev/zero: " + DEVICE,
    ),
    "--prompt-file a named pipe": (
        lambda m, t: fifo(t / "prompt"),
        ["run", "--prompt-file", "{tmp}/prompt", "--steps", "2"],
        None,
        "/prompt: " + PIPE,
    ),
    "--prompt-file of 1 GB (sparse)": (
        lambda m, t: sparse(t / "prompt", 1 << 30),
        ["run", "--prompt-file", "{tmp}/prompt", "--steps", "2"],
        None,
        "prompt: 1,073,741,824 bytes exceed the limit of 4,194,304",
    ),
    "--prompt-file - of 5 MB": (
        lambda m, t: None,
        ["run", "--prompt-file", "-", "--steps", "2"],
        "a" * (5 * MiB),
        r"--prompt-file - \(standard input\): more than the limit of 4,194,304 bytes",
    ),
    "eval --text /dev/zero": (lambda m, t: None, ["eval", "--text", "/dev/zero"], None, "--text /dev/zero: " + DEVICE),
    "eval --text of 100 MB (sparse)": (
        lambda m, t: sparse(t / "text", 100 * MiB),
        ["eval", "--text", "{tmp}/text"],
        None,
        "text: 104,857,600 bytes exceed the limit of 67,108,864",
    ),
    "a board file nested 100,000 deep": (
        lambda m, t: (t / "deep.toml").write_text("a = " + DEEP),
        ["build", "--board", "{tmp}/deep.toml"],
        None,
        "deep.toml: TOML " + NESTED,
    ),
    "a board file whose key has 100,000 dots": (
        lambda m, t: (t / "dots.toml").write_text("a" + ".a" * 100_000 + " = 1"),
        ["build", "--board", "{tmp}/dots.toml"],
        None,
        "dots.toml: TOML " + NESTED,
    ),
    "a board file of 2 MB": (
        lambda m, t: (t / "big.toml").write_text("# " + "x" * (2 * MiB)),
        ["build", "--board", "{tmp}/big.toml"],
        None,
        "big.toml: 2,097,154 bytes exceed the limit of 1,048,576",
    ),
}


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, path)
    return path


def refused(capsys, monkeypatch, argv: list[str], stdin: str | None, out: Path) -> str:
    """The CLI's main in this process: exit status 2, nothing built, one error line, returned."""
    from generator.cli import main

    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), lines
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_past_its_limits_is_one_line_before_anything_is_read_whole(case, model, tmp_path, capsys, monkeypatch):
    import re

    damage, args, stdin, message = CASES[case]
    damage(model, tmp_path)
    argv = [a.format(tmp=tmp_path) for a in args]
    line = refused(capsys, monkeypatch, [argv[0], "--model", str(model), *argv[1:]], stdin, tmp_path / "out")
    assert re.search(message, line), line


def test_a_colibri_toml_nested_100000_deep_is_one_line(tmp_path, monkeypatch):
    from generator import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "colibri.toml").write_text("[run]\nsteps = " + DEEP)
    with pytest.raises(ColibriError, match="colibri.toml: TOML " + NESTED):
        cli.parse_args(["run"])


@pytest.mark.parametrize(
    "text, depth",
    [
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[", "\\\\", "\\"[[", {"]]": "{{"}]', 2),  # brackets, escaped quotes and backslashes in strings
        ('"\\\\\\"[["', 0),
        ("[" * 65 + "]" * 65, 65),
    ],
)
def test_json_depth_is_counted_outside_strings(text, depth):
    assert files._json_depth(text.encode()) == depth
    if depth <= MAX_NESTING:
        files.check_json_nesting(text, "x.json")
        assert json.loads(text) is not None


def test_a_real_board_file_and_json_within_the_limits_pass(tmp_path):
    """Every board of targets/ and the bundled model's JSON files are far inside the limits."""
    for board in sorted((files.REPO / "targets").glob("*.toml")):
        assert files.load_toml(board, board.name)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        files.check_json_nesting(files.read_limited(DEFAULT_MODEL / name, files.CONFIG_BYTES * 8, name), name)


def test_a_file_that_grows_past_its_limit_while_read_is_refused(tmp_path, monkeypatch):
    """The size is checked on the open file and again on what was read: a file that grows between
    its stat and its read is cut at the limit and refused."""
    path = tmp_path / "grows"
    path.write_bytes(b"x" * 10)
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real_fstat(fd)[:6], 0, *real_fstat(fd)[7:])))
    path.write_bytes(b"x" * 100)
    with pytest.raises(ColibriError, match="grows: more than the limit of 50 bytes: it grew while it was read"):
        files.read_limited(path, 50, "grows")
