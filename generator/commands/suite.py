"""test: the whole test suite (./colibri test installs its dependencies first and never reaches
here; run as python -m generator.cli test it is the same suite with the environment at hand)."""

from __future__ import annotations

import argparse
import os
import sys

from ..files import REPO
from .common import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Declared for --help only: everything after `test` goes to pytest, where tests/conftest.py
    # defines --fast.
    p.add_argument("--fast", action="store_true", help="the fast tier: leave out the tests marked slow")


def run(args: argparse.Namespace) -> int:
    python = sys.executable
    argv = [
        python,
        "-m",
        "generator.device.setup_toolchain",
        "--all",
        "--packages",
        "tests/apt-packages.txt",
        "--",
        python,
        "-m",
        "pytest",
        "-q",
        "tests",
        *args.pytest_args,
    ]
    os.chdir(REPO)
    sys.stdout.flush()
    os.execv(python, argv)
    return 0  # not reached


COMMANDS = [
    Command(
        "test",
        "install the test dependencies and run the whole test suite "
        "(arguments after it go to pytest, as with ./colibri test)",
        add_arguments,
        run,
    )
]
