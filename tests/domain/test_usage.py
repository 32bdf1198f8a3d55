"""Usage accounting, pure: held stretches from status histories, days in UTC and in a viewer's zone (DST), cluster
sessions, accelerator shares, and rollups that recompute exactly from their records."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.model import Driver, Kernel, Session, SessionType, StatusChange
from domain.model import SessionStatus as S
from domain.usage import (
    KERNEL_SECONDS,
    MEASURED,
    SECONDS,
    SLOT,
    USED,
    GroupBy,
    RollupKey,
    UsageRecord,
    add_rollups,
    held_intervals,
    record_of,
    record_rollup,
    report,
    rollup,
    split_days,
)

T0 = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")  # DST began 2026-03-29 02:00 local, ended 2026-10-25 03:00 local


def kernel(role: str, index: int, **resources: str) -> Kernel:
    return Kernel(role=role, index=index, hostname=f"{role}{index}", image="i", resources=resources)


def session(
    history: list[tuple[S, datetime]], *kernels: Kernel, owner: str = "alice", project: str = "p", sid: str = "s1"
) -> Session:
    ks = kernels or (kernel("main", 1, cpu="1", mem="1024"),)
    return Session(
        id=sid,
        name="n",
        owner_id=owner,
        type=SessionType.INTERACTIVE,
        driver=Driver.DOCKER,
        image="i",
        resources={},
        kernels=ks,
        created_at=history[0][1],
        status=history[-1][0],
        status_history=tuple(StatusChange(status, at, "r") for status, at in history),
        project=project,
    )


def test_a_session_counts_from_running_to_terminated_to_the_second() -> None:
    s = session(
        [
            (S.PENDING, T0),
            (S.PREPARING, T0 + timedelta(seconds=5)),
            (S.RUNNING, T0 + timedelta(seconds=12, microseconds=900_000)),
            (S.TERMINATING, T0 + timedelta(seconds=100)),
            (S.TERMINATED, T0 + timedelta(seconds=103, microseconds=100)),
        ],
        kernel("main", 1, cpu="0.5", mem="2048"),
    )
    record = record_of(s, now=T0 + timedelta(days=9))
    assert record.ended and record.seconds == 103 - 12
    assert record.totals() == {SECONDS: 91, KERNEL_SECONDS: 91, SLOT + "cpu": 500 * 91, SLOT + "mem": 2048 * 91}


def test_a_running_session_counts_up_to_now_and_a_restart_pauses_it() -> None:
    history = [
        (S.PENDING, T0),
        (S.RUNNING, T0 + timedelta(seconds=10)),
        (S.PREPARING, T0 + timedelta(seconds=20)),  # restarted in place: holds nothing until RUNNING again
        (S.RUNNING, T0 + timedelta(seconds=30)),
    ]
    record = record_of(session(history), now=T0 + timedelta(seconds=45))
    assert not record.ended
    assert record.intervals == ((int(T0.timestamp()) + 10, int(T0.timestamp()) + 20),) + (
        (int(T0.timestamp()) + 30, int(T0.timestamp()) + 45),
    )


def test_a_session_cancelled_before_running_counts_nothing() -> None:
    record = record_of(session([(S.PENDING, T0), (S.CANCELLED, T0 + timedelta(hours=1))]), now=T0)
    assert record.seconds == 0 and record.totals() == {}


def test_a_cluster_session_counts_every_kernels_own_slots_and_shares_in_thousandths() -> None:
    s = session(
        [(S.PENDING, T0), (S.RUNNING, T0), (S.TERMINATED, T0 + timedelta(seconds=10))],
        kernel("main", 1, cpu="2", **{"sim.shares": "0.5"}),
        kernel("sub", 2, cpu="1", **{"sim.shares": "0.25"}),
        kernel("sub", 3, cpu="1", **{"sim.device": "1"}),
    )
    totals = record_of(s, now=T0).totals()
    assert totals[SLOT + "cpu"] == 4000 * 10
    assert totals[SLOT + "sim.shares"] == 750 * 10
    assert totals[SLOT + "sim.device"] == 1000 * 10
    assert totals[KERNEL_SECONDS] == 30 and totals[SECONDS] == 10


def test_a_session_across_midnight_splits_into_its_days() -> None:
    start = datetime(2026, 1, 10, 23, 30, tzinfo=UTC)
    s = session([(S.PENDING, start), (S.RUNNING, start), (S.TERMINATED, start + timedelta(hours=25))])
    rows = record_rollup(record_of(s, now=start))
    seconds = {key.day: row[SECONDS] for key, row in rows.items()}
    assert seconds == {date(2026, 1, 10): 1800, date(2026, 1, 11): 86400, date(2026, 1, 12): 1800}


def test_dst_days_have_23_and_25_hours_in_the_viewers_zone() -> None:
    spring = int(datetime(2026, 3, 28, 0, 0, tzinfo=BERLIN).timestamp())
    assert [s for _, s in split_days(spring, spring + 3 * 86400, BERLIN)][:2] == [86400, 23 * 3600]
    autumn = int(datetime(2026, 10, 25, 0, 0, tzinfo=BERLIN).timestamp())
    assert split_days(autumn, autumn + 25 * 3600, BERLIN) == [(date(2026, 10, 25), 25 * 3600)]
    # the same 25 hours are two days in UTC
    assert [d for d, _ in split_days(autumn, autumn + 25 * 3600)] == [date(2026, 10, 24), date(2026, 10, 25)]


def test_used_utilization_is_kept_beside_what_was_allocated() -> None:
    s = session([(S.PENDING, T0), (S.RUNNING, T0), (S.TERMINATED, T0 + timedelta(seconds=100))])
    totals = record_of(s, now=T0, used={"cpu_util": 12.34}).totals()
    assert totals[USED + "cpu_util"] == 123 * 100 and totals[MEASURED + "cpu_util"] == 100


def test_report_groups_by_what_is_asked() -> None:
    a = UsageRecord("a", "alice", "p1", "g", "BATCH", ((0, 10),), {SECONDS: 1})
    b = UsageRecord("b", "bob", "p1", "g", "BATCH", ((0, 20),), {SECONDS: 1})
    rows = report(rollup([a, b]), first=date(1970, 1, 1), last=date(1970, 1, 1), group_by=[GroupBy.PROJECT])
    assert [(r.project, r.user, r.measures[SECONDS]) for r in rows] == [("p1", None, 30)]
    rows = report(rollup([a, b]), first=date(1970, 1, 1), last=date(1970, 1, 1), group_by=[GroupBy.USER])
    assert [(r.user, r.measures[SECONDS]) for r in rows] == [("alice", 10), ("bob", 20)]


ZONES = st.sampled_from([UTC, BERLIN, ZoneInfo("America/New_York"), ZoneInfo("Asia/Kolkata"), ZoneInfo("Pacific/Apia")])
BASE = int(datetime(2026, 3, 1, tzinfo=UTC).timestamp())


@st.composite
def records(draw: st.DrawFn) -> UsageRecord:
    starts = sorted(draw(st.lists(st.integers(0, 400 * 86400), min_size=0, max_size=6, unique=True)))
    intervals = []
    for i in range(0, len(starts) - 1, 2):
        intervals.append((BASE + starts[i], BASE + starts[i + 1]))
    rates = {SECONDS: 1, KERNEL_SECONDS: draw(st.integers(1, 8))}
    for slot in draw(st.sets(st.sampled_from(["cpu", "mem", "sim.shares", "cuda.device"]))):
        rates[SLOT + slot] = draw(st.integers(1, 2**36))
    return UsageRecord(
        draw(st.uuids()).hex,
        draw(st.sampled_from(["alice", "bob", "carol"])),
        draw(st.sampled_from(["p1", "p2"])),
        draw(st.sampled_from(["default", "gpu"])),
        draw(st.sampled_from(["BATCH", "INTERACTIVE"])),
        tuple(intervals),
        rates,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), max_size=12), ZONES)
def test_rollups_sum_each_records_rate_times_its_own_seconds_exactly(batch: list[UsageRecord], zone: object) -> None:
    assert isinstance(zone, (ZoneInfo, type(UTC)))
    rows = rollup(batch, zone)
    # every record's days add up to its own rate × its own seconds (never summed amounts × summed durations)
    for record in batch:
        days = record_rollup(record, zone)
        for measure, total in record.totals().items():
            assert sum(row.get(measure, 0) for row in days.values()) == total
    # the rollup recomputed record by record in any order is the same, and its grand total is the records' total
    again: dict[RollupKey, dict[str, int]] = {}
    for record in reversed(batch):
        add_rollups(again, record_rollup(record, zone))
    assert again == rows
    grand: dict[str, int] = {}
    for record in batch:
        for measure, total in record.totals().items():
            grand[measure] = grand.get(measure, 0) + total
    summed: dict[str, int] = {}
    for row in rows.values():
        for measure, amount in row.items():
            summed[measure] = summed.get(measure, 0) + amount
    assert {m: v for m, v in summed.items() if v} == {m: v for m, v in grand.items() if v}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500 * 86400), st.integers(0, 40 * 86400), ZONES)
def test_split_days_covers_the_span_in_consecutive_days(offset: int, length: int, zone: object) -> None:
    assert isinstance(zone, (ZoneInfo, type(UTC)))
    start = BASE + offset
    parts = split_days(start, start + length, zone)
    assert sum(seconds for _, seconds in parts) == length
    assert all(0 < seconds <= 25 * 3600 for _, seconds in parts)
    days = [day for day, _ in parts]
    assert all(b - a == timedelta(days=1) for a, b in zip(days, days[1:], strict=False))


def test_held_intervals_ignore_a_terminating_that_never_ran() -> None:
    history = [
        StatusChange(S.PENDING, T0, "c"),
        StatusChange(S.TERMINATING, T0, "c"),
        StatusChange(S.CANCELLED, T0, "c"),
    ]
    assert held_intervals(history, now=T0 + timedelta(hours=1)) == ()
