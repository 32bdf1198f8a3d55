"""``caravan dev`` as a real child process of the test: its supervisor and the three service processes under it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2

from caravan.stack.processes import free_port
from core.settings import Settings
from tests.harness import ADMIN_TOKEN, caravan_env

ROLES = ("gateway", "scheduler", "idle")


def children_of(pid: int) -> set[int]:
    """Live (not zombie) child processes of ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except OSError:
                continue
            if int(parent) == pid and state != "Z":
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def role_of(pid: int) -> str | None:
    """The ``caravan <role>`` a process runs, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((a.decode() for a in argv if a.decode() in ROLES), None)


async def until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def gateway_answers(http: httpx2.AsyncClient, url: str) -> bool:
    """Does a gateway at ``url`` answer the admin's ``viewer``?"""
    try:
        response = await http.post(
            url, json={"query": "{ viewer { id } }"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
    except httpx2.TransportError:
        return False
    return bool(response.json() == {"data": {"viewer": {"id": "admin"}}})


@dataclass
class DevProcess:
    supervisor: subprocess.Popen[bytes]
    url: str
    log: Path

    def roles(self) -> dict[str, int]:
        """The supervisor's service processes, by role."""
        return {role: pid for pid in children_of(self.supervisor.pid) if (role := role_of(pid)) is not None}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def caravan_dev(settings: Settings, **env: str) -> AsyncIterator[DevProcess]:
    """``caravan dev`` for ``settings``' namespace (extra ``CARAVAN_*`` in ``env``), once its gateway answers and
    the scheduler and idle checker hold their leases; stopped (SIGTERM) at the end."""
    port = free_port()
    log = settings.home / "caravan-dev.log"
    with log.open("ab") as out:
        supervisor = subprocess.Popen(  # noqa: ASYNC220 (starts it and returns; asyncio's would tie it to this loop)
            [sys.executable, "-m", "caravan.cli", "dev"],
            stdout=out,
            stderr=out,
            env={**caravan_env(settings, port), **env},
            start_new_session=True,
        )
    dev = DevProcess(supervisor, f"http://127.0.0.1:{port}/graphql", log)
    try:
        async with httpx2.AsyncClient(timeout=5) as http:
            deadline = time.monotonic() + 90
            while not await gateway_answers(http, dev.url):
                assert supervisor.poll() is None, dev.log_text()
                assert time.monotonic() < deadline, "caravan dev did not come up\n" + dev.log_text()
                await asyncio.sleep(0.3)
        yield dev
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            try:
                supervisor.wait(30)
            except subprocess.TimeoutExpired:
                supervisor.kill()
                supervisor.wait()
        with contextlib.suppress(ProcessLookupError):  # anything left in its group
            os.killpg(supervisor.pid, signal.SIGKILL)
