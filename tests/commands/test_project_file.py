"""colibri.toml: a project's default board, model, port (and any other long option), read by every
command from the current directory or the repository root, overridden by flags. Every file here
lives in a temporary directory: none is left in the repository."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, REPO

from generator import cli, project_file
from generator.boards import load_board
from generator.errors import ColibriError
from generator.option_checks import check_board_options
from generator.project_file import apply_project_file, find_project_file, load_project_file


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory as the current directory; write(text) puts colibri.toml in it."""
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> Path:
        path = tmp_path / "colibri.toml"
        path.write_text(text)
        return path

    return write


def test_the_file_gives_every_command_its_defaults_and_flags_override_them(project, tmp_path):
    project('board = "esp32p4"\nmodel = "models/mine"\nport = "/dev/ttyACM3"\n\n[bench]\nsteps = 32\n')
    args = cli.parse_args(["run", "--prompt", "x"])
    assert (args.board, args.model, args.port) == ("esp32p4", tmp_path / "models" / "mine", "/dev/ttyACM3")
    assert args.given == {"prompt"}  # what the file set is not "given" on the command line
    args = cli.parse_args(["bench"])
    assert args.steps == 32 and args.board == "esp32p4"
    args = cli.parse_args(["run", "--board", "host", "--steps", "5"])
    assert args.board == "host" and args.steps == 5 and {"board", "steps"} <= args.given
    # The file's port means nothing to host: skipped, not refused. On the command line it is refused.
    check_board_options(load_board("host"), args, args.given)
    args = cli.parse_args(["run", "--board", "host", "--port", "/dev/ttyUSB1"])
    with pytest.raises(ColibriError, match="--port is for boards on a serial port"):
        check_board_options(load_board("host"), args, args.given)
    args = cli.parse_args(["build"])  # build has no --port: the key is skipped
    assert not hasattr(args, "port") and args.board == "esp32p4"


def test_clean_and_verify_release_do_not_take_the_build_defaults(project):
    project('board = "esp32p4"\nmodel = "models/mine"\n')
    args = cli.parse_args(["clean"])
    assert args.only_board is None and args.only_model is None
    assert cli.parse_args(["verify-release", "x"]).release_model is None


@pytest.mark.parametrize(
    "text, words",
    [
        ('bord = "host"\n', "bord is not an option of any command"),
        ("[run]\nbaud = 9600\n", "[run] baud is not an option of run"),
        ("[frobnicate]\nsteps = 3\n", "[frobnicate] is not a command"),
        ("steps = 0\n", "steps = 0: expected a positive integer"),
        ('quant = "q3"\n', "choose from f32, q8_0, q4_0"),
        ('greedy = "yes"\n', "greedy = 'yes': expected true or false"),
        ("board = \n", "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line(project, capsys, text, words):
    path = project(text)
    assert cli.main(["run", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"colibri: error: {path}") and words in err[0], err


def test_booleans_and_dashed_keys(project):
    project('greedy = true\nprompt-ids = "1,2,3"\n[verify]\nignore_eos = true\n')
    args = cli.parse_args(["verify"])
    assert args.greedy is True and args.prompt_ids == "1,2,3" and args.ignore_eos is True


def test_any_option_of_a_command_is_a_key_remote_included_once_a_command_has_it(tmp_path):
    """The keys are the parsers' options, so an option added later (e.g. --remote for Linux boards
    over SSH) is a colibri.toml key without touching project_file.py."""
    run = argparse.ArgumentParser(prog="run")
    run.add_argument("--board", default="host")
    run.add_argument("--remote")
    path = tmp_path / "colibri.toml"
    path.write_text('board = "linux-aarch64"\nremote = "pi@raspberrypi:2222"\n')
    applied = apply_project_file(load_project_file(path, {"run"}), "run", {"run": run})
    assert applied == {"board": "linux-aarch64", "remote": "pi@raspberrypi:2222"}
    assert run.parse_args([]).remote == "pi@raspberrypi:2222"
    assert run.parse_args(["--remote", "me@board"]).remote == "me@board"


def test_the_file_is_found_in_the_current_directory_then_at_the_repository_root(tmp_path, monkeypatch):
    here, root = tmp_path / "here", tmp_path / "root"
    here.mkdir()
    root.mkdir()
    monkeypatch.setattr(project_file, "REPO", root)
    assert find_project_file(here) is None
    (root / "colibri.toml").write_text('board = "qemu-rv32"\n')
    assert find_project_file(here) == root / "colibri.toml"
    (here / "colibri.toml").write_text('board = "host"\n')
    assert find_project_file(here) == here / "colibri.toml"


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_a_command_run_from_a_project_directory_uses_its_file(tmp_path):
    (tmp_path / "colibri.toml").write_text(f'board = "qemu-rv32"\nmodel = "{DEFAULT_MODEL}"\n[build]\nctx = 64\n')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "generator.cli", "build", "--json", "--out", str(tmp_path / "b")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["board"] == "qemu-rv32" and info["n_ctx"] == 64
    assert f"settings from {tmp_path / 'colibri.toml'}: board = qemu-rv32" in done.stderr


def test_file_values_a_board_cannot_take_are_skipped_and_flags_beat_the_files_greedy(project):
    from generator.option_checks import check_sampling_options

    project('threads = 4\nport = "/dev/ttyACM0"\ngreedy = true\n')
    args = cli.parse_args(["run", "--board", "qemu-rv32", "--temperature", "0.7"])
    check_board_options(load_board("qemu-rv32"), args, args.given, args.parser_defaults)
    assert args.threads == 1 and args.port is None  # skipped: this board takes neither
    check_sampling_options(args, args.given)
    assert args.greedy is False and args.temperature == 0.7  # the command line overrides the file
    args = cli.parse_args(["run", "--board", "host"])
    check_board_options(load_board("host"), args, args.given, args.parser_defaults)
    assert args.threads == 4 and args.greedy is True
