"""The suite's own time, per test and per file: wall time and CPU time (the test's process and
the children it waited for: compilers, emulators, firmware runs, CLI subprocesses), measured in
the worker that ran the test and carried to the main process in the test's reports, so that a
parallel run adds them up like a serial one.

Every run ends with the 15 test files that took the most (beside pytest's --durations=30 slowest
tests): the suite's time is planned from it (docs/verification.md). Each file's wall time is kept
in pytest's cache for the next run's order (file_order). COLIBRI_TEST_TIMES=FILE also writes every
test's line to FILE (tab-separated: test, wall seconds, CPU seconds)."""

from __future__ import annotations

import json
import os
import resource
from collections import defaultdict
from pathlib import Path

import pytest

FILES_SHOWN = 15
FILE_SECONDS_KEY = "colibri/file-seconds"  # in pytest's cache (.pytest_cache): each file's last wall time
SEED = Path(__file__).with_name("file_seconds.json")  # a whole run's, for a clean clone
_CPU_PROPERTY = "cpu_seconds"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measured(item):
    started = _cpu_seconds()
    yield
    item._colibri_phase_cpu = _cpu_seconds() - started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # (a report's user_properties travel from an xdist worker to the main process with it)
    report.user_properties = [*report.user_properties, (_CPU_PROPERTY, getattr(item, "_colibri_phase_cpu", 0.0))]
    item._colibri_phase_cpu = 0.0


class SuiteTimes:
    def __init__(self) -> None:
        self.tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        cpu = dict(report.user_properties).get(_CPU_PROPERTY)
        if cpu is None:
            return
        spent = self.tests[report.nodeid]
        spent[0] += report.duration
        spent[1] += cpu

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for nodeid, (wall, cpu) in self.tests.items():
            total = files[nodeid.split("::", 1)[0]]
            total[0], total[1], total[2] = total[0] + wall, total[1] + cpu, total[2] + 1
        wall_sum = sum(w for w, _ in self.tests.values())
        cpu_sum = sum(c for _, c in self.tests.values())
        terminalreporter.write_sep("=", f"the {FILES_SHOWN} test files that took the most")
        terminalreporter.write_line(f"{'wall s':>8} {'CPU s':>8} {'tests':>6}  file")
        for name, (wall, cpu, count) in sorted(files.items(), key=lambda f: -f[1][0])[:FILES_SHOWN]:
            terminalreporter.write_line(f"{wall:8.1f} {cpu:8.1f} {count:6d}  {name}")
        terminalreporter.write_line(
            f"{wall_sum:8.1f} {cpu_sum:8.1f} {len(self.tests):6d}  all tests (wall summed over the workers)"
        )
        # Each file's wall time, kept for the next run's order (tests/conftest.py: longest first).
        # A file this run did not run keeps its last time.
        cache = getattr(terminalreporter.config, "cache", None)  # (none with -p no:cacheprovider)
        if cache is not None:
            known = dict(cache.get(FILE_SECONDS_KEY, {}))
            known.update({name: round(wall, 1) for name, (wall, _, _) in files.items()})
            cache.set(FILE_SECONDS_KEY, known)
        path = os.environ.get("COLIBRI_TEST_TIMES")
        if path:
            with open(path, "w") as f:
                for nodeid, (wall, cpu) in sorted(self.tests.items()):
                    f.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\n")


def file_order(config, items: list) -> list:
    """The files longest first, each file's tests in their own order: the parallel workers take
    whole files in this order (--dist loadfile), so the long ones start at once and the short ones
    fill the gaps at the end. A file's time is its last run's (pytest's cache); with none known
    (a clean clone) a whole CI run's (tests/file_seconds.json, files of 5 s and more; remake it
    from COLIBRI_TEST_TIMES's table when files change much), then the files holding slow tests."""
    cache = getattr(config, "cache", None)  # (none with -p no:cacheprovider)
    seconds = cache.get(FILE_SECONDS_KEY, {}) if cache is not None else {}
    if not seconds:  # a clean clone (CI): the files' wall times of a whole run, committed
        seconds = json.loads(SEED.read_text()) if SEED.is_file() else {}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item) -> tuple[float, bool]:
        name = item.nodeid.split("::", 1)[0]
        return (-seconds.get(name, 0.0), item.path not in slow_files)

    return sorted(items, key=key)  # a stable sort


def pytest_configure(config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the main process adds up every worker's reports
        config.pluginmanager.register(SuiteTimes(), "colibri-suite-times")
