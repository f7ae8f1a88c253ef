"""verify-release as an attacker meets it: nothing of a bundle runs before its hashes and signature
check, a manifest names only paths inside the bundle or the model directory and a board of
targets/, hostile tarballs are refused from their headers, every case is one line and the
temporary directory is gone afterwards. The hostile bundles are copies of the one signed host
release the session makes (no test here builds firmware)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, REPO, copy_release, resign_sums, run_cli

from generator.errors import ColibriError
from generator.release import check
from generator.release.bundle import MANIFEST, MAX_BUNDLE_FILES, SIGNATURE, json_bytes, sha256_file
from generator.release.check import check_release

pytestmark = pytest.mark.slow  # the session's release fixture builds one (about 70 s, shared)


class RebuildReached(Exception):
    """Raised where the rebuild would start compiling: every check before it has passed."""


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The temporary directory verify-release makes its own in, to see that nothing is left there."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def tamper(bundle: Path, edit) -> dict:
    """Change manifest.json with `edit(manifest)` and make SHA256SUMS agree (the signature cannot)."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    edit(manifest)
    (bundle / MANIFEST).write_bytes(json_bytes(manifest))
    resign_sums(bundle)
    return manifest


def add_output(bundle: Path, manifest: dict, rel: str, data: bytes) -> None:
    """A file added to the bundle and to its manifest's outputs, as a tamperer would."""
    (bundle / rel).write_bytes(data)
    manifest["outputs"][rel] = {"sha256": sha256_file(bundle / rel), "size": len(data)}


def hostile_board(marker: Path) -> bytes:
    """targets/host.toml with commands in its cflags that create `marker` if a shell ever sees them."""
    text = (REPO / "targets" / "host.toml").read_text()
    return text.replace(
        'cflags = ["-std=c11",', f'cflags = ["`touch {marker}`", "$(touch {marker})", "-std=c11",'
    ).encode()


def one_error_line(done) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith(("checking ", "note: "))]
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), done.stderr
    return lines[0]


# ---- the bundle's own board file: never built, signed or not --------------------------------------


@pytest.fixture
def board_in_bundle(signed_host_release, tmp_path):
    """A bundle whose manifest names a board file it carries, with commands in its cflags, every
    hash made to agree; the manifest no longer matches its signature. Kept where users keep
    releases, under the checkout's releases/ (git ignores it), as the attack found it."""
    out = REPO / "releases" / f".test-{tmp_path.name}"
    had_releases = out.parent.exists()
    bundle = copy_release(signed_host_release, out)
    marker = tmp_path / "MARKER"

    def edit(manifest):
        add_output(bundle, manifest, "evil.toml", hostile_board(marker))
        manifest["board"]["name"] = str(bundle / "evil.toml")
        manifest["board"]["file"] = "evil.toml"

    tamper(bundle, edit)
    yield bundle, marker
    shutil.rmtree(out)
    if not had_releases:
        with contextlib.suppress(OSError):  # another test's bundle may be there now
            out.parent.rmdir()


def test_with_a_key_a_tampered_manifest_stops_at_its_signature(board_in_bundle, release_keys, private_tmp):
    bundle, marker = board_in_bundle
    done = run_cli("verify-release", bundle, "--verify-key", release_keys / "release.pub")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"FAIL: {bundle}: {SIGNATURE}: the signature does not verify with release.pub "
        f"({MANIFEST} was changed after signing, or signed with another key)"
    ]
    assert not marker.exists(), "a command from the bundle's board file ran"


def test_without_a_key_a_board_file_in_the_bundle_is_refused_before_any_build(board_in_bundle, private_tmp):
    bundle, marker = board_in_bundle
    done = run_cli("verify-release", bundle, "--model", DEFAULT_MODEL)
    line = one_error_line(done)
    assert "is not a board of this checkout's targets/" in line, line
    assert not marker.exists(), "a command from the bundle's board file ran"
    assert list(private_tmp.iterdir()) == []


def test_a_board_file_in_the_bundle_must_be_the_targets_one_byte_for_byte(signed_host_release, tmp_path, monkeypatch):
    monkeypatch.setattr(
        check,
        "ensure_toolchain",
        lambda board: _reached(board),
    )
    bundle = copy_release(signed_host_release, tmp_path)
    marker = tmp_path / "MARKER"

    def edit(manifest):
        add_output(bundle, manifest, "board.toml", hostile_board(marker))
        manifest["board"]["file"] = "board.toml"

    tamper(bundle, edit)
    with pytest.raises(ColibriError, match="board file board.toml is not byte for byte targets/host.toml"):
        check_release(bundle, model_dir=DEFAULT_MODEL)
    # The same file holding exactly targets/host.toml is the board of targets/ it copies.
    tamper(bundle, lambda m: add_output(bundle, m, "board.toml", (REPO / "targets" / "host.toml").read_bytes()))
    with pytest.raises(RebuildReached):
        check_release(bundle, model_dir=DEFAULT_MODEL)
    assert not marker.exists()


def _reached(board):
    raise RebuildReached(board.name)


@pytest.mark.parametrize(
    "board, file",
    [
        ("/etc/colibri-board.toml", "targets/host.toml"),  # a board file outside the repository
        ("../targets/host", "targets/host.toml"),
        ("host", "../../../etc/passwd"),
        ("host", "/etc/passwd"),
        ("host.toml", "targets/host.toml"),
        ("no-such-board", "targets/no-such-board.toml"),
    ],
)
def test_a_manifest_names_a_board_of_targets(board, file, signed_host_release, tmp_path, private_tmp):
    bundle = copy_release(signed_host_release, tmp_path)
    tamper(bundle, lambda m: m["board"].update(name=board, file=file))
    with pytest.raises(ColibriError) as error:
        check_release(bundle, model_dir=DEFAULT_MODEL)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"{MANIFEST}: ")
    assert list(private_tmp.iterdir()) == []


# ---- the model's name and files: inside the temporary directory, always ----------------------------


def test_an_absolute_model_name_links_nothing_outside(signed_host_release, tmp_path, private_tmp):
    outside = tmp_path / "outside"
    bundle = copy_release(signed_host_release, tmp_path / "r")
    tamper(bundle, lambda m: m["inputs"]["model"].update(name=str(outside)))
    done = run_cli("verify-release", bundle, "--model", DEFAULT_MODEL)
    assert "inputs.model.name" in one_error_line(done)
    assert not outside.exists(), "model files were linked outside the temporary directory"
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/tmp", "", None, 7, "kjv\ntiny"])
def test_the_model_name_is_one_directory_name(name, signed_host_release, tmp_path, private_tmp):
    bundle = copy_release(signed_host_release, tmp_path)
    tamper(bundle, lambda m: m["inputs"]["model"].update(name=name))
    with pytest.raises(ColibriError, match="inputs.model.name .* is not a plain directory name") as error:
        check_release(bundle, model_dir=DEFAULT_MODEL)
    assert "\n" not in str(error.value)
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize("file", ["/etc/passwd", "../config.json", "sub/config.json", ""])
def test_the_model_files_are_plain_names(file, signed_host_release, tmp_path):
    bundle = copy_release(signed_host_release, tmp_path)
    entry = {"sha256": "0" * 64, "size": 1}
    tamper(bundle, lambda m: m["inputs"]["model"]["files"].update({file: entry}))
    with pytest.raises(ColibriError, match="inputs.model.files names .* not a plain file name"):
        check_release(bundle, model_dir=DEFAULT_MODEL)


@pytest.mark.parametrize("rel", ["/etc/passwd", "../../etc/passwd", "generated/../manifest.json", "./SHA256SUMS"])
def test_outputs_name_only_paths_inside_the_bundle(rel, signed_host_release, tmp_path):
    bundle = copy_release(signed_host_release, tmp_path)
    tamper(bundle, lambda m: m["outputs"].update({rel: {"sha256": "0" * 64, "size": 1}}))
    result = check_release(bundle, model_dir=DEFAULT_MODEL)
    assert result.problems == [f"{MANIFEST}: outputs names {json.dumps(rel)}, which is not a path inside the bundle"]
    assert not result.rebuilt


def test_the_temporary_directory_is_removed_on_ctrl_c(signed_host_release, private_tmp, monkeypatch):
    def interrupted(board):
        assert len(list(private_tmp.iterdir())) == 1  # the rebuild's directory, while it runs
        raise KeyboardInterrupt

    monkeypatch.setattr(
        check,
        "ensure_toolchain",
        interrupted,
    )
    with pytest.raises(KeyboardInterrupt):
        check_release(signed_host_release.tarball, model_dir=DEFAULT_MODEL)
    assert list(private_tmp.iterdir()) == []


# ---- manifest fuzzing: one line or a clean pass, never a traceback ---------------------------------

FUZZ_VALUES = [None, True, 0, -1, 2**64, 1.5, "", "host", "/etc/passwd", "../..", "a" * 5000, [], [1], {}, {"a": 1}]
FUZZ_CASES = 40
DEEP = "nested 100,000 deep"  # put in as text, then written as 100,000 nested arrays


def _fuzz_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _fuzz_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _fuzz_paths(v, (*prefix, i))


def _mutate(manifest: dict, rng: random.Random) -> object:
    """One random change: a value replaced, a key removed, or a deep nesting put in."""
    path = rng.choice([p for p in _fuzz_paths(manifest) if p])
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    how = rng.random()
    if how < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
    elif how < 0.2:
        parent[path[-1]] = DEEP
    else:
        parent[path[-1]] = rng.choice(FUZZ_VALUES)
    return path


def test_fuzzed_manifests_give_one_line_or_a_clean_pass(signed_host_release, tmp_path, private_tmp, monkeypatch):
    monkeypatch.setattr(
        check,
        "ensure_toolchain",
        _reached,
    )
    bundle = copy_release(signed_host_release, tmp_path)
    original = json.loads((bundle / MANIFEST).read_text())
    rng = random.Random(48)
    outcomes = {"error": 0, "fail": 0, "rebuild": 0}
    for case in range(FUZZ_CASES):
        manifest = json.loads(json.dumps(original))
        changed = [_mutate(manifest, rng) for _ in range(rng.randint(1, 3))]
        deep = b"[" * 100_000 + b"]" * 100_000
        (bundle / MANIFEST).write_bytes(json_bytes(manifest).replace(json.dumps(DEEP).encode(), deep))
        resign_sums(bundle)
        try:
            result = check_release(bundle, model_dir=DEFAULT_MODEL)
        except ColibriError as e:
            assert "\n" not in str(e), (case, changed, str(e))
            outcomes["error"] += 1
        except RebuildReached:
            outcomes["rebuild"] += 1  # every name and path it would use was checked
        else:
            assert result.problems and not result.rebuilt, (case, changed)
            assert all("\n" not in p for p in result.problems)
            outcomes["fail"] += 1
        assert list(private_tmp.iterdir()) == [], case
    assert min(outcomes.values()) > 0, outcomes  # the table reaches every outcome


# ---- hostile tarballs: refused from their headers, one line each -----------------------------------


def _header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname, info.mode = size, kind, linkname, 0o644
    return info.tobuf(tarfile.USTAR_FORMAT)


def _tar(*entries: bytes) -> bytes:
    return b"".join(entries) + b"\0" * 1024


def _file(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + b"\0" * (-len(data) % 512)


def _gzip_bomb(path: Path, name: str, size: int) -> None:
    """`name` declared and stored as `size` zero bytes, in a few MB: one gzip member of 1 MiB of
    zeros repeated (a gzip file may be several members), written without compressing it all."""
    block = gzip.compress(bytes(1 << 20), compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        f.write(gzip.compress(_header("b", kind=tarfile.DIRTYPE) + _header(f"b/{name}", size), mtime=0))
        for _ in range(size >> 20):
            f.write(block)
        f.write(gzip.compress(b"\0" * 1024, mtime=0))


HOSTILE = {
    "file then directory": (
        _tar(_header("b", kind=tarfile.DIRTYPE), _file("b/x", b"1"), _header("b/x", kind=tarfile.DIRTYPE)),
        "'b/x' is both a file and a directory",
    ),
    "file inside a file": (_tar(_file("b/x", b"1"), _file("b/x/y", b"2")), "'b/x' is both a file and a directory"),
    "duplicate file": (_tar(_file("b/x", b"1"), _file("b/x", b"2")), "'b/x' appears twice"),
    "symbolic link": (_tar(_header("b/l", kind=tarfile.SYMTYPE, linkname="/etc/passwd")), "is a symbolic link"),
    "hard link": (_tar(_header("b/l", kind=tarfile.LNKTYPE, linkname="b/x")), "is a hard link"),
    "device": (_tar(_header("b/d", kind=tarfile.CHRTYPE)), "is a device"),
    "FIFO": (_tar(_header("b/f", kind=tarfile.FIFOTYPE)), "is a FIFO"),
    "absolute path": (_tar(_file("/b/x", b"1")), "unsafe entry name '/b/x'"),
    "parent path": (_tar(_file("b/../../x", b"1")), "unsafe entry name"),
    "two top directories": (_tar(_file("b/x", b"1"), _file("c/x", b"1")), "outside the bundle directory 'b'"),
    "empty": (_tar(), "an empty tarball"),
    "a pax header of 1 GiB": (
        _tar(_header("b/././@PaxHeader", 1 << 30, kind=tarfile.XHDTYPE)),
        "a pax header of 1,073,741,824 bytes",
    ),
    "a manifest of 1 GiB": (_tar(_header("b/manifest.json", 1 << 30)), "'b/manifest.json' declares 1,073,741,824"),
    "corrupt header": (_tar(_header("b/x", 1)[:148] + b"1234567\0" + _header("b/x", 1)[156:]), "corrupt header"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_tarball_is_one_line(case, tmp_path, private_tmp):
    payload, expected = HOSTILE[case]
    tarball = tmp_path / "b.tar.gz"
    tarball.write_bytes(gzip.compress(payload, mtime=0))
    with pytest.raises(ColibriError) as error:
        check_release(tarball, rebuild=False)
    assert expected in str(error.value) and "\n" not in str(error.value)
    assert list(private_tmp.iterdir()) == []
    assert not Path("/etc/passwd").is_symlink()


def test_a_truncated_tarball_is_one_line(signed_host_release, tmp_path):
    tarball = tmp_path / signed_host_release.tarball.name
    data = signed_host_release.tarball.read_bytes()
    for cut in (len(data) // 2, len(data) - 10):
        tarball.write_bytes(data[:cut])
        with pytest.raises(ColibriError, match="truncated"):
            check_release(tarball, rebuild=False)
    tarball.write_bytes(b"not gzip at all")
    with pytest.raises(ColibriError, match="truncated or corrupt gzip stream"):
        check_release(tarball, rebuild=False)


def test_a_small_tarball_declaring_2_gib_is_refused_before_extraction(tmp_path, private_tmp):
    for name, expected in (("manifest.json", "declares 2,147,483,648 bytes"), ("weights.img", "more than 100 to 1")):
        tarball = tmp_path / f"{name}.tar.gz"
        _gzip_bomb(tarball, name, 2 << 30)
        assert tarball.stat().st_size < 3 << 20
        done = run_cli("verify-release", tarball, "--no-rebuild")
        assert expected in one_error_line(done)
        assert list(private_tmp.iterdir()) == []


def test_100000_empty_members_are_one_line(tmp_path):
    raw = io.BytesIO()
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    raw.write(compressor.compress(_header("b", kind=tarfile.DIRTYPE)))
    # One header made by tarfile, then only its name's digits and its checksum changed (fast).
    template = bytearray(_header("b/000000"))
    checksum = sum(template[:148]) + 8 * 32 + sum(template[156:]) - sum(b"000000")
    for i in range(100_000):
        digits = b"%06d" % i
        template[2:8] = digits
        template[148:156] = b"%06o\0 " % (checksum + sum(digits))
        raw.write(compressor.compress(bytes(template)))
    raw.write(compressor.compress(b"\0" * 1024) + compressor.flush())
    tarball = tmp_path / "b.tar.gz"
    tarball.write_bytes(raw.getvalue())
    done = run_cli("verify-release", tarball, "--no-rebuild")
    assert f"more than {MAX_BUNDLE_FILES:,} entries" in one_error_line(done)
    assert done.stdout == ""


def test_a_bundle_directory_with_a_link_or_too_many_files(signed_host_release, tmp_path, monkeypatch):
    monkeypatch.setattr(check, "MAX_BUNDLE_FILES", 40)  # the limit's check, without making 10,001 files
    bundle = copy_release(signed_host_release, tmp_path)
    (bundle / "passwd").symlink_to("/etc/passwd")
    result = check_release(bundle, rebuild=False)
    assert result.problems == ["'passwd': not a regular file (a bundle holds only files and directories)"]
    (bundle / "passwd").unlink()
    (bundle / "a\nFAIL").write_bytes(b"")  # a name that would print as two lines
    result = check_release(bundle, rebuild=False)
    assert result.problems == ["'a\\nFAIL': a name a bundle may not have (a control character or a backslash)"]
    (bundle / "a\nFAIL").unlink()
    many = bundle / "many"
    many.mkdir()
    for i in range(41):
        (many / str(i)).touch()
    with pytest.raises(ColibriError, match="more than 40 files"):
        check_release(bundle, rebuild=False)


def test_a_manifest_larger_than_its_limit_is_not_read(signed_host_release, tmp_path):
    bundle = copy_release(signed_host_release, tmp_path)
    with open(bundle / MANIFEST, "r+b") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB that cost nothing on disk
    with pytest.raises(ColibriError, match="2,147,483,648 bytes, more than the"):
        check_release(bundle, rebuild=False)
