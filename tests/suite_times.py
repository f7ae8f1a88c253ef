"""The suite's own time, per test and per file: wall time and CPU time (the test's process and
the children it waited for: compilers, emulators, firmware runs, CLI subprocesses), measured in
the worker that ran the test and carried to the main process in the test's reports, so that a
parallel run adds them up like a serial one.

Every run ends with the 15 test files that took the most (beside pytest's --durations=30 slowest
tests): the suite's time is planned from it (docs/verification.md). COLIBRI_TEST_TIMES=FILE also
writes every test's line to FILE (tab-separated: test, wall seconds, CPU seconds)."""

from __future__ import annotations

import os
import resource
from collections import defaultdict

import pytest

FILES_SHOWN = 15
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
        path = os.environ.get("COLIBRI_TEST_TIMES")
        if path:
            with open(path, "w") as f:
                for nodeid, (wall, cpu) in sorted(self.tests.items()):
                    f.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\n")


def pytest_configure(config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the main process adds up every worker's reports
        config.pluginmanager.register(SuiteTimes(), "colibri-suite-times")
