"""A standby taking the lease while Redis refuses the lease's write (its EVAL inside MULTI/EXEC) waits as in any
outage, on a real Redis of its own: a primary without its replicas (``NOREPLICAS``) or one a failover has just
demoted (``READONLY``). Found by bench/chaos: the refusal came back as a plain error reply, the standby scheduler or
idle checker died of it, and no standby took over a paused leader's lease for 30 s."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from caravan.services import serve_health
from caravan.stack.processes import free_port
from caravan.stack.redis_server import start_redis
from core.keys import Keys
from core.lease import STANDBY_RETRY_MAX, Fence, Lease, lead_forever
from core.redis import NotPrimary, NotReplicated, client
from core.retry import TRANSIENT, with_backoff
from core.settings import RedisSettings, Settings
from tests.conftest import TEST_KEY_PREFIXES

pytestmark = [pytest.mark.redis]


@pytest.fixture
def own_redis(tmp_path: Path, secrets_dir: Path) -> Iterator[Settings]:
    port = free_port()
    service = start_redis(
        tmp_path / "redis", port, log=tmp_path / "redis.log", secrets_dir=secrets_dir, key_prefixes=TEST_KEY_PREFIXES
    )
    redis = RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="t" + uuid.uuid4().hex[:10])
    yield Settings(home=tmp_path, secrets_dir=secrets_dir, redis=redis)
    service.stop()


@pytest.fixture
async def admin(own_redis: Settings) -> AsyncIterator[Redis]:
    redis = client(own_redis.for_role("admin").redis)
    yield redis
    await redis.aclose()


@pytest.fixture
async def lease(own_redis: Settings) -> AsyncIterator[Lease]:
    redis = client(own_redis.for_role("scheduler").redis)
    keys = Keys(own_redis.redis.prefix)
    yield Lease(redis, keys.scheduler_lease, keys.scheduler_fence, ttl=10)
    await redis.aclose()


async def test_a_lease_refused_for_want_of_replicas_is_an_outage_the_standby_waits_out(
    admin: Redis, lease: Lease
) -> None:
    await admin.config_set("min-replicas-to-write", 1)  # FAULT: a primary whose replicas are gone
    with pytest.raises(NotReplicated):
        await lease.try_acquire()
    standby = asyncio.ensure_future(with_backoff("acquire lease", lease.acquire))
    await asyncio.sleep(1)  # a few refused attempts
    assert not standby.done() or standby.exception() is None, standby.exception()
    await admin.config_set("min-replicas-to-write", 0)  # its replicas back
    fence = await asyncio.wait_for(standby, 60)
    assert fence.token == 1


async def test_a_lease_refused_by_a_demoted_primary_is_an_outage_the_standby_waits_out(
    admin: Redis, lease: Lease
) -> None:
    await admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # FAULT: demoted, its primary unreachable
    try:
        with pytest.raises(NotPrimary) as refused:
            await lease.try_acquire()
        assert isinstance(refused.value, TRANSIENT)
        standby = asyncio.ensure_future(with_backoff("acquire lease", lease.acquire))
        await asyncio.sleep(1)
        assert not standby.done() or standby.exception() is None, standby.exception()
    finally:
        await admin.execute_command("REPLICAOF", "NO", "ONE")  # the primary again
    fence = await asyncio.wait_for(standby, 60)
    assert fence.token == 1


async def refused_but_written(admin: Redis, lease: Lease) -> None:
    """FAULT: an attempt at the lease that Redis wrote and then refused (no replica confirmed it: the primary has none
    here, and the client waits for one), as in a failover; its write stays, under this process's own id."""
    lease.redis.wait_replicas = 1  # type: ignore[attr-defined]
    try:
        with pytest.raises(NotReplicated):
            await lease.try_acquire()
    finally:
        lease.redis.wait_replicas = 0  # type: ignore[attr-defined]
    assert await admin.get(lease.key) == lease.holder


async def test_a_lease_its_own_refused_attempt_left_is_taken_again_at_once(admin: Redis, lease: Lease) -> None:
    """Found by bench/chaos: the standby's next attempt found its own unconfirmed lease, could not take it (``SET NX``)
    and waited for it to expire, a TTL with nobody leading."""
    await refused_but_written(admin, lease)
    fence = await lease.try_acquire()  # the replica back
    assert fence is not None and fence.token == 2
    other = Lease(lease.redis, lease.key, lease.fence_key, ttl=10)
    assert await other.try_acquire() is None  # held: another process still cannot take it


async def test_a_standby_whose_refused_attempt_left_a_lease_is_not_leading(
    admin: Redis, lease: Lease, own_redis: Settings
) -> None:
    """Found by bench/chaos: the health port named such a standby leader (the lease in Redis was its own) while nobody
    led; the bench paused it as the leader, and nobody took over for 49 s."""
    settings = replace(own_redis, health_port=free_port())
    async with serve_health(settings, lease.redis, lease):
        await refused_but_written(admin, lease)
        assert await health(settings) is False
        lease.term = await lease.try_acquire()  # what lead_forever does with the term it starts
        assert await health(settings) is True


async def health(settings: Settings) -> bool | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", settings.health_port)
    writer.write(b"GET /health HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    leading: bool | None = json.loads(answer.split(b"\r\n\r\n", 1)[1])["leading"]
    return leading


ATTEMPT_FAILED = r"acquire lease: .*; retrying in ([\d.]+)s"


async def test_a_standby_tries_the_lease_at_least_once_a_second_while_redis_fails(
    lease: Lease, own_redis: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by bench/chaos: the standby's attempts backed off to 5 s apart, and against a Redis failing over every
    few seconds they fell in its outages; a paused idle checker's lease was taken 49 s late."""
    unreachable = replace(own_redis.redis, url=f"redis://127.0.0.1:{free_port()}/0")  # FAULT: Redis down
    redis = client(replace(own_redis, redis=unreachable).for_role("scheduler").redis)
    standby = Lease(redis, lease.key, lease.fence_key, ttl=10)
    caplog.set_level(logging.WARNING, logger="core.retry")

    async def leading(fence: Fence) -> None:
        raise AssertionError("Redis is down: no term can start")

    waiting = asyncio.ensure_future(lead_forever("scheduler", standby, leading))
    try:
        while (
            len(delays := [float(d) for d in re.findall(r"acquire lease: .*; retrying in ([\d.]+)s", caplog.text)]) < 6
        ):
            await asyncio.sleep(0.1)
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await redis.aclose()
    assert max(delays) <= STANDBY_RETRY_MAX, delays
