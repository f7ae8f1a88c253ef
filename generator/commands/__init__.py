"""The commands of the command line, each declared beside its options (esptool v5's shape): a
module per group, each command a Command (its name, its help, add_arguments(parser), run(args)).

    build.py     build, report, clean, boards      (a firmware and what it holds)
    run.py       run, verify, selftest, chat,      (firmware running: job.py's prepare -> build -> link)
                 eval, bench
    device.py    flash, ota, monitor, devices      (a board on a serial port)
    release.py   release, verify-release, deploy, rollback
    suite.py     test

cli.py turns them into one parser and dispatches to the command's run.
"""

from __future__ import annotations

from . import build, device, release, run, suite
from .common import Command

# In the order `./colibri --help` lists them.
ORDER = (
    "build",
    "run",
    "verify",
    "selftest",
    "chat",
    "eval",
    "report",
    "bench",
    "flash",
    "ota",
    "monitor",
    "release",
    "verify-release",
    "deploy",
    "rollback",
    "clean",
    "boards",
    "devices",
    "test",
)


def all_commands() -> list[Command]:
    by_name = {c.name: c for module in (build, run, device, release, suite) for c in module.COMMANDS}
    return [by_name[name] for name in ORDER]
