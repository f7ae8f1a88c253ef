"""What a release bundle holds and how it is written: its file names, the one JSON spelling, the
firmware files a board's build contributes, SHA256SUMS and the deterministic tarball.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import Callable

from ..boards import Board
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
