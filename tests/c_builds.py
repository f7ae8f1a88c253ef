"""The tests' C programs (harnesses, simulated boards) built with this machine's gcc as strictly as
the firmware is: C11, every warning an error."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# How the kernel sets' harnesses and the kernel benchmarks in tools/ compile: C11, every warning an
# error, the numerics contract's flags.
STRICT_C_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-fno-math-errno"]


def gcc(out: Path, *args: object, optimize: str = "-O2") -> Path:
    """gcc -std=c11 <optimize> -Wall -Wextra -Werror, then args (flags, sources, libraries), into out."""
    command = ["gcc", "-std=c11", optimize, "-Wall", "-Wextra", "-Werror", *map(str, args), "-o", str(out)]
    subprocess.run(command, check=True)
    return out


# The C the test programs are built from: a program's key holds all of it, so a changed header is
# a new program even though the command does not name it.
PROGRAM_SOURCES = (Path(__file__).resolve().parent / "c", Path(__file__).resolve().parents[1] / "firmware_src")


def built_once(name: str, command: list[str]) -> Path:
    """The program that `command` (a compiler and its arguments, without -o) links, built once per
    test run and shared by the run's parallel workers: kept in the run's program folder
    (COLIBRI_TEST_PROGRAMS, made by tests/conftest.py) under a key of the command and every file in
    PROGRAM_SOURCES; a worker that asks while another builds it waits for that build."""
    key = hashlib.sha256("\0".join(command).encode())
    for folder in PROGRAM_SOURCES:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    folder = Path(os.environ["COLIBRI_TEST_PROGRAMS"])
    out = folder / f"{name}-{key.hexdigest()[:16]}"
    with open(folder / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            partial = out.with_suffix(".partial")
            subprocess.run([*command, "-o", str(partial)], check=True)
            partial.rename(out)
    return out


def objects_once(compile_command: list[str], sources: list) -> list[Path]:
    """Each source compiled (-c) by compile_command (a compiler and its flags) once per test run,
    built_once: programs linked from the same sources with the same flags (a kernel set's numerics
    harness and the kernel benchmarks in tools/) share its objects instead of compiling the set
    again. The sources are compiled side by side, one per core (a worker that needs an object
    another is compiling waits for it). Sources are given by absolute paths, so the command is the
    same from any directory."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(
            pool.map(
                lambda source: built_once(f"object-{Path(source).stem}", [*compile_command, "-c", str(source)]), sources
            )
        )
