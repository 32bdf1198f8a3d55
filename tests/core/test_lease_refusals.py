"""A standby taking the lease while Redis refuses the lease's write (its EVAL inside MULTI/EXEC) waits as in any
outage, on a real Redis of its own: a primary without its replicas (``NOREPLICAS``) or one a failover has just
demoted (``READONLY``). Found by bench/chaos: the refusal came back as a plain error reply, the standby scheduler or
idle checker died of it, and no standby took over a paused leader's lease for 30 s."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from caravan.stack.processes import free_port
from caravan.stack.redis_server import start_redis
from core.keys import Keys
from core.lease import Lease
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
