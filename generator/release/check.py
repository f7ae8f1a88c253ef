"""verify_release: check a bundle's hashes and signature, rebuild it from its manifest in a fresh
directory and compare byte for byte, naming each file that differs.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..boards import TARGETS_DIR, Board, available_boards, load_board
from ..device.session import RunRequest
from ..device.setup_toolchain import ensure_toolchain
from ..documents import JsonDocument, json_field
from ..errors import ColibriError
from ..files import REPO
from .bundle import (
    DOCUMENT_LIMITS,
    MANIFEST,
    MAX_BUNDLE_FILES,
    RELEASE_FORMAT,
    SIGNATURE,
    SUMS,
    Progress,
    bundle_files,
    is_bundle_path,
    is_plain_name,
    merged_rank_problems,
    rank_count,
    rank_problems,
    read_document,
    say,
    sha256_file,
    unpack_tarball,
    write_tarball,
)
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
        if len(self.problems) == 1:
            return f"FAIL: {self.bundle}: {self.problems[0]}"
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


def _read_sums(bundle: Path, problems: list[str]) -> dict[str, str]:
    sums: dict[str, str] = {}
    if not (bundle / SUMS).is_file():
        problems.append(f"{SUMS} is missing")
        return sums
    for n, line in enumerate(read_document(bundle / SUMS).decode(errors="replace").splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or not _SHA256.fullmatch(digest) or not is_bundle_path(rel):
            problems.append(f"{SUMS}: line {n} is malformed")
            continue
        sums[rel] = digest
    return sums


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _scan_bundle(bundle: Path, problems: list[str]) -> set[str]:
    """The bundle's regular files (relative paths); anything else in it (a link, a FIFO, a device)
    is a problem and is never opened."""
    files = set()
    for root, dirs, names in os.walk(bundle):
        for name in sorted(dirs + names):
            path = Path(root) / name
            rel = path.relative_to(bundle).as_posix()
            mode = path.lstat().st_mode
            if not is_bundle_path(rel):
                problems.append(f"{rel!r}: a name a bundle may not have (a control character or a backslash)")
            elif stat.S_ISREG(mode):
                files.add(rel)
            elif not stat.S_ISDIR(mode):
                problems.append(f"{rel!r}: not a regular file (a bundle holds only files and directories)")
        if len(files) > MAX_BUNDLE_FILES:
            raise ColibriError(f"{bundle}: more than {MAX_BUNDLE_FILES:,} files; not a release bundle")
    return files


def _file_digest(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def check_hashes(bundle: Path, result: VerifyResult, manifest_bytes: bytes | None) -> dict[str, Any] | None:
    """Every file against SHA256SUMS and manifest.json's outputs (`manifest_bytes`: manifest.json as
    read once, what the signature is checked on too); returns the manifest (a JSON document, not
    yet trusted), or None. No path the bundle names is opened unless it is a path inside it."""
    problems = result.problems
    files = _scan_bundle(bundle, problems)
    sums = _read_sums(bundle, problems)
    digests = {rel: _file_digest(bundle / rel) for rel in sorted(files - {MANIFEST})}
    if manifest_bytes is not None:
        digests[MANIFEST] = hashlib.sha256(manifest_bytes).hexdigest()
    for rel in sorted(sums):
        if rel not in files:
            problems.append(f"{rel}: listed in {SUMS} but missing from the bundle")
        elif digests[rel] != sums[rel]:
            problems.append(f"{rel}: SHA-256 does not match {SUMS}")
    for rel in sorted(files - set(sums) - {SUMS}):
        problems.append(f"{rel}: not listed in {SUMS} (a file was added)")
    result.files_checked = len(files)
    if manifest_bytes is None:
        problems.append(f"{MANIFEST} is missing")
        return None
    try:
        manifest = json.loads(manifest_bytes)
        outputs = manifest["outputs"]
        if not isinstance(outputs, dict) or not all(isinstance(e, dict) for e in outputs.values()):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        problems.append(f"{MANIFEST} is not a release manifest (malformed JSON or no outputs)")
        return None
    if manifest.get("format") != RELEASE_FORMAT:
        problems.append(f"{MANIFEST}: format {_short(manifest.get('format'))} is not {RELEASE_FORMAT!r}")
    for rel, entry in sorted(outputs.items()):
        if not is_bundle_path(rel):
            problems.append(f"{MANIFEST}: outputs names {_short(rel)}, which is not a path inside the bundle")
        elif rel not in files:
            problems.append(f"{rel}: listed in {MANIFEST} but missing from the bundle")
        elif (bundle / rel).stat().st_size != entry.get("size") or digests.get(rel) != entry.get("sha256"):
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


def _json_differences(a: Path, b: Path, limit: int = 4) -> str:
    """The keys two JSON files differ in, for files of a document's size (the bundle's may be anything)."""
    if max(a.stat().st_size, b.stat().st_size) > DOCUMENT_LIMITS[MANIFEST]:
        return ""
    try:
        fa, fb = _flatten(json.loads(a.read_bytes())), _flatten(json.loads(b.read_bytes()))
    except (ValueError, RecursionError):
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
                detail = _json_differences(given / rel, rebuilt / rel) if rel.endswith(".json") else ""
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


@dataclass(frozen=True)
class RebuildInputs:
    """What a rebuild takes from a verified manifest, every name and path in it checked."""

    board: Board
    model_name: str  # one path component: the staged directory's name
    model_files: dict[str, dict]  # plain file name -> {"sha256", "size"}
    quant: str
    ctx: int
    request: RunRequest
    ranks: int = 1  # MPI ranks the weights were split over (the manifest's ranks.count)


def _malformed(what: str) -> ColibriError:
    return ColibriError(f"{MANIFEST}: {what}; the release cannot be rebuilt from it")


def _release_board(recorded: object, bundle: Path, outputs: dict) -> Board:
    """The board a manifest names: a board of this checkout's targets/ (`board.file` its
    targets/<name>.toml), or a board file inside the bundle that its hashes cover and that is byte
    for byte that targets/ file. A rebuild compiles only with this checkout's board files."""
    if not isinstance(recorded, dict):
        raise _malformed("no board")
    name, file = recorded.get("name"), recorded.get("file")
    if not is_plain_name(name) or name not in available_boards():
        raise _malformed(f"board {_short(name)} is not a board of this checkout's targets/")
    own = TARGETS_DIR / f"{name}.toml"
    if file != f"targets/{name}.toml":
        if not is_bundle_path(file) or file not in outputs:
            raise _malformed(
                f"board.file {_short(file)} is neither targets/{name}.toml nor a file of the bundle its hashes cover"
            )
        if not _same_bytes(bundle / file, own):
            raise _malformed(
                f"the bundle's board file {file} is not byte for byte targets/{name}.toml of this checkout"
            )
    return load_board(name)


def _model_files(files: object) -> dict[str, dict]:
    if not isinstance(files, dict) or not files:
        raise _malformed("inputs.model.files is not a table of the model's files")
    for file, entry in files.items():
        if not is_plain_name(file):
            raise _malformed(f"inputs.model.files names {_short(file)}, which is not a plain file name")
        if not isinstance(entry, dict) or not (
            isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])
        ):
            raise _malformed(f"inputs.model.files[{file!r}] has no SHA-256")
    return files


def rebuild_inputs(manifest: dict[str, Any], bundle: Path) -> RebuildInputs:
    """The rebuild's inputs from a manifest whose hashes (and signature) have been checked: a board
    of targets/, a model name that is one path component, plain model file names, a quant, a ctx
    and the decode request. One-line error otherwise."""
    inputs = manifest.get("inputs")
    model = inputs.get("model") if isinstance(inputs, dict) else None
    if not isinstance(model, dict):
        raise _malformed("no inputs.model")
    if not is_plain_name(model.get("name")):
        raise _malformed(f"inputs.model.name {_short(model.get('name'))} is not a plain directory name")
    quant, ctx = inputs.get("quant"), inputs.get("ctx")
    if not is_plain_name(quant) or len(quant) > 32:
        raise _malformed(f"inputs.quant {_short(quant)} is not a quantization's name")
    if isinstance(ctx, bool) or not isinstance(ctx, int) or not 0 < ctx <= 1 << 31:
        raise _malformed(f"inputs.ctx {_short(ctx)} is not a context length")
    if not isinstance(inputs.get("verification"), dict):
        raise _malformed("no inputs.verification")
    board = _release_board(manifest.get("board"), bundle, manifest["outputs"])
    return RebuildInputs(
        board,
        model["name"],
        _model_files(model.get("files")),
        quant,
        ctx,
        request_from(inputs["verification"]),
        rank_count(manifest),
    )


@contextlib.contextmanager
def _terminated_as_interrupted():
    """SIGTERM unwinds as Ctrl-C does, so the temporary directory of a rebuild is removed then too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _read_signature(bundle: Path) -> bytes | None:
    return read_document(bundle / SIGNATURE) if (bundle / SIGNATURE).exists() else None


def check_release(
    bundle: Path | str,
    verify_key: Path | str | None = None,
    model_dir: Path | str | None = None,
    rebuild: bool = True,
    progress: Progress = None,
) -> VerifyResult:
    """verify_release with the details (what was checked, notes) for the CLI.

    In this order, each step only on what the ones before have verified: the hashes and the
    signature (any problem stops here, nothing of the bundle used); the names and paths in the
    manifest (a one-line error); the tarball against the bundle's files; the rebuild, in a temporary
    directory removed on every exit."""
    path = locate_bundle(Path(bundle))
    result = VerifyResult(str(path))
    with _terminated_as_interrupted(), tempfile.TemporaryDirectory(prefix="colibri-verify-") as tmp:
        tmp = Path(tmp)
        if path.is_dir():
            bundle_dir = path
            sibling = path.parent / f"{path.name}.tar.gz"
            tarball = sibling if sibling.is_file() else None
        else:
            tarball = path
            bundle_dir = unpack_tarball(path, tmp / "unpacked")
        say(progress, f"checking the hashes of {bundle_dir.name}")
        manifest_bytes = read_document(bundle_dir / MANIFEST) if (bundle_dir / MANIFEST).exists() else None
        manifest = check_hashes(bundle_dir, result, manifest_bytes)
        result.problems[:] = merged_rank_problems(result.problems)
        signature = _read_signature(bundle_dir)
        if verify_key is not None:
            problem = signature_problem(signature, manifest_bytes, Path(verify_key))
            result.signature_checked = problem is None
            if problem:
                result.problems.append(problem)
        elif signature is not None:
            result.notes.append(f"{SIGNATURE} is present but was not checked (no verify key given)")
        if manifest is not None and not result.problems:
            result.problems += rank_problems(bundle_dir, manifest)
        if manifest is None or result.problems:
            result.notes.append("nothing rebuilt: the bundle's hashes, signature or rank images do not check")
            return result
        sde = manifest.get("source_date_epoch")
        if isinstance(sde, bool) or not isinstance(sde, int) or not 0 <= sde < 1 << 33:
            result.problems.append(f"{MANIFEST}: no valid source_date_epoch")
            return result
        if manifest.get("name") != bundle_dir.name:
            result.problems.append(
                f"{MANIFEST}: names the bundle {_short(manifest.get('name'))}, its directory is {bundle_dir.name!r}"
            )
            return result
        inputs = rebuild_inputs(manifest, bundle_dir) if rebuild else None
        if tarball is not None:
            canonical = tmp / "canonical.tar.gz"
            write_tarball(bundle_dir, canonical, sde)
            problem = _compare_tarballs(tarball, canonical, "the canonical tarball of the bundle's files")
            result.tarball_checked = problem is None
            if problem:
                result.problems.append(problem)
        if inputs is None:
            result.notes.append("not rebuilt (hashes and signature only)")
            return result
        src = Path(model_dir) if model_dir is not None else REPO / "models" / inputs.model_name
        if not src.is_dir():
            raise ColibriError(
                f"the release was made from model {inputs.model_name!r}: give its directory with "
                f"--model (it is not at {src})"
            )
        here = source_info(inputs.board)
        recorded = manifest.get("generator")
        if not isinstance(recorded, dict) or here.get("source_sha256") != recorded.get("source_sha256"):
            commit = recorded.get("git_commit", "?") if isinstance(recorded, dict) else "?"
            result.notes.append(
                f"this checkout's sources differ from the release's (commit {_short(commit)}): "
                "the rebuild may differ for that reason"
            )
        ensure_toolchain(inputs.board)
        # The release's model files under the release's model name, wherever the user keeps them.
        staged, hashes = stage_model(
            src, sorted(inputs.model_files), tmp / "model", inputs.model_name, inputs.model_files
        )
        say(progress, f"rebuilding {bundle_dir.name} from its manifest in a fresh directory")
        made = produce(
            Inputs(inputs.board, staged, hashes, inputs.quant, inputs.ctx, sde, inputs.request, ranks=inputs.ranks),
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
