"""The timing rules of recurring schedules, with the clock passed in: every minute, DST days in Europe/Berlin, the
missed-run policies after downtime, end dates and max runs, and the checks of what users give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from core.errors import InvalidInput
from domain.model import SessionType
from domain.schedules import (
    SKIP_GRACE,
    ConcurrencyPolicy,
    MissedRunPolicy,
    Schedule,
    Timing,
    check_timing,
    due_times,
    new_schedule,
    next_run_times,
    plan_due,
    resolved_spec,
    restarted,
    run_key,
    run_session_name,
)
from domain.templates import TemplateSpec

T0 = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def schedule_of(timing: Timing, *, now: datetime = T0, **changes: object) -> Schedule:
    made = new_schedule(
        name="nightly",
        owner_id="alice",
        project="default",
        timing=timing,
        concurrency=ConcurrencyPolicy.ALLOW,
        now=now,
        spec=TemplateSpec(type=SessionType.BATCH, startup_command="true"),
    )
    return made.evolve(**changes)


@pytest.mark.parametrize(
    ("cron", "zone", "after", "expected"),
    [
        ("* * * * *", "UTC", "2026-11-24T06:00:00+00:00",
         ["2026-11-24T06:01:00+00:00", "2026-11-24T06:02:00+00:00", "2026-11-24T06:03:00+00:00"]),
        ("* * * * *", "UTC", "2026-11-24T06:00:30+00:00",
         ["2026-11-24T06:01:00+00:00", "2026-11-24T06:02:00+00:00", "2026-11-24T06:03:00+00:00"]),
        ("@hourly", "Asia/Kolkata", "2026-11-24T06:00:00+00:00",  # a half-hour zone: local full hours
         ["2026-11-24T06:30:00+00:00", "2026-11-24T07:30:00+00:00", "2026-11-24T08:30:00+00:00"]),
        # spring forward (Berlin, 2026-03-29 02:00 CET -> 03:00 CEST): 02:30 does not exist; it runs once at 03:30
        ("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00+00:00",
         ["2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"]),
        # fall back (Berlin, 2026-10-25 03:00 CEST -> 02:00 CET): 02:30 happens twice; it runs at the first only
        ("30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00+00:00",
         ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]),
        # hourly on spring forward: 02:00 and 03:00 are one instant, which runs once
        ("0 * * * *", "Europe/Berlin", "2026-03-29T00:30:00+01:00",
         ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00"]),
        # hourly on fall back: the repeated 02:00 (CET) is not run again
        ("0 * * * *", "Europe/Berlin", "2026-10-25T00:30:00+02:00",
         ["2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T03:00:00+01:00"]),
    ],
)  # fmt: skip
def test_cron_due_times(cron: str, zone: str, after: str, expected: list[str]) -> None:
    timing = Timing(cron=cron, interval=None, zone=zone)
    assert list(islice(due_times(timing, utc(after)), 3)) == [utc(e) for e in expected]


def test_after_the_repeated_hour_starts_a_walk_the_next_day() -> None:
    # 02:40 CET, in the repeated hour, after the day's 02:30 CEST has run: the next is tomorrow's 02:30
    timing = Timing(cron="30 2 * * *", interval=None, zone="Europe/Berlin")
    assert next(due_times(timing, utc("2026-10-25T02:40:00+01:00"))) == utc("2026-10-26T02:30:00+01:00")


def test_a_fall_back_day_has_24_hourly_runs_and_a_spring_forward_day_23() -> None:
    timing = Timing(cron="0 * * * *", interval=None, zone="Europe/Berlin")
    for start, end, count in [
        ("2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 24),
        ("2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23),
    ]:
        runs = [m for m in islice(due_times(timing, utc(start) - timedelta(seconds=1)), 30) if m < utc(end)]
        assert len(runs) == count
        assert len(set(runs)) == count


def test_interval_due_times_follow_the_anchor() -> None:
    timing = check_timing(cron=None, interval=5, zone="UTC", now=T0)
    assert timing.anchor == T0 + timedelta(seconds=5)
    assert list(islice(due_times(timing, T0 + timedelta(seconds=7)), 2)) == [
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=15),
    ]


def every_minute(**timing: object) -> Timing:
    return Timing(cron="* * * * *", interval=None, **timing)  # type: ignore[arg-type]


def test_a_new_schedule_is_due_at_its_first_due_time() -> None:
    schedule = schedule_of(every_minute(), now=T0 + timedelta(seconds=10))
    assert schedule.next_due == T0 + timedelta(minutes=1)
    assert plan_due(schedule, T0 + timedelta(seconds=59)) is None
    plan = plan_due(schedule, T0 + timedelta(minutes=1, seconds=0.2))
    assert plan is not None
    assert (plan.run_due, plan.missed, plan.next_due) == (T0 + timedelta(minutes=1), 0, T0 + timedelta(minutes=2))


@pytest.mark.parametrize(
    ("policy", "deadline", "late", "runs", "missed"),
    [
        # an hour down, every minute (06:00 to 07:00 passed): 07:00 runs once, the 60 others are one MISSED record
        (MissedRunPolicy.RUN_LATEST, None, 3600 + 20, True, 60),
        (MissedRunPolicy.SKIP, None, 3600 + 20, True, 60),  # 07:00 is 20 s late: within SKIP's grace
        (MissedRunPolicy.SKIP, 10.0, 3600 + 20, False, 61),  # past the deadline: all missed
        (MissedRunPolicy.RUN_LATEST, 10.0, 3600 + 20, False, 61),
        (MissedRunPolicy.RUN_LATEST, 30.0, 3600 + 20, True, 60),
        (MissedRunPolicy.RUN_LATEST, None, 0.5, True, 0),  # on time
        (MissedRunPolicy.SKIP, 1.0, 2.0, False, 1),  # one due time, 2 s late, deadline 1 s
    ],
)
def test_missed_runs_after_downtime(
    policy: MissedRunPolicy, deadline: float | None, late: float, runs: bool, missed: int
) -> None:
    schedule = schedule_of(every_minute(missed_runs=policy, starting_deadline=deadline), next_due=T0)
    now = T0 + timedelta(seconds=late)
    plan = plan_due(schedule, now)
    assert plan is not None
    latest = T0 + timedelta(minutes=int(late // 60))
    assert plan.run_due == (latest if runs else None)
    assert plan.missed == missed
    assert plan.next_due == latest + timedelta(minutes=1)
    assert plan.last_missed == (None if not missed else latest - timedelta(minutes=1) if runs else latest)


def test_skip_without_a_deadline_has_a_grace() -> None:
    hourly = Timing(cron="0 * * * *", interval=None, missed_runs=MissedRunPolicy.SKIP)
    plan = plan_due(schedule_of(hourly, next_due=T0), T0 + timedelta(seconds=SKIP_GRACE + 1))
    assert plan is not None and (plan.run_due, plan.missed) == (None, 1)
    late = Timing(cron="0 * * * *", interval=None, missed_runs=MissedRunPolicy.RUN_LATEST)
    plan = plan_due(schedule_of(late, next_due=T0), T0 + timedelta(minutes=59))
    assert plan is not None and (plan.run_due, plan.missed) == (T0, 0)


def test_end_date_stops_the_schedule() -> None:
    end = T0 + timedelta(minutes=2, seconds=30)
    schedule = schedule_of(every_minute(end_at=end), next_due=T0 + timedelta(minutes=2))
    plan = plan_due(schedule, T0 + timedelta(minutes=2, seconds=1))
    assert plan is not None and plan.run_due == T0 + timedelta(minutes=2)
    assert plan.next_due is None  # 06:03 is after the end
    # long downtime past the end: the last due time before the end runs, nothing after it
    plan = plan_due(schedule_of(every_minute(end_at=end), next_due=T0), T0 + timedelta(hours=1))
    assert plan is not None
    assert (plan.run_due, plan.missed, plan.next_due) == (T0 + timedelta(minutes=2), 2, None)


def test_max_runs_ends_after_the_last_run() -> None:
    schedule = schedule_of(every_minute(max_runs=3), next_due=T0, runs_started=2)
    plan = plan_due(schedule, T0 + timedelta(seconds=1))
    assert plan is not None and plan.run_due == T0 and plan.next_due is None
    assert next_run_times(schedule, 5) == [T0]
    assert next_run_times(schedule.evolve(runs_started=0), 5) == [T0 + timedelta(minutes=i) for i in range(3)]


def test_paused_schedules_are_not_due_and_resume_from_now() -> None:
    schedule = schedule_of(every_minute(), next_due=T0, paused=True)
    assert plan_due(schedule, T0 + timedelta(hours=1)) is None
    assert schedule.index_score is None
    assert next_run_times(schedule, 3) == []
    resumed = restarted(schedule.evolve(paused=False), T0 + timedelta(hours=1, seconds=5))
    assert resumed.next_due == T0 + timedelta(hours=1, minutes=1)  # the hour paused is not made up for


def test_run_key_is_one_per_due_instant() -> None:
    due = utc("2026-10-25T02:30:00+02:00")
    assert run_key("s1", due) == run_key("s1", due.astimezone(UTC)) == "schedule:s1:due:20261025T003000.000000Z"
    assert run_key("s1", due) != run_key("s2", due)
    assert run_key("s1", due) != run_key("s1", due + timedelta(hours=1))
    assert run_key("s1", due) != run_key("s1", due, triggered=True)
    name = run_session_name(schedule_of(every_minute()), due)
    assert name == "nightly-20261025-003000" and len(name) <= 64


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "* * * * * *"}, "cron"),  # six fields (seconds): not a five-field expression
        ({"cron": "@reboot"}, "cron"),
        ({"cron": "bad"}, "cron"),
        ({"cron": None}, "cron"),  # neither
        ({"cron": "* * * * *", "interval": 60}, "cron"),  # both
        ({"cron": None, "interval": 0.5}, "interval"),
        ({"cron": "* * * * *", "zone": "Mars/Olympus"}, "timeZone"),
        ({"cron": "* * * * *", "zone": "../../etc/passwd"}, "timeZone"),
        ({"cron": "* * * * *", "starting_deadline": 0}, "startingDeadline"),
        ({"cron": "* * * * *", "end_at": T0}, "endAt"),
        ({"cron": "* * * * *", "max_runs": 0}, "maxRuns"),
    ],
)
def test_bad_timing_names_the_field(given: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"interval": None, "zone": "UTC", **given}
    with pytest.raises(InvalidInput) as raised:
        check_timing(now=T0, **values)  # type: ignore[arg-type]
    assert raised.value.field == field


def test_shorthands_and_spacing_are_accepted() -> None:
    assert check_timing(cron="@Daily", interval=None, zone="UTC", now=T0).cron == "@daily"
    assert check_timing(cron=" 30  2 * * 1-5 ", interval=None, zone="UTC", now=T0).cron == "30 2 * * 1-5"


def test_overrides_go_over_the_template_item_by_item() -> None:
    template = TemplateSpec(
        type=SessionType.BATCH, startup_command="old", environ={"A": "1", "B": "2"}, resources={"cpu": "1"}
    )
    schedule = new_schedule(
        name="from-template",
        owner_id="alice",
        project="default",
        timing=every_minute(),
        concurrency=ConcurrencyPolicy.FORBID,
        now=T0,
        template_id="t1",
        overrides=TemplateSpec(startup_command="new", environ={"B": "3"}),
        overridden=("startup_command", "environ"),
    )
    spec = resolved_spec(schedule, template)
    assert (spec.startup_command, spec.environ, spec.resources) == ("new", {"A": "1", "B": "3"}, {"cpu": "1"})
