"""The habits of the code, checked by the test command like everything else: ruff's lint on every
Python file, ruff's format on all of it, mypy on the typed packages
(pyproject.toml holds each tool's settings)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_in_the_python():
    done = tool("ruff", "check", "--output-format", "concise", "generator", "tools", "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_python_is_as_ruff_format_lays_it_out():
    done = tool("ruff", "format", "--check", "generator", "tools", "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_typed_packages():
    done = tool("mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_typed_packages_include_the_formatted_ones():
    typed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"generator/boards", "generator/device/links.py", "generator/job.py"} <= set(typed)
    # The results other modules read (bench's, report's, verify's, the stats frame's) are typed.
    assert {"generator/bench", "generator/report.py", "generator/verify.py", "generator/device/session.py"} <= set(
        typed
    )


def test_the_console_command_is_the_cli():
    """pyproject.toml's `colibri` entry point names the CLI's main, which ./colibri runs too."""
    from generator.cli import main

    script = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["colibri"]
    module, _, name = script.partition(":")
    assert (module, name) == (main.__module__, main.__name__)


def test_the_bootstrap_installs_the_console_command_into_the_venv():
    """./colibri installs the project editable into .venv: `.venv/bin/colibri` runs this checkout."""
    done = subprocess.run([str(BIN / "colibri"), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from generator import __version__

    assert __version__ in done.stdout + done.stderr
