"""Where the suite's time goes, by module and by directory: a pytest plugin (registered by ``tests/conftest.py``).

pytest's ``--durations`` names the slowest single phases; the suite's time is mostly spent elsewhere, in hundreds of
tests of a second or two each (CI's slowest 40 were 995 s of 2,453). This sums setup, call and teardown of every test
by module and by directory and prints the heaviest at the end of a run, so that work on the suite's time starts from
where the time is. Module-scoped fixtures count in the test that set them up or tore them down, as pytest reports."""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 15
"""Modules listed (the directories are all listed)."""


class ModuleDurations:
    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.tests: defaultdict[str, int] = defaultdict(int)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.when == "call":
            self.tests[module] += 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section("time by directory and heaviest modules (setup + call + teardown)")
        directories: defaultdict[str, float] = defaultdict(float)
        counts: defaultdict[str, int] = defaultdict(int)
        for module, seconds in self.seconds.items():
            directory = module.rsplit("/", 1)[0] if "/" in module else "."
            directories[directory] += seconds
            counts[directory] += self.tests[module]
        for directory, seconds in sorted(directories.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.1f}s {counts[directory]:5d} tests  {directory}/")
        write("")
        heaviest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SHOWN]
        for module, seconds in heaviest:
            write(f"{seconds:8.1f}s {self.tests[module]:5d} tests  {module}")
