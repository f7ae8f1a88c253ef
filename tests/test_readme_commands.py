"""The README's commands match the CLI: every command has a row, each row lists exactly the options
the command's parser has, the decoding options exist, and the README's scons line runs as written."""

from __future__ import annotations

import re
import subprocess

import pytest

from generator.cli import make_parser

from conftest import REPO

README = (REPO / "README.md").read_text()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def command_rows() -> dict[str, tuple[str, str]]:
    """README's commands table: command name -> (options cell, what-it-does cell)."""
    section = README[README.index("## Commands"):README.index("### Benchmarks")]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(?:\./colibri|\.venv/bin/scons) ?([a-z-]*)[^`]*` \| (.*?) \| (.*) \|$", line)
        if m:
            name = m.group(1) if "colibri" in line.split("|")[1] else "scons"
            rows[name] = (m.group(2), m.group(3))
    return rows


def parser_flags(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


_, COMMANDS = make_parser()
ROWS = command_rows()


def test_the_readme_opens_with_its_two_commands():
    assert README.split("```sh\n", 1)[1].startswith(
        './colibri verify --board host --model models/kjv-tiny --prompt "And God said"\n./colibri test\n```')


def test_every_command_has_a_row():
    assert set(COMMANDS) <= set(ROWS), sorted(set(COMMANDS) - set(ROWS))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_row_lists_exactly_the_commands_options(name):
    options, _ = ROWS[name]
    documented = set(FLAG.findall(options))
    as_other = re.match(r"as `(\w[\w-]*)`", options)
    if as_other:
        documented |= set(FLAG.findall(ROWS[as_other.group(1)][0]))
    if name in ("run", "verify") or (as_other and as_other.group(1) in ("run", "verify")):
        # "the decoding options below": the paragraph that lists them
        paragraph = README[README.index("Decoding options for `run` and `verify`"):]
        documented |= set(FLAG.findall(paragraph.split("\n\n", 1)[0]))
    assert documented == parser_flags(COMMANDS[name]), (
        f"{name}: documented but not in the parser {sorted(documented - parser_flags(COMMANDS[name]))}; "
        f"in the parser but not documented {sorted(parser_flags(COMMANDS[name]) - documented)}")


def test_the_top_level_options_are_documented():
    parser, _ = make_parser()
    assert "`./colibri --version`" in README and parser_flags(parser) == {"--version"}


def test_the_readme_scons_line_runs_as_written(tmp_path):
    line = next(line for line in README.splitlines() if line.startswith("| `.venv/bin/scons "))
    command = line.split("`")[1].split()
    out = REPO / "build" / "host" / "kjv-tiny-q8_0-ctx256"
    existed = out.exists()
    # As written, with -n: SCons works out the whole build without writing anything.
    done = subprocess.run([command[0], "-n", *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "colibri: error" not in done.stderr
    assert out.exists() == existed


def documented_outputs() -> dict[str, set[str]]:
    """README's build outputs table: board -> the paths it documents for that board."""
    section = README[README.index("### Build outputs"):]
    section = section[:section.index("\n\n", section.index("| path |"))]
    per_board: dict[str, set[str]] = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 3 or cells[0] == "path" or set(cells[0]) <= {"-"}:
            continue
        paths = [p.rstrip("/") for p in re.findall(r"`([^`]+)`", cells[0])]
        boards = ["host", "linux-aarch64", "qemu-rv32", "esp32p4", "esp32p4-idf"] if cells[1] == "all" else \
            [b.strip() for b in cells[1].split(",")]
        for board in boards:
            per_board.setdefault(board, set()).update(paths)
    return per_board


@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32", "esp32p4", "esp32p4-idf"])
def test_the_build_outputs_table_is_what_a_build_leaves(builder, board):
    from conftest import DEFAULT_MODEL

    _, art, _ = builder.build(DEFAULT_MODEL, "q8_0", 64, board=board)
    present = {p.name for p in art.out_dir.iterdir()} - {".sconsign.dblite", "idf-project.stamp"}
    assert present == documented_outputs()[board]


def test_every_report_row_is_explained():
    from generator.report import ROWS

    table = README[README.index("| row | what |"):]
    table = table[:table.index("\n\n")]
    explained = set(re.findall(r"`([a-z_]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert set(ROWS) == explained
