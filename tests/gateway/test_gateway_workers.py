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

import httpx2

from caravan.stack.processes import free_port
from core.settings import Settings
from tests.dev_process import alive, children_of, gateway_answers, until
from tests.harness import caravan_env

ROOT = Path(__file__).resolve().parents[2]


async def test_workers_share_the_port_and_die_with_a_killed_supervisor(redis_settings: Settings) -> None:
    port = free_port()
    env = {**caravan_env(redis_settings, port), "CARAVAN_GATEWAY_WORKERS": "2"}
    url = f"http://127.0.0.1:{port}/graphql"
    with (redis_settings.home / "gateway.log").open("ab") as log:
        supervisor = subprocess.Popen(  # noqa: ASYNC220 (starts it and returns; asyncio's would tie it to this loop)
            [sys.executable, "-m", "caravan.cli", "gateway"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        async with httpx2.AsyncClient(timeout=5) as http:
            deadline = time.monotonic() + 120
            while not await gateway_answers(http, url):
                assert supervisor.poll() is None, (redis_settings.home / "gateway.log").read_text()
                assert time.monotonic() < deadline, "the gateway did not come up"
                await asyncio.sleep(0.3)
            workers = {
                pid
                for pid in children_of(supervisor.pid)
                if "uvicorn" in Path(f"/proc/{pid}/cmdline").read_text()
                or "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()
            }
            assert len(workers) >= 2, workers

            supervisor.send_signal(signal.SIGKILL)
            supervisor.wait()
            await until(lambda: not any(alive(pid) for pid in workers), 10, "the workers to die")
            assert not await gateway_answers(http, url)  # nobody is left serving the port
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group outlives a killed supervisor while a worker lives
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
