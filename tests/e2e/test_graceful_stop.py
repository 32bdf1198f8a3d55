"""A leader stopped with SIGTERM (what Nomad sends a deployed allocation, and ``caravan dev`` its children) releases its
lease before it exits: its standby takes over at once instead of after the lease's TTL (``caravan deploy``'s rolling
updates and stops hand leadership over this way; ``bench/deploy_recovery`` measures it); a stopped gateway finishes
the request in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis

from caravan.stack.processes import free_port
from core.keys import Keys
from core.settings import Settings
from tests.harness import ADMIN_TOKEN, caravan_env

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


async def test_a_stopped_gateway_finishes_the_request_in_flight(settings: Settings) -> None:
    """SIGTERM while a request's body is half sent: the gateway stops accepting connections, still reads the rest,
    answers it, and exits (Nomad's stop of a deployed replica; ``caravan.services.SHUTDOWN_GRACE``)."""
    port = free_port()
    log = (settings.home / "gateway.log").open("ab")
    process = subprocess.Popen(  # noqa: ASYNC220 (a child of the test, signalled and waited below)
        [sys.executable, "-m", "caravan.cli", "gateway"], env=caravan_env(settings, port), stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 60
        while not await accepts(port):
            assert process.poll() is None and time.monotonic() < deadline, (settings.home / "gateway.log").read_text()
            await asyncio.sleep(0.1)
        body = json.dumps({"query": "{ viewer { id } }"}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        await writer.drain()
        await asyncio.sleep(0.2)  # the request has started (headers read) before the stop
        process.send_signal(signal.SIGTERM)
        while await accepts(port):  # stopped accepting: the stop is under way
            assert time.monotonic() < deadline + 30
            await asyncio.sleep(0.05)
        writer.write(body[10:])
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'{"data":{"viewer":{"id":"admin"}}}' in answer.replace(b" ", b"")
        # uvicorn raises the signal it handled again once shut down: the exit is SIGTERM's, after the answer
        assert await asyncio.to_thread(process.wait, 30) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


async def accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True
