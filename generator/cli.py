"""The colibri command line: build, run, verify, report, bench, flash, monitor, release and
verify-release for a board and a model; clean, boards and devices around them.

Each command is declared beside its options in generator/commands/; this module makes the one
parser of them all, lays colibri.toml's defaults under it (project_file.py; flags override them)
and dispatches to the command's run. Every check that needs no compiler comes first (job.py), so a
refused command compiles nothing and leaves no build directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from . import __version__
from .commands import all_commands
from .console import progress
from .errors import ColibriError
from .model.hub import HubReference
from .model.load import model_path
from .project_file import apply_project_file, find_project_file, load_project_file


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"colibri: error: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """--version: the generator, its git commit and the toolchains found here."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str = argparse.SUPPRESS,
        default: Any = argparse.SUPPRESS,
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from .release.provenance import version_report

        print("\n".join(version_report()))
        parser.exit(0)


def make_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each command's own (colibri.toml sets the commands' defaults)."""
    parser = Parser(prog="colibri", description="Hugging Face checkpoints to verified C firmware.")
    parser.add_argument(
        "--version",
        action=VersionAction,
        help=f"show colibri's version ({__version__}), git commit and the toolchains found",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    commands: dict[str, argparse.ArgumentParser] = {}
    for command in all_commands():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        p.set_defaults(func=command.run)
        command.add_arguments(p)
        commands[command.name] = p
    return parser, commands


def _options(parser: argparse.ArgumentParser) -> dict[str, object]:
    return {a.dest: a.default for a in parser._actions if a.option_strings and a.dest != "help"}


def command_first(argv: list[str], names: set[str]) -> list[str]:
    """A command's options given before it (./colibri --board qemu-rv32 run ...) moved after it,
    where its parser declares them; --help and --version before a command stay colibri's own."""
    if any(a in ("-h", "--help", "--version") for a in argv[:1]) or not argv or not argv[0].startswith("-"):
        return argv
    at = next((i for i, a in enumerate(argv) if a in names), None)
    if at is None:
        raise ColibriError(
            f"{argv[0]} is an option of a command: give the command too, before or after its options "
            f"(./colibri COMMAND {' '.join(argv)}; ./colibri --help lists the commands)"
        )
    if any(a in ("-h", "--help", "--version") for a in argv[:at]):
        return argv
    return [argv[at], *argv[:at], *argv[at + 1 :]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line over colibri.toml's defaults. args.given: the options the command
    line itself set (option_checks refuses those a board cannot take; a file's defaults that do
    not apply to the board in use are skipped)."""
    parser, commands = make_parser()
    argv = command_first(list(sys.argv[1:] if argv is None else argv), set(commands))
    name = next((a for a in argv if not a.startswith("-")), None)  # the top level has only options
    applied: dict = {}
    defaults: dict = {}
    if name in commands:
        defaults = _options(commands[name])
        path = find_project_file()
        if path is not None:
            applied = apply_project_file(load_project_file(path, set(commands)), name, commands)
            if applied:
                shown = ", ".join(f"{k.replace('_', '-')} = {v}" for k, v in applied.items())
                progress(f"colibri: settings from {path}: {shown}")
    if name == "test":
        # Everything after `test` is pytest's, options included (argparse would claim them).
        at = argv.index("test") + 1
        args = parser.parse_args(argv[:at])
        args.pytest_args = argv[at:]
    else:
        args = parser.parse_args(argv)
    args.given = {
        dest for dest, default in defaults.items() if getattr(args, dest, default) != applied.get(dest, default)
    }
    args.parser_defaults = defaults
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if isinstance(getattr(args, "model", None), HubReference):
            args.model = model_path(args.model, show_progress=not getattr(args, "json", False))
        return args.func(args)
    except ColibriError as e:
        print(f"colibri: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("colibri: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`./colibri run ... | head`): stop quietly, as a shell tool does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
