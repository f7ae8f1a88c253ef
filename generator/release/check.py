"""verify_release: check a bundle's hashes and signature, rebuild it from its manifest in a fresh
directory and compare byte for byte, naming each file that differs.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..boards import load_board
from ..documents import JsonDocument, json_field
from ..errors import ColibriError
from ..files import REPO
from .bundle import MANIFEST, RELEASE_FORMAT, SIGNATURE, SUMS, Progress, bundle_files, say, sha256_file, write_tarball
from .make import Inputs, produce
from .provenance import request_from, source_info, stage_model
from .signing import signature_problem


@dataclass
class VerifyResult(JsonDocument):
    """verify-release's outcome; to_json() is its --json document."""

    bundle: str = json_field(then=("ok",))
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files_checked: int = 0
    signature_checked: bool = False
    rebuilt: bool = False
    tarball_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.problems:
            return "\n".join(
                [f"FAIL: {self.bundle}: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]
            )
        done = [f"{self.files_checked} files match SHA256SUMS and the manifest"]
        if self.signature_checked:
            done.append("the ed25519 signature of manifest.json verifies")
        if self.tarball_checked:
            done.append("the tarball is the bundle's canonical tarball")
        if self.rebuilt:
            done.append("a rebuild from the manifest is byte-identical, tarball included")
        return f"PASS: {self.bundle}: " + "; ".join(done)


def _unpack(tarball: Path, dest: Path) -> Path:
    """Extract a release tarball (regular files and directories under one top directory only)."""
    try:
        tar = tarfile.open(tarball, "r:gz")
    except (OSError, tarfile.TarError) as e:
        raise ColibriError(f"{tarball}: not a release tarball ({e})") from None
    top = None
    with tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if not parts or member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                raise ColibriError(f"{tarball}: unsafe or unexpected entry {member.name!r}")
            if top is None:
                top = parts[0]
            if parts[0] != top:
                raise ColibriError(f"{tarball}: entries outside the bundle directory {top!r}")
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(target, 0o755 if member.mode & stat.S_IXUSR else 0o644)
    if top is None:
        raise ColibriError(f"{tarball}: empty tarball")
    return dest / top


def _read_sums(bundle: Path, problems: list[str]) -> dict[str, str]:
    sums = {}
    path = bundle / SUMS
    if not path.is_file():
        problems.append(f"{SUMS} is missing")
        return sums
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            problems.append(f"{SUMS}: line {n} is malformed")
            continue
        sums[rel] = digest
    return sums


def check_hashes(bundle: Path, result: VerifyResult) -> dict[str, Any] | None:
    """Every file against SHA256SUMS and manifest.json's outputs; returns the manifest as read from
    the bundle (a JSON document, not yet trusted), or None."""
    problems = result.problems
    files = set(bundle_files(bundle))
    sums = _read_sums(bundle, problems)
    for rel in sorted(sums):
        if rel not in files:
            problems.append(f"{rel}: listed in {SUMS} but missing from the bundle")
        elif sha256_file(bundle / rel) != sums[rel]:
            problems.append(f"{rel}: SHA-256 does not match {SUMS}")
    for rel in sorted(files - set(sums) - {SUMS}):
        problems.append(f"{rel}: not listed in {SUMS} (a file was added)")
    result.files_checked = len(files)
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        outputs = manifest["outputs"]
        if manifest.get("format") != RELEASE_FORMAT:
            problems.append(f"{MANIFEST}: format {manifest.get('format')!r} is not {RELEASE_FORMAT!r}")
    except FileNotFoundError:
        problems.append(f"{MANIFEST} is missing")
        return None
    except (ValueError, KeyError, TypeError):
        problems.append(f"{MANIFEST} is not a release manifest (malformed JSON or no outputs)")
        return None
    for rel, entry in sorted(outputs.items()):
        path = bundle / rel
        if not path.is_file():
            problems.append(f"{rel}: listed in {MANIFEST} but missing from the bundle")
        elif path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            problems.append(f"{rel}: does not match the SHA-256 and size in {MANIFEST}")
    for rel in sorted(files - set(outputs) - {MANIFEST, SIGNATURE, SUMS}):
        problems.append(f"{rel}: not listed in {MANIFEST}'s outputs")
    return manifest


def _flatten(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_differences(a: bytes, b: bytes, limit: int = 4) -> str:
    try:
        fa, fb = _flatten(json.loads(a)), _flatten(json.loads(b))
    except ValueError:
        return ""
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))
    if not keys:
        return ""
    shown = "; ".join(
        f"{k}: {_short(fa.get(k, '<absent>'))} in the bundle, {_short(fb.get(k, '<absent>'))} rebuilt"
        for k in keys[:limit]
    )
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return f" ({shown}{more})"


def compare_bundles(given: Path, rebuilt: Path) -> list[str]:
    """Byte-for-byte comparison, one problem per file that differs."""
    problems = []
    a, b = set(bundle_files(given)), set(bundle_files(rebuilt))
    for rel in sorted(a | b):
        if rel not in b:
            problems.append(f"{rel}: in the bundle but not produced by the rebuild")
        elif rel not in a:
            problems.append(f"{rel}: produced by the rebuild but missing from the bundle")
        else:
            if not _same_bytes(given / rel, rebuilt / rel):
                detail = (
                    _json_differences((given / rel).read_bytes(), (rebuilt / rel).read_bytes())
                    if rel.endswith(".json")
                    else ""
                )
                problems.append(f"{rel}: differs from the rebuild{detail}")
    return problems


COMPARE_CHUNK = 8 << 20  # bytes compared at a time: a bundle's weight image may be tens of GB


def _same_stream(a, b) -> bool:
    while True:
        x, y = a.read(COMPARE_CHUNK), b.read(COMPARE_CHUNK)
        if x != y:
            return False
        if not x:
            return True


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes, read a chunk at a time (never whole)."""
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return _same_stream(fa, fb)


def _same_tar_payload(a: Path, b: Path) -> bool:
    """Whether two .tar.gz files hold the same tar, decompressed a chunk at a time."""
    try:
        with gzip.open(a, "rb") as fa, gzip.open(b, "rb") as fb:
            return _same_stream(fa, fb)
    except (OSError, EOFError):
        return False


def _compare_tarballs(given: Path, expected: Path, what: str) -> str | None:
    if _same_bytes(given, expected):
        return None
    if _same_tar_payload(given, expected):
        return f"{given.name}: the tar inside is identical to {what}, only the gzip compression differs (another zlib?)"
    return f"{given.name}: differs from {what}"


def locate_bundle(path: Path) -> Path:
    """The bundle a user means by `path`: a bundle directory, its tarball, or the `release --out`
    directory when that holds one bundle (with several, say which there are)."""
    if not path.exists():
        raise ColibriError(
            f"{path} does not exist (give a release bundle directory, its .tar.gz, or the release's --out directory)"
        )
    if not path.is_dir() or (path / MANIFEST).is_file():
        return path
    bundles = sorted(
        d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file()
    )
    if len(bundles) == 1:
        return path / bundles[0]
    if bundles:
        raise ColibriError(
            f"{path} holds {len(bundles)} release bundles; name one: " + ", ".join(str(path / b) for b in bundles)
        )
    tarballs = sorted(t.name for t in path.glob("*.tar.gz") if not t.name.startswith("."))
    if len(tarballs) == 1:
        return path / tarballs[0]
    if tarballs:
        raise ColibriError(
            f"{path} holds {len(tarballs)} release tarballs; name one: " + ", ".join(str(path / t) for t in tarballs)
        )
    raise ColibriError(f"{path} is not a release bundle (no {MANIFEST}) and holds none")


def check_release(
    bundle: Path | str,
    verify_key: Path | str | None = None,
    model_dir: Path | str | None = None,
    rebuild: bool = True,
    progress: Progress = None,
) -> VerifyResult:
    """verify_release with the details (what was checked, notes) for the CLI."""
    from ..device.setup_toolchain import ensure_toolchain

    path = locate_bundle(Path(bundle))
    result = VerifyResult(str(path))
    with tempfile.TemporaryDirectory(prefix="colibri-verify-") as tmp:
        tmp = Path(tmp)
        if path.is_dir():
            bundle_dir = path
            sibling = path.parent / f"{path.name}.tar.gz"
            tarball = sibling if sibling.is_file() else None
        else:
            tarball = path
            bundle_dir = _unpack(path, tmp / "unpacked")
        say(progress, f"checking the hashes of {bundle_dir.name}")
        manifest = check_hashes(bundle_dir, result)
        if verify_key is not None:
            problem = signature_problem(bundle_dir, Path(verify_key))
            result.signature_checked = problem is None
            if problem:
                result.problems.append(problem)
        elif (bundle_dir / SIGNATURE).is_file():
            result.notes.append(f"{SIGNATURE} is present but was not checked (no verify key given)")
        if manifest is None:
            return result
        try:
            sde = int(manifest["source_date_epoch"])
            if manifest["name"] != bundle_dir.name:
                result.problems.append(
                    f"{MANIFEST}: names the bundle {manifest['name']!r}, its directory is {bundle_dir.name!r}"
                )
        except (KeyError, TypeError, ValueError):
            result.problems.append(f"{MANIFEST}: no valid source_date_epoch or name")
            return result
        if tarball is not None:
            canonical = tmp / "canonical.tar.gz"
            write_tarball(bundle_dir, canonical, sde)
            problem = _compare_tarballs(tarball, canonical, "the canonical tarball of the bundle's files")
            result.tarball_checked = problem is None
            if problem:
                result.problems.append(problem)
        if not rebuild:
            result.notes.append("not rebuilt (hashes and signature only)")
            return result
        try:
            board = load_board(manifest["board"]["name"])
            model = manifest["inputs"]["model"]
            quant, ctx = manifest["inputs"]["quant"], int(manifest["inputs"]["ctx"])
            request = request_from(manifest["inputs"]["verification"])
            expected_files = dict(model["files"])
        except (KeyError, TypeError, ValueError):
            result.problems.append(f"{MANIFEST}: the inputs needed to rebuild are missing or malformed")
            return result
        src = Path(model_dir) if model_dir is not None else REPO / "models" / model["name"]
        if not src.is_dir():
            raise ColibriError(
                f"the release was made from model {model['name']!r}: give its directory with "
                f"--model (it is not at {src})"
            )
        here = source_info(board)
        recorded = manifest.get("generator", {})
        if here.get("source_sha256") != recorded.get("source_sha256"):
            result.notes.append(
                f"this checkout's sources differ from the release's (commit "
                f"{recorded.get('git_commit', '?')}): the rebuild may differ for that reason"
            )
        ensure_toolchain(board)
        # The release's model files under the release's model name, wherever the user keeps them.
        staged, hashes = stage_model(src, sorted(expected_files), tmp / "model", model["name"], expected_files)
        signature = (bundle_dir / SIGNATURE).read_bytes() if (bundle_dir / SIGNATURE).is_file() else None
        say(progress, f"rebuilding {manifest['name']} from its manifest in a fresh directory")
        made = produce(
            Inputs(board, staged, hashes, quant, ctx, sde, request),
            tmp / "rebuild",
            progress,
            signature=signature,
            require_pass=False,
        )
        result.rebuilt = True
        result.problems += compare_bundles(bundle_dir, made.bundle)
        if tarball is not None:
            problem = _compare_tarballs(tarball, made.tarball, "the rebuilt tarball")
            if problem:
                result.problems.append(problem)
        if not made.verification.get("passed", True) and made.verification.get("ran"):
            result.problems.append("the rebuilt firmware does not match the NumPy reference on this machine")
    return result


def verify_release(
    bundle: Path | str,
    verify_key: Path | str | None = None,
    model_dir: Path | str | None = None,
    rebuild: bool = True,
    progress: Progress = None,
) -> list[str]:
    """Problems with a release bundle (directory or .tar.gz); empty means it checks out:
    every hash, the signature when a key is given, and a byte-for-byte rebuild from the manifest
    (the model from `model_dir`, by default models/<name> of this checkout)."""
    return check_release(bundle, verify_key, model_dir, rebuild, progress).problems
