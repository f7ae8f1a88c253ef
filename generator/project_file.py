"""colibri.toml: a project's defaults for every command, as platformio.ini is for PlatformIO.

    # colibri.toml, in the current directory or at the repository root
    board = "esp32p4"
    model = "models/kjv-tiny"      # relative paths are relative to this file
    port = "/dev/ttyUSB0"

    [bench]                        # a table per command overrides the keys above for that command
    steps = 64

A key is any long option of a command, spelled as on the command line without the dashes
(`prompt-ids` or `prompt_ids`); a top-level key applies to every command that has that option and
is skipped by the others (`port` means nothing to `build`). Flags on the command line override the
file. A key no command has, or a value the option would refuse, is a one-line error.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ColibriError
from .files import REPO, load_toml

FILE_NAME = "colibri.toml"


@dataclass(frozen=True)
class ProjectFile:
    path: Path
    common: dict = field(default_factory=dict)  # top-level keys
    commands: dict = field(default_factory=dict)  # command -> its table

    def values_for(self, command: str) -> dict:
        return {**self.common, **self.commands.get(command, {})}


def find_project_file(cwd: Path | None = None) -> Path | None:
    """colibri.toml in the current directory, else at the repository root."""
    for directory in (Path.cwd() if cwd is None else cwd, REPO):
        candidate = directory / FILE_NAME
        if candidate.is_file():
            return candidate
    return None


def load_project_file(path: Path, commands: set[str]) -> ProjectFile:
    try:
        data = load_toml(path, str(path))
    except tomllib.TOMLDecodeError as e:
        raise ColibriError(f"{path}: not valid TOML ({e})") from None
    common, tables = {}, {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in commands:
                raise ColibriError(
                    f"{path}: [{key}] is not a command (tables are per command: {', '.join(sorted(commands))})"
                )
            tables[key] = {_dest(k): v for k, v in value.items()}
        else:
            common[_dest(key)] = value
    return ProjectFile(path, common, tables)


def _dest(key: str) -> str:
    return key.replace("-", "_")


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A command's long options by their dest (positionals, --help and --version excluded)."""
    return {
        a.dest: a
        for a in parser._actions
        if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    }


def _convert(project: ProjectFile, key: str, value, action: argparse.Action):
    where = f"{project.path}: {key} = {value!r}"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ColibriError(f"{where}: expected true or false")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(value, (bool, dict, list)):
        raise ColibriError(f"{where}: expected a {'number' if action.type in (int, float) else 'string'}")
    text = str(value)
    try:
        converted = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise ColibriError(f"{where}: {e}") from None
    if action.choices is not None and converted not in action.choices:
        raise ColibriError(f"{where}: choose from {', '.join(map(str, action.choices))}")
    if isinstance(converted, Path) and not converted.is_absolute() and text != "-":
        converted = project.path.parent / converted  # relative to the file, wherever it is used from
    return converted


def apply_project_file(project: ProjectFile, command: str, parsers: dict[str, argparse.ArgumentParser]) -> dict:
    """Make the file's values the defaults of `command`'s parser (so flags still override them);
    returns {dest: value} of what it set. Every key must be an option of some command."""
    known = set()
    for parser in parsers.values():
        known |= set(_options(parser))
    for table, values in [("", project.common), *((f"[{c}] ", v) for c, v in project.commands.items())]:
        options = known if not table else set(_options(parsers[table.strip("[] ")]))
        for key in values:
            if key not in options:
                scope = f"an option of {table.strip('[] ')}" if table else "an option of any command"
                raise ColibriError(
                    f"{project.path}: {table}{key.replace('_', '-')} is not {scope} "
                    f"(keys are long options without the dashes, e.g. board, model, port)"
                )
    parser = parsers[command]
    options = _options(parser)
    applied = {
        key: _convert(project, key, value, options[key])
        for key, value in project.values_for(command).items()
        if key in options
    }
    parser.set_defaults(**applied)
    return applied
