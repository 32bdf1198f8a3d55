"""Session events: what a status change writes to its streams, and reading it back."""

from __future__ import annotations

from datetime import UTC, datetime

from redis.asyncio import Redis

from core.keys import Keys
from domain.lifecycle import restate, transition
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from stores import events
from stores.sessions import SessionStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def session() -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="busybox", resources={"cpu": "1"})
    return Session(
        id="s1",
        name="job",
        owner_id="alice",
        type=SessionType.BATCH,
        driver=Driver.EXEC,
        image="busybox",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=T0,
    )


def test_an_event_carries_the_change_its_reason_and_the_kernels() -> None:
    ended = transition(session(), SessionStatus.CANCELLED, reason="user-requested", at=T0.replace(minute=5))
    event = events.decode("1700000000000-3", events.event_fields(ended))
    assert event == events.SessionEvent(
        id="1700000000000-3",
        session_id="s1",
        owner_id="alice",
        status=SessionStatus.CANCELLED,
        reason="user-requested",
        at=T0.replace(minute=5),
        kernels=(events.KernelState("main1", SessionStatus.CANCELLED),),
    )


def test_a_new_session_event_is_stamped_with_its_creation() -> None:
    event = events.latest_of(session())
    assert (event.id, event.status, event.reason, event.at) == (events.BEGINNING, SessionStatus.PENDING, "created", T0)


def test_cursors_are_stream_ids() -> None:
    assert events.is_cursor("1700000000000-0") and events.is_cursor(events.BEGINNING)
    for bad in ("", "$", "+", "1700000000000", "1-2-3", "-1-0", "1 -0", "x-1", "1" * 21 + "-0"):
        assert not events.is_cursor(bad), bad


async def test_status_changes_are_appended_with_them_and_read_back_in_order(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    [created] = await store.create([session()])
    stream, owner_stream = keys.session_events(created.id), keys.owner_events("alice")
    before = await events.last_id(redis, owner_stream)
    await store.update(created.id, lambda s: transition(s, SessionStatus.SCHEDULED, reason="placed", at=T0))
    assert await redis.ttl(stream) == -1  # kept while the session lives
    await store.update(created.id, lambda s: transition(s, SessionStatus.CANCELLED, reason="user-requested", at=T0))
    assert 0 < await redis.ttl(stream) <= events.SESSION_STREAM_TTL
    read = await events.read_after(redis, stream, events.BEGINNING)
    assert [(e.status, e.reason) for e in read] == [
        (SessionStatus.PENDING, "created"),
        (SessionStatus.SCHEDULED, "placed"),
        (SessionStatus.CANCELLED, "user-requested"),
    ]
    assert [e.status for e in await events.read_after(redis, owner_stream, before)] == [
        SessionStatus.SCHEDULED,
        SessionStatus.CANCELLED,
    ]
    assert await events.read_after(redis, stream, read[-1].id) == []


async def test_a_cursor_the_cap_trimmed_away_is_not_kept(redis: Redis, keys: Keys) -> None:
    stream = keys.owner_events("alice")
    ids = [await redis.xadd(stream, {"event": "{}"}) for _ in range(5)]
    await redis.xtrim(stream, maxlen=2, approximate=False)
    assert [await events.is_kept(redis, stream, i) for i in ids] == [False, False, False, True, True]
    assert await events.is_kept(redis, stream, events.BEGINNING)
    assert await events.is_kept(redis, keys.owner_events("nobody"), ids[0])


async def test_a_preparing_sessions_new_reason_is_an_event_with_its_detail(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    [created] = await store.create([session()])
    for target, reason in ((SessionStatus.SCHEDULED, "scheduled"), (SessionStatus.PREPARING, "job-registered")):
        await store.update(created.id, lambda s, t=target, r=reason: transition(s, t, reason=r, at=T0))  # type: ignore[misc]
    why = "Nomad cannot place it: constraint '${node.unique.id} = x' excluded 1 node"
    await store.update(created.id, lambda s: restate(s, reason="unplaceable", detail=why, at=T0))
    await store.update(created.id, lambda s: s.evolve(name="renamed"))  # not a change of status or reason: no event
    read = await events.read_after(redis, keys.session_events(created.id), events.BEGINNING)
    assert [(e.status, e.reason, e.detail) for e in read][-2:] == [
        (SessionStatus.PREPARING, "job-registered", None),
        (SessionStatus.PREPARING, "unplaceable", why),
    ]
