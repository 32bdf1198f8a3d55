"""What the gateway, the idle checker and the follower ask the scheduler's job owner, through the session store: in
the same transaction as the session's new state (real Redis; the owner acting on it is
tests/scheduler/test_job_owner)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from stores.sessions import SessionStore

S = SessionStatus


def session(status: S, job: bool = True) -> Session:
    kernel = Kernel(
        role="main", index=1, hostname="main1", image="", resources={"cpu": "1", "mem": "268435456"}, status=status
    )
    sid = str(uuid.uuid4())
    return Session(
        id=sid,
        name="s-" + sid[:8],
        owner_id="u",
        type=SessionType.INTERACTIVE,
        driver=Driver.EXEC,
        image="",
        resources=kernel.resources,
        kernels=(kernel,),
        created_at=utcnow(),
        status=status,
        nomad_job_id=f"cv-{sid}" if job else None,
    )


async def stored(store: SessionStore, status: S, job: bool = True) -> Session:
    created = session(S.PENDING, job)
    await store.create([created])
    await store.update(created.id, lambda s: replace(s, status=status))
    return created


async def test_ending_a_session_with_a_job_asks_to_stop_it_in_the_same_write(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    running = await stored(store, S.RUNNING)
    after = await store.request_termination(running.id, reason="user-requested", at=utcnow())
    assert after is not None and after.status is S.TERMINATING
    _, stop, _ = await store.requests.owner_work()
    assert stop == {running.id: "stop"}
    assert await redis.llen(keys.job_owner_wakeup) >= 1  # and woke the owner


async def test_a_forced_end_asks_for_a_purge_and_a_plain_one_never_weakens_it(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    running = await stored(store, S.RUNNING)
    await store.request_termination(running.id, reason="user-requested", at=utcnow())
    await store.request_termination(running.id, reason="user-requested", at=utcnow(), forced=True)
    await store.requests.request_stop(running.id)  # the reconciler's safety net, later
    assert (await store.requests.owner_work())[1] == {running.id: "purge"}
    await store.requests.stopped(running.id, "stop")  # a stop done for the first request does not settle the purge
    assert (await store.requests.owner_work())[1] == {running.id: "purge"}
    await store.requests.stopped(running.id, "purge")
    assert (await store.requests.owner_work())[1] == {}


async def test_a_service_session_ended_by_observation_has_its_job_stopped_a_batch_one_not(
    redis: Redis, keys: Keys
) -> None:
    """Nomad would restart or reschedule the job of an INTERACTIVE session whose task failed; a BATCH job ends with
    its task (stopping it would only register a new version of it)."""
    store = SessionStore(redis, keys)
    running = await stored(store, S.RUNNING)
    await store.update(running.id, lambda s: replace(s, status=S.TERMINATED))
    assert (await store.requests.owner_work())[1] == {running.id: "stop"}
    batch = session(S.PENDING)
    batch = replace(batch, type=SessionType.BATCH)
    await store.create([batch])
    await store.update(batch.id, lambda s: replace(s, status=S.RUNNING))
    await store.update(batch.id, lambda s: replace(s, status=S.TERMINATED))
    assert batch.id not in (await store.requests.owner_work())[1]


async def test_nothing_is_asked_for_a_session_without_a_job(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    pending = await stored(store, S.PENDING, job=False)
    after = await store.request_termination(pending.id, reason="user-requested", at=utcnow())
    assert after is not None and after.status is S.CANCELLED
    assert await store.requests.owner_work() == (set(), {}, set())


async def test_a_restart_is_asked_and_forgotten_once_done(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    running = await stored(store, S.RUNNING)
    await store.requests.request_restart(running.id, utcnow())
    assert (await store.requests.owner_work())[2] == {running.id}
    await store.requests.restarted(running.id)
    assert (await store.requests.owner_work())[2] == set()
