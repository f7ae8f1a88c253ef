"""A board file is data (BOARD_FIELDS in boards/load.py): a value that would reach a shell, a path
outside the build, or C source unchecked is refused when the board loads, with one line naming the
field; the compiler is started without a shell. None of these tests builds: loading is where they
stop."""

from __future__ import annotations

import copy
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from generator import __version__, cli
from generator.boards import available_boards, board_from_data, load_board, read_board_file
from generator.boards.load import TARGETS_DIR
from generator.compile.build import spawn_argument_list
from generator.compile.emit import board_context, environment
from generator.errors import ColibriError


def board_file(tmp_path: Path, text: str) -> Path:
    """A board of one's own that extends host and says `text` besides."""
    path = tmp_path / "mine.toml"
    path.write_text('extends = "host"\nname = "mine"\n' + text)
    return path


def refused(path: Path) -> str:
    with pytest.raises(ColibriError) as e:
        load_board(str(path))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path.name}: "), message
    return message


HOSTILE = [
    ("[toolchain]\ncflags = ['-O2', '`touch {marker}`']", "toolchain.cflags[1]"),
    ("[toolchain]\ncflags = ['-O2 -DX']", "toolchain.cflags[0]"),
    ("[toolchain]\nldflags = ['-Wl,$(touch {marker})']", "toolchain.ldflags[0]"),
    ("[toolchain]\nldflags = ['-o/tmp/elsewhere']", "toolchain.ldflags[0]"),
    ("[toolchain]\ncflags = ['-wrapper', 'sh,-c']", "toolchain.cflags[0]"),
    ("[toolchain]\nlibs = ['m;touch {marker};']", "toolchain.libs[0]"),
    ("[toolchain]\napt = ['-oAPT::Update::Pre-Invoke::=touch {marker}']", "toolchain.apt[0]"),
    ("[toolchain]\ncc = 'gcc;touch {marker}'", "toolchain.cc"),
    ("[toolchain]\nlinker_script = '../../etc/passwd'", "toolchain.linker_script"),
    ("[runner]\nweights = 'FILE 1\\nint injected;'", "runner.weights"),
    ("[[memory]]\nname = 'ram'\nkind = '*/ int injected; /*'\nsize = 0\nholds = ['code']", "memory[0].kind"),
    ("[[memory]]\nname = 'ram */ int injected; /*'\nkind = 'dram'\nsize = 0\nholds = ['code']", "memory[0].name"),
    ("[[memory]]\nname = 'ram'\nkind = 'dram'\nsize = -5\nholds = ['code']", "memory[0].size"),
    ("[[memory]]\nname = 'ram'\nkind = 'dram'\nsize = 0x10000000000000000\nholds = ['code']", "memory[0].size "),
    ("kernels = ['../../../tmp/x']", "kernels[0]"),
    ("bsp = '/tmp'", "bsp"),
    ("[toolchain.sysroot]\narch = 'arm64'\npackages = ['--hook-dir=/tmp']", "toolchain.sysroot.packages[0]"),
    ("[toolchain.sysroot]\narch = 'arm64'\npackages = ['libc6-dev']\nlib = ['../../etc']", "toolchain.sysroot.lib[0]"),
]


@pytest.mark.parametrize(("text", "field"), HOSTILE, ids=[f for _, f in HOSTILE])
def test_a_value_outside_its_grammar_is_refused_with_one_line_naming_the_field(tmp_path, text, field):
    marker = tmp_path / "marker"
    assert field in refused(board_file(tmp_path, text.format(marker=marker)))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../elsewhere", "a/b", "", ".."])
def test_name_is_a_plain_name(tmp_path, name):
    path = tmp_path / "mine.toml"
    path.write_text(f'extends = "host"\nname = "{name}"\n')
    assert "name = " in refused(path)


@pytest.mark.parametrize("program", ["/tmp/firmware", "../../firmware", "", "a/../../b"])
def test_program_stays_inside_the_build_directory(tmp_path, program):
    assert "program = " in refused(board_file(tmp_path, f'program = "{program}"\n'))


def test_a_region_ending_beyond_a_32_bit_address_space_is_refused(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        'extends = "qemu-rv32"\nname = "mine"\n[[memory]]\nname = "ram"\nkind = "sram"\nbase = 0xFFFF0000\n'
        'size = 0x20000\nholds = ["code", "weights", "kv_cache", "scratch", "rope_tables"]\n'
    )
    assert "beyond the 32-bit address space" in refused(path)


@pytest.mark.parametrize(
    ("toolchain", "field"),
    [("cflags = ['-O2', '`touch {marker}`']", "cflags"), ("libs = ['m;touch {marker};']", "libs")],
)
def test_build_refuses_the_board_before_anything_runs(tmp_path, toolchain, field):
    marker, out = tmp_path / "marker", tmp_path / "out"
    path = board_file(tmp_path, "[toolchain]\n" + toolchain.format(marker=marker) + "\n")
    done = run_cli("build", "--board", path, "--out", out)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and f"toolchain.{field}" in lines[0], done.stderr
    assert not marker.exists() and not out.exists()


def test_a_colibri_toml_naming_such_a_board_file_is_refused_the_same(tmp_path, monkeypatch, capsys):
    marker, out = tmp_path / "marker", tmp_path / "out"
    path = board_file(tmp_path, f"[toolchain]\nlibs = ['m;touch {marker};']\n")
    (tmp_path / "colibri.toml").write_text(f'board = "{path}"\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build", "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("colibri: error:")]
    assert len(lines) == 1 and "toolchain.libs[0]" in lines[0]
    assert not marker.exists() and not out.exists()


def test_the_compiler_gets_its_arguments_as_a_list_never_through_a_shell(tmp_path):
    marker, seen = tmp_path / "marker", tmp_path / "seen"
    argument = f"`touch {marker}`;$(touch {marker}) | touch {marker}"
    write = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
    assert spawn_argument_list("sh", None, sys.executable, [sys.executable, "-c", write, str(seen), argument], {}) == 0
    assert seen.read_text() == argument and not marker.exists()


def test_a_compiler_that_cannot_start_is_one_line(tmp_path, capsys):
    assert spawn_argument_list("sh", None, "x", [str(tmp_path / "no-such-cc"), "-c", "a.c"], {}) == 127
    assert capsys.readouterr().err.count("\n") == 1


# ---- Fuzzing: random strings into every field of every board of targets/ ----

NASTY = [
    "",
    "`touch MARKER`",
    "$(touch MARKER)",
    "a;touch MARKER",
    "../../../tmp/x",
    "/tmp/x",
    "*/ int injected; /*",
    'x" int injected; "',
    "a\nb",
    "a\0b",
    "-o",
    "é\u202e",
    "x" * 300,
    "${__import__('os').system('touch MARKER')}",
]
NON_STRINGS = [-5, 2**70, 3.5, True, [], {}, ["-O2", 7]]


# board_def.h's macros that follow the board's values: its regions' names and where weights live
VARYING_MACROS = re.compile(
    r"COLIBRI_REGION_[A-Z0-9_]+_(BASE|SIZE)|COLIBRI_WEIGHTS_(FILE|MAPPED|EMBEDDED|PARTITION|ADDR|REGION_BYTES)"
)


def _leaves(value, where=()):
    """Every (path, value) of a parsed board file: table keys and list indices."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*where, k))
    elif isinstance(value, list):
        yield where, value
        for i, v in enumerate(value):
            yield from _leaves(v, (*where, i))
    else:
        yield where, value


def _with(data: dict, where: tuple, value) -> dict:
    changed = copy.deepcopy(data)
    target = changed
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    return changed


def _board_def_h(board) -> str:
    context = dict(board_context(board), fw_version=__version__)
    return environment().get_template("board_def.h.j2").render(context)


def _declares(headers: list[Path]) -> tuple[set[str], str]:
    """The macros the headers define and what they hold besides them (gcc's preprocessor, once
    for all of them)."""
    args = ["gcc", "-E", "-x", "c", *map(str, headers)]
    macros = subprocess.run([*args, "-dM"], capture_output=True, text=True, check=True).stdout
    code = subprocess.run([*args, "-P"], capture_output=True, text=True, check=True).stdout
    return {line.split()[1].split("(")[0] for line in macros.splitlines() if line.startswith("#define")}, code.strip()


@pytest.mark.parametrize("board_name", available_boards())
def test_fuzzed_board_files_load_cleanly_or_are_refused_with_one_line(tmp_path, board_name):
    """Every field of the board (each key, list and element) replaced by hostile strings (four of
    NASTY, drawn per field), a random one and a value of another type: each board is a Board or a one-line ColibriError, never
    another exception. A board that loads renders a board_def.h with the same macros as the
    untouched board's and no code (nothing injected)."""
    path = TARGETS_DIR / f"{board_name}.toml"
    data = read_board_file(path)
    original = tmp_path / "original.h"
    original.write_text(_board_def_h(board_from_data(data, path)))
    expected = _declares([original])[0]
    rng = random.Random(board_name)
    alphabet = "abc-_./;`$(){}[]*|&<>'\"\\ \n\t\0é#!~?=,:@%^+0123456789"
    accepted = []
    for where, _ in _leaves(data):
        random_text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        values = [*rng.sample(NASTY, 4), rng.choice(NON_STRINGS), random_text]
        for value in values:
            try:
                board = board_from_data(_with(data, where, value), path)
            except ColibriError as e:
                assert "\n" not in str(e), (where, value, str(e))
                continue
            accepted.append(board)
    assert accepted  # (free text such as the description takes any string)
    headers = []
    for text in sorted({_board_def_h(board) for board in accepted}):
        headers.append(tmp_path / f"board_def_{len(headers)}.h")
        headers[-1].write_text(text)
    macros, code = _declares(headers)
    assert code == "" and sorted(m for m in macros if m not in expected and not VARYING_MACROS.fullmatch(m)) == []
    assert not list(tmp_path.glob("**/*MARKER*")) and not Path("MARKER").exists()


def test_an_emulator_naming_a_sysroot_the_board_lacks_is_refused(tmp_path):
    path = board_file(tmp_path, "[runner]\nemulator = ['qemu-aarch64', '-L', '{sysroot}']\n")
    assert "names {sysroot}, but the board has no [toolchain.sysroot]" in refused(path)
