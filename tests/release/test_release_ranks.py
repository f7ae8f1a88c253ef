"""A release of a build for two MPI ranks (host-mpi, the default model): every rank's weight image in
the bundle and its manifest, verify-release naming the rank of a missing, altered or swapped image
and rebuilding the ranks byte for byte, and deploy giving each board of an inventory its own rank's
image (over real SSH, tests/sshd.py) with the switch on PASS and the rollback of a damaged one. One
release (about 70 s: the release tests compile from source) serves every test here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, REPO, copy_release, resign_sums, run_cli
from damaged_images import entry as tensor_entry
from damaged_images import tensor_edited

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sshd import Sshd  # noqa: E402

from generator.compile.image import identity_sha256, map_image, read_header  # noqa: E402
from generator.release.bundle import MANIFEST, json_bytes, sha256_file  # noqa: E402
from generator.release.check import check_release  # noqa: E402
from generator.release.deploy import SLOT_SCRIPT, outcome_of, payload_of, rank_hosts, switch_together  # noqa: E402
from generator.release.make import make_release  # noqa: E402

pytestmark = pytest.mark.slow  # a release build for two ranks, its rebuild, real sshd and ansible-playbook

RANKS = 2


@pytest.fixture(scope="module")
def ranked(tmp_path_factory, release_keys):
    """A signed host-mpi release of the default model for two ranks."""
    out = tmp_path_factory.mktemp("ranked")
    return make_release("host-mpi", DEFAULT_MODEL, "q8_0", 64, out, sign_key=release_keys / "release.key", ranks=RANKS)


def test_a_release_for_two_ranks_holds_every_ranks_image_and_names_each_in_its_manifest(ranked):
    bundle, manifest = ranked.bundle, ranked.manifest
    assert bundle.name.endswith("-host-mpi-q8_0-ctx64-ranks2")
    assert ranked.verification["ran"] and ranked.verification["passed"]  # decoded on two ranks here
    table = manifest["ranks"]
    assert table["count"] == RANKS and [e["rank"] for e in table["images"]] == [0, 1]
    sums = (bundle / "SHA256SUMS").read_text()
    for rank, entry in enumerate(table["images"]):
        image = bundle / entry["file"]
        assert entry["file"] == f"generated/weights.rank{rank}.img"
        assert entry["sha256"] == sha256_file(image) == manifest["outputs"][entry["file"]]["sha256"]
        assert f"{entry['sha256']}  {entry['file']}" in sums
        blob = map_image(image)
        assert entry["model_hash"] == read_header(blob).model_hash.hex() == manifest["model_hash"]
        assert entry["identity"] == identity_sha256(blob).hex()
    assert len({e["sha256"] for e in table["images"]}) == RANKS  # each rank its own share


def test_verify_release_rebuilds_the_ranks_byte_for_byte(ranked, release_keys):
    """The second compile of the module (verify-release's rebuild, in a fresh directory): the two
    ranks' images, the manifest and the tarball identical to the release's."""
    result = check_release(ranked.bundle, verify_key=release_keys / "release.pub")
    assert result.ok and result.rebuilt and result.signature_checked, result.problems


def _problems(bundle: Path) -> list[str]:
    return check_release(bundle, rebuild=False).problems


def _rewrite_manifest(bundle: Path, edit) -> None:
    """Edit manifest.json and make its outputs and SHA256SUMS agree (an unsigned, careless editor's bundle)."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    for rel, entry in manifest["outputs"].items():
        entry.update(sha256=sha256_file(bundle / rel), size=(bundle / rel).stat().st_size)
    edit(manifest)
    (bundle / MANIFEST).write_bytes(json_bytes(manifest))
    (bundle / "manifest.json.sig").unlink(missing_ok=True)
    resign_sums(bundle)


def test_verify_release_names_the_rank_of_a_missing_altered_or_swapped_image(ranked, tmp_path):
    altered = copy_release(ranked, tmp_path / "altered")
    image = altered / "generated/weights.rank1.img"
    blob = bytearray(image.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    image.write_bytes(bytes(blob))
    [problem] = _problems(altered)
    assert problem.startswith("rank 1: weight image generated/weights.rank1.img: ") and "SHA-256" in problem

    missing = copy_release(ranked, tmp_path / "missing")
    (missing / "generated/weights.rank0.img").unlink()
    [problem] = _problems(missing)
    assert problem.startswith("rank 0: weight image generated/weights.rank0.img: ") and "missing" in problem

    # Rank 0's image given as rank 1's, every hash (the ranks table's too) made to agree with it.
    swapped = copy_release(ranked, tmp_path / "swapped")
    shutil.copyfile(swapped / "generated/weights.rank0.img", swapped / "generated/weights.rank1.img")

    def same_as_rank0(manifest):
        manifest["ranks"]["images"][1]["sha256"] = manifest["ranks"]["images"][0]["sha256"]

    _rewrite_manifest(swapped, same_as_rank0)
    [problem] = _problems(swapped)
    assert problem == (
        "rank 1: weight image generated/weights.rank1.img is rank 0's of 2, not rank 1's of 2 (swapped?)"
    )

    # An image the manifest's ranks table does not record (the outputs and sums agreeing with it).
    stale = copy_release(ranked, tmp_path / "stale")
    _rewrite_manifest(stale, lambda m: m["ranks"]["images"][1].update(sha256="0" * 64))
    [problem] = _problems(stale)
    assert problem.startswith("rank 1: weight image generated/weights.rank1.img: ") and "altered" in problem

    # An empty file as rank 1's image, every hash made to agree with it.
    empty = copy_release(ranked, tmp_path / "empty")
    (empty / "generated/weights.rank1.img").write_bytes(b"")

    def empty_image(manifest):
        manifest["ranks"]["images"][1]["sha256"] = manifest["outputs"]["generated/weights.rank1.img"]["sha256"]

    _rewrite_manifest(empty, empty_image)
    assert _problems(empty) == [
        "rank 1: weight image generated/weights.rank1.img: weight image is 0 bytes, too short to be one"
    ]

    done = run_cli("verify-release", altered, "--no-rebuild")
    assert done.returncode == 1 and done.stdout.count("\n") == 1 and "rank 1" in done.stdout, done.stdout


def test_release_for_ranks_on_a_board_that_runs_one_process_is_refused_before_building(tmp_path):
    done = run_cli("release", "--board", "host", "--ctx", "64", "--ranks", "2", "--out", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.startswith("colibri: error: board host runs one process")
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


# ---- deploy: each board its own rank's image ---------------------------------------------------


# Two boards: one sshd listening on two loopback addresses, reached through one ssh config, as
# mpirun (the ranks' joint self-test) and Ansible both reach them: no per-host port or user, which
# mpirun's one ssh command cannot carry.
ADDRESSES = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def boards(tmp_path_factory):
    """COLIBRI_SSH_COMMAND for the two boards."""
    server = Sshd(tmp_path_factory.mktemp("sshd"), extra_config="".join(f"ListenAddress {a}\n" for a in ADDRESSES))
    yield f"ssh -F {server.hosts_config(ADDRESSES)}"
    server.stop()


def _inventory(path: Path, roots: dict[str, Path]) -> Path:
    lines = [
        f"{name} ansible_host={ADDRESSES[i % len(ADDRESSES)]} colibri_root={root}"
        for i, (name, root) in enumerate(roots.items())
    ]
    path.write_text("[boards]\n" + "\n".join(lines) + "\n[boards:vars]\nansible_python_interpreter=/usr/bin/python3\n")
    return path


def _deploy(bundle: Path, inventory: Path, ssh_command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "generator.cli", "deploy", str(bundle), "--inventory", str(inventory), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, COLIBRI_SSH_COMMAND=ssh_command),
        timeout=300,
    )


def test_deploy_ships_each_board_its_own_ranks_image_and_a_damaged_one_rolls_back(
    ranked, boards, tmp_path, monkeypatch
):
    """One ansible-playbook run (about 40 s) to two boards, every board switched after the ranks'
    joint self-test over the new slots; then the rank check of the board's slot script on a damaged
    image, run here as the playbook runs it on the board."""
    roots = {"board-a": tmp_path / "a", "board-b": tmp_path / "b"}  # by name: board-a rank 0, board-b rank 1
    inventory = _inventory(tmp_path / "inventory.ini", roots)
    payload = payload_of(ranked.bundle)
    done = _deploy(ranked.bundle, inventory, boards)
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    for rank, name in enumerate(roots):
        assert hosts[name]["outcome"] == "pass" and hosts[name]["current"] == payload.slot, hosts
        assert hosts[name]["detail"].startswith(f"rank check rank={rank} ranks=2 result=pass"), hosts
        assert hosts[name]["detail"].endswith("; the ranks' joint self-test PASS over 2 hosts"), hosts
        assert hosts[name]["selftest"]["pass"] is True, hosts
        held = roots[name] / "current"
        assert os.readlink(held) == f"slots/{payload.slot}"
        assert (held / "weights.img").read_bytes() == (ranked.bundle / f"generated/weights.rank{rank}.img").read_bytes()
        assert (held / "firmware").read_bytes() == (ranked.bundle / "firmware/firmware").read_bytes()

    # Rank 1's next slot with a damaged image, and one given rank 0's image: each removed, current kept.
    for name, image in (("damaged", _damaged(payload.rank_weights[1], tmp_path)), ("swapped", payload.rank_weights[0])):
        slot = _slot_script("deploy", roots["board-b"], name, _incoming(tmp_path / name, payload, image, 1))
        assert slot.returncode == 1 and "rolled back" in slot.stdout, slot.stdout + slot.stderr
        assert "rank check rank=1 ranks=2 result=fail: weights.img is not rank 1's image" in slot.stdout
        assert os.readlink(roots["board-b"] / "current") == f"slots/{payload.slot}"
        assert not (roots["board-b"] / "slots" / name).exists()

    # The next release staged on both boards as the playbook stages it (slots checked, current kept),
    # rank 1's image damaged with the manifest naming its SHA-256: each board's check passes, and
    # rank 1's firmware refuses its image when the ranks self-test together: no board switches.
    bad = payload_of(_release_whose_rank_1_only_the_ranks_refuse(ranked, tmp_path))
    staged = []
    for rank, (name, root) in enumerate(roots.items()):
        slot = _slot_script(
            "stage", root, bad.slot, _incoming(tmp_path / f"staged-{name}", bad, bad.rank_weights[rank], rank)
        )
        assert slot.returncode == 0 and f"staged={bad.slot} current={payload.slot}" in slot.stdout, slot.stdout
        staged.append(outcome_of(name, bad.slot, slot.returncode, slot.stdout))
    monkeypatch.setenv("COLIBRI_SSH_COMMAND", boards)  # deploy's last step in this process, over the boards' ssh
    ranks = rank_hosts(inventory, bad, dict(os.environ), None)
    for outcome in switch_together(ranks, bad, staged):
        assert (outcome.outcome, outcome.current) == ("rolled back", payload.slot), outcome
        assert outcome.detail.startswith("the ranks' joint self-test over 2 hosts failed: rank 1: weight image "), (
            outcome
        )
        assert outcome.detail.endswith("(rank 1 is host board-b); no host switched"), outcome.detail
    for root in roots.values():
        assert os.readlink(root / "current") == f"slots/{payload.slot}" and not (root / "slots" / bad.slot).exists()

    # A host whose slot does not stage (here rank 1's: its check fails) switches no host either.
    good = _slot_script(
        "stage", roots["board-a"], bad.slot, _incoming(tmp_path / "again-a", bad, bad.rank_weights[0], 0)
    )
    refused = _slot_script(
        "stage", roots["board-b"], bad.slot, _incoming(tmp_path / "again-b", bad, payload.rank_weights[0], 1)
    )
    staged = [outcome_of(name, bad.slot, s.returncode, s.stdout) for name, s in zip(roots, (good, refused))]
    for outcome in switch_together(ranks, bad, staged):
        assert (outcome.outcome, outcome.current) == ("rolled back", payload.slot), outcome
        assert outcome.detail.startswith("rank 1's host board-b did not take its slot (rolled back: rank check"), (
            outcome
        )
    assert not (roots["board-a"] / "slots" / bad.slot).exists()


def _incoming(where: Path, payload, image: Path, rank: int) -> Path:
    """A rank's files as the playbook leaves them on its board for colibri-slot."""
    where.mkdir()
    shutil.copyfile(payload.program, where / "firmware")
    shutil.copyfile(image, where / "weights.img")
    (where / "rank").write_text(payload.rank_files[rank])
    return where


def _slot_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SLOT_SCRIPT), *map(str, args)], capture_output=True, text=True)


def _release_whose_rank_1_only_the_ranks_refuse(ranked, where: Path) -> Path:
    """A copy of the release under another name (another slot), rank 1's image with its first
    tensor's bytes damaged (its header and directory intact) and the manifest naming its SHA-256."""
    bundle = copy_release(ranked, where / "rank-1-damaged")
    image = bundle / "generated" / "weights.rank1.img"
    blob = image.read_bytes()
    image.write_bytes(tensor_edited(blob, 0, tensor_entry(blob, 0)[4] // 2, fix_directory=False))

    def edit(manifest: dict) -> None:
        manifest["name"] += "-rank-1-damaged"
        manifest["ranks"]["images"][1]["sha256"] = sha256_file(image)

    _rewrite_manifest(bundle, edit)
    return bundle


def _damaged(image: Path, where: Path) -> Path:
    blob = bytearray(image.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    (where / "damaged.img").write_bytes(bytes(blob))
    return where / "damaged.img"


def test_deploy_refuses_an_inventory_of_another_host_count_before_copying_anything(ranked, boards, tmp_path):
    roots = {f"board-{c}": tmp_path / c for c in "abc"}
    inventory = _inventory(tmp_path / "three.ini", roots)
    done = _deploy(ranked.bundle, inventory, boards)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "names 3 hosts" in done.stderr and "made for 2 ranks" in done.stderr
    assert not any(root.exists() for root in roots.values())

    remote = run_cli("deploy", ranked.bundle, "--remote", "root@127.0.0.1")
    assert remote.returncode == 2 and "--inventory" in remote.stderr and remote.stderr.count("\n") == 1
