"""Make sure a board's toolchain is installed: the board file lists its Debian packages.

    python -m generator.setup_toolchain (--all | BOARD...) [--packages FILE] [-- COMMAND ...]
installs what is missing (as root, through apt-get), then runs COMMAND if one is given. FILE lists
further Debian packages, one per line (# starts a comment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import ColibriError
from .targets import Board, available_boards, load_board


def apt_install(packages: list[str], why: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ColibriError(f"missing {why}: install {' '.join(packages)} (e.g. sudo apt-get install {' '.join(packages)})")
    print(f"colibri: installing {why}: {' '.join(packages)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ColibriError(f"{' '.join(cmd[:2])} failed: {last}")


def installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip().endswith("installed")


def ensure_packages(listing: Path) -> None:
    wanted = [line.split("#")[0].strip() for line in listing.read_text().splitlines()]
    missing = [p for p in wanted if p and not installed(p)]
    if missing:
        apt_install(missing, f"packages listed in {listing.name}")


def ensure_toolchain(board: Board) -> None:
    missing = [t for t in board.tools() if not shutil.which(t)]
    if not missing:
        return
    packages = list(board.apt_packages)
    if not packages:
        raise ColibriError(f"{missing[0]!r} for board {board.name} not found")
    apt_install(packages, f"the {board.name} toolchain ({missing[0]} not found)")
    still = [t for t in board.tools() if not shutil.which(t)]
    if still:
        raise ColibriError(f"installed {' '.join(packages)} but {still[0]!r} is still not on PATH")


def main(argv: list[str]) -> int:
    boards, command = argv, []
    if "--" in argv:
        i = argv.index("--")
        boards, command = argv[:i], argv[i + 1:]
    listing = None
    if "--packages" in boards:
        i = boards.index("--packages")
        listing = Path(boards[i + 1])
        boards = boards[:i] + boards[i + 2:]
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
