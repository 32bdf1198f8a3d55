"""A leader stopped with SIGTERM (what Nomad sends a deployed allocation, and ``caravan dev`` its children) releases its
lease before it exits: its standby takes over at once instead of after the lease's TTL (``caravan deploy``'s rolling
updates and stops hand leadership over this way; ``bench/deploy_recovery`` measures it)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis

from caravan.stack.processes import free_port
from core.keys import Keys
from core.settings import Settings
from tests.harness import caravan_env

pytestmark = [pytest.mark.nomad, pytest.mark.redis]


@pytest.mark.parametrize("role", ["scheduler", "idle"])
async def test_a_leader_releases_its_lease_on_sigterm(settings: Settings, redis: Redis, role: str) -> None:
    keys = Keys(settings.redis.prefix)
    lease = keys.scheduler_lease if role == "scheduler" else keys.idle_lease
    log = (settings.home / f"{role}.log").open("ab")
    process = subprocess.Popen(  # noqa: ASYNC220 (a child of the test, signalled and waited below)
        [sys.executable, "-m", "caravan.cli", role], env=caravan_env(settings, free_port()), stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 60
        while not await redis.exists(lease):
            assert process.poll() is None and time.monotonic() < deadline, (settings.home / f"{role}.log").read_text()
            await asyncio.sleep(0.1)
        holder = await redis.get(lease)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
        assert await redis.get(lease) != holder  # released, not left to expire (a TTL of 10 s)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
