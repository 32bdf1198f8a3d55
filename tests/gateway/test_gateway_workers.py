"""``caravan gateway`` with several worker processes, as production runs it (``CARAVAN_GATEWAY_WORKERS``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from caravan.stack.processes import free_port
from common.settings import Settings
from tests.harness import ADMIN_TOKEN

ROOT = Path(__file__).resolve().parents[2]


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def until(check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_workers_share_the_port_and_die_with_a_killed_supervisor(settings: Settings) -> None:
    port = free_port()
    env = {**os.environ, "CARAVAN_HOME": str(settings.home), "CARAVAN_SECRETS_DIR": str(settings.secrets),
           "CARAVAN_REDIS_URL": settings.redis.url,
           "CARAVAN_REDIS_PREFIX": settings.redis.prefix, "CARAVAN_NOMAD_ADDR": settings.nomad.addr,
           "CARAVAN_ADMIN_TOKEN": ADMIN_TOKEN, "CARAVAN_GATEWAY_HOST": "127.0.0.1", "CARAVAN_GATEWAY_PORT": str(port),
           "CARAVAN_GATEWAY_WORKERS": "2"}
    with (settings.home / "gateway.log").open("ab") as log:
        supervisor = subprocess.Popen([sys.executable, "-m", "caravan.cli", "gateway"], cwd=ROOT, env=env,
                                      stdout=log, stderr=log, start_new_session=True)
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            async def answers() -> bool:
                try:
                    response = await http.post(f"http://127.0.0.1:{port}/graphql", json={"query": "{ viewer { id } }"},
                                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                except httpx.TransportError:
                    return False
                return bool(response.json() == {"data": {"viewer": {"id": "admin"}}})

            deadline = time.monotonic() + 120
            while not await answers():
                assert supervisor.poll() is None, (settings.home / "gateway.log").read_text()
                assert time.monotonic() < deadline, "the gateway did not come up"
                await asyncio.sleep(0.3)
            workers = {pid for pid in children_of(supervisor.pid) if "uvicorn" in Path(f"/proc/{pid}/cmdline").read_text()
                       or "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()}
            assert len(workers) >= 2, workers

            supervisor.send_signal(signal.SIGKILL)
            supervisor.wait()
            await until(lambda: not any(alive(pid) for pid in workers), timeout=10)
            assert not await answers()  # nobody is left serving the port
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group outlives a killed supervisor while a worker lives
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
