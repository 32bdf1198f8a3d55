"""``caravan stack down`` releases the mounts of Nomad's ended allocations while running sessions survive it, and
``caravan stack reset`` leaves nothing: a whole dev stack (Redis, a single-node Nomad with its state on disk, ``caravan
dev``), started by the stack's own code in a state directory of the test's, on ports of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from caravan.stack.processes import mounts_under
from caravan.stack.session_network import recorded_network
from node_plugins.namespace_pool import Client, make
from nomad_jobs.namespace_keeper import LABEL
from tests.conftest import DOCKER, STACK
from tests.dev_stack import Stack, stack_home

pytestmark = [
    pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad"),
    pytest.mark.nomad,
    pytest.mark.redis,
]  # `caravan stack up` starts both


PAUSE_IMAGE = os.environ.get("CARAVAN_PAUSE_IMAGE", "")


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


def bridge_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.fixture
def stack() -> Iterator[Stack]:
    with stack_home() as home:
        running = Stack(home)
        yield running
        running.reset()


def test_stop_releases_ended_allocations_mounts_sessions_survive_and_reset_leaves_nothing(stack: Stack) -> None:
    stack.run("up")
    batch = stack.create("said-hello", "BATCH", "echo hello")
    ended = stack.wait_for(batch, "TERMINATED")
    interactive = stack.create("stays-up", "INTERACTIVE", "echo up; sleep 100000")
    running = stack.wait_for(interactive, "RUNNING")
    ended_dir, running_dir = stack.allocation_dir(ended["nomadJobId"]), stack.allocation_dir(running["nomadJobId"])
    [before] = stack.allocations(running["nomadJobId"])
    assert mounts_under(ended_dir) and mounts_under(running_dir)  # secrets, private (and alloc) of each

    stack.run("down")
    assert mounts_under(ended_dir) == []  # the ended session's are released ...
    assert mounts_under(running_dir)  # ... the running one's stay with its task, which outlives the stop
    assert mounts_under(stack.home) == mounts_under(running_dir)

    stack.run("up")
    assert stack.wait_for(interactive, "RUNNING")["status"] == "RUNNING"
    [after] = stack.allocations(running["nomadJobId"])
    task = (
        after["TaskStates"]["kernel"] if "kernel" in after["TaskStates"] else next(iter(after["TaskStates"].values()))
    )
    assert (after["ID"], after["ClientStatus"], task["Restarts"]) == (before["ID"], "running", 0)  # the same task
    assert stack.wait_for(batch, "TERMINATED")["mainKernel"]["logs"]["stdout"] == "hello\n"  # its logs are kept

    network = recorded_network(stack.home / "nomad")
    assert network is not None and bridge_exists(network.bridge)
    left = None
    if DOCKER and PAUSE_IMAGE:  # a pooled namespace as a keeper killed before it released its free ones leaves it
        node_id = (stack.home / "nomad" / "data" / "client" / "client-id").read_text().strip()
        left = make(Client(network.conflist(), network.cni_path), PAUSE_IMAGE, {LABEL: node_id}).name
    done = stack.run("reset", "--yes")
    assert "removed" in done.stdout
    assert not stack.home.exists()
    assert f" {stack.home}" not in Path("/proc/self/mounts").read_text()
    assert processes_mentioning(str(stack.home)) == []
    assert not bridge_exists(network.bridge)
    if left is not None:
        assert subprocess.run(["docker", "inspect", left], capture_output=True).returncode != 0, left


def test_reset_asks_for_yes_and_refuses_what_is_not_a_state_directory(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "home")
    asked = subprocess.run(
        [sys.executable, "-m", "caravan.cli", "stack", "reset"],
        env=stack.env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert asked.returncode == 2 and "--yes" in asked.stderr
    stranger = tmp_path / "not-caravan"
    (stranger / "docs").mkdir(parents=True)
    refused = subprocess.run(
        [sys.executable, "-m", "caravan.cli", "stack", "reset", "--yes"],
        text=True,
        env={**stack.env, "CARAVAN_HOME": str(stranger)},
        capture_output=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "not a Caravan state directory" in refused.stderr
    assert (stranger / "docs").exists()
