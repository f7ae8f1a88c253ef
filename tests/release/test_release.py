"""Releases: byte-identical rebuilds from two checkouts and two build directories under different
TZ, locale, umask and PYTHONHASHSEED; verify-release on fresh, tampered and re-signed bundles;
ed25519 signing; measurements kept out of the release."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, REPO, copy_release, resign_sums, run_cli

from generator.boards import load_board
from generator.errors import ColibriError
from generator.release.bundle import MANIFEST, SIGNATURE, SUMS, json_bytes, sha256_file, write_tarball
from generator.release.check import check_release, locate_bundle, verify_release
from generator.release.make import make_release
from generator.release.provenance import default_source_date_epoch, source_info

pytestmark = pytest.mark.slow  # builds, verifies and rebuilds release bundles

BOARDS = ("host", "linux-aarch64", "qemu-rv32", "esp32p4")
EPOCH = 1700000000  # SOURCE_DATE_EPOCH given to both builds of the rebuild test
# What a build needs from a checkout (the rest of the working tree does not matter to it).
CHECKOUT = (
    "SConstruct",
    "site_scons",
    "generator",
    "templates",
    "firmware_src",
    "targets",
    "requirements.txt",
    "models/kjv-tiny",
)

MAKE = """
import sys
sys.path.insert(0, ".")
from generator.errors import ColibriError
from generator.release.make import make_release
try:
    make_release(sys.argv[1], sys.argv[2], "q8_0", 64, sys.argv[3])
except ColibriError as e:
    sys.exit(f"colibri: error: {e}")
"""

# Two environments as different as this machine allows (it has only the C and C.UTF-8 locales;
# LANG still names another one). Each build also runs from its own checkout into its own directory.
ENVIRONMENTS = (
    {"TZ": "UTC", "LC_ALL": "C", "LANG": "C", "PYTHONHASHSEED": "1", "umask": 0o022},
    {"TZ": "Asia/Kolkata", "LC_ALL": "C.UTF-8", "LANG": "de_DE.UTF-8", "PYTHONHASHSEED": "4242", "umask": 0o077},
)


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def copy_checkout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".sconsign*")
    for name in CHECKOUT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, symlinks=True)
        elif src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """The same sources at two paths of different lengths (a copy, so concurrent edits of the
    working tree cannot make the two builds differ)."""
    root = tmp_path_factory.mktemp("checkouts")
    first = copy_checkout(root / "a")
    second = copy_checkout(root / "a-checkout-with-a-longer-name" / "b")
    return first, second


def release_in(checkout: Path, board: str, out: Path, env_spec: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE")}
    env.update({k: v for k, v in env_spec.items() if k != "umask"}, SOURCE_DATE_EPOCH=str(EPOCH))
    umask = env_spec["umask"]
    return subprocess.Popen(
        [sys.executable, "-c", MAKE, board, str(checkout / "models" / "kjv-tiny"), str(out)],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )


@pytest.mark.parametrize("board", BOARDS)
def test_two_directory_rebuild_is_byte_identical(board, checkouts, tmp_path):
    """Two releases of the board from two checkouts at different paths, in different locales and
    umasks, give the same bytes. Slow (about a minute for host): each release compiles from source,
    as releases do, and a shared build cache would make the comparison say nothing."""
    outs = (tmp_path / "out-a", tmp_path / "elsewhere" / "deeper" / "out-b")
    outs[1].parent.mkdir(parents=True)  # --out's parent must exist, as for any user's --out
    procs = [release_in(c, board, o, e) for c, o, e in zip(checkouts, outs, ENVIRONMENTS)]
    for proc in procs:  # the two builds run at the same time: private build directories
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-3000:]
    (bundle_a,), (bundle_b,) = ([p for p in o.iterdir() if p.is_dir()] for o in outs)
    assert bundle_a.name == bundle_b.name == f"colibri-kjv-tiny-{board}-q8_0-ctx64"
    names = files_under(bundle_a)
    assert names == files_under(bundle_b)
    differing = [n for n in names if (bundle_a / n).read_bytes() != (bundle_b / n).read_bytes()]
    assert not differing, f"{board}: these files differ between the two builds: {differing}"
    tar_a, tar_b = (o / f"{bundle_a.name}.tar.gz" for o in outs)
    assert tar_a.read_bytes() == tar_b.read_bytes(), f"{board}: the tarballs differ"
    for name in names:  # the bundle directories themselves are the same, modes included
        assert (bundle_a / name).stat().st_mode == (bundle_b / name).stat().st_mode, name

    # The bundle is what the board needs, and nothing names where or on what it was made.
    manifest = json.loads((bundle_a / MANIFEST).read_text())
    program = load_board(board).program
    assert f"firmware/{program}" in names and "generated/weights.img" in names
    if board == "esp32p4":
        assert {"firmware/firmware.bin", "firmware/flash.bin"} <= set(names)
        assert manifest["flash"]["merged"] == {"offset": 0, "file": "firmware/flash.bin"}
        assert manifest["flash"]["images"] == [{"offset": 0x2000, "file": "firmware/firmware.bin"}]
    assert manifest["source_date_epoch"] == EPOCH
    assert manifest["generator"]["git_commit"] == "unknown"  # the copies are not git checkouts
    leaks = [str(checkouts[0]), str(checkouts[1]), str(outs[0]), str(outs[1]), str(tmp_path), str(REPO)]
    host = socket.gethostname()
    for name in names:
        data = (bundle_a / name).read_bytes()
        found = [leak for leak in leaks if leak.encode() in data]
        if len(host) >= 6 and not name.startswith("firmware/") and host.encode() in data:
            found.append(host)  # (a short host name would turn up by chance in binary data)
        assert not found, f"{board}: {name} contains {found}"

    verification = json.loads((bundle_a / "verification.json").read_text())
    if board == "esp32p4":
        assert verification["ran"] is False and len(verification["reference"]["tokens"]) == 32
    else:
        assert verification["passed"] is True
        assert verification["firmware"]["tokens"] == verification["reference"]["tokens"]
        assert verification["firmware"]["logits_sha256"] == verification["reference"]["logits_sha256"]
        assert verification["hello"]["model"] == manifest["model_hash"]
    if board == "qemu-rv32":
        counts = verification["instructions"]
        assert counts["prefill"] > 0 and counts["decode"] > 0 and counts["decode_forward_passes"] == 31
        assert counts["counted"] == (
            "forward pass at contexts 9-39, greedy sampling, the logits' SHA-256, the token frame"
        )

    # The tarball: sorted entries, one mtime, numeric root owner, normalised modes, no gzip stamp.
    raw = tar_a.read_bytes()
    assert raw[3] & 0x08 == 0, "gzip header carries a file name"
    assert raw[4:8] == b"\0\0\0\0", "gzip header carries a timestamp"
    with tarfile.open(tar_a) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted((m.name for m in members), key=lambda n: n.split("/"))
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(EPOCH, 0, 0, "", "")}
    assert {m.mode for m in members} <= {0o644, 0o755}
    assert {m.name.split("/", 1)[1] for m in members if m.isfile()} == set(names)


# ---- one signed host release, checked every way --------------------------------------------------


@pytest.fixture
def keys(release_keys):
    return release_keys


@pytest.fixture
def host_release(signed_host_release):
    return signed_host_release


def test_verify_release_passes_on_a_fresh_bundle(host_release, keys):
    # Every hash, the signature and the tarball; the rebuild (a whole compile) is the next test's.
    result = check_release(host_release.bundle, verify_key=keys / "release.pub", rebuild=False)
    assert result.problems == []
    assert result.signature_checked and result.tarball_checked and not result.rebuilt
    assert result.files_checked == len(files_under(host_release.bundle))
    assert verify_release(host_release.bundle, verify_key=keys / "release.pub", rebuild=False) == []


def test_verify_release_names_a_changed_file_and_rebuilds_nothing(host_release, tmp_path):
    bundle = copy_release(host_release, tmp_path)
    weights = bundle / "generated" / "weights.img"
    data = bytearray(weights.read_bytes())
    data[4096] ^= 0x01
    weights.write_bytes(bytes(data))
    result = check_release(bundle)
    assert result.problems == [
        "generated/weights.img: SHA-256 does not match SHA256SUMS",
        "generated/weights.img: does not match the SHA-256 and size in manifest.json",
    ]
    assert not result.rebuilt and any("nothing rebuilt" in n for n in result.notes)


def test_verify_release_rebuild_catches_a_consistently_altered_firmware(host_release, keys, tmp_path):
    # Firmware replaced and every hash list updated to match: only the signature and the rebuild
    # can tell. With the key the signature stops it before anything is rebuilt; without one the
    # rebuild names the file.
    bundle = copy_release(host_release, tmp_path)
    program = bundle / "firmware" / "firmware"
    program.write_bytes(program.read_bytes() + b"\0")
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["outputs"]["firmware/firmware"] = {"sha256": sha256_file(program), "size": program.stat().st_size}
    (bundle / MANIFEST).write_bytes(json_bytes(manifest))
    resign_sums(bundle)
    assert verify_release(bundle, rebuild=False) == []  # the hashes alone agree now
    signed = check_release(bundle, verify_key=keys / "release.pub")
    assert len(signed.problems) == 1 and signed.problems[0].startswith(f"{SIGNATURE}: the signature does not verify")
    assert not signed.rebuilt
    problems = verify_release(bundle)
    assert any(p.startswith("firmware/firmware: differs from the rebuild") for p in problems), problems
    assert any(p.startswith("manifest.json: differs from the rebuild (outputs.firmware/firmware") for p in problems)


def test_tampered_manifest_fails_the_signature(host_release, keys, tmp_path):
    bundle = copy_release(host_release, tmp_path)
    text = (bundle / MANIFEST).read_text()
    assert '"verified": true' in text
    (bundle / MANIFEST).write_text(text.replace('"verified": true', '"verified": false'))
    problems = verify_release(bundle, verify_key=keys / "release.pub", rebuild=False)
    assert "manifest.json: SHA-256 does not match SHA256SUMS" in problems
    assert any(p.startswith(f"{SIGNATURE}: the signature does not verify") for p in problems)
    resign_sums(bundle)
    problems = verify_release(bundle, verify_key=keys / "release.pub", rebuild=False)
    assert len(problems) == 1 and problems[0].startswith(f"{SIGNATURE}: the signature does not verify"), problems
    # Without a key the hashes pass (and the result says the signature went unchecked).
    unsigned = check_release(bundle, rebuild=False)
    assert unsigned.problems == [] and any("not checked" in n for n in unsigned.notes)


def test_signature_needs_the_right_key_and_a_signature(host_release, keys, tmp_path):
    problems = verify_release(host_release.bundle, verify_key=keys / "other.pub", rebuild=False)
    assert len(problems) == 1 and "does not verify with other.pub" in problems[0]
    bundle = copy_release(host_release, tmp_path)
    (bundle / SIGNATURE).unlink()
    resign_sums(bundle)
    assert verify_release(bundle, verify_key=keys / "release.pub", rebuild=False) == [
        f"{SIGNATURE} is missing: the bundle is not signed"
    ]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_signature_is_a_plain_ed25519_signature_openssl_checks(host_release, keys):
    bundle = host_release.bundle
    done = subprocess.run(
        [
            "openssl",
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            str(keys / "release.pub"),
            "-rawin",
            "-in",
            str(bundle / MANIFEST),
            "-sigfile",
            str(bundle / SIGNATURE),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "Signature Verified Successfully" in done.stdout, done.stdout + done.stderr


def test_measurements_stay_outside_the_release(host_release):
    name = host_release.bundle.name
    assert host_release.measurements_file == host_release.bundle.parent / f"{name}.measurements.json"
    measured = json.loads(host_release.measurements_file.read_text())
    assert measured["ran"] is True and measured["decode_tok_s"] > 0 and measured["name"] == host_release.bundle.name
    sums = (host_release.bundle / SUMS).read_text()
    assert "measurements" not in sums
    with tarfile.open(host_release.tarball) as tar:
        assert not [m.name for m in tar.getmembers() if "measurements" in m.name]
    assert not (host_release.bundle / "measurements.json").exists()
    # Nothing that varies from run to run is in the bundle: no timings in the verification record.
    verification = (host_release.bundle / "verification.json").read_text()
    assert "_us" not in verification and "tok_s" not in verification and "seconds" not in verification
    assert files_under(host_release.bundle) == sorted(
        [
            MANIFEST,
            SIGNATURE,
            SUMS,
            "firmware/firmware",
            "generated/board_def.h",
            "generated/image_format.h",
            "generated/model_data.c",
            "generated/model_def.h",
            "generated/plan.json",
            "generated/selftest_checks.h",
            "generated/selftest_data.c",
            "generated/weights.img",
            "memory-report.json",
            "memory-report.txt",
            "verification.json",
        ]
    )
    # sha256sum(1) can check the bundle by itself.
    done = subprocess.run(
        ["sha256sum", "--check", "--strict", SUMS], cwd=host_release.bundle, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_releases_into_one_out_directory_keep_their_own_measurements(host_release, tmp_path):
    out = host_release.bundle.parent
    before = host_release.measurements_file.read_bytes()
    other = make_release("host", DEFAULT_MODEL, "q8_0", 32, out)
    assert other.measurements_file != host_release.measurements_file
    assert host_release.measurements_file.read_bytes() == before  # not overwritten by the second release
    assert json.loads(other.measurements_file.read_text())["name"] == other.bundle.name
    shutil.rmtree(other.bundle)  # the module's other tests expect one bundle in this directory
    other.tarball.unlink()
    other.measurements_file.unlink()


def test_release_refuses_to_overwrite_and_bad_inputs(host_release, keys, tmp_path):
    with pytest.raises(ColibriError, match="already exists"):
        make_release("host", DEFAULT_MODEL, "q8_0", 64, host_release.bundle.parent)
    with pytest.raises(ColibriError, match="not a PEM or OpenSSH private key"):
        make_release("host", DEFAULT_MODEL, "q8_0", 64, tmp_path / "out", sign_key=keys / "release.pub")
    with pytest.raises(ColibriError, match="does not exist"):
        make_release("host", tmp_path / "no-such-model", "q8_0", 64, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_verify_release_refuses_a_different_model(host_release, tmp_path):
    other = tmp_path / "kjv-tiny"
    shutil.copytree(DEFAULT_MODEL, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config, indent=1))
    with pytest.raises(ColibriError, match="config.json is not the file the release was made from"):
        verify_release(host_release.bundle, model_dir=other)


def test_tarball_depends_only_on_contents(tmp_path):
    trees = []
    for i, (mode, mtime) in enumerate(((0o600, 1), (0o664, 2_000_000_000))):
        root = tmp_path / f"t{i}" / "bundle"
        (root / "sub").mkdir(parents=True)
        for name, data in (("sub/z.bin", b"\0\1"), ("a.txt", b"a"), ("sub/run", b"#!")):
            (root / name).write_bytes(data)
            os.chmod(root / name, mode | (0o100 if name == "sub/run" else 0))
            os.utime(root / name, (mtime, mtime))
        write_tarball(root, tmp_path / f"t{i}.tar.gz", 12345)
        trees.append((tmp_path / f"t{i}.tar.gz").read_bytes())
    assert trees[0] == trees[1]
    with tarfile.open(tmp_path / "t0.tar.gz") as tar:
        assert [(m.name, m.mode) for m in tar] == [
            ("bundle", 0o755),
            ("bundle/a.txt", 0o644),
            ("bundle/sub", 0o755),
            ("bundle/sub/run", 0o755),
            ("bundle/sub/z.bin", 0o644),
        ]
    assert gzip.decompress(trees[0])[:6] == b"bundle"


def test_unsafe_tarball_is_refused(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("bundle/../../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ColibriError, match="unsafe entry name"):
        verify_release(evil)
    assert not (tmp_path.parent / "escape").exists()


def test_sources_and_source_date_epoch_come_from_git(monkeypatch):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    info = source_info(load_board("host"))
    assert len(info["git_commit"]) == 40 and int(info["git_commit"], 16) >= 0
    committed = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    assert default_source_date_epoch() == int(committed.stdout)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "123")
    assert default_source_date_epoch() == 123
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ColibriError, match="SOURCE_DATE_EPOCH"):
        default_source_date_epoch()


# ---- the command line (needs the `release` and `verify-release` subcommands in generator/cli.py) --


def test_cli_release_and_verify_release(host_release, keys, tmp_path):
    """The two commands as a user runs them, end to end: the module's release was made by
    `release --sign --json` (compiled from source on purpose: no build cache, what is signed was
    built here); verify-release checks its tarball against the key and builds it again from source
    with the model under another name in another place (about 45 s), byte for byte."""
    info = host_release.summary
    assert host_release.bundle.is_dir() and host_release.tarball.is_file() and info["signed"] is True
    assert info["verification"]["passed"] is True and info["files"] == len(
        json.loads((host_release.bundle / MANIFEST).read_text())["outputs"]
    )
    renamed = tmp_path / "my-copy-of-the-model"
    shutil.copytree(DEFAULT_MODEL, renamed)
    done = run_cli(
        "verify-release", host_release.tarball, "--verify-key", keys / "release.pub", "--model", renamed, "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["problems"] == [] and result["rebuilt"] and result["tarball_checked"] and result["signature_checked"]
    done = run_cli("verify-release", host_release.bundle, "--verify-key", keys / "release.pub", "--no-rebuild")
    assert done.returncode == 0 and done.stdout.startswith("PASS"), done.stdout + done.stderr

    bundle = copy_release(host_release, tmp_path / "edited")
    report = bundle / "memory-report.txt"
    report.write_text(report.read_text() + "edited\n")
    done = run_cli("verify-release", bundle, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    problems = json.loads(done.stdout)["problems"]
    assert any(p.startswith("memory-report.txt:") for p in problems), problems
    out = tmp_path / "rel"
    done = run_cli("release", "--board", "host", "--model", tmp_path / "missing", "--out", out)
    assert done.returncode == 2 and done.stderr.startswith("colibri: error:") and "Traceback" not in done.stderr
    assert not out.exists()


def test_verify_release_accepts_the_out_directory_holding_one_bundle(host_release, keys):
    """What a user types after `release --out DIR`: `verify-release DIR`."""
    out = host_release.bundle.parent
    assert locate_bundle(out) == host_release.bundle
    result = check_release(out, verify_key=keys / "release.pub", rebuild=False)
    assert result.problems == [] and result.tarball_checked and result.bundle == str(host_release.bundle)


def test_an_out_directory_with_several_bundles_names_them(host_release, tmp_path):
    for name in ("a", "b"):
        copy_release(host_release, tmp_path / "out" / name)
    (tmp_path / "out" / "a" / host_release.bundle.name).rename(tmp_path / "out" / "first")
    (tmp_path / "out" / "b" / host_release.bundle.name).rename(tmp_path / "out" / "second")
    with pytest.raises(ColibriError, match=r"holds 2 release bundles; name one: .*first, .*second"):
        locate_bundle(tmp_path / "out")


def test_an_out_directory_with_only_a_tarball_uses_it(host_release, tmp_path):
    shutil.copyfile(host_release.tarball, tmp_path / host_release.tarball.name)
    assert locate_bundle(tmp_path) == tmp_path / host_release.tarball.name


def test_a_directory_without_a_release_is_refused_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ColibriError, match="is not a release bundle"):
        locate_bundle(tmp_path)


def test_the_usual_release_directory_is_ignored_by_git():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "releases/colibri-x/manifest.json"])
    assert done.returncode == 0
