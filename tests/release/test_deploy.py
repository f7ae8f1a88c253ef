"""deploy and rollback on Linux boards over real SSH (tests/sshd.py: OpenSSH servers on localhost
ports, each board's slots in a directory of its own): a release goes into a new slot, its self-test
runs there, and `current` moves only on PASS; a damaged image rolls back by itself. The fleet run
goes through the shipped playbook with the real ansible-playbook, two boards, one given a damaged
image (the host variable colibri_host_weights): it rolls back while the other updates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sshd import ALIAS, Sshd  # noqa: E402

from generator.device.remote import parse_remote  # noqa: E402
from generator.release.deploy import deploy_remote, payload_of, rollback_remote  # noqa: E402

pytestmark = pytest.mark.slow  # a release build and real sshd


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("releases")
    env_build = tmp_path_factory.mktemp("build")
    os.environ.setdefault("COLIBRI_BUILD_DIR", str(env_build))
    done = run_cli("release", "--board", "host", "--ctx", "64", "--out", out)
    assert done.returncode == 0, done.stderr
    return next(p for p in out.iterdir() if p.is_dir())


def variant(bundle: Path, where: Path, name: str, damage: bool = False) -> Path:
    """A copy of the bundle under another release name (another slot), its image damaged if asked."""
    copy = where / name
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["name"] = name
    (copy / "manifest.json").write_text(json.dumps(manifest))
    if damage:
        image = copy / manifest["weights"]["file"]
        blob = bytearray(image.read_bytes())
        blob[len(blob) // 2] ^= 0x10
        image.write_bytes(bytes(blob))
    return copy


@pytest.fixture(scope="module")
def boards(tmp_path_factory):
    servers = [Sshd(tmp_path_factory.mktemp(f"sshd{i}")) for i in range(2)]
    yield servers
    for s in servers:
        s.stop()


def slots(root: Path) -> tuple[str, str]:
    return os.readlink(root / "current"), (root / "previous").read_text().strip() if (
        root / "previous"
    ).exists() else ""


def test_deploy_switches_only_on_pass_and_rolls_back(release, boards, tmp_path, monkeypatch):
    server = boards[0]
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", server.ssh_command())
    root = tmp_path / "board"
    remote = parse_remote(ALIAS)
    first, second = payload_of(variant(release, tmp_path, "first")), payload_of(variant(release, tmp_path, "second"))
    broken = payload_of(variant(release, tmp_path, "broken", damage=True))

    a = deploy_remote(remote, first, str(root))
    assert a.passed and a.selftest.passed and a.current == first.slot
    b = deploy_remote(remote, second, str(root))
    assert b.passed and slots(root) == (f"slots/{second.slot}", first.slot)

    c = deploy_remote(remote, broken, str(root))
    assert c.outcome == "rolled back" and not c.selftest.passed and "CRC-32" in c.selftest.fields["image"]
    assert slots(root)[0] == f"slots/{second.slot}"  # current untouched
    assert not (root / "slots" / broken.slot).exists()  # the failed slot is gone

    assert rollback_remote(remote, str(root)) == first.slot
    assert slots(root) == (f"slots/{first.slot}", second.slot)


def test_deploy_through_ansible_two_boards_one_rolls_back(release, boards, tmp_path):
    good, bad = boards
    damaged = variant(release, tmp_path, "damaged", damage=True) / "generated" / "weights.img"
    roots = {"board-a": tmp_path / "a", "board-b": tmp_path / "b"}
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[boards]\n"
        f"board-a ansible_host=127.0.0.1 ansible_port={good.port} ansible_user=root colibri_root={roots['board-a']}\n"
        f"board-b ansible_host=127.0.0.1 ansible_port={bad.port} ansible_user=root colibri_root={roots['board-b']} "
        f"colibri_host_weights={damaged}\n"
        "[boards:vars]\nansible_python_interpreter=/usr/bin/python3\n"
    )
    # One client config for both boards: the second trusts the first's key, one known_hosts for the two.
    (bad.root / "authorized_keys").write_text((good.root / "id_ed25519.pub").read_text())
    known = good.root / "known_hosts"
    known.write_text(known.read_text() + (bad.root / "known_hosts").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "generator.cli", "deploy", str(release), "--inventory", str(inventory), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, COLIBRI_SSH_COMMAND=good.ssh_command()),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    hosts = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    slot = payload_of(release).slot
    assert hosts["board-a"]["outcome"] == "pass" and hosts["board-a"]["current"] == slot, hosts
    assert os.readlink(roots["board-a"] / "current") == f"slots/{slot}"
    assert hosts["board-b"]["outcome"] == "rolled back" and hosts["board-b"]["selftest"]["result"] == "fail", hosts
    assert not (roots["board-b"] / "current").exists() and not (roots["board-b"] / "slots" / slot).exists()
