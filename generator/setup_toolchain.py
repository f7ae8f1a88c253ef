"""Make sure a board's toolchain is installed: the board file lists its Debian packages.

    python -m generator.setup_toolchain (--all | BOARD...) [-- COMMAND ...]
installs what is missing (as root, through apt-get), then runs COMMAND if one is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .errors import ColibriError
from .targets import Board, available_boards, load_board


def ensure_toolchain(board: Board) -> None:
    missing = [t for t in board.tools() if not shutil.which(t)]
    if not missing:
        return
    packages = list(board.apt_packages)
    if not packages:
        raise ColibriError(f"{missing[0]!r} for board {board.name} not found")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ColibriError(f"{missing[0]!r} for board {board.name} not found: "
                           f"install {' '.join(packages)} (e.g. sudo apt-get install {' '.join(packages)})")
    print(f"colibri: installing the {board.name} toolchain: {' '.join(packages)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ColibriError(f"{' '.join(cmd[:2])} failed: {last}")
    still = [t for t in board.tools() if not shutil.which(t)]
    if still:
        raise ColibriError(f"installed {' '.join(packages)} but {still[0]!r} is still not on PATH")


def main(argv: list[str]) -> int:
    boards, command = argv, []
    if "--" in argv:
        i = argv.index("--")
        boards, command = argv[:i], argv[i + 1:]
    names = available_boards() if boards == ["--all"] else boards
    try:
        for name in names:
            ensure_toolchain(load_board(name))
    except ColibriError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
