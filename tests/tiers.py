"""Test tiers: what a test needs, as markers, applied from the fixtures it uses, and a watch that fails a test that
starts a Nomad agent (or a Redis server) without the marker that says so.

======= ====================================================================== =========================
marker  a test with it needs                                                   applied
======= ====================================================================== =========================
(none)  nothing: a pure test (no Redis, no Nomad, no Docker)                   —
redis   a real Redis (the session's, or one it starts)                         ``redis_server`` in its fixtures
nomad   a Nomad agent (the session's dev agent, or one it starts)              ``nomad_agent`` in its fixtures
cluster the multi-client Nomad cluster (``tests/cluster_fixtures.py``) or      ``nomad_cluster``,
        the multi-host one (``tests/multihost_fixtures.py``)                   ``multihost_cluster``;
                                                                               implies ``nomad``
docker  a Docker engine; skipped where none could be started                   by hand
qemu    QEMU and a VM image (``ops/build-vm-image``); skipped where missing    by hand
ui      a headless Chromium and chromedriver (``tests/ui/``, ``bench/ui``) and  by hand
        the built web UI (``ops/build-web``); skipped where missing
slow    a long test (tens of seconds) in any tier                              by hand
======= ====================================================================== =========================

A test that starts Redis or Nomad itself (not through the session's fixtures) carries the marker by hand; the
:class:`ServiceWatch` makes forgetting it impossible to miss: it fails (an error at teardown) any test during which a
Redis server or a Nomad agent was started below this pytest process without the test being marked for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.workers import write_groups

TIER_OF_FIXTURE: Mapping[str, str] = {
    "redis_server": "redis",
    "nomad_agent": "nomad",
    "nomad_cluster": "cluster",
    "multihost_cluster": "cluster",
}
"""A test that uses this fixture (directly or through others) needs this tier."""
IMPLIED: Mapping[str, tuple[str, ...]] = {"cluster": ("nomad",)}
"""Markers that imply others: the cluster is Nomad too."""
SERVICE_TIERS: tuple[str, ...] = ("nomad", "redis")
"""The services :class:`ServiceWatch` looks for, by the marker a test starting one must carry."""
SAMPLE_SECONDS = 0.2
"""How often the watch looks at this process's descendants. A Nomad agent lives seconds at least (its start waits for
the agent and its node to be ready), so none goes unseen."""


def mark_tiers(items: Iterable[pytest.Item], *, docker: bool, qemu: bool, ui: bool = True) -> None:
    """Mark each item with the tiers of the fixtures it uses; skip ``docker``, ``qemu`` and ``ui`` items this machine
    lacks."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for name in {TIER_OF_FIXTURE[f] for f in fixtures & TIER_OF_FIXTURE.keys()}:
            item.add_marker(name)
        for name, implied in IMPLIED.items():
            if item.get_closest_marker(name):
                for other in implied:
                    item.add_marker(other)
        if item.get_closest_marker("docker") and not docker:
            item.add_marker(pytest.mark.skip(reason="no Docker engine could be started on this machine"))
        if item.get_closest_marker("qemu") and not qemu:
            item.add_marker(pytest.mark.skip(reason="qemu-system-x86_64 or a VM image (ops/build-vm-image) is missing"))
        if item.get_closest_marker("ui") and not ui:
            item.add_marker(
                pytest.mark.skip(reason="chromium, chromedriver or the built web UI (ops/build-web) is missing")
            )


ALONE: Mapping[str, str] = {"cluster": "cluster"}
"""Tiers whose tests share one worker when the suite runs on several (``pytest -n``, ``tests/workers.py``): the
multi-host cluster is one per machine (its hosts are network namespaces of fixed names), and the multi-client one
(six Nomad clients) is started once rather than in every worker."""
ALONE_DIRECTORIES: Mapping[str, str] = {"stack": "stack"}
"""Directories under ``tests/`` whose tests share one worker: ``tests/stack`` starts whole stacks and stops them
(``./ops/stop``, ``reset``), one at a time."""


def worker_group(item: pytest.Item) -> str | None:
    """The group of tests ``item`` shares one worker with (``tests/workers.py``), or None: its module's worker."""
    for tier, group in ALONE.items():
        if item.get_closest_marker(tier):
            return group
    parts = Path(str(item.path)).parts
    if "tests" in parts and (index := parts.index("tests")) + 1 < len(parts):
        return ALONE_DIRECTORIES.get(parts[index + 1])
    return None


def service_of(comm: bytes, argv: list[bytes]) -> str | None:
    """The tier of the service a process runs, from its name (``/proc/<pid>/comm``) and command line: a Nomad agent
    (``nomad agent …``, not the agent's plugin processes ``nomad logmon``, ``nomad executor``) or a Redis server
    (which rewrites its command line to ``redis-server <address>``)."""
    if comm == b"nomad" and argv[1:2] == [b"agent"]:
        return "nomad"
    if comm == b"redis-server":
        return "redis"
    return None


def started_service(comm: bytes, argv: list[bytes], parent_comm: bytes, parent_argv: list[bytes]) -> str | None:
    """The tier of a new process's service, unless its parent runs the same service: a Nomad agent forks its log
    monitors and executors, and a Redis server forks to save; until such a child execs or renames itself it carries
    its parent's name and command line, and one seen then is no new agent or server (CI once charged two such children
    of the session's agent to the browser test running at that moment)."""
    tier = service_of(comm, argv)
    return None if tier is not None and service_of(parent_comm, parent_argv) == tier else tier


Process = tuple[int, int]
"""A process: its pid and its start time (clock ticks since boot), which tell a reused pid from its old holder."""


def descendants(root: int) -> dict[Process, int]:
    """The processes below ``root``, each with its parent's pid, from one reading of /proc."""
    parents: dict[Process, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            parents[(int(name), int(fields[19]))] = int(fields[1])
    below: dict[Process, int] = {}
    frontier = {root}
    while frontier:
        found = {process: parent for process, parent in parents.items() if parent in frontier and process not in below}
        below |= found
        frontier = {pid for pid, _ in found}
    return below


def name_and_command_line(pid: int) -> tuple[bytes, list[bytes]]:
    try:
        comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        return comm, Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return b"", []


@dataclass
class ServiceWatch:
    """Samples this process's descendants every :data:`SAMPLE_SECONDS` in a thread of its own, and charges each new
    Redis server or Nomad agent to the test running when it was first seen."""

    root: int = field(default_factory=os.getpid)
    current: pytest.Item | None = None
    """The test running now (set around each test's setup, call and teardown)."""
    unmarked: dict[str, list[str]] = field(default_factory=dict)
    """Test node id → what it started without the marker for it."""
    _seen: set[Process] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._seen = set(descendants(self.root))
        self._thread = threading.Thread(target=self._run, name="service-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def sample(self) -> None:
        """Look once (the thread does this every :data:`SAMPLE_SECONDS`; tests of the watch call it directly)."""
        item = self.current
        for process, parent in descendants(self.root).items():
            if process in self._seen:
                continue
            self._seen.add(process)
            pid = process[0]
            comm, argv = name_and_command_line(pid)
            tier = started_service(comm, argv, *name_and_command_line(parent))
            if tier is None or item is None or item.get_closest_marker(tier):
                continue
            with self._lock:
                self.unmarked.setdefault(item.nodeid, []).append(
                    f"a {tier} process (pid {pid}: {b' '.join(argv[:3]).decode(errors='replace')})"
                )

    def charged_to(self, item: pytest.Item) -> list[str]:
        """What ``item`` started without its marker (and forget it)."""
        with self._lock:
            return self.unmarked.pop(item.nodeid, [])

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()


def unmarked_message(item: pytest.Item, started: list[str]) -> str:
    tiers = sorted({text.split()[1] for text in started})
    return (
        f"{item.nodeid} started {', '.join(started)} but is not marked {' or '.join(tiers)}: mark it "
        f"(@pytest.mark.{tiers[0]}, or pytestmark in its module) so that the tiers (./ops/test --quick, -m) "
        "select it rightly; see tests/tiers.py"
    )


class Tiers:
    """The pytest plugin (registered by ``tests/conftest.py``): marks the tiers at collection, before ``-m`` selects
    by them, and runs the :class:`ServiceWatch` around the tests."""

    def __init__(self, *, docker: bool, qemu: bool, ui: bool = True) -> None:
        self.docker, self.qemu, self.ui = docker, qemu, ui
        self.watch = ServiceWatch()

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        mark_tiers(items, docker=self.docker, qemu=self.qemu, ui=self.ui)
        write_groups({item.nodeid: group for item in items if (group := worker_group(item))})

    def pytest_sessionstart(self) -> None:
        self.watch.start()

    def pytest_sessionfinish(self) -> None:
        self.watch.stop()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[object]:
        self.watch.current = item
        try:
            return (yield)
        finally:
            self.watch.current = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
        report: pytest.TestReport = yield
        if call.when == "teardown" and (started := self.watch.charged_to(item)):
            report.outcome = "failed"
            report.longrepr = unmarked_message(item, started)
        return report
