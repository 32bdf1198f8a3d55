"""Exactly one idle checker acts at a time, and a deposed one cannot write (real Redis)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.lease import Lease, LostLease
from core.settings import Settings
from domain.idle.verdict import TerminationReason, Verdict
from domain.model import SessionStatus
from stores.idle import IdleStore
from stores.sessions import SessionStore
from tests.idle.running import acquire_tries, eventually, policy_file, running_idle, stored_session

FAST = 'check_interval = "0.2s"\n'


async def holder(redis: Redis, keys: Keys) -> str | None:
    found: str | None = await redis.get(keys.idle_lease)
    return found


async def test_one_leader_and_a_standby_that_takes_over_at_once(
    settings: Settings, redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    path = policy_file(tmp_path, FAST)
    async with running_idle(settings, path, lease_ttl=30) as first:
        first_tries = acquire_tries(first)
        async with running_idle(settings, path, lease_ttl=30) as second:
            second_tries = acquire_tries(second)
            leader = await eventually(lambda: holder(redis, keys), timeout=30)
            assert leader in {first.lease.holder, second.lease.holder}
            standby_tries = second_tries if leader == first.lease.holder else first_tries

            async def standby_refused_twice() -> bool:
                return standby_tries.count(False) >= 2

            await eventually(standby_refused_twice, timeout=30)
            assert await holder(redis, keys) == leader
            assert await redis.get(keys.idle_fence) == "1"  # one term only
        # the second stopped: if it led, it released the lease and the first leads without waiting 30 s
        assert await eventually(lambda: holder(redis, keys), timeout=3) == first.lease.holder


async def test_a_deposed_leaders_writes_are_refused(redis_settings: Settings, redis: Redis, keys: Keys) -> None:
    store, idle_store = SessionStore(redis, keys), IdleStore(redis, keys)
    session = await stored_session(store)
    old = Lease(redis, keys.idle_lease, keys.idle_fence, ttl=30)
    old_fence = await old.acquire()
    await redis.delete(keys.idle_lease)  # the old leader stalls past its lease's life; another takes over
    new_fence = await Lease(redis, keys.idle_lease, keys.idle_fence, ttl=10).acquire()
    assert new_fence.token == old_fence.token + 1

    verdict = Verdict(terminate=False, reason=None, reports=())
    with pytest.raises(LostLease):
        await idle_store.save_sweep(old_fence, checked_at=utcnow(), verdicts={session.id: verdict}, ttl=30)
    with pytest.raises(LostLease):
        await store.request_termination(
            session.id, reason=TerminationReason.NETWORK_TIMEOUT.value, at=utcnow(), fence=old_fence
        )
    assert await redis.hlen(keys.jobs_to_stop) == 0  # nor was its job asked to stop
    assert await idle_store.verdict(session.id) is None
    found = await store.get(session.id)
    assert found is not None and found.status is SessionStatus.RUNNING

    await idle_store.save_sweep(new_fence, checked_at=utcnow(), verdicts={session.id: verdict}, ttl=30)
    assert await idle_store.verdict(session.id) is not None


async def test_a_checker_that_lost_its_lease_stops_acting_until_it_leads_again(
    settings: Settings, redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    store = SessionStore(redis, keys)
    session = await stored_session(store, running_since=utcnow() - timedelta(seconds=60))
    path = policy_file(tmp_path, FAST + "defaults {\n  max_session_lifetime = 3600\n}\n")
    async with running_idle(settings, path, lease_ttl=0.6) as service:
        tries = acquire_tries(service)
        await eventually(lambda: holder(redis, keys), timeout=30)
        await redis.delete(keys.idle_lease)  # as if its lease had expired while it stalled
        usurper = Lease(redis, keys.idle_lease, keys.idle_fence, ttl=30)
        await usurper.acquire()
        path.write_text(FAST + "defaults {\n  max_session_lifetime = 1\n}\n")
        service.request_reload()

        async def standing_by() -> bool:
            return False in tries  # it tried to lead again, and could not: its term (and any sweep) is over

        await eventually(standing_by, timeout=30)
        found = await store.get(session.id)
        assert found is not None and found.status is SessionStatus.RUNNING  # no verdict was acted on
        await usurper.release()

        async def reclaimed() -> bool:
            found = await store.get(session.id)
            return found is not None and found.status_info == TerminationReason.SESSION_LIFETIME.value

        await eventually(reclaimed, timeout=30)
