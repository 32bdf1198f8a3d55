"""``caravan stack down`` releases the mounts of Nomad's ended allocations while running sessions survive it, and
``caravan stack reset`` leaves nothing: a whole dev stack (Redis, a single-node Nomad with its state on disk, ``caravan
dev``), started by the stack's own code in a state directory of the test's, on ports of its own."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from caravan.stack.processes import free_port, mounts_under
from caravan.stack.session_network import recorded_network
from core.secrets import nomad_token_path, read_secret
from tests.conftest import STACK

pytestmark = [
    pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad"),
    pytest.mark.nomad,
    pytest.mark.redis,
]  # `caravan stack up` starts both

TOKEN = "stack-test-admin-token"
CREATE = """mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"""
SESSION = """query($id: ID!) { session(id: $id) { status nomadJobId mainKernel { logs { stdout } } } }"""


def three_free_ports() -> int:
    """A port whose next two are free too (a single-node Nomad's RPC and Serf take HTTP + 1 and + 2)."""
    for _ in range(50):
        port = free_port()
        with contextlib.ExitStack() as held:
            try:
                for p in (port + 1, port + 2):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise AssertionError("no three free ports in a row")


class Stack:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.nomad = f"http://127.0.0.1:{three_free_ports()}"
        self.gateway = f"http://127.0.0.1:{free_port()}/graphql"
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("CARAVAN_")}
        self.env = {
            **inherited,
            "CARAVAN_HOME": str(home),
            "CARAVAN_ADMIN_TOKEN": TOKEN,
            "CARAVAN_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "CARAVAN_NOMAD_ADDR": self.nomad,
            "CARAVAN_GATEWAY_PORT": self.gateway.split(":")[2].split("/")[0],
            **{k: STACK[k] for k in ("CARAVAN_NOMAD_HOME", "CARAVAN_ROOTFS") if k in STACK},
            "CARAVAN_DEFAULT_IMAGE": STACK.get("CARAVAN_DEFAULT_IMAGE", ""),
            "CARAVAN_RECONCILE_INTERVAL": "2",
        }

    def run(self, *action: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "caravan.cli", "stack", *action],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = httpx2.post(
            self.gateway,
            json={"query": query, "variables": variables or {}},
            timeout=30,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        body: dict[str, Any] = response.json()
        assert not body.get("errors"), body
        return body["data"]  # type: ignore[no-any-return]

    def create(self, name: str, session_type: str, command: str) -> str:
        fields = {"name": name, "type": session_type, "driver": "EXEC", "startupCommand": command}
        return str(self.gql(CREATE, {"input": fields})["createSession"]["sessions"][0]["id"])

    def wait_for(self, session_id: str, status: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (session := self.gql(SESSION, {"id": session_id})["session"])["status"] != status:
            assert time.monotonic() < deadline, session
            time.sleep(0.3)
        return session  # type: ignore[no-any-return]

    def allocations(self, job_id: str) -> list[dict[str, Any]]:
        request = urllib.request.Request(f"{self.nomad}/v1/job/{job_id}/allocations")
        request.add_header("X-Nomad-Token", read_secret(nomad_token_path(self.home / "secrets", "admin")) or "")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def allocation_dir(self, job_id: str) -> Path:
        [allocation] = self.allocations(job_id)
        return (self.home / "nomad" / "data" / "alloc" / allocation["ID"]).resolve()


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
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path / "home")
    yield running
    if running.home.exists():  # the test failed half-way: take everything down anyway
        subprocess.run(
            [sys.executable, "-m", "caravan.cli", "stack", "reset", "--yes"],
            env=running.env,
            capture_output=True,
            timeout=300,
        )


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
    done = stack.run("reset", "--yes")
    assert "removed" in done.stdout
    assert not stack.home.exists()
    assert f" {stack.home}" not in Path("/proc/self/mounts").read_text()
    assert processes_mentioning(str(stack.home)) == []
    assert not bridge_exists(network.bridge)


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
