"""The idle service judging stored sessions: which are reclaimed, with which reason, and what it reports.

Real Redis and the real Nomad agent; the sessions have no job behind them (their allocation is unknown to
Nomad), which is enough for everything but utilization, covered end to end in tests/e2e/test_idle.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import Settings
from domain.idle.config import CheckName
from domain.idle.verdict import RemainingBasis
from domain.model import Session, SessionStatus, SessionType
from stores.activity import open_connection, record_activity
from stores.idle import IdleStore, StoredVerdict, report_ttl
from stores.sessions import SessionStore
from tests.idle.running import eventually, policy_file, running_idle, stored_session, swept_since

FAST = 'check_interval = "0.2s"\n'
S = SessionStatus


@pytest.fixture
def store(redis: Redis, keys: Keys) -> SessionStore:
    return SessionStore(redis, keys)


@pytest.fixture
def idle_store(redis: Redis, keys: Keys) -> IdleStore:
    return IdleStore(redis, keys)


def policy(tmp_path: Path, body: str) -> Path:
    return policy_file(tmp_path, FAST + "defaults {\n" + body + "\n}\n")


async def reclaimed(store: SessionStore, session: Session, *, timeout: float = 5.0) -> str:
    """The reason ``session`` was marked TERMINATING with."""

    async def marked() -> str | None:
        found = await store.get(session.id)
        return found.status_info if found and found.status is S.TERMINATING else None

    return await eventually(marked, timeout=timeout)


async def report(idle_store: IdleStore, session: Session) -> StoredVerdict:
    return await eventually(lambda: idle_store.verdict(session.id), timeout=30)


@pytest.mark.parametrize(
    ("body", "running_for", "reason"),
    [
        ("max_session_lifetime = 2", 5, "idle-session-lifetime"),
        ("network_idle_timeout = 2", 5, "idle-timeout"),
        ("max_session_lifetime = 2\nnetwork_idle_timeout = 2", 5, "idle-session-lifetime"),
    ],
    ids=["lifetime", "network", "both: lifetime first"],
)
async def test_an_expired_check_reclaims_with_its_reason(
    settings: Settings, store: SessionStore, tmp_path: Path, body: str, running_for: float, reason: str
) -> None:
    session = await stored_session(store, running_since=utcnow() - timedelta(seconds=running_for))
    async with running_idle(settings, policy(tmp_path, body)):
        assert await reclaimed(store, session) == reason
    after = await store.get(session.id)
    assert after is not None and after.status_history[-1].reason == reason


async def test_lifetime_counts_from_running_not_from_creation(
    settings: Settings, store: SessionStore, idle_store: IdleStore, tmp_path: Path
) -> None:
    session = await stored_session(store, running_since=utcnow() + timedelta(seconds=30))  # queued a long time
    async with running_idle(settings, policy(tmp_path, "max_session_lifetime = 60")):
        lifetime = (await report(idle_store, session)).verdict.reports[0]
    assert lifetime.name is CheckName.SESSION_LIFETIME and lifetime.measured_against is RemainingBasis.LIFETIME
    assert lifetime.remaining is not None and 85 < lifetime.remaining <= 90


async def test_recent_activity_or_an_open_connection_keeps_a_session(
    settings: Settings, redis: Redis, keys: Keys, store: SessionStore, tmp_path: Path
) -> None:
    long_ago = utcnow() - timedelta(seconds=60)
    used = await stored_session(store, name="used", running_since=long_ago)
    connected = await stored_session(store, name="connected", running_since=long_ago)
    unused = await stored_session(store, name="unused", running_since=long_ago)
    await open_connection(redis, keys, connected.id, "terminal", utcnow(), ttl=30)
    async with running_idle(settings, policy(tmp_path, "network_idle_timeout = 1.5")):
        for _ in range(10):
            await record_activity(redis, keys, used.id, utcnow())
            await asyncio.sleep(0.2)
        assert await reclaimed(store, unused) == "idle-timeout"
    for kept in (used, connected):
        found = await store.get(kept.id)
        assert found is not None and found.status is S.RUNNING


@pytest.mark.parametrize(
    ("type", "kept", "reason"),
    [
        (SessionType.BATCH, {CheckName.SESSION_LIFETIME, CheckName.NETWORK_TIMEOUT}, None),
        (SessionType.INFERENCE, {CheckName.NETWORK_TIMEOUT}, "idle-session-lifetime"),
    ],
    ids=["batch", "inference"],
)
async def test_exemptions_by_session_type(
    settings: Settings,
    store: SessionStore,
    idle_store: IdleStore,
    tmp_path: Path,
    type: SessionType,
    kept: set[CheckName],
    reason: str | None,
) -> None:
    session = await stored_session(store, type=type, running_since=utcnow() - timedelta(seconds=60))
    async with running_idle(settings, policy(tmp_path, "max_session_lifetime = 1\nnetwork_idle_timeout = 1")):
        stored = await report(idle_store, session)
        if reason is not None:
            assert await reclaimed(store, session) == reason
        else:
            await swept_since(idle_store, session.id, stored.checked_at)  # judged again, and acted on
            found = await store.get(session.id)
            assert found is not None and found.status is S.RUNNING
    exempt = {r.name for r in stored.verdict.reports if "exempt" in r.note or "batch timeout" in r.note}
    assert exempt == kept


async def test_utilization_without_stats_is_a_gap_not_idleness(
    settings: Settings, store: SessionStore, idle_store: IdleStore, tmp_path: Path
) -> None:
    """The allocation is unknown to Nomad: no sample, so no verdict, however long it runs."""
    session = await stored_session(store, running_since=utcnow() - timedelta(seconds=60))
    body = 'utilization {\n  window = "0.6s"\n  thresholds {\n    cpu_util = 50\n  }\n}'
    started = utcnow()
    async with running_idle(settings, policy(tmp_path, body)):
        long_after = started + timedelta(seconds=1.5)  # well past a window
        utilization = (await swept_since(idle_store, session.id, long_after)).verdict.reports[2]
    found = await store.get(session.id)
    assert found is not None and found.status is S.RUNNING
    assert (utilization.expired, utilization.note, utilization.measured_against) == (
        False, "collecting samples", RemainingBasis.WINDOW,
    )  # fmt: skip
    assert [(r.metric, r.average, r.threshold) for r in utilization.readings] == [("cpu_util", None, 50.0)]


async def test_only_running_sessions_are_judged_and_reports_expire(
    settings: Settings, redis: Redis, keys: Keys, store: SessionStore, idle_store: IdleStore, tmp_path: Path
) -> None:
    preparing = await stored_session(store, name="preparing", status=S.PREPARING)
    running = await stored_session(store, name="running")
    started = utcnow()
    async with running_idle(settings, policy(tmp_path, "max_session_lifetime = 3600")):
        stored = await report(idle_store, running)
    assert started - timedelta(seconds=1) < stored.checked_at < utcnow()
    assert stored.verdict.terminate is False
    assert 0 < await redis.ttl(keys.idle_report(running.id)) <= report_ttl(0.2)
    assert await idle_store.verdict(preparing.id) is None
