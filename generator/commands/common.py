"""What the command modules share: the Command record, the run-like options out of argparse's
namespace, and printing a --json document."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..job import JobOptions


@dataclass(frozen=True)
class Command:
    """One command: its name and help, the options it declares, what it does (its exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def print_json(document: Any, indent: int | None = 2, flush: bool = False) -> None:
    print(json.dumps(document, indent=indent), flush=flush)


def job_options(args: argparse.Namespace) -> JobOptions:
    """The run-like options out of argparse's namespace (by dest), with what the command line set."""
    taken = {
        f.name: getattr(args, f.name)
        for f in fields(JobOptions)
        if hasattr(args, f.name) and f.name not in ("quiet", "given", "defaults")
    }
    return JobOptions(**taken, quiet=getattr(args, "json", False), given=args.given, defaults=args.parser_defaults)
