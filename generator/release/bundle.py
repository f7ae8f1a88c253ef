"""What a release bundle holds and how it is written: its file names, the one JSON spelling, the
firmware files a board's build contributes, SHA256SUMS and the deterministic tarball; and a release
of a build for several MPI ranks (docs/several-boards.md): every rank's weight image in the bundle
(generated/weights.rank{r}.img), the manifest's `ranks` table naming each with its SHA-256, the
model hash its header carries and its identity (the SHA-256 of its header and directory, what the
firmware holds for that rank), and verify-release's check of each image against that table.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable

from ..boards import Board
from ..compile import image_format as fmt
from ..compile.build import GENERATED_DIR
from ..compile.image import identity_sha256, map_image, read_header
from ..compile.layout import rank_image_name
from ..errors import ColibriError

RELEASE_FORMAT = "colibri-release-1"


MANIFEST = "manifest.json"


SIGNATURE = "manifest.json.sig"


SUMS = "SHA256SUMS"


VERIFICATION = "verification.json"


REPORT_JSON = "memory-report.json"


REPORT_TEXT = "memory-report.txt"


# Beside the bundle, named after it (OUT/<name>.measurements.json), so that releases of several
# boards into one --out directory each keep their own.
MEASUREMENTS_SUFFIX = ".measurements.json"


FIRMWARE_DIR = "firmware"


Progress = Callable[[str], None] | None


# What verify-release reads from a bundle it has not verified yet is bounded before it is read
# (docs/releases.md, "What verify-release trusts"): the documents by their size, a tarball by its
# member count, its declared sizes and their ratio to its compressed size.
DOCUMENT_LIMITS = {MANIFEST: 4 << 20, SUMS: 4 << 20, SIGNATURE: 4096}


MAX_BUNDLE_FILES = 10_000  # a bundle holds a few dozen files


MAX_COMPRESSION_RATIO = 100  # declared bytes per compressed byte (a real bundle's is under 5)


RATIO_EXEMPT_BYTES = 64 << 20  # a tarball declaring less than this is not held to the ratio


MAX_PAX_HEADER = 64 << 10  # a pax extended header (a long path or a large size) is a few hundred bytes


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_bytes(obj) -> bytes:
    """The one JSON spelling used in a bundle: sorted keys, ASCII, two-space indent, final newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


def say(progress: Progress, message: str) -> None:
    if progress:
        progress(message)


def firmware_files(board: Board, out: Path) -> list[str]:
    """Paths (relative to the build directory) of the ELF and every flashable image built."""
    flash = board.flash
    built = [board.program] + ([f for f in (flash.app_image, flash.flash_image) if f] if flash else [])
    names = built + ([i.file for i in flash.images] if flash else [])
    found = []
    for name in dict.fromkeys(names):
        if (out / name).is_file():
            found.append(name)
        elif name in built:
            raise ColibriError(
                f"the {board.name} build did not produce {name}"
                + (
                    " (ESP-IDF is not installed here: build the project with idf.py, where it is, "
                    "and make the release there)"
                    if board.is_esp_idf
                    else ""
                )
            )
    return found


def flash_layout(board: Board) -> dict | None:
    flash = board.flash
    if not flash:
        return None
    layout = {"chip": flash.chip, "mode": flash.mode, "frequency": flash.frequency, "size": flash.size}
    layout["images"] = [{"offset": i.offset, "file": f"{FIRMWARE_DIR}/{i.file}"} for i in flash.images]
    if flash.flash_image:
        layout["merged"] = {"offset": 0, "file": f"{FIRMWARE_DIR}/{flash.flash_image}"}
    return layout


def put(src: Path, dest: Path, executable: bool = False) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755 if executable else 0o644)


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)


def bundle_files(bundle: Path) -> list[str]:
    return sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())


def write_sums(bundle: Path) -> None:
    lines = [f"{sha256_file(bundle / rel)}  {rel}\n" for rel in bundle_files(bundle) if rel != SUMS]
    write_file(bundle / SUMS, "".join(lines).encode())


def write_tarball(bundle: Path, dest: Path, mtime: int) -> None:
    """The bundle as <name>/... in a tar.gz that depends only on its contents and `mtime`: sorted
    entries, one mtime, uid/gid 0 with no owner names, modes 0644/0755, gzip without a timestamp
    or file name."""
    root = PurePosixPath(bundle.name)
    entries = [(root, bundle)] + sorted(
        ((root / p.relative_to(bundle).as_posix(), p) for p in bundle.rglob("*")), key=lambda e: e[0].parts
    )
    with open(dest, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name, path in entries:
                    info = tarfile.TarInfo(str(name))
                    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
                    if path.is_dir():
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                    else:
                        info.size = path.stat().st_size
                        info.mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
                        with open(path, "rb") as f:
                            tar.addfile(info, f)


def is_bundle_path(rel: object) -> bool:
    """Whether `rel` is a path a bundle may name: relative, normalised (no '.', '..' or empty part),
    POSIX, without control characters or backslashes, so it stays inside the bundle."""
    if not isinstance(rel, str) or not rel or len(rel) > 1024 or "\\" in rel:
        return False
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def is_plain_name(name: object) -> bool:
    """A single path component (a file or directory name), never '.', '..' or a path."""
    return is_bundle_path(name) and "/" not in str(name)


def read_document(path: Path, limit: int | None = None) -> bytes:
    """A bundle's document (manifest.json, SHA256SUMS, the signature), refused before reading when
    it is not a regular file or larger than its limit."""
    limit = DOCUMENT_LIMITS[path.name] if limit is None else limit
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ColibriError(f"{path}: not a regular file")
            if info.st_size > limit:
                raise ColibriError(
                    f"{path}: {info.st_size:,} bytes, more than the {limit:,} a release's {path.name} may have"
                )
            return f.read(limit + 1)[:limit]
    except OSError as e:
        raise ColibriError(f"{path}: cannot be read ({e.strerror})") from None


class _TarStream:
    """The decompressed bytes of a .tar.gz, read forward only; a short or corrupt stream is an error."""

    def __init__(self, tarball: Path, gz: BinaryIO):
        self.tarball, self.gz = tarball, gz

    def read(self, n: int) -> bytes:
        try:
            data = self.gz.read(n)
        except (OSError, EOFError, zlib.error) as e:
            raise ColibriError(f"{self.tarball}: truncated or corrupt gzip stream ({e})") from None
        if len(data) != n:
            raise ColibriError(f"{self.tarball}: truncated: the archive ends inside an entry")
        return data

    def skip(self, n: int) -> None:
        while n:
            n -= len(self.read(min(n, 1 << 20)))

    def rest_is_padding(self, limit: int = 1 << 20) -> bool:
        """After the end-of-archive block: only zero padding (tar pads to 10240 bytes) to the end."""
        seen = 0
        while True:
            try:
                data = self.gz.read(1 << 16)
            except (OSError, EOFError, zlib.error) as e:
                raise ColibriError(f"{self.tarball}: truncated or corrupt gzip stream ({e})") from None
            if not data:
                return True
            seen += len(data)
            if seen > limit or data.count(0) != len(data):
                return False


_OCTAL = re.compile(rb"[0-7]*")


def _tar_number(field: bytes) -> int:
    """A header's number: octal text, or base-256 (GNU, for sizes of 8 GiB and more)."""
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise ValueError("negative number")
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not _OCTAL.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[bytes, bytes]:
    """`LEN key=value\\n` records of a pax extended header."""
    records, at = {}, 0
    while at < len(data) and data[at:].strip(b"\0"):
        length_text, space, _ = data[at : at + 20].partition(b" ")
        if not space or not length_text.isdigit():
            raise ValueError("malformed pax record")
        record = data[at : at + int(length_text)]
        if len(record) != int(length_text) or not record.endswith(b"\n") or b"=" not in record:
            raise ValueError("malformed pax record")
        key, _, value = record[len(length_text) + 1 : -1].partition(b"=")
        records[key] = value
        at += len(record)
    return records


def _padded(size: int) -> int:
    return -size % 512


def unpack_tarball(tarball: Path, dest: Path) -> Path:
    """Extract a release tarball into `dest`, every limit checked on the headers before anything is
    written: regular files and directories only, under one top directory, no path twice (nor as a
    file and a directory), at most MAX_BUNDLE_FILES entries, the documents within DOCUMENT_LIMITS,
    the declared bytes within MAX_COMPRESSION_RATIO of the compressed size and within the free
    space of `dest`. A first pass reads only the headers; the second checks them again as it writes.
    The headers are parsed here, not by tarfile, which reads a pax header of any size whole.
    Returns the top directory."""
    try:
        info = os.stat(tarball)
    except OSError as e:
        raise ColibriError(f"{tarball}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ColibriError(f"{tarball}: not a regular file")
    dest.mkdir(parents=True, exist_ok=True)
    with open(tarball, "rb") as raw:
        _walk_tarball(tarball, raw, info.st_size, shutil.disk_usage(dest).free, None)
        raw.seek(0)
        return dest / _walk_tarball(tarball, raw, info.st_size, shutil.disk_usage(dest).free, dest)


def _walk_tarball(tarball: Path, raw: BinaryIO, compressed: int, free: int, dest: Path | None) -> str:
    """One pass over a release tarball's entries, refusing the first that breaks a rule (see
    unpack_tarball); writes them under `dest` unless it is None. Returns the top directory's name."""
    with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        stream = _TarStream(tarball, gz)
        kinds: dict[str, str] = {}  # path -> "file", "dir" or "parent" (a directory made for a file in it)
        top, members, declared, pax = None, 0, 0, {}

        def refuse(why: str) -> ColibriError:
            return ColibriError(f"{tarball}: {why}; not a release tarball")

        while True:
            header = stream.read(512)
            if not header.strip(b"\0"):
                if not stream.rest_is_padding():
                    raise refuse("data after the end-of-archive block")
                break
            members += 1
            if members > MAX_BUNDLE_FILES:
                raise refuse(f"more than {MAX_BUNDLE_FILES:,} entries")
            try:
                stored = _tar_number(header[148:156])
                if stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
                    raise ValueError("header checksum mismatch")
                size, mode = _tar_number(header[124:136]), _tar_number(header[100:108])
            except ValueError as e:
                raise refuse(f"entry {members}: corrupt header ({e})") from None
            kind = header[156:157]
            if kind == b"x":  # a pax header: the next entry's path and size
                if size > MAX_PAX_HEADER or pax:
                    raise refuse(f"entry {members}: a pax header of {size:,} bytes")
                try:
                    pax = _pax_records(stream.read(size + _padded(size))[:size])
                except ValueError as e:
                    raise refuse(f"entry {members}: {e}") from None
                continue
            name = header[:100].split(b"\0", 1)[0]
            if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
                name = header[345:500].split(b"\0", 1)[0] + b"/" + name
            try:
                name = pax.pop(b"path", name)
                size = int(pax.pop(b"size", size))
                path = name.decode("utf-8")
            except ValueError:
                raise refuse(f"entry {members}: a malformed name or size") from None
            pax = {}
            if kind not in (b"0", b"\0", b"5"):
                what = {
                    b"1": "a hard link",
                    b"2": "a symbolic link",
                    b"3": "a device",
                    b"4": "a device",
                    b"6": "a FIFO",
                }
                raise refuse(f"{path!r} is {what.get(kind, f'an entry of type {kind!r}')} (only files and directories)")
            if kind == b"5":
                path = path.removesuffix("/")
            if not is_bundle_path(path):
                raise refuse(f"unsafe entry name {path!r}")
            parts = path.split("/")
            top = top or parts[0]
            if parts[0] != top or (kind != b"5" and len(parts) == 1):
                raise refuse(f"{path!r} is outside the bundle directory {top!r}")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if kinds.get(parent) == "file":
                    raise refuse(f"{parent!r} is both a file and a directory")
                kinds.setdefault(parent, "parent")
            seen = kinds.get(path)
            if seen is not None and not (kind == b"5" and seen == "parent"):
                twice = (seen == "file") == (kind != b"5")
                raise refuse(f"{path!r} appears twice" if twice else f"{path!r} is both a file and a directory")
            if kind == b"5":
                kinds[path] = "dir"
                if dest is not None:
                    dest.joinpath(*parts).mkdir(parents=True, exist_ok=True)
                continue
            kinds[path] = "file"
            limit = DOCUMENT_LIMITS.get(path.partition("/")[2])
            if limit is not None and size > limit:
                raise refuse(f"{path!r} declares {size:,} bytes, more than the {limit:,} it may have")
            declared += size
            if declared > RATIO_EXEMPT_BYTES and declared > MAX_COMPRESSION_RATIO * compressed:
                raise refuse(
                    f"its entries declare {declared:,} bytes from {compressed:,} compressed "
                    f"(more than {MAX_COMPRESSION_RATIO} to 1)"
                )
            if declared > free:
                raise ColibriError(
                    f"{tarball}: its entries need {declared:,} bytes, more than the {free:,} free in {dest}"
                )
            if dest is None:
                stream.skip(size + _padded(size))
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as f:
                left = size
                while left:
                    left -= f.write(stream.read(min(left, 1 << 20)))
            stream.skip(_padded(size))
            os.chmod(target, 0o755 if mode & stat.S_IXUSR else 0o644)
    if top is None:
        raise ColibriError(f"{tarball}: an empty tarball; not a release tarball")
    return top


# ---- a release for several MPI ranks: every rank's image ------------------------------------


MAX_RANKS = 4096  # a manifest claiming more is not one this release made
RANK_IMAGE = re.compile(r"generated/weights\.rank(\d+)\.img")


def local_ranks(ranks: int) -> tuple[str, ...]:
    """mpirun's host arguments for a release's verification run: every rank on this machine."""
    return ("--host", f"localhost:{ranks}") if ranks > 1 else ()


def rank_image_file(rank: int) -> str:
    """Rank `rank`'s image's path inside a bundle."""
    return f"{GENERATED_DIR}/{rank_image_name(rank)}"


def image_fields(path: Path) -> dict[str, Any]:
    """What the manifest records of an image file (and verify-release compares): its header's rank,
    rank count and model hash, and its identity; a ColibriError when it is not a weight image."""
    if path.stat().st_size == 0:  # np.memmap cannot map an empty file
        raise ColibriError("weight image is 0 bytes, too short to be one")
    blob = map_image(path)
    header = read_header(blob)
    fields = fmt.unpack(fmt.HEADER, blob)
    return {
        "rank": fields["rank"],
        "ranks": fields["ranks"],
        "model_hash": header.model_hash.hex(),
        "identity": identity_sha256(blob).hex(),
    }


def rank_entries(images: tuple[Path, ...], outputs: dict[str, dict]) -> dict[str, Any]:
    """The manifest's `ranks`: the rank count and each rank's image, rank 0 first."""
    entries = []
    for rank, image in enumerate(images):
        file = rank_image_file(rank)
        found = image_fields(image)
        entries.append(
            {
                "rank": rank,
                "file": file,
                "sha256": outputs[file]["sha256"],
                "model_hash": found["model_hash"],
                "identity": found["identity"],
            }
        )
    return {"count": len(images), "images": entries}


def rank_count(manifest: dict[str, Any]) -> int:
    """The ranks a manifest's build was made for (1: no `ranks` table); a ColibriError when the table
    is not one a release writes."""
    table = manifest.get("ranks")
    if table is None:
        return 1
    count = table.get("count") if isinstance(table, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 < count <= MAX_RANKS:
        raise ColibriError(f"manifest.json: ranks.count {str(count)[:40]!r} is not a rank count")
    images = table.get("images")
    if not isinstance(images, list) or len(images) != count or not all(isinstance(e, dict) for e in images):
        raise ColibriError(f"manifest.json: ranks.images does not list {count} ranks' images")
    return count


def rank_problems(bundle: Path, manifest: dict[str, Any]) -> list[str]:
    """Each rank's image against the manifest's `ranks` table, one line naming the rank per image that
    is missing, altered or another rank's; called once the bundle's hashes have been checked."""
    try:
        count = rank_count(manifest)
    except ColibriError as e:
        return [str(e)]
    if count == 1:
        strays = sorted(rel for rel in manifest["outputs"] if RANK_IMAGE.fullmatch(rel))
        return [f"{rel}: a rank's weight image in a release made for one board" for rel in strays]
    problems = []
    outputs, table = manifest["outputs"], manifest["ranks"]["images"]
    for rank, entry in enumerate(table):
        file = rank_image_file(rank)
        where = f"rank {rank}: weight image {file}"
        if entry.get("rank") != rank or entry.get("file") != file:
            problems.append(f"{where}: the manifest's ranks.images[{rank}] names another rank or file")
        elif file not in outputs or not (bundle / file).is_file():
            problems.append(f"{where} is missing from the bundle")
        elif outputs[file].get("sha256") != entry.get("sha256"):
            problems.append(f"{where}: its SHA-256 is not the one the manifest's ranks table records (altered)")
        else:
            problems += _header_problems(bundle / file, where, rank, count, entry, manifest.get("model_hash"))
    made = {f"{rank_image_file(r)}" for r in range(count)}
    for rel in sorted(rel for rel in outputs if RANK_IMAGE.fullmatch(rel) and rel not in made):
        problems.append(f"{rel}: a rank's weight image beyond the {count} ranks the release was made for")
    return problems


def _header_problems(
    path: Path, where: str, rank: int, count: int, entry: dict[str, Any], model_hash: object
) -> list[str]:
    try:
        found = image_fields(path)
    except ColibriError as e:
        return [f"{where}: {e}"]
    if (found["rank"], found["ranks"]) != (rank, count):
        return [f"{where} is rank {found['rank']}'s of {found['ranks']}, not rank {rank}'s of {count} (swapped?)"]
    if found["model_hash"] != model_hash or found["model_hash"] != entry.get("model_hash"):
        return [
            f"{where} is another model's (model hash {found['model_hash'][:16]}, the release's {str(model_hash)[:16]})"
        ]
    if found["identity"] != entry.get("identity"):
        return [f"{where}: its header and directory are not the ones the manifest records (identity differs)"]
    return []


def merged_rank_problems(problems: list[str]) -> list[str]:
    """The hash check's problems with every rank image's merged into one line naming its rank (a
    rank image altered or missing is found against SHA256SUMS and the manifest both)."""
    seen: set[str] = set()
    merged = []
    for problem in problems:
        rel, sep, rest = problem.partition(": ")
        found = RANK_IMAGE.fullmatch(rel) if sep else None
        if found is None:
            merged.append(problem)
        elif rel not in seen:
            seen.add(rel)
            merged.append(f"rank {int(found.group(1))}: weight image {rel}: {rest}")
    return merged
