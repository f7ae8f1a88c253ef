"""The tests' C programs (harnesses, simulated boards) built with this machine's gcc as strictly as
the firmware is: C11, every warning an error."""

from __future__ import annotations

import subprocess
from pathlib import Path


def gcc(out: Path, *args: object, optimize: str = "-O2") -> Path:
    """gcc -std=c11 <optimize> -Wall -Wextra -Werror, then args (flags, sources, libraries), into out."""
    command = ["gcc", "-std=c11", optimize, "-Wall", "-Wextra", "-Werror", *map(str, args), "-o", str(out)]
    subprocess.run(command, check=True)
    return out
