"""Linux boards over SSH (--remote), against a real OpenSSH server started by the tests (tests/sshd.py):
verify PASS for host and linux-aarch64 (the latter under a qemu-aarch64 remote prefix, since this
machine cannot execute aarch64 binaries), bit-identical to local runs; content-addressed copies (a
second run sends no weight byte); and every fault ending in one line with nothing half-copied."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, run_cli
from sshd import ALIAS, Sshd, processes_running

from generator.device.remote import Blob, Remote, copy_blob, default_remote, file_sha256, parse_remote
from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.errors import ColibriError

pytestmark = pytest.mark.slow  # starts its own sshd and deploys over SSH

PROMPT = "1,21,51,68,104,44,74,51,100"  # "In the beginning"
CTX = 64
# Stands between the remote shell and the firmware and holds the request back for 3 s: the firmware
# has started and sent its hello, and is still running when a test pulls the rug.
HOLD_PREFIX = "sh -c '{ sleep 3; cat; } | \"$@\"' sh"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "board-cache"


@pytest.fixture
def board_env(sshd, cache, monkeypatch):
    """The environment a user with that board in ~/.ssh/config would have (the tests' own config)."""
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", sshd.ssh_command())
    monkeypatch.setenv("COLIBRI_REMOTE_CACHE", str(cache))
    return sshd


def build(builder, board):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", CTX, board)
    return board, art


def cli(builder, board, *args):
    _, art = build(builder, board)
    return run_cli(*args, "--board", board, "--ctx", CTX, "--out", art.out_dir, "--json")


def one_line_error(done, *fragments) -> str:
    """The command failed with exit 2 and said so in exactly one line, nothing else on stderr."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("colibri: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_only_complete(cache: Path, expected: set[Path] = frozenset()) -> None:
    """The board's cache holds complete copies only (named by their SHA-256), no temporary file."""
    entries = sorted(cache.iterdir()) if cache.exists() else []
    names = {e.name for e in entries}
    assert names == {file_sha256(p) for p in expected}, names
    for entry in entries:
        assert hashlib.sha256(entry.read_bytes()).hexdigest() == entry.name


def test_remote_specs_parse_and_options_in_disguise_are_refused():
    assert parse_remote("rock5b") == Remote("rock5b")
    assert parse_remote("pi@192.168.1.20:2222") == Remote("192.168.1.20", "pi", 2222)
    assert parse_remote("admin@[fe80::1]:22") == Remote("fe80::1", "admin", 22)
    assert str(parse_remote("admin@[fe80::1]:22")) == "admin@[fe80::1]:22"
    for bad in ("", "-oProxyCommand=touch /tmp/x", "host:0", "host:70000", "a b", "user@", "@host", "host;ls"):
        with pytest.raises(ColibriError, match=r"expected \[user@\]host\[:port\]"):
            parse_remote(bad)


@pytest.mark.parametrize("board, prefix", [("host", ""), ("linux-aarch64", "qemu-aarch64")])
def test_verify_passes_over_ssh_bit_identical_to_a_local_run_and_a_second_run_copies_nothing(
    board, prefix, builder, board_env, cache, monkeypatch
):
    monkeypatch.setenv("COLIBRI_REMOTE_PREFIX", prefix)
    b, art = build(builder, board)
    local = run_on_board(
        b, art.program, art.weights, RunRequest([int(t) for t in PROMPT.split(",")], 24), art.model_hash()
    )

    first = cli(builder, board, "verify", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 24, "--greedy")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["pass"] is True
    assert out["firmware"]["tokens"] == local.tokens and out["firmware"]["logits_sha256"] == local.digests
    remote = out["remote"]
    assert remote["firmware_machine"] == ("aarch64" if board == "linux-aarch64" else "x86_64")
    assert remote["kernels"] == local.hello["kernels"] and remote["cpu"] == local.hello["cpu"]
    sent = remote["bytes_sent"]
    assert sent["firmware"] == art.program.stat().st_size and sent["weights"] == art.weights.stat().st_size
    assert_only_complete(cache, {art.program, art.weights})

    # The same board by address instead of its alias: the same cache, so only the request goes.
    second = cli(
        builder,
        board,
        "verify",
        "--remote",
        f"root@127.0.0.1:{board_env.port}",
        "--prompt-ids",
        PROMPT,
        "--steps",
        24,
        "--greedy",
    )
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["pass"] is True and out["firmware"]["logits_sha256"] == local.digests
    assert out["remote"]["bytes_sent"] == {
        "firmware": 0,
        "weights": 0,
        "request": sent["request"],
        "total": sent["request"],
    }


def test_the_remote_defaults_to_colibri_remote_then_the_user_config_and_empty_runs_here(
    builder, board_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("COLIBRI_REMOTE", ALIAS)
    done = cli(builder, "host", "run", "--prompt-ids", PROMPT, "--steps", 4)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["remote"]["host"] == ALIAS
    done = cli(builder, "host", "run", "--remote", "", "--prompt-ids", PROMPT, "--steps", 4)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["remote"] is None

    monkeypatch.delenv("COLIBRI_REMOTE")
    config = tmp_path / "config.toml"
    config.write_text(f'[remote]\nhost = "root@127.0.0.1:{board_env.port}"\n')
    monkeypatch.setenv("COLIBRI_CONFIG", str(config))
    done = cli(builder, "host", "run", "--prompt-ids", PROMPT, "--steps", 4)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["remote"]["host"] == f"root@127.0.0.1:{board_env.port}"
    config.write_text("[remote]\nhost = 5\n")
    one_line_error(cli(builder, "host", "run", "--prompt-ids", PROMPT, "--steps", 4), "[remote] host must be a string")


def test_bench_over_ssh_probes_the_boards_bandwidth_and_reports_its_peak_rss(builder, board_env, cache):
    _, art = build(builder, "host")
    done = cli(builder, "host", "bench", "--remote", ALIAS, "--repeat", 2, "--steps", 8)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["read_bandwidth_bytes_s"]["min"] > 0 and out["peak_rss_bytes"] > 0
    # Two runs, one copy: the second found everything in the board's cache.
    assert out["remote"]["bytes_sent"]["weights"] == art.weights.stat().st_size
    assert out["remote"]["bytes_sent"]["firmware"] == art.program.stat().st_size


def test_a_key_the_board_does_not_accept_is_one_line(builder, board_env, cache, monkeypatch):
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", board_env.ssh_command(name="wrong-key", identity="wrong_key"))
    one_line_error(
        cli(builder, "host", "run", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        f"{ALIAS} refused the login",
        "Permission denied (publickey)",
        "never a password",
    )
    assert not cache.exists()


def test_an_unknown_host_key_says_how_to_accept_it(builder, board_env, cache, monkeypatch):
    command = board_env.ssh_command(name="no-known-hosts", known_hosts="empty_known_hosts")
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", command)
    line = one_line_error(
        cli(builder, "host", "verify", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        f"the host key of {ALIAS} is not in known_hosts",
        f"`{command} {ALIAS}`",
        f"ssh-keyscan -p {board_env.port} 127.0.0.1 >> {board_env.root}/empty_known_hosts`",
    )
    assert "batch mode" in line
    assert not cache.exists()


def test_a_board_nobody_answers_on_is_unreachable(builder, board_env, cache):
    from sshd import free_port

    one_line_error(
        cli(builder, "host", "run", "--remote", f"root@127.0.0.1:{free_port()}", "--prompt-ids", PROMPT, "--steps", 16),
        "cannot reach root@127.0.0.1:",
        "Connection refused",
    )


def watch_for_firmware(program: Path, then) -> threading.Thread:
    """Call then(pid) once the firmware runs on the board (argv[0] ./<its SHA-256>)."""
    argv0 = f"./{file_sha256(program)}"

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = processes_running(argv0)
            if pids:
                then(pids[0])
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sshd_stopped_mid_run_is_a_dropped_connection_and_leaves_nothing_behind(builder, tmp_path, cache, monkeypatch):
    server = Sshd(tmp_path / "sshd")
    try:
        monkeypatch.setenv("COLIBRI_SSH_COMMAND", server.ssh_command())
        monkeypatch.setenv("COLIBRI_REMOTE_CACHE", str(cache))
        monkeypatch.setenv("COLIBRI_REMOTE_PREFIX", HOLD_PREFIX)
        _, art = build(builder, "host")
        watcher = watch_for_firmware(art.program, lambda pid: server.stop())
        one_line_error(
            cli(builder, "host", "run", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
            f"the connection to {ALIAS} dropped during the run",
            "closed by remote host",
        )
        watcher.join()
    finally:
        server.stop()
    assert_only_complete(cache, {art.program, art.weights})
    # The firmware does not outlive its connection.
    deadline = time.monotonic() + 20
    while processes_running(f"./{file_sha256(art.program)}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_running(f"./{file_sha256(art.program)}")


def test_the_firmware_killed_on_the_board_is_said_so(builder, board_env, cache, monkeypatch):
    monkeypatch.setenv("COLIBRI_REMOTE_PREFIX", HOLD_PREFIX)
    _, art = build(builder, "host")
    watcher = watch_for_firmware(art.program, lambda pid: os.kill(pid, signal.SIGKILL))
    one_line_error(
        cli(builder, "host", "run", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        f"the firmware was killed on {ALIAS} by signal 9 (SIGKILL)",
        "out-of-memory killer",
        "dmesg",
    )
    watcher.join()
    assert_only_complete(cache, {art.program, art.weights})


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB filesystem: the firmware and the weight image do not fit."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_board_without_room_is_refused_before_copying_with_the_numbers(builder, board_env, small_tmpfs, monkeypatch):
    monkeypatch.setenv("COLIBRI_REMOTE_CACHE", str(small_tmpfs / "cache"))
    _, art = build(builder, "host")
    need = art.program.stat().st_size + art.weights.stat().st_size
    line = one_line_error(
        cli(builder, "host", "verify", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        f"not enough space on {ALIAS}: {small_tmpfs}/cache has 65,536 bytes free",
        f"the firmware and the weight image need {need:,}",
        "nothing was copied",
    )
    assert "COLIBRI_REMOTE_CACHE" in line
    assert_only_complete(small_tmpfs / "cache")


def test_a_copy_cut_short_or_out_of_room_is_never_kept(builder, board_env, small_tmpfs, tmp_path):
    _, art = build(builder, "host")
    weights = art.weights
    remote = parse_remote(ALIAS)
    cache = small_tmpfs / "cache"
    cache.mkdir()
    blob = Blob("weights", "weight image", weights, file_sha256(weights), weights.stat().st_size, "644")
    # The disk fills up halfway (the check before copying is what normally prevents this).
    with pytest.raises(
        ColibriError,
        match=r"copying the weight image to colibri-board failed: .*No space left "
        r"on device \(nothing incomplete is kept on the board\)",
    ):
        copy_blob(remote, str(cache), blob, None)
    assert_only_complete(cache)
    # The stream ends early, as when the host dies mid-copy: the board sees fewer bytes than announced.
    short = tmp_path / "short.img"
    short.write_bytes(weights.read_bytes()[:30000])
    with pytest.raises(ColibriError, match="received 30000 of 40000 bytes"):
        copy_blob(remote, str(cache), Blob("weights", "weight image", short, "0" * 64, 40000, "644"), None)
    assert_only_complete(cache)


def test_the_wrong_architecture_is_refused_before_copying(builder, board_env, cache, monkeypatch):
    # linux-aarch64 without its test prefix: the board (this machine) says x86_64.
    monkeypatch.setenv("COLIBRI_REMOTE_PREFIX", "")
    one_line_error(
        cli(builder, "linux-aarch64", "run", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        f"{ALIAS} is an x86_64 machine (uname -m) but board linux-aarch64 is for aarch64",
        "nothing was copied",
        "--board host matches it",
    )
    assert not any(cache.iterdir())


def test_a_board_whose_uname_says_aarch64_is_refused_for_host(builder, tmp_path, cache, monkeypatch):
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "uname").write_text("#!/bin/sh\necho aarch64\n")
    (fake / "uname").chmod(0o755)
    server = Sshd(tmp_path / "sshd", extra_config=f"SetEnv PATH={fake}:/usr/local/bin:/usr/bin:/bin")
    try:
        monkeypatch.setenv("COLIBRI_SSH_COMMAND", server.ssh_command())
        monkeypatch.setenv("COLIBRI_REMOTE_CACHE", str(cache))
        one_line_error(
            cli(builder, "host", "run", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
            f"{ALIAS} is an aarch64 machine (uname -m) but board host is for x86_64",
            "--board linux-aarch64 matches it",
        )
    finally:
        server.stop()
    assert not any(cache.iterdir())


def test_remote_is_for_linux_boards_only(builder):
    one_line_error(
        run_cli("run", "--board", "qemu-rv32", "--remote", ALIAS, "--prompt-ids", PROMPT, "--steps", 16),
        "--remote is for Linux boards",
    )
    line = one_line_error(
        run_cli("run", "--remote=-oProxyCommand=sh", "--prompt-ids", PROMPT, "--steps", 16),
        "--remote: expected [user@]host[:port]",
    )
    assert not re.search("Traceback", line)


def test_memory_budget_auto_is_resolved_on_the_board_not_here(builder, board_env, cache):
    """The CLI cannot see the board's cgroup or memory: the firmware resolves auto there, bench
    reports what it chose, and one the board cannot hold is the firmware's one line."""
    done = cli(builder, "host", "bench", "--remote", ALIAS, "--repeat", 1, "--steps", 4, "--memory-budget", "auto")
    assert done.returncode == 0, done.stderr
    budget = json.loads(done.stdout)["memory_budget"]
    assert budget["unlimited"] and budget["auto"]["whole_model"] and budget["auto"]["margin"] == 128 * 2**20
    assert budget["auto"]["source"] in ("cgroup-v2", "cgroup-v1", "meminfo") and budget["auto"]["found"] > 0
    line = one_line_error(
        cli(
            builder,
            "host",
            "run",
            "--remote",
            ALIAS,
            "--prompt-ids",
            PROMPT,
            "--steps",
            4,
            "--memory-budget",
            "auto-1T",
        ),
        "error 102: --memory-budget auto: ",
        " - margin 1099511627776 B = 0 B cannot hold this model",
    )
    assert "too small" not in line, "refused by the firmware on the board, not by the CLI here"


@pytest.mark.parametrize(
    "text, says",
    [
        ("[remote]\nhost = " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 deep"),
        ("[remote]\nhost = 'x'\n" + "# padding\n" * 120_000, "exceed the limit"),
    ],
)
def test_the_user_config_is_read_within_the_file_limits(tmp_path, monkeypatch, text, says):
    config = tmp_path / "config.toml"
    config.write_text(text)
    monkeypatch.delenv("COLIBRI_REMOTE", raising=False)
    monkeypatch.setenv("COLIBRI_CONFIG", str(config))
    with pytest.raises(ColibriError, match=says):
        default_remote("host")
