"""The build cache: SCons's CacheDir, shared by every build directory, as ccache is for a compiler.

A compiled object or linked program is stored under the signature of everything that made it
(the sources' and headers' contents, the command line without the paths that the prefix maps make
irrelevant), so the same firmware is never compiled twice: not in another build directory, not
after `clean`, not in a second checkout. Generated weights and sources are never stored (a weight
image can be tens of GB; generation has its own up-to-date check).

Where it lives, first match wins: `--cache-dir DIR` (or `cache-dir` in colibri.toml), then
$COLIBRI_CACHE_DIR, then $XDG_CACHE_HOME/colibri/build-cache, else ~/.cache/colibri/build-cache.
`off` (or an empty value) turns it off. After each build the cache is trimmed to
$COLIBRI_CACHE_MAX_MB (default 2048), oldest files first; `./colibri clean --cache` empties it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ColibriError

DEFAULT_MAX_BYTES = 2048 << 20
OFF = ("", "off", "none")
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"  # bford.info/cachedir


def default_cache_dir() -> Path:
    """The user's cache directory: $XDG_CACHE_HOME/colibri/build-cache, else ~/.cache/..."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "colibri" / "build-cache"


def resolve_cache_dir(given: str | Path | None) -> Path | None:
    """--cache-dir's value (None: not given, then $COLIBRI_CACHE_DIR, then the user's cache
    directory) as an absolute directory, or None when it says `off`."""
    if given is None:
        given = os.environ.get("COLIBRI_CACHE_DIR")
    if given is None:
        return default_cache_dir()
    if str(given).strip().lower() in OFF:
        return None
    return Path(given).expanduser().resolve()


def prepare_cache_dir(path: Path | None) -> Path | None:
    """Make the cache directory, or say in one line why it cannot be one."""
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ColibriError(f"build cache {path}: cannot create it ({e.strerror})") from None
    if any(path.iterdir()) and not is_cache(path):
        raise ColibriError(f"build cache {path}: a directory of other files, not a build cache (give an empty one)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ColibriError(f"build cache {path}: not writable (give another with --cache-dir, or --cache-dir off)")
    return path


def is_cache(path: Path) -> bool:
    """Whether SCons made `path` a cache (its CACHEDIR.TAG, the cachedir standard's signature)."""
    tag = path / "CACHEDIR.TAG"
    return tag.is_file() and tag.read_bytes().startswith(CACHEDIR_SIGNATURE)


def max_cache_bytes() -> int:
    value = os.environ.get("COLIBRI_CACHE_MAX_MB")
    if value is None:
        return DEFAULT_MAX_BYTES
    if not value.isdigit():
        raise ColibriError(f"COLIBRI_CACHE_MAX_MB must be a whole number of MiB, got {value!r}")
    return int(value) << 20


def _cached_files(path: Path) -> list[tuple[Path, os.stat_result]]:
    """The cache's entries: SCons's files named by their signature in two-character folders, and
    nothing else (a mistaken --cache-dir full of the user's files loses none of them)."""
    found = []
    for folder in path.iterdir():
        if not (folder.is_dir() and not folder.is_symlink() and re.fullmatch(r"[0-9A-F]{2}", folder.name)):
            continue
        for f in folder.iterdir():
            if re.fullmatch(r"[0-9a-f]{32,128}", f.name) and f.is_file() and not f.is_symlink():
                found.append((f, f.stat()))
    return found


def cache_bytes(path: Path) -> int:
    """The bytes the cache holds."""
    if not path.is_dir():
        return 0
    return sum(st.st_size for _, st in _cached_files(path))


def trim_cache(path: Path | None, limit: int | None = None) -> int:
    """Remove the least recently used entries (by access, else modification time) until the cache
    holds at most `limit` bytes. Returns the bytes removed."""
    if path is None or not path.is_dir():
        return 0
    limit = max_cache_bytes() if limit is None else limit
    files = _cached_files(path)
    total = sum(st.st_size for _, st in files)
    removed = 0
    for f, st in sorted(files, key=lambda e: (max(e[1].st_atime, e[1].st_mtime), str(e[0]))):
        if total <= limit:
            break
        try:
            f.unlink()
        except OSError:
            continue
        total -= st.st_size
        removed += st.st_size
    return removed


def empty_cache(path: Path | None) -> int:
    """Remove everything the cache holds; returns the bytes freed. Only a directory SCons made a
    cache (its CACHEDIR.TAG) is emptied: --cache-dir naming another is refused, not wiped."""
    if path is None or not path.is_dir():
        return 0
    if not is_cache(path):
        raise ColibriError(f"{path} is not a build cache (no CACHEDIR.TAG): not emptied")
    freed = cache_bytes(path)
    for f, _ in _cached_files(path):
        f.unlink()
    return freed
