"""Make sure a board's toolchain is installed: the board file lists its Debian packages.

    python -m generator.setup_toolchain (--all | BOARD...) [--packages FILE] [-- COMMAND ...]
installs what is missing (as root, through apt-get), then runs COMMAND if one is given. FILE lists
further Debian packages, one per line (# starts a comment).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..boards import Board, available_boards, load_board
from ..boards.board import MADE_STAMP, Sysroot
from ..boards.load import DEBIAN_PACKAGE
from ..documents import JsonDocument, json_field
from ..errors import ColibriError


def apt_install(packages: list[str], why: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ColibriError(
            f"missing {why}: install {' '.join(packages)} (e.g. sudo apt-get install {' '.join(packages)})"
        )
    print(f"colibri: installing {why}: {' '.join(packages)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # --no-remove: apt must not make room by removing packages (a board's cross compiler, say);
    # it fails instead, and the failure names the conflict. --no-install-recommends: only what is
    # listed and what it needs (libc6-dev-i386 recommends gcc-multilib, which conflicts with every
    # cross compiler: with recommends on, a fresh Debian removed linux-aarch64's to install it).
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-remove", "--no-install-recommends", *packages],
    ):
        run_apt(cmd, env)


# A fresh Debian or Ubuntu board often runs unattended-upgrades at boot, holding dpkg's locks for
# minutes: apt waits for them (DPkg::Lock::Timeout) and a lock error is tried again until then.
APT_LOCK_WAIT_SECONDS = 600
APT_LOCK_ERRORS = ("Could not get lock", "Unable to acquire the dpkg frontend lock", "Unable to lock directory")


def run_apt(cmd: list[str], env: dict, wait: float = APT_LOCK_WAIT_SECONDS, pause: float = 5.0) -> None:
    """Run an apt-get command; while another apt or dpkg holds its lock, wait (at most `wait`
    seconds, saying so once); any other failure is one line with apt's last message."""
    deadline = time.monotonic() + wait
    told = False
    while True:
        lock_wait = max(1, int(deadline - time.monotonic()))
        done = subprocess.run(
            [cmd[0], "-o", f"DPkg::Lock::Timeout={lock_wait}", *cmd[1:]],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode == 0:
            return
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if any(e in done.stderr for e in APT_LOCK_ERRORS) and time.monotonic() + pause < deadline:
            if not told:
                print(
                    f"colibri: another apt or dpkg holds its lock (unattended-upgrades?): waiting for it,"
                    f" at most {wait / 60:.0f} minutes",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            time.sleep(pause)
            continue
        raise ColibriError(f"{' '.join(cmd[:2])} failed: {last}")


# dpkg's package states (dpkg-query(1), "Package states"): the files are on disk and configured in
# these; in the others (not-installed, config-files, half-installed, unpacked, half-configured)
# the package cannot be relied on.
USABLE_STATES = ("installed", "triggers-awaited", "triggers-pending")


def status_is_installed(status: str) -> bool:
    """Whether dpkg's `${Status}` ("want error-flag state", e.g. "install ok installed") says the
    package is installed and usable. A package dpkg has seen but never installed reads
    "unknown ok not-installed"; "reinstreq" marks a broken installation."""
    words = status.split()
    return len(words) == 3 and words[1] == "ok" and words[2] in USABLE_STATES


def installed_packages(packages: list[str]) -> set[str]:
    """Those of `packages` that dpkg reports installed (any architecture of a multi-arch one)."""
    if not packages:
        return set()
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${binary:Package}\t${Status}\n", *packages], capture_output=True, text=True
    )
    # Exit status 1 only says that some name is unknown to dpkg; the others are still listed.
    found = set()
    for line in done.stdout.splitlines():
        name, _, status = line.partition("\t")
        if status_is_installed(status):
            found.add(name.split(":")[0])
    return found


def installed(package: str) -> bool:
    return package in installed_packages([package])


def have_dpkg() -> bool:
    return shutil.which("dpkg-query") is not None


def ensure_packages(listing: Path) -> None:
    wanted = [p for p in (line.split("#")[0].strip() for line in listing.read_text().splitlines()) if p]
    for name in wanted:  # handed to apt-get as root: a name, never an option (as a board file's apt)
        if not DEBIAN_PACKAGE.accepts(name):
            raise ColibriError(f"{listing.name}: {name!r} is not {DEBIAN_PACKAGE.what}")
    present = installed_packages(wanted)
    missing = [p for p in wanted if p not in present]
    if missing:
        apt_install(missing, f"packages listed in {listing.name}")


def missing_for(board: Board) -> tuple[list[str], list[str]]:
    """What this machine lacks for a board: its Debian packages that dpkg does not report installed
    (on machines with dpkg; a library such as picolibc has no program to look for) and its programs
    that are not on PATH."""
    tools = [t for t in board.tools() if not shutil.which(t)]
    packages = []
    if have_dpkg():
        present = installed_packages(list(board.apt_packages))
        packages = [p for p in board.apt_packages if p not in present]
    return packages, tools


@dataclass(frozen=True)
class BoardNeeds(JsonDocument):
    """What a board needs on this machine (`devices --probe` with no board plugged in): its programs
    and where they are (None: not on PATH), its Debian packages not installed, and for an ESP-IDF
    board where idf.py is (None: not found: the project is generated, not built, here); for a board
    that links against a sysroot (linux-aarch64-mpi), where it goes while it is not made."""

    board: str
    programs: dict[str, str | None]
    packages_missing: list[str]
    idf: str | None = None
    needs_idf: bool = False
    sysroot_missing: str | None = json_field(None, then=("ready",))
    sysroot_arch: str = json_field("", skip=True)

    @property
    def ready(self) -> bool:
        return (
            all(self.programs.values())
            and not self.packages_missing
            and (self.idf is not None or not self.needs_idf)
            and self.sysroot_missing is None
        )

    def line(self) -> str:
        parts = [f"{program} {where or 'NOT FOUND'}" for program, where in self.programs.items()]
        if self.packages_missing:
            parts.append(f"Debian packages not installed: {' '.join(self.packages_missing)}")
        if self.needs_idf:
            parts.append(
                f"ESP-IDF's idf.py {self.idf or 'NOT FOUND (its project is generated here, built where ESP-IDF is)'}"
            )
        if self.sysroot_missing:
            parts.append(
                f"the {self.sysroot_arch} sysroot {self.sysroot_missing} is not made: make it with "
                f"`.venv/bin/python -m generator.device.setup_toolchain {self.board}` (mmdebstrap, about a minute)"
            )
        return f"{self.board:<14} {'ready' if self.ready else 'NOT READY'}: {'; '.join(parts)}"


def board_needs(board: Board) -> BoardNeeds:
    from ..compile.esp32.idf_build import find_idf

    packages, _ = missing_for(board)
    programs = {tool: shutil.which(tool) for tool in board.tools()}
    idf = find_idf() if board.idf is not None else None
    sysroot = board.sysroot
    missing = str(sysroot.path()) if sysroot is not None and not sysroot.is_made() else None
    arch = sysroot.arch if sysroot is not None else ""
    return BoardNeeds(board.name, programs, packages, str(idf) if idf else None, board.idf is not None, missing, arch)


def every_board_needs() -> list[BoardNeeds]:
    return [board_needs(load_board(name)) for name in available_boards()]


def ensure_toolchain(board: Board) -> None:
    packages, tools = missing_for(board)
    if packages or tools:
        install_toolchain(board, packages, tools)
    if board.sysroot is not None:
        make_sysroot(board.sysroot)


def install_toolchain(board: Board, packages: list[str], tools: list[str]) -> None:
    if not board.apt_packages:
        raise ColibriError(f"{tools[0]!r} for board {board.name} not found")
    why = f"{tools[0]} not found" if tools else f"{packages[0]} not installed"
    apt_install(packages or list(board.apt_packages), f"the {board.name} toolchain ({why})")
    packages, tools = missing_for(board)
    if tools:
        raise ColibriError(f"installed {' '.join(board.apt_packages)} but {tools[0]!r} is still not on PATH")
    if packages:
        raise ColibriError(f"apt-get ran but dpkg still does not report {' '.join(packages)} installed")


# ---- A board's sysroot (Sysroot, boards/board.py), made once with mmdebstrap ----

APT_DIR = Path("/etc/apt")
OS_RELEASE = Path("/etc/os-release")
# A mirror's URI becomes one argument of mmdebstrap (no shell): http(s), no whitespace or quotes.
_MIRROR = re.compile(r"https?://[A-Za-z0-9._~:/?#@!$&*+,;=%-]+")


def host_suite(os_release: Path = OS_RELEASE) -> str:
    """This machine's Debian release (VERSION_CODENAME): the sysroot's, so its C library is the
    cross toolchain's and its Open MPI the one this machine's mpirun speaks to."""
    try:
        text = os_release.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and re.fullmatch(r"[a-z]+", value.strip().strip('"')):
            return value.strip().strip('"')
    raise ColibriError(f"{os_release} names no Debian release (VERSION_CODENAME): a sysroot is made on Debian")


def _source_entries(apt_dir: Path) -> Iterator[tuple[list[str], str, list[str], list[str]]]:
    """(types, URI, suites, components) of every source apt is configured with: one-line entries
    (sources.list, sources.list.d/*.list) and deb822 stanzas (sources.list.d/*.sources)."""
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in one_line:
        for line in _read_or_empty(path).splitlines():
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()  # [options] left out
            if len(words) >= 4:
                yield [words[0]], words[1], [words[2]], words[3:]
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", _read_or_empty(path)):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                if line and not line.startswith(("#", " ", "\t")) and ":" in line:
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.split()
            if fields.get("enabled", ["yes"])[0].lower() == "no":
                continue
            for uri in fields.get("uris", []):
                yield fields.get("types", []), uri, fields.get("suites", []), fields.get("components", [])


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def debian_mirror(suite: str, apt_dir: Path = APT_DIR) -> str:
    """The Debian archive this machine's apt sources already name for `suite` (main): the sysroot
    comes from where this machine's own packages do."""
    for types, uri, suites, components in _source_entries(apt_dir):
        if "deb" in types and suite in suites and "main" in components and _MIRROR.fullmatch(uri):
            return uri.rstrip("/")
    raise ColibriError(
        f"no Debian mirror for {suite} (main) in {apt_dir}/sources.list or sources.list.d/: "
        "the sysroot is made from the archive apt already uses"
    )


def make_sysroot(sysroot: Sysroot, apt_dir: Path = APT_DIR, os_release: Path = OS_RELEASE) -> Path:
    """The sysroot, made once (mmdebstrap --variant=extract: the packages unpacked, nothing run)
    into a temporary folder beside it and renamed into place whole, so no half-made one is used."""
    final = sysroot.path()
    if sysroot.is_made():
        return final
    suite = host_suite(os_release)
    mirror = debian_mirror(suite, apt_dir)
    if not shutil.which("mmdebstrap"):
        raise ColibriError("mmdebstrap not found: the sysroot is made with it (apt-get install mmdebstrap)")
    final.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    packages = ",".join(sysroot.packages)
    print(
        f"colibri: making the {sysroot.arch} sysroot {final} ({packages} from {mirror}, {suite}; once, about a minute)",
        file=sys.stderr,
        flush=True,
    )
    command = ["mmdebstrap", "--quiet", f"--arch={sysroot.arch}", "--variant=extract", f"--include={packages}"]
    done = subprocess.run([*command, suite, str(making), mirror], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        shutil.rmtree(making, ignore_errors=True)
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ColibriError(f"mmdebstrap could not make the {sysroot.arch} sysroot: {last}")
    (making / MADE_STAMP).write_text(f"suite {suite}\nmirror {mirror}\npackages {packages}\n")
    if final.exists() and not sysroot.is_made():
        shutil.rmtree(final)  # a folder left by an interrupted run of an older version
    try:
        making.rename(final)
    except OSError:
        shutil.rmtree(making, ignore_errors=True)
        if not sysroot.is_made():  # else another run made it meanwhile
            raise
    return final


def main(argv: list[str]) -> int:
    boards, command = argv, []
    if "--" in argv:
        i = argv.index("--")
        boards, command = argv[:i], argv[i + 1 :]
    listing = None
    if "--packages" in boards:
        i = boards.index("--packages")
        listing = Path(boards[i + 1])
        boards = boards[:i] + boards[i + 2 :]
    names = available_boards() if boards == ["--all"] else boards
    try:
        for name in names:
            ensure_toolchain(load_board(name))
        if listing:
            ensure_packages(listing)
    except ColibriError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
