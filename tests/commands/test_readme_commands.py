"""The documented commands match the CLI: the README's command table has a line for every command,
docs/commands.md has a row per command listing exactly the options the command's parser has, the
decoding options exist, and the documented scons lines run as written."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO

from generator.cli import make_parser

pytestmark = pytest.mark.slow  # runs the README's commands

README = (REPO / "README.md").read_text()
COMMANDS_DOC = (REPO / "docs" / "commands.md").read_text()  # the full reference of every command
BOARDS_DOC = (REPO / "docs" / "boards.md").read_text()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def command_rows() -> dict[str, tuple[str, str]]:
    """docs/commands.md's commands table: command name -> (options cell, what-it-does cell)."""
    section = COMMANDS_DOC[COMMANDS_DOC.index("# Commands") : COMMANDS_DOC.index("## Chat and eval")]
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
        './colibri verify --board host --model models/kjv-tiny --prompt "And God said"\n./colibri test\n```'
    )


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
        paragraph = COMMANDS_DOC[COMMANDS_DOC.index("Decoding options for `run` and `verify`") :]
        documented |= set(FLAG.findall(paragraph.split("\n\n", 1)[0]))
    assert documented == parser_flags(COMMANDS[name]), (
        f"{name}: documented but not in the parser {sorted(documented - parser_flags(COMMANDS[name]))}; "
        f"in the parser but not documented {sorted(parser_flags(COMMANDS[name]) - documented)}"
    )


def test_the_readme_has_one_line_per_command():
    """The landing page's command table: every command once, and nothing that is not a command."""
    section = README[README.index("## Commands") : README.index("## Documentation")]
    names = re.findall(r"^\| `\./colibri ([a-z-]+)` \| [^|]+ \|$", section, flags=re.M)
    assert sorted(names) == sorted(COMMANDS), (
        f"missing {sorted(set(COMMANDS) - set(names))}, not commands {sorted(set(names) - set(COMMANDS))}, "
        f"twice {sorted({n for n in names if names.count(n) > 1})}"
    )


def test_the_readme_names_the_test_command_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    last = [line for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")][-1]
    assert last.strip() == "./colibri test"
    assert "./colibri test\n```" in README and "CI\n(`.ci/run`) runs `./colibri test`" in README
    assert "| `./colibri test` |" in README and "(what `.ci/run` calls)" in README


def test_the_top_level_options_are_documented():
    parser, _ = make_parser()
    assert "`./colibri --version`" in README and "`./colibri --version`" in COMMANDS_DOC
    assert parser_flags(parser) == {"--version"}


@pytest.mark.parametrize("doc", ["README.md", "docs/commands.md"])
def test_the_documented_scons_line_runs_as_written(doc):
    text = (REPO / doc).read_text()
    line = next(line for line in text.splitlines() if line.startswith("| `.venv/bin/scons "))
    command = line.split("`")[1].split()
    out = REPO / "build" / "host" / "kjv-tiny-q8_0-ctx256"
    existed = out.exists()
    # As written, with -n: SCons works out the whole build without writing anything.
    done = subprocess.run([command[0], "-n", *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "colibri: error" not in done.stderr
    assert out.exists() == existed


def documented_outputs() -> dict[str, set[str]]:
    """docs/commands.md's build outputs table: board -> the paths it documents for that board."""
    section = COMMANDS_DOC[COMMANDS_DOC.index("## Build outputs") :]
    section = section[: section.index("\n\n", section.index("| path |"))]
    per_board: dict[str, set[str]] = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 3 or cells[0] == "path" or set(cells[0]) <= {"-"}:
            continue
        paths = [p.rstrip("/") for p in re.findall(r"`([^`]+)`", cells[0])]
        boards = (
            ["host", "linux-aarch64", "qemu-rv32", "esp32p4", "esp32p4-idf"]
            if cells[1] == "all"
            else [b.strip() for b in cells[1].split(",")]
        )
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

    table = BOARDS_DOC[BOARDS_DOC.index("| row | what |") :]
    table = table[: table.index("\n\n")]
    explained = set(re.findall(r"`([a-z_]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert set(ROWS) == explained
