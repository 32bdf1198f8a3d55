"""The suite on several workers (``ops/test`` runs ``pytest -n 2``, pytest-xdist): which tests share one worker.

Most tests only wait (on Nomad, Docker, a browser): the e2e tier keeps the machine's two cores about 17 % busy, so two
workers, each with its own Redis and Nomad agent (``tests/conftest.py``), run the suite in well under half the time.
A few things are one per machine, or too costly to start twice, and their tests must share one worker, one after the
other: the groups of :func:`tests.tiers.worker_group` (the multi-host and multi-client Nomad clusters, whole stacks).

pytest-xdist's own grouping (``--dist loadgroup`` with ``xdist_group`` marks) does nothing under pytest 9: it renames
each item's node id through an attribute pytest no longer reads, so a group's tests were spread over both workers
(two multi-host clusters at once: refused). So the grouping is done here, in two halves:

- each worker, once it has collected, writes the group of every test that has one to a file in a directory the
  controller made (:data:`GROUPS_DIR`, in the environment the workers inherit);
- the controller's scheduler, xdist's load-scope scheduling, reads it: a group is one unit of work, run by one worker
  in collection order; every other module is a unit of its own (its module-scoped fixtures are set up once). Units
  go out largest first, so a long group does not start last.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

GROUPS_DIR = "CARAVAN_TEST_GROUPS"
"""The environment variable naming the directory where the workers write their tests' groups."""


def controller_setup(config: pytest.Config) -> None:
    """In the controller of a run on workers: the directory the workers write their groups to, and the scheduler."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return
    if not config.getoption("numprocesses", None):
        return
    os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="caravan-test-groups-")
    config.pluginmanager.register(GroupScheduler(), "caravan-group-scheduler")
    config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True))  # one per run, not kept


def write_groups(groups: Mapping[str, str]) -> None:
    """In a worker: ``groups`` (node id -> group) written for the controller's scheduler (atomically)."""
    directory, worker = os.environ.get(GROUPS_DIR), os.environ.get("PYTEST_XDIST_WORKER")
    if not directory or not worker:
        return
    path = Path(directory) / f"{worker}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(dict(groups)))
    partial.replace(path)


def read_groups(directory: Path) -> dict[str, str]:
    """Every worker's groups (they collected the same tests)."""
    found: dict[str, str] = {}
    for path in sorted(directory.glob("*.json")):
        found.update(json.loads(path.read_text()))
    return found


class GroupScheduler:
    """The plugin (controller only) whose scheduler keeps each group on one worker."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling  # only where xdist runs the suite

        class Scheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
            groups: dict[str, str] | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self.groups is None:  # asked once every worker has collected (and so written its groups)
                    self.groups = read_groups(Path(os.environ[GROUPS_DIR]))
                group = self.groups.get(nodeid)
                return f"group:{group}" if group else nodeid.rsplit("::", 1)[0]

        return Scheduling(config, log)
