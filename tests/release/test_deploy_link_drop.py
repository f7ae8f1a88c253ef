"""A deploy whose SSH link drops at any moment leaves the board on a working slot, and the user
learns where it ended. The board is a real OpenSSH server on a localhost port (tests/sshd.py) behind
a TCP relay of the test's own that cuts the connection at a chosen moment: part-way through the
payload, as the self-test starts or ends, just before or just after the rename that switches
`current`; or the session's sshd is killed. The moments are held by two wrappers on the board,
which wait at a gate the test opens after the cut: the firmware's COLIBRI_PREFIX (the self-test)
and an `mv` first on the session's PATH (the switch), both set by the sshd's ForceCommand. After
each cut, `current` points at a slot that passes its self-test, no lock or half slot is left, and
the host said what happened in one line, exit status 1."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sshd import ALIAS, Sshd, descendants  # noqa: E402
from test_deploy import variant  # noqa: E402

from generator.device.remote import parse_remote  # noqa: E402
from generator.release import deploy  # noqa: E402
from generator.release.deploy import SLOT_SCRIPT, payload_of  # noqa: E402

pytestmark = pytest.mark.slow  # a release build and real sshd


class Relay:
    """A TCP relay from a localhost port to the board's sshd that cuts its connections on demand:
    cut() at once, cut_after(n) once n bytes went towards the board; refuse() turns every new
    connection away (a board that stays unreachable)."""

    def __init__(self, port: int):
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.budget: int | None = None
        self.refusing = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            board = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.pairs.append((client, board))
            threading.Thread(target=self._pump, args=(client, board, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(board, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, towards_board: bool) -> None:
        try:
            while data := src.recv(65536):
                if towards_board and self.budget is not None:
                    with self.lock:
                        keep = min(len(data), self.budget)
                        self.budget -= keep
                    dst.sendall(data[:keep])
                    if self.budget == 0:
                        self.budget = None
                        self.cut()
                        return
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def cut_after(self, count: int) -> None:
        self.budget = count

    def refuse(self, refusing: bool = True) -> None:
        self.refusing = refusing

    def close(self) -> None:
        self.listener.close()
        self.cut()


GATE = """\
gate() { # NAME: when armed (for a command line containing the armed file's text), wait for NAME.go
    [ -e "$G/$1.armed" ] || return 0
    case "$ARGS" in *"$(cat "$G/$1.armed")"*) ;; *) return 0 ;; esac
    rm -f "$G/$1.armed"
    : > "$G/$1.reached"
    i=0
    while [ ! -e "$G/$1.go" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    rm -f "$G/$1.go"
}
"""


class Board:
    """The board: sshd, the relay before it, the gates and the slots' directory."""

    def __init__(self, where: Path):
        where.mkdir(parents=True, exist_ok=True)
        self.gates = where / "gates"
        self.gates.mkdir()
        bin_dir = where / "bin"
        bin_dir.mkdir()
        mv = shutil.which("mv")
        header = f'#!/bin/sh\nG={shlex.quote(str(self.gates))}\nARGS="$*"\n{GATE}'
        hold = where / "hold-selftest"
        hold.write_text(f'{header}gate selftest-start\n"$@"\nstatus=$?\ngate selftest-end\nexit $status\n')
        (bin_dir / "mv").write_text(
            f'{header}case "$*" in\n'
            f'    *"/current.new "*/current) gate before-rename; {mv} "$@"; status=$?; gate after-rename; exit $status ;;\n'
            f'esac\nexec {mv} "$@"\n'
        )
        for f in (hold, bin_dir / "mv"):
            f.chmod(0o755)
        # Every session runs under the prefix and the PATH with the wrapped mv (set after the login
        # shell's own start-up files, which may set PATH).
        self.sshd = Sshd(
            where / "sshd",
            extra_config=f'ForceCommand COLIBRI_PREFIX={hold} PATH={bin_dir}:$PATH exec sh -c "$SSH_ORIGINAL_COMMAND"',
        )
        self.relay = Relay(self.sshd.port)
        config = self.sshd.client_config()
        config.write_text(config.read_text().replace(f"Port {self.sshd.port}", f"Port {self.relay.port}"))
        known = self.sshd.root / "known_hosts"
        host_key = known.read_text().split(" ", 1)[1]
        known.write_text(known.read_text() + f"[127.0.0.1]:{self.relay.port} {host_key}")
        self.ssh = shlex.join(["ssh", "-F", str(config)])
        self.root = where / "slots-root"

    def arm(self, gate: str, matching: str = "") -> None:
        (self.gates / f"{gate}.armed").write_text(matching)

    def reached(self, gate: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not (self.gates / f"{gate}.reached").exists():
            assert time.monotonic() < deadline, f"the deploy never reached {gate}"
            time.sleep(0.05)
        (self.gates / f"{gate}.reached").unlink()

    def go(self, gate: str) -> None:
        (self.gates / f"{gate}.go").write_text("")

    def kill_sessions(self) -> None:
        """SIGKILL every session sshd of the server (what a crashing or OOM-killed sshd does)."""
        for pid in descendants(self.sshd.proc.pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def slot(self, *args: str) -> subprocess.CompletedProcess:
        """colibri-slot run on the board's side (here: locally, as the board's own shell would)."""
        return subprocess.run(["sh", str(SLOT_SCRIPT), *args], capture_output=True, text=True, timeout=120)

    def current(self) -> str:
        return os.readlink(self.root / "current").removeprefix("slots/")

    def assert_working(self, slot: str) -> None:
        """current is `slot`, it passes its self-test, and no lock or half slot is left behind."""
        assert self.current() == slot
        test = self.slot("selftest", str(self.root))
        assert test.returncode == 0 and " selftest result=pass " in test.stdout, test.stdout + test.stderr
        assert not (self.root / "deploying").exists()
        assert not [p for p in (self.root / "slots").iterdir() if p.name.startswith(".")]
        assert not [p for p in (self.root / "incoming").iterdir() if not p.name.startswith(".")]

    def stop(self) -> None:
        self.relay.close()
        self.sshd.stop()


@pytest.fixture(scope="module")
def release(signed_host_release):
    """The session's host release (a release compiles from source: one per worker, shared with the
    release tests); each test deploys copies of it (variant)."""
    return signed_host_release.bundle


@pytest.fixture
def board(tmp_path):
    b = Board(tmp_path)
    yield b
    b.stop()


def start_deploy(board: Board, bundle: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "generator.cli", "deploy", str(bundle), "--remote", ALIAS, "--root", str(board.root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLIBRI_SSH_COMMAND=board.ssh),
    )


def finish(run: subprocess.Popen) -> tuple[int, str, str]:
    out, err = run.communicate(timeout=300)
    return run.returncode, out, err


def deploy_cleanly(board: Board, bundle: Path) -> str:
    code, out, err = finish(start_deploy(board, bundle))
    assert code == 0 and ": PASS: " in out, out + err
    return payload_of(bundle).slot


# (the gate the deploy is held at, how the link goes): each leaves the board on the new slot.
CUTS_AFTER_THE_TRANSFER = [
    ("selftest-start", "relay"),
    ("selftest-end", "relay"),
    ("before-rename", "relay"),
    ("after-rename", "relay"),
    ("selftest-start", "sshd killed"),
    ("after-rename", "sshd killed"),
]


@pytest.mark.parametrize("gate,how", CUTS_AFTER_THE_TRANSFER)
def test_a_link_cut_after_the_transfer_lets_the_board_finish_and_the_host_says_so(release, board, tmp_path, gate, how):
    first = deploy_cleanly(board, variant(release, tmp_path, "first"))
    new = variant(release, tmp_path, "second")
    board.arm(gate)
    run = start_deploy(board, new)
    board.reached(gate)
    board.relay.cut() if how == "relay" else board.kill_sessions()
    board.go(gate)
    code, out, err = finish(run)
    slot = payload_of(new).slot
    assert code == 1, out + err
    assert out.startswith(f"{ALIAS}: LINK DROPPED deploying slot {slot}: the connection to {ALIAS} dropped"), out
    assert f"reconnected: the deploy finished on the board; board is on slot {slot} (PASS)" in out, out
    assert len(out.splitlines()) == 1 and not err, out + err
    board.assert_working(slot)
    assert (board.root / "previous").read_text().strip() == first


def test_a_transfer_cut_short_installs_nothing_and_the_board_stays_on_its_slot(release, board, tmp_path):
    first = deploy_cleanly(board, variant(release, tmp_path, "first"))
    new = variant(release, tmp_path, "second")
    board.relay.cut_after(len(deploy.payload_tar(payload_of(new))) // 2)
    code, out, err = finish(start_deploy(board, new))
    slot = payload_of(new).slot
    assert code == 1, out + err
    assert f"LINK DROPPED deploying slot {slot}" in out, out + err
    assert (
        f"reconnected: the release did not arrive whole: nothing was installed; board is on slot {first} (PASS)" in out
    )
    board.assert_working(first)
    assert not (board.root / "slots" / slot).exists()
    # What a cut transfer leaves is a stale incoming directory, which the next deploy replaces.
    assert deploy_cleanly(board, new) == slot
    board.assert_working(slot)


def test_a_damaged_release_cut_during_its_self_test_is_rolled_back_on_the_board(release, board, tmp_path):
    first = deploy_cleanly(board, variant(release, tmp_path, "first"))
    broken = variant(release, tmp_path, "broken", damage=True)
    board.arm("selftest-start")
    run = start_deploy(board, broken)
    board.reached("selftest-start")
    board.relay.cut()
    board.go("selftest-start")
    code, out, err = finish(run)
    slot = payload_of(broken).slot
    assert code == 1
    assert (
        f"reconnected: slot {slot} failed its self-test on the board and was removed; board is on slot {first} (PASS)"
        in out
    )
    board.assert_working(first)
    assert not (board.root / "slots" / slot).exists()


def test_the_board_side_finishes_through_a_hangup_and_a_dead_stdout(release, board, tmp_path):
    """colibri-slot itself, without ssh: SIGHUP to its process group and its stdout's reader gone
    while the self-test is held; the deploy still switches current and exits 0."""
    payload = payload_of(release)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    shutil.copy(payload.program, incoming / "firmware")
    shutil.copy(payload.weights, incoming / "weights.img")
    board.arm("selftest-start")
    run = subprocess.Popen(
        ["sh", str(SLOT_SCRIPT), "deploy", str(board.root), payload.slot, str(incoming)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(os.environ, COLIBRI_PREFIX=str(tmp_path / "hold-selftest")),
    )
    board.reached("selftest-start")
    run.stdout.close()
    run.stderr.close()
    os.killpg(run.pid, signal.SIGHUP)
    board.go("selftest-start")
    assert run.wait(timeout=120) == 0
    assert board.current() == payload.slot
    assert (board.root / "last-deploy").read_text().split() == [payload.slot, "pass"]
    assert " selftest result=pass " in (board.root / "deploy.log").read_text()
    assert not (board.root / "deploying").exists()


def test_a_board_that_stays_unreachable_is_said_so_and_finishes_on_its_own(release, board, tmp_path, monkeypatch):
    deploy_cleanly(board, variant(release, tmp_path, "first"))
    new = payload_of(variant(release, tmp_path, "second"))
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", board.ssh)
    monkeypatch.setattr(deploy, "RECONNECT_SECONDS", 6)
    monkeypatch.setattr(deploy, "RETRY_SECONDS", 1)
    board.arm("selftest-start")
    outcome = []
    worker = threading.Thread(
        target=lambda: outcome.append(deploy.deploy_remote(parse_remote(ALIAS), new, str(board.root)))
    )
    worker.start()
    board.reached("selftest-start")
    board.relay.refuse()
    board.relay.cut()
    worker.join(timeout=120)
    (o,) = outcome
    assert o.outcome == "unreachable" and not o.passed
    assert o.line().startswith(f"{ALIAS}: UNREACHABLE: slot {new.slot}; the connection to {ALIAS} dropped")
    assert o.line().endswith("the board did not answer again in 6 s: where its deploy ended is unknown")
    board.go("selftest-start")
    status = board.slot("status", str(board.root), "60")
    assert f"current={new.slot} " in status.stdout and "deploying=no" in status.stdout, status.stdout
    board.assert_working(new.slot)


def test_a_second_deploy_is_refused_while_one_runs_and_a_stale_lock_is_taken_over(release, board, tmp_path):
    first, second = variant(release, tmp_path, "first"), variant(release, tmp_path, "second")
    board.arm("selftest-start")
    running = start_deploy(board, first)
    board.reached("selftest-start")
    code, out, err = finish(start_deploy(board, second))
    assert code == 2 and not out, out + err
    assert err.startswith(
        f"colibri: error: {ALIAS}: deploy refused: another deploy is running under {board.root} (pid "
    )
    assert len(err.splitlines()) == 1, err
    status = board.slot("status", str(board.root))
    assert "deploying=yes" in status.stdout, status.stdout
    on_board = board.slot("rollback", str(board.root))
    assert on_board.returncode == 2 and "another deploy is running" in on_board.stderr, on_board
    board.go("selftest-start")
    code, out, err = finish(running)
    assert code == 0, out + err
    board.assert_working(payload_of(first).slot)

    # A lock left by a deploy of an earlier boot, or by a process that is gone, is taken over.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    gone = subprocess.Popen(["true"])
    gone.wait()
    for holder in (f"{os.getpid()} 00000000-0000-0000-0000-000000000000", f"{gone.pid} {boot}"):
        (board.root / "deploying").write_text(holder + "\n")
        slot = deploy_cleanly(board, second if board.current() != payload_of(second).slot else first)
        board.assert_working(slot)


def test_rollback_self_tests_the_slot_it_goes_back_to_and_refuses_a_broken_one(release, board, tmp_path, monkeypatch):
    first = deploy_cleanly(board, variant(release, tmp_path, "first"))
    second = deploy_cleanly(board, variant(release, tmp_path, "second"))
    image = board.root / "slots" / first / "weights.img"
    blob = bytearray(image.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    image.write_bytes(bytes(blob))
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", board.ssh)
    done = run_cli("rollback", "--remote", ALIAS, "--root", board.root)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"colibri: error: {ALIAS}: rollback failed: the previous slot {first} fails its self-test: current stays {second}"
    )
    board.assert_working(second)
    on_board = board.slot("rollback", str(board.root))
    assert on_board.returncode == 2 and "fails its self-test" in on_board.stdout + on_board.stderr
    assert board.current() == second


def test_an_ansible_fleet_run_with_one_host_dropped_reconnects_and_reports_where_it_ended(release, tmp_path):
    a, b = Board(tmp_path / "a"), Board(tmp_path / "b")
    try:
        inventory = tmp_path / "inventory.ini"
        inventory.write_text(
            "[boards]\n"
            f"board-a ansible_host=127.0.0.1 ansible_port={a.relay.port} colibri_root={a.root}\n"
            f"board-b ansible_host=127.0.0.1 ansible_port={b.relay.port} colibri_root={b.root}\n"
            # piped: the boards' ForceCommand serves no sftp subsystem
            "[boards:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\n"
            "ansible_ssh_transfer_method=piped\n"
        )
        # One client config for both boards: b trusts a's key, a's known_hosts knows both.
        (b.sshd.root / "authorized_keys").write_text((a.sshd.root / "id_ed25519.pub").read_text())
        known = a.sshd.root / "known_hosts"
        known.write_text(known.read_text() + (b.sshd.root / "known_hosts").read_text())
        b.arm("selftest-start")
        run = subprocess.Popen(
            [sys.executable, "-m", "generator.cli", "deploy", str(release), "--inventory", str(inventory), "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, COLIBRI_SSH_COMMAND=a.ssh),
        )
        b.reached("selftest-start", seconds=240)
        b.relay.cut()
        b.go("selftest-start")
        code, out, err = finish(run)
        assert code == 1, out + err
        hosts = {h["host"]: h for h in json.loads(out)["hosts"]}
        slot = payload_of(release).slot
        assert hosts["board-a"]["outcome"] == "pass" and hosts["board-a"]["current"] == slot, hosts
        dropped = hosts["board-b"]
        assert dropped["outcome"] == "link dropped" and dropped["current"] == slot, hosts
        assert dropped["selftest"]["result"] == "pass", hosts
        assert dropped["detail"].startswith("the link dropped during the deploy ("), dropped
        assert dropped["detail"].endswith("; reconnected: the deploy finished on the board"), dropped
        a.assert_working(slot)
        b.assert_working(slot)
    finally:
        a.stop()
        b.stop()
