"""A whole dev stack as ``./ops/dev`` starts it (``caravan stack up``: Redis, a single-node Nomad with its state on
disk, ``caravan dev``), in a state directory of the test's, on ports of its own; driven over its GraphQL API."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2

from caravan.stack.processes import free_port
from core.secrets import nomad_token_path, read_secret
from tests.conftest import STACK

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


@contextlib.contextmanager
def stack_home() -> Iterator[Path]:
    """A state directory for a stack, short as ``./ops/dev``'s ``.caravan`` is: its HAProxy's unix sockets must fit in
    97 bytes (``SOCKET_PATH_MAX``), which a test's own temporary directory outgrew under a worker of the suite's
    (``.../popen-gw0/<test>/``)."""
    folder = Path(tempfile.mkdtemp(prefix="cvs-", dir="/tmp"))
    try:
        yield folder / "home"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Stack:
    """``caravan stack`` for a state directory ``home`` of the test's, with ``env`` over what ``./ops/dev`` would
    set (``ops/``'s stack file, read by ``tests.conftest``: Nomad, the rootfs, the default image)."""

    def __init__(self, home: Path, **env: str) -> None:
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
            "CARAVAN_GATEWAY_PORT": self.gateway.split(":")[2].split("/")[0],  # HAProxy's: the gateway is behind it
            "CARAVAN_GATEWAY_BACKEND_PORT": str(free_port()),
            **{k: STACK[k] for k in ("CARAVAN_NOMAD_HOME", "CARAVAN_ROOTFS") if k in STACK},
            "CARAVAN_DEFAULT_IMAGE": STACK.get("CARAVAN_DEFAULT_IMAGE", ""),
            "CARAVAN_RECONCILE_INTERVAL": "2",
            **env,
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

    def reset(self) -> None:
        """Take everything down, if anything is left (a test that failed half-way)."""
        if self.home.exists():
            subprocess.run(
                [sys.executable, "-m", "caravan.cli", "stack", "reset", "--yes"],
                env=self.env,
                capture_output=True,
                timeout=300,
            )
