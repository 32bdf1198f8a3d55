"""Sessions stored before the listing indexes existed are indexed once, by the scheduler at the start of its term."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from core.keys import Keys
from domain.lifecycle import transition
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from stores.sessions import LISTING_INDEXES_VERSION, SessionStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def session(i: int, project: str) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="busybox", resources={"cpu": "1"})
    return Session(
        id=f"s{i}",
        name=f"job-{i:04d}",
        owner_id="alice",
        type=SessionType.BATCH,
        driver=Driver.EXEC,
        image="busybox",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=T0 + timedelta(seconds=i),
        project=project,
    )


def listing_keys(keys: Keys) -> list[str]:
    """Every key of the listing indexes the sessions of this test touch (what an older Caravan did not write)."""
    return [
        keys.sessions_of_project("p1"),
        keys.sessions_of_project("p2"),
        keys.session_names,
        keys.sessions_by_terminated,
        keys.sessions_of_type(SessionType.BATCH.value),
        keys.sessions_in_group("default"),
        *(keys.sessions_with_status(s.value) for s in SessionStatus),
    ]


async def test_sessions_missing_from_the_listing_indexes_are_indexed_once(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    await store.create([session(i, "p1" if i % 2 else "p2") for i in range(1, 1201)])  # more than one batch
    await store.update(
        "s7", lambda s: transition(s, SessionStatus.CANCELLED, reason="user-requested", at=T0 + timedelta(hours=1))
    )
    written = {key: await redis.dump(key) for key in listing_keys(keys)}
    await redis.delete(*listing_keys(keys))  # as an older Caravan left them

    assert await store.ensure_listing_indexes() == 1200
    assert {key: await redis.dump(key) is not None for key in written} == {k: v is not None for k, v in written.items()}
    assert await redis.zcard(keys.sessions_of_project("p1")) == 600
    assert await redis.smembers(keys.sessions_with_status("CANCELLED")) == {"s7"}
    assert await redis.scard(keys.sessions_with_status("PENDING")) == 1199
    assert await redis.zrange(keys.sessions_by_terminated, 0, -1) == ["s7"]
    assert await redis.hget(keys.session_names, "s1200") == "job-1200"
    assert await redis.get(keys.listing_indexes_version) == LISTING_INDEXES_VERSION

    await redis.srem(keys.sessions_with_status("PENDING"), "s1")
    assert await store.ensure_listing_indexes() == 0  # done once: the marker holds
    assert not await redis.sismember(keys.sessions_with_status("PENDING"), "s1")


async def test_a_session_changing_during_the_reindex_is_indexed_as_it_is_stored(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    await store.create([session(1, "p1")])
    await redis.delete(*listing_keys(keys))
    changed = False

    class RacingRedis:
        """Named fault injector: a status change lands between the reindex's read and its write, once."""

        def __getattr__(self, name: str) -> object:
            return getattr(redis, name)

        def pipeline(self, transaction: bool = True) -> object:
            pipe = redis.pipeline(transaction=transaction)
            real_mget = pipe.mget

            async def mget(keys_: list[str]) -> object:
                nonlocal changed
                found = await real_mget(keys_)
                if not changed:
                    changed = True
                    await store.update(
                        "s1",
                        lambda s: replace(
                            transition(s, SessionStatus.CANCELLED, reason="user-requested", at=T0 + timedelta(hours=1))
                        ),
                    )
                return found

            pipe.mget = mget  # type: ignore[method-assign]
            return pipe

    racing = SessionStore(RacingRedis(), keys)  # type: ignore[arg-type]
    assert await racing.ensure_listing_indexes() == 1
    assert changed
    assert await redis.smembers(keys.sessions_with_status("CANCELLED")) == {"s1"}
    assert not await redis.smembers(keys.sessions_with_status("PENDING"))
