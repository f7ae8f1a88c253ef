"""--out, for every command that takes it: a directory that cannot be one (a file, a missing parent,
/proc, /sys, a read-only place, an empty name) or that holds the user's own files is refused in one
line with exit 2 before any work (no model read, nothing built), and the user's files stay as they were."""

import os
import stat
import time
from pathlib import Path

import pytest

from generator.cli import main
from generator.compile import build as colibri_build

# The commands with --out, each with what it needs besides it to get past argparse.
COMMANDS = {
    "build": [],
    "run": ["--prompt-ids", "1,2"],
    "verify": ["--prompt-ids", "1,2"],
    "chat": [],
    "eval": ["--text", "text.txt"],
    "bench": [],
    "report": [],
    "flash": ["--board", "esp32p4"],
    "ota": ["--board", "esp32p4-idf"],
    "release": [],
}


def read_only_dir(tmp_path: Path) -> Path:
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return ro / "out"


# Each case: the --out text, made from a fresh tmp_path, and a fragment of the one error line.
CASES = {
    "empty name": (lambda tmp: "", "is empty"),
    "a regular file": (lambda tmp: tmp / "file.txt", "not a directory"),
    "the README": (lambda tmp: Path(__file__).resolve().parents[2] / "README.md", "not a directory"),
    "missing parent": (lambda tmp: tmp / "no" / "such" / "out", "does not exist"),
    "under a file": (lambda tmp: tmp / "file.txt" / "out", "is not a directory"),
    "/proc": (lambda tmp: "/proc/nope", "cannot write in /proc"),
    "/sys": (lambda tmp: "/sys/kernel/x", "cannot write in /sys/kernel"),
    "read-only": (read_only_dir, "cannot write in"),
    "the user's files": (lambda tmp: tmp / "mine", "holds files a build did not make (firmware"),
}


def refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_out_is_one_line_before_any_work(capsys, tmp_path, command, case):
    if case == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes in a read-only directory")
    if case == "the user's files" and command == "release":
        pytest.skip("a release's --out holds many bundles: it refuses only a bundle's own names")
    (tmp_path / "file.txt").write_text("the user's\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "firmware").write_text("the user's firmware\n")
    make, fragment = CASES[case]
    out = make(tmp_path)
    started = time.monotonic()
    # A model that does not exist: reaching it would be a different error, so the --out check came first.
    line = refused(capsys, [command, *COMMANDS[command], "--model", str(tmp_path / "no-model"), "--out", str(out)])
    assert fragment in line, line
    assert time.monotonic() - started < 2
    assert (mine / "firmware").read_text() == "the user's firmware\n"
    assert (tmp_path / "file.txt").read_text() == "the user's\n"
    assert not Path("/proc/nope").exists()


def test_a_build_directory_and_an_empty_one_are_accepted():
    """What may be overwritten: a directory a build made (its marker, or SCons's database from
    before the marker), and an empty one."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, marker in (("marked", colibri_build.BUILD_DIR_MARKER), ("older", colibri_build.SCONS_DATABASE)):
            (root / name).mkdir()
            (root / name / marker).touch()
            (root / name / "firmware").touch()
            colibri_build.check_build_dir(root / name)
        (root / "empty").mkdir()
        colibri_build.check_build_dir(root / "empty")
        colibri_build.check_build_dir(root / "new")
        made = root / "made" / "deeper"
        colibri_build.make_build_dir(made)
        (made / "firmware").touch()
        colibri_build.check_build_dir(made)
