"""Usage recorded in the MULTI that ends a session (real Redis): once, whoever ends it and however often the write is
retried; rollups equal the raw records recomputed; live sessions count up to now; utilization beside allocation."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from redis.asyncio import Redis

from core.errors import InvalidInput
from core.keys import Keys
from core.lease import Lease
from core.replies import text_hash
from domain.access import Scope
from domain.idle.config import CheckName
from domain.idle.verdict import CheckReport, MetricReading, Verdict
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType, StatusChange
from domain.usage import (
    FIELD_SEPARATOR,
    MEASURED,
    SECONDS,
    SLOT,
    USED,
    GroupBy,
    Grouping,
    Rollup,
    check_period,
    days_of,
    report,
    rollup,
)
from stores.idle import IdleStore
from stores.sessions import SessionStore
from stores.usage import add_utilization

S = SessionStatus
T0 = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)


def new_session(owner: str = "alice", project: str = "p1", group: str = "default", kernels: int = 1) -> Session:
    ks = tuple(
        Kernel(
            role="main" if i == 1 else "sub",
            index=i,
            hostname=f"main{i}" if i == 1 else f"sub{i - 1}",
            image="",
            resources={"cpu": "0.5", "mem": "268435456", "sim.shares": "0.25"},
        )
        for i in range(1, kernels + 1)
    )
    sid = str(uuid.uuid4())
    return Session(
        id=sid,
        name="s-" + sid[:8],
        owner_id=owner,
        type=SessionType.BATCH,
        driver=Driver.EXEC,
        image="",
        resources={},
        kernels=ks,
        created_at=T0,
        status_history=(StatusChange(S.PENDING, T0, "created"),),
        project=project,
        resource_group=group,
    )


async def move(store: SessionStore, sid: str, status: S, at: datetime) -> Session | None:
    def mutate(s: Session) -> Session | None:
        if s.status.is_terminal:
            return None
        return s.evolve(status=status, status_history=(*s.status_history, StatusChange(status, at, "test")))

    return await store.update(sid, mutate)


async def run_and_end(store: SessionStore, session: Session, start: datetime, seconds: int) -> None:
    await store.create([session])
    await move(store, session.id, S.RUNNING, start)
    await move(store, session.id, S.TERMINATING, start + timedelta(seconds=seconds - 1))
    await move(store, session.id, S.TERMINATED, start + timedelta(seconds=seconds))


async def stored_days(store: SessionStore, first: date, last: date) -> Rollup:
    rows, _ = await store.usage.stored_rollup(days_of(first, last))
    return dict(rows)


async def test_an_ended_session_is_recorded_once_with_its_rollup(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    session = new_session(kernels=2)
    await run_and_end(store, session, T0, 7200)  # 23:00 -> 01:00: two UTC days
    record = await store.usage.record(session.id)
    assert record is not None and record.seconds == 7200
    assert record.totals()[SLOT + "cpu"] == 1000 * 7200  # two kernels of 0.5
    assert record.totals()[SLOT + "sim.shares"] == 500 * 7200
    rows = await stored_days(store, T0.date(), T0.date() + timedelta(days=1))
    assert {k.day: r[SECONDS] for k, r in rows.items()} == {T0.date(): 3600, T0.date() + timedelta(days=1): 3600}
    # the same end written again (a retry), a destroy after it: nothing counted twice
    await move(store, session.id, S.TERMINATED, T0 + timedelta(hours=5))
    await store.request_termination(session.id, reason="user-requested", at=T0 + timedelta(hours=6), forced=True)
    # an ended session's document written again (the follower noting a kernel's end late): still ended, not again
    await store.update(session.id, lambda s: s.evolve(status_detail="the task's exit code arrived late"))
    assert await stored_days(store, T0.date(), T0.date() + timedelta(days=1)) == rows
    assert (await store.usage.totals())[("p1", SLOT + "cpu")] == 1000 * 7200


async def test_amounts_beyond_a_doubles_precision_are_added_exactly(redis: Redis, keys: Keys) -> None:
    """The recording script passes amounts to HINCRBY as strings: a Lua number (a double) would round these."""
    store = SessionStore(redis, keys)
    big = new_session()
    huge = {"cpu": "0.5", "mem": str(2**40 + 1), "sim.shares": "0.25"}  # a TiB for 10 days: ~9.5e17 byte-s
    big = big.evolve(kernels=(dataclasses.replace(big.kernels[0], resources=huge),))
    await run_and_end(store, big, T0, 10 * 86400 + 1)
    await run_and_end(store, new_session(), T0, 3)  # and 3 more seconds of 256 MiB on top
    total = (2**40 + 1) * (10 * 86400 + 1) + 268435456 * 3  # odd, and above 2**53
    assert total > 2**53 and float(total) != total
    assert (await store.usage.totals())[("p1", SLOT + "mem")] == total
    rows = await stored_days(store, T0.date(), T0.date() + timedelta(days=10))
    assert sum(r.get(SLOT + "mem", 0) for r in rows.values()) == total


async def test_concurrent_enders_count_a_session_once(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    session = new_session()
    await store.create([session])
    await move(store, session.id, S.RUNNING, T0)
    # the follower, a forced destroy and the idle checker all end it at once, at different moments
    await asyncio.gather(
        *(move(store, session.id, S.TERMINATED, T0 + timedelta(seconds=s)) for s in (100, 200, 300, 400)),
        store.request_termination(session.id, reason="user-requested", at=T0 + timedelta(seconds=50), forced=True),
    )
    ended = await store.get(session.id)
    assert ended is not None and ended.terminated_at is not None
    expected = (ended.terminated_at - T0) // timedelta(seconds=1)
    rows = await stored_days(store, T0.date(), T0.date())
    assert [r[SECONDS] for r in rows.values()] == [expected]


async def test_rollups_recomputed_from_raw_records_equal_the_stored_ones(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    rng = random.Random(29)
    ended = []
    for _ in range(60):
        session = new_session(
            owner=rng.choice(["alice", "bob", "carol"]),
            project=rng.choice(["p1", "p2"]),
            group=rng.choice(["default", "gpu"]),
            kernels=rng.randint(1, 3),
        )
        start = T0 + timedelta(seconds=rng.randint(0, 3 * 86400))
        await run_and_end(store, session, start, rng.randint(1, 2 * 86400))
        ended.append(session.id)
    records = [await store.usage.record(sid) for sid in ended]
    recomputed = rollup(r for r in records if r is not None)
    first, last = T0.date(), T0.date() + timedelta(days=6)
    stored = await stored_days(store, first, last)
    assert stored == recomputed
    # the report's path (each day's compact document, built from the day's hash) gives what grouping the rows gives,
    # built the first time, read the next, and built again once a session's end added to the day
    for _ in range(2):
        compact, _ = await store.usage.compact_days(days_of(first, last))
        fast = Grouping(GroupBy.ALL)
        for day in compact:
            fast.add_compact(date.fromisoformat(day.day), day.rows)
        assert fast.rows() == report(recomputed, first=first, last=last, group_by=GroupBy.ALL)
    late = new_session(owner="dave")
    await run_and_end(store, late, T0, 600)
    compact, _ = await store.usage.compact_days([T0.date()])
    assert "dave" in {row.split(FIELD_SEPARATOR)[0] for row, _ in compact[0].rows}


async def test_a_running_session_counts_up_to_now_and_others_usage_is_not_visible(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    session = new_session(owner="bob", project="p2")
    await store.create([session])
    await move(store, session.id, S.RUNNING, T0)
    period = check_period(T0.date(), T0.date() + timedelta(days=1), "UTC")
    now = T0 + timedelta(minutes=90)
    by_day = (await store.usage.grouped(period, Grouping([GroupBy.DAY, GroupBy.USER]), now=now)).rows()
    assert [(r.day, r.user, r.measures[SECONDS]) for r in by_day] == [
        (T0.date(), "bob", 3600),
        (T0.date() + timedelta(days=1), "bob", 1800),
    ]
    alice_only = Grouping([GroupBy.USER], Scope(everything=False, owners=("alice",)))
    assert (await store.usage.grouped(period, alice_only, now=now)).rows() == []
    p2_admin = Grouping([GroupBy.USER], Scope(everything=False, owners=("alice",), projects=("p2",)))
    assert [(r.user, r.measures[SECONDS]) for r in (await store.usage.grouped(period, p2_admin, now=now)).rows()] == [
        ("bob", 5400)
    ]


async def test_a_viewers_zone_is_counted_from_raw_records_within_their_retention(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys, usage_retention=30 * 86400)
    session = new_session()
    await run_and_end(store, session, T0, 7200)  # 00:00 -> 02:00 in Berlin on 2026-03-29 (DST begins at 02:00)
    berlin = check_period(date(2026, 3, 29), date(2026, 3, 29), "Europe/Berlin")
    rows = (await store.usage.grouped(berlin, Grouping([GroupBy.DAY]), now=T0 + timedelta(days=2))).rows()
    assert [(r.day, r.measures[SECONDS]) for r in rows] == [(date(2026, 3, 29), 7200)]
    assert berlin.zone == ZoneInfo("Europe/Berlin")
    with pytest.raises(InvalidInput) as refused:
        await store.usage.grouped(berlin, Grouping([GroupBy.DAY]), now=T0 + timedelta(days=90))
    assert refused.value.field == "from"
    ttl = await redis.ttl(keys.usage_record(session.id))
    assert 0 < ttl <= 30 * 86400


async def test_measured_utilization_is_kept_beside_the_allocation(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    session = new_session()
    await store.create([session])
    await move(store, session.id, S.RUNNING, T0)
    async with redis.pipeline(transaction=True) as pipe:
        add_utilization(pipe, keys, session.id, {"cpu_util": 20.0}, 30)
        add_utilization(pipe, keys, session.id, {"cpu_util": 50.0}, 10)
        await pipe.execute()
    await move(store, session.id, S.TERMINATED, T0 + timedelta(seconds=100))
    record = await store.usage.record(session.id)
    assert record is not None
    assert record.rates[USED + "cpu_util"] == 275 and record.rates[MEASURED + "cpu_util"] == 1  # 27.5 %
    assert not await redis.exists(keys.usage_utilization(session.id))


def test_a_bad_period_is_refused_with_the_field_named() -> None:
    for first, last, zone, field in [
        (date(2026, 1, 2), date(2026, 1, 1), "UTC", "to"),
        (date(2026, 1, 1), date(2026, 1, 1), "Mars/Olympus", "timeZone"),
        (date(2020, 1, 1), date(2026, 1, 1), "UTC", "to"),
    ]:
        with pytest.raises(InvalidInput) as refused:
            check_period(first, last, zone)
        assert refused.value.field == field


async def test_an_idle_sweep_adds_its_measured_utilization_to_the_session(redis: Redis, keys: Keys) -> None:
    store, idle = SessionStore(redis, keys), IdleStore(redis, keys)
    session = new_session()
    await store.create([session])
    await move(store, session.id, S.RUNNING, T0)
    fence = await Lease(redis, keys.idle_lease, keys.idle_fence, ttl=30).acquire()
    readings = (MetricReading("cpu_util", 10.0, 5.0), MetricReading("mem", None, 5.0))  # mem: no sample yet
    report = CheckReport(CheckName.UTILIZATION, expired=False, remaining=None, measured_against=None, readings=readings)
    verdict = Verdict(terminate=False, reason=None, reports=(report,))
    for _ in range(3):
        await idle.save_sweep(fence, checked_at=T0, verdicts={session.id: verdict}, ttl=30, interval=15.0)
    assert await store.usage.utilization(session.id) == {"cpu_util": 10.0}
    await move(store, session.id, S.TERMINATED, T0 + timedelta(seconds=60))
    record = await store.usage.record(session.id)
    assert record is not None and record.rates[USED + "cpu_util"] == 100


async def test_the_leaders_compaction_builds_exactly_the_days_written_since(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    day1 = datetime(2026, 3, 10, 1, 0, tzinfo=UTC)
    day2 = day1 + timedelta(days=1)
    await run_and_end(store, new_session(owner="alice"), day1, 600)
    await run_and_end(store, new_session(owner="bob"), day2, 600)
    assert await store.usage.compact_written_days() == [day1.date().isoformat(), day2.date().isoformat()]
    assert await store.usage.compact_written_days() == []  # nothing written since: nothing built
    await run_and_end(store, new_session(owner="carol"), day2 + timedelta(hours=1), 600)
    assert await store.usage.compact_written_days() == [day2.date().isoformat()]
    # what it built is what a report reads: fresh, so the report builds nothing on its path
    versions = text_hash(await redis.hgetall(keys.usage_day_versions))
    compact, _ = await store.usage.compact_days([day1.date(), day2.date()])
    assert [c.version for c in compact] == [int(versions[d.date().isoformat()]) for d in (day1, day2)]
    assert {row.split(FIELD_SEPARATOR)[0] for row, _ in compact[1].rows} == {"bob", "carol"}
    # a report that built a day itself counts as built for the leader too
    await run_and_end(store, new_session(owner="dave"), day1 + timedelta(hours=2), 600)
    await store.usage.compact_days([day1.date()])
    assert await store.usage.compact_written_days() == []
