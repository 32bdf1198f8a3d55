"""The idle sweep following the change feed (``stores.session_changes``) on a real Redis: between two full reads it
reads only the sessions written since its last sweep, sees every such write, reads everything again when the feed
cannot vouch for what changed, and judges exactly as a sweep that reads every live session (a new leader's first).

No Nomad: the policy checks lifetime and network idleness (no utilization, no SFTP session), so the sweep asks Nomad
nothing; the Nomad address is the test session's tripwire, which fails the test if it is called."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import Settings
from domain.idle.columns import WindowColumns
from domain.idle.config import IdlePolicyConfig, PolicyLayer
from domain.lifecycle import transition
from domain.model import Session, SessionStatus
from idle.sweeper import RESYNC_INTERVAL, Sweeper, Swept
from nomad_jobs.client import NomadClient
from stores.activity import record_activity
from stores.sessions import SessionStore
from tests.idle.running import stored_session

LIFETIME = 3600.0
CONFIG = IdlePolicyConfig(
    source="test", defaults=PolicyLayer(max_session_lifetime=LIFETIME, network_idle_timeout=1200.0)
)


@pytest.fixture
async def nomad(settings: Settings) -> AsyncIterator[NomadClient]:
    # the real agent: every running session is read on its chart turn (its stored allocation is none Nomad knows)
    client = NomadClient(settings.nomad)
    yield client
    await client.aclose()


@pytest.fixture
def store(redis: Redis, keys: Keys) -> SessionStore:
    return SessionStore(redis, keys)


def sweeper(store: SessionStore, nomad: NomadClient) -> Sweeper:
    return Sweeper(store, nomad, windows=WindowColumns(), concurrency=4)


async def running(store: SessionStore, name: str, *, minutes_ago: float = 1.0) -> Session:
    return await stored_session(store, name=f"feed-{name}", running_since=utcnow() - timedelta(minutes=minutes_ago))


def started(minutes_ago: float) -> Callable[[Session], Session]:
    def move(session: Session) -> Session:
        return replace(session, started_at=utcnow() - timedelta(minutes=minutes_ago))

    return move


def renamed(name: str) -> Callable[[Session], Session]:
    return lambda session: replace(session, name=name)


def lifetime_expired(swept: Swept, session_id: str) -> bool:
    return swept.verdicts[session_id].terminate


async def test_a_write_between_two_sweeps_is_seen_without_reading_every_session(
    store: SessionStore, nomad: NomadClient
) -> None:
    a, b = await running(store, "a"), await running(store, "b")
    sweep = sweeper(store, nomad)
    first = await sweep.sweep(utcnow(), CONFIG)
    assert {s.id for s in first.sessions} == {a.id, b.id} and not lifetime_expired(first, a.id)
    assert sweep.feed.full_reads == 1

    await store.update(a.id, started(120))  # running for two hours now: past the lifetime
    c = await running(store, "c")
    await store.request_termination(b.id, reason="test", at=utcnow(), forced=True)  # TERMINATED at once
    second = await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 1  # followed the feed: read only a, b and c
    assert {s.id for s in second.sessions} == {a.id, c.id} and set(second.live_ids) == {a.id, c.id}
    assert lifetime_expired(second, a.id) and not lifetime_expired(second, c.id)

    third = await sweep.sweep(utcnow(), CONFIG)  # nothing written since: nothing read, the same views
    assert sweep.feed.full_reads == 1 and third.sessions == second.sessions
    assert all(x is y for x, y in zip(third.sessions, second.sessions, strict=True))


async def test_a_session_that_starts_or_stops_running_between_two_sweeps_is_judged_as_a_full_read_judges(
    store: SessionStore, nomad: NomadClient
) -> None:
    """The sweep keeps its RUNNING sessions as the feed's writes change them (``idle.views.ViewCache``): a session
    that reaches RUNNING is judged from the next sweep on, on its new document; one that leaves RUNNING is not."""
    preparing = await stored_session(store, name="feed-preparing", status=SessionStatus.PREPARING)
    stays = await running(store, "stays")
    leaves = await running(store, "leaves")
    sweep = sweeper(store, nomad)
    first = await sweep.sweep(utcnow(), CONFIG)
    assert {s.id for s in first.sessions} == {stays.id, leaves.id}

    two_hours_ago = utcnow() - timedelta(minutes=120)
    await store.update(preparing.id, lambda s: transition(s, SessionStatus.RUNNING, reason="test", at=two_hours_ago))
    await store.request_termination(leaves.id, reason="test", at=utcnow())  # TERMINATING: live, not judged
    now = utcnow()
    second = await sweep.sweep(now, CONFIG)
    oracle = await sweeper(store, nomad).sweep(now, CONFIG)
    assert sweep.feed.full_reads == 1  # followed the feed
    assert {s.id for s in second.sessions} == {s.id for s in oracle.sessions} == {stays.id, preparing.id}
    assert set(second.live_ids) == set(oracle.live_ids) == {stays.id, preparing.id, leaves.id}
    assert second.verdicts == oracle.verdicts and lifetime_expired(second, preparing.id)


async def test_a_lost_cursor_reads_everything_again(store: SessionStore, nomad: NomadClient, redis: Redis) -> None:
    a = await running(store, "a")
    sweep = sweeper(store, nomad)
    await sweep.sweep(utcnow(), CONFIG)

    # the cursor's entry trimmed off the stream's head (as FEED_LENGTH trims it), then a write: the sweep cannot
    # vouch that it saw every write since, and reads everything
    await redis.xtrim(store.keys.session_changes, maxlen=0, approximate=False)
    await store.update(a.id, started(120))
    swept = await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 2 and lifetime_expired(swept, a.id)

    # the feed deleted (a Redis restarted without its data): read everything, then follow the new feed
    await redis.delete(store.keys.session_changes)
    b = await running(store, "b")
    swept = await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 3 and {s.id for s in swept.sessions} == {a.id, b.id}
    await store.update(b.id, started(120))
    swept = await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 3 and lifetime_expired(swept, b.id)


async def test_every_resync_interval_everything_is_read_again(store: SessionStore, nomad: NomadClient) -> None:
    await running(store, "a")
    sweep = sweeper(store, nomad)
    now = utcnow()
    await sweep.sweep(now, CONFIG)
    await sweep.sweep(now + RESYNC_INTERVAL - timedelta(seconds=1), CONFIG)
    assert sweep.feed.full_reads == 1
    await sweep.sweep(now + RESYNC_INTERVAL, CONFIG)  # the periodic full read
    assert sweep.feed.full_reads == 2
    await sweep.sweep(now + RESYNC_INTERVAL + timedelta(seconds=15), CONFIG)
    assert sweep.feed.full_reads == 2


async def test_more_writes_than_the_limit_read_everything_again(store: SessionStore, nomad: NomadClient) -> None:
    sessions = [await running(store, f"s{i}") for i in range(3)]
    sweep = sweeper(store, nomad)
    sweep.feed.limit = 2
    await sweep.sweep(utcnow(), CONFIG)
    for session in sessions[:2]:
        await store.update(session.id, started(120))
    await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 1  # two writes: within the limit
    for session in sessions:  # three: more
        await store.update(session.id, started(5))
    swept = await sweep.sweep(utcnow(), CONFIG)
    assert sweep.feed.full_reads == 2 and not any(v.terminate for v in swept.verdicts.values()), swept.verdicts


async def test_following_the_feed_judges_as_reading_everything(
    store: SessionStore, nomad: NomadClient, redis: Redis
) -> None:
    """Rounds of random writes (new sessions, ends, starts moved, renames, activity), some racing the sweep itself;
    after each, the sweep that follows the feed and a new leader's first sweep (everything read) at the same moment
    give the same live sessions, the same judged sessions and the same verdicts."""
    rng = random.Random(30)
    live = [await running(store, f"s{i}", minutes_ago=rng.uniform(0, 90)) for i in range(12)]
    stopping: set[str] = set()
    following = sweeper(store, nomad)
    counter = 0

    async def write() -> None:
        nonlocal counter
        counter += 1
        choice = rng.random()
        if choice < 0.2 or not live:
            live.append(await running(store, f"n{counter}", minutes_ago=rng.uniform(0, 90)))
        elif choice < 0.35:  # TERMINATED at once, or TERMINATING (still live, no longer judged)
            ended = live.pop(rng.randrange(len(live)))
            forced = rng.random() < 0.5
            await store.request_termination(ended.id, reason="test", at=utcnow(), forced=forced)
            if not forced:
                stopping.add(ended.id)
        elif choice < 0.7:
            await store.update(rng.choice(live).id, started(rng.uniform(0, 90)))
        elif choice < 0.85:
            await store.update(rng.choice(live).id, renamed(f"feed-renamed-{counter}"))
        else:
            await record_activity(redis, store.keys, rng.choice(live).id, utcnow() - timedelta(minutes=30))

    for round_ in range(12):
        writes = [write() for _ in range(rng.randrange(0, 6))]
        if round_ % 3 == 2:  # racing the sweep: seen now or by the next one, never lost
            await asyncio.gather(following.sweep(utcnow(), CONFIG), *writes)
        else:
            await asyncio.gather(*writes)
        now = utcnow()
        swept = await following.sweep(now, CONFIG)
        oracle = await sweeper(store, nomad).sweep(now, CONFIG)
        assert set(swept.live_ids) == set(oracle.live_ids) == {s.id for s in live} | stopping
        assert sorted(s.id for s in swept.sessions) == sorted(s.id for s in oracle.sessions)
        assert {s.id for s in swept.sessions} == {s.id for s in live}
        assert {s.id: s for s in swept.sessions} == {s.id: s for s in oracle.sessions}
        assert swept.verdicts == oracle.verdicts
    assert following.feed.full_reads == 1
    assert any(v.terminate for v in swept.verdicts.values()) and not all(v.terminate for v in swept.verdicts.values())
