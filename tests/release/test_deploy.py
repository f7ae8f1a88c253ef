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
from generator.release.artifacts import MENDER_MODULE, RAUC_HOOK, write_rauc  # noqa: E402
from generator.release.deploy import deploy_remote, payload_of, rollback_remote  # noqa: E402

pytestmark = pytest.mark.slow  # a release build and real sshd


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """An ECDSA P-256 key and its self-signed certificate (what mender-artifact and rauc sign with),
    and another pair that must not verify."""
    d = tmp_path_factory.mktemp("keys")
    for name in ("artifact", "other"):
        subprocess.run(
            ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", d / f"{name}.key"], check=True
        )
        subprocess.run(
            ["openssl", "ec", "-in", d / f"{name}.key", "-pubout", "-out", d / f"{name}.pub"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-key",
                d / f"{name}.key",
                "-subj",
                f"/CN=colibri-{name}",
                "-days",
                "30",
                "-out",
                d / f"{name}.crt",
            ],
            check=True,
        )
    return d


@pytest.fixture(scope="module")
def release(tmp_path_factory, keys):
    """A host release, with its Mender artifact beside it (release --format mender)."""
    out = tmp_path_factory.mktemp("releases")
    env_build = tmp_path_factory.mktemp("build")
    os.environ.setdefault("COLIBRI_BUILD_DIR", str(env_build))
    done = run_cli(
        "release",
        "--board",
        "host",
        "--ctx",
        "64",
        "--out",
        out,
        "--format",
        "mender",
        "--artifact-key",
        keys / "artifact.key",
    )
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


# ---- Mender and RAUC -------------------------------------------------------------------------


def mender_files(artifact: Path, tree: Path) -> Path:
    """The update module's file tree for an artifact, as the Mender client lays it out: header/
    artifact_name and files/ (the payload, from the artifact's data/0000.tar.gz)."""
    import tarfile

    (tree / "header").mkdir(parents=True)
    (tree / "files").mkdir()
    with tarfile.open(artifact) as outer:
        data = outer.extractfile("data/0000.tar.gz")
        with tarfile.open(fileobj=data, mode="r:gz") as inner:
            inner.extractall(tree / "files", filter="data")
        with tarfile.open(fileobj=outer.extractfile("header.tar.gz"), mode="r:gz") as header:
            info = json.loads(header.extractfile("header-info").read())
    (tree / "header" / "artifact_name").write_text(info["artifact_provides"]["artifact_name"])
    return tree


def module(state: str, tree: Path, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(MENDER_MODULE), state, str(tree)],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLIBRI_ROOT=str(root)),
    )


def test_the_mender_artifact_reads_back_signed_and_its_module_installs_commits_and_rolls_back(release, keys, tmp_path):
    artifact = release.parent / f"{release.name}.mender"
    read = subprocess.run(
        ["mender-artifact", "read", "-k", keys / "artifact.pub", artifact], capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr
    assert "signed and verified correctly" in read.stdout and "Type:   colibri" in read.stdout
    for name in ("firmware", "weights.img", "colibri-slot"):
        assert f"name:     {name}" in read.stdout
    wrong = subprocess.run(
        ["mender-artifact", "validate", "-k", keys / "other.pub", artifact], capture_output=True, text=True
    )
    assert wrong.returncode != 0

    root = tmp_path / "board"
    first = mender_files(artifact, tmp_path / "first")
    assert module("SupportsRollback", first, root).stdout.strip() == "Yes"
    assert module("ArtifactInstall", first, root).returncode == 0
    assert module("ArtifactCommit", first, root).returncode == 0
    slot = payload_of(release).slot
    assert os.readlink(root / "current") == f"slots/{slot}"

    # A second artifact whose image is damaged: its install fails, current stays, rollback is a no-op.
    broken = mender_files(artifact, tmp_path / "broken")
    (broken / "header" / "artifact_name").write_text("broken-1")
    image = broken / "files" / "weights.img"
    blob = bytearray(image.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    image.write_bytes(bytes(blob))
    failed = module("ArtifactInstall", broken, root)
    assert failed.returncode != 0 and "result=fail" in failed.stdout
    assert module("ArtifactRollback", broken, root).returncode == 0
    assert os.readlink(root / "current") == f"slots/{slot}"

    # A good second artifact installed, then rolled back (as Mender does when a later state fails).
    second = mender_files(artifact, tmp_path / "second")
    (second / "header" / "artifact_name").write_text("second-1")
    assert module("ArtifactInstall", second, root).returncode == 0
    assert os.readlink(root / "current") == "slots/second-1"
    assert module("ArtifactRollback", second, root).returncode == 0
    assert os.readlink(root / "current") == f"slots/{slot}"


def test_the_rauc_bundle_reads_back_signed_and_its_hook_installs(release, keys, tmp_path):
    payload = payload_of(release)
    bundle = write_rauc(payload, tmp_path, keys / "artifact.key", keys / "artifact.crt")
    info = subprocess.run(["rauc", "info", "--keyring", keys / "artifact.crt", bundle], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert f"Version:    \t'{payload.slot}'" in info.stdout and "colibri-host" in info.stdout
    other = subprocess.run(["rauc", "info", "--keyring", keys / "other.crt", bundle], capture_output=True, text=True)
    assert other.returncode != 0
    content = tmp_path / "content"
    extracted = subprocess.run(
        ["rauc", "extract", "--keyring", keys / "artifact.crt", bundle, content], capture_output=True, text=True
    )
    assert extracted.returncode == 0, extracted.stderr
    root = tmp_path / "board"
    hook = subprocess.run(
        ["sh", str(RAUC_HOOK), "slot-install"],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLIBRI_ROOT=str(root), RAUC_IMAGE_NAME=str(content / "colibri.tar")),
    )
    assert hook.returncode == 0, hook.stdout + hook.stderr
    assert os.readlink(root / "current") == f"slots/{payload.slot}"
