"""Recurring schedules of batch sessions: the model and the timing rules. Pure: the clock is always passed in.

A schedule creates sessions (the runs) at its **due times**, given by a five-field cron expression (or an ``@hourly``
style shorthand, parsed by ``croniter``) read in an IANA time zone, or by a fixed interval counted from an anchor.

**Wall-clock time and daylight saving.** A cron expression names wall-clock times in the schedule's zone. A wall time
that does not exist (the hour skipped when the clocks spring forward) is read with the offset in force before the
change, so it lands as far after the gap as it was into it; a wall time that occurs twice (the hour repeated when the
clocks fall back) is taken at its first occurrence only. So a ``30 2 * * *`` schedule in Europe/Berlin runs:

* on the spring-forward day (2026-03-29, 02:00 CET -> 03:00 CEST): **once, at 03:30 CEST** (01:30 UTC);
* on the fall-back day (2026-10-25, 03:00 CEST -> 02:00 CET): **once, at the first 02:30** (02:30 CEST, 00:30 UTC),
  not again at 02:30 CET;
* every other day at 02:30 local time.

Due times are distinct instants: an hourly schedule runs once at 03:00 CEST on the spring-forward day (its 02:00 and
03:00 are the same instant) and 24 times, not 25, on the fall-back day. Interval schedules ignore the zone: they run
every ``interval`` seconds of real time from their anchor.

**After downtime** (the scheduler down, or a due time found late): of the due times that passed, at most one runs,
the latest; every earlier one is recorded in the history as missed, in one record with their count (never a burst).
The latest runs unless it is later than the starting deadline; ``SKIP`` gives a schedule without a deadline one of
``SKIP_GRACE`` seconds, ``RUN_LATEST`` none. A run more than the deadline late is recorded as missed.

**Exactly once**: each run's sessions are created with an idempotency key (:func:`run_key`) derived from the
schedule's id and the due instant, so however many scheduler processes race on one due time, one set of sessions
exists for it (``stores.schedules``).
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, croniter

from core.errors import InvalidInput
from domain.session_requests import RUN_TOKEN_PREFIX, SessionRequest
from domain.templates import TemplateSpec

SCHEDULE_NAME_RULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{2,38}[A-Za-z0-9_]$")
"""4-40 characters: a run's session is named ``<name>-<due time>`` (``-m`` when triggered), within the 64 a
session name may have even with ``-<n>`` for ``count`` sessions."""
MIN_INTERVAL = 1.0
"""Shortest interval between due times, in seconds."""
MAX_INTERVAL = 366 * 86400.0
SKIP_GRACE = 60.0
"""Seconds late a ``SKIP`` schedule without a starting deadline may still run a due time."""
MAX_CRON_STEPS = 100_000
"""Most due times walked in one computation (a cron expression that names no real time, such as ``0 0 30 2 *``,
ends a walk here: the schedule has no next run)."""
SHORTHANDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
MERGED = ("environ", "resources")
"""Override fields merged into the template's item by item (an environment variable, a slot) rather than replacing."""


class ConcurrencyPolicy(StrEnum):
    ALLOW = "ALLOW"
    """Runs may overlap."""
    FORBID = "FORBID"
    """A due time while the previous run's sessions are still live is skipped (recorded)."""
    REPLACE = "REPLACE"
    """The previous run's live sessions are asked to end (``schedule-replaced``) and the new run starts."""


class MissedRunPolicy(StrEnum):
    RUN_LATEST = "RUN_LATEST"
    """After downtime the latest passed due time runs once (unless later than the starting deadline)."""
    SKIP = "SKIP"
    """After downtime a passed due time runs only within the starting deadline (``SKIP_GRACE`` without one)."""


class RunOutcome(StrEnum):
    CREATED = "CREATED"
    """The run's sessions were created (their status and result are the sessions')."""
    SKIPPED = "SKIPPED"
    """FORBID: the previous run was still live."""
    MISSED = "MISSED"
    """Due times that passed without running (downtime, or later than the starting deadline)."""
    FAILED = "FAILED"
    """The sessions could not be created: the reason says why (a policy, a quota, a template gone...)."""


@dataclass(frozen=True)
class Timing:
    """When a schedule is due. Exactly one of ``cron`` and ``interval``."""

    cron: str | None
    """Five-field cron expression or shorthand, read in ``zone``."""
    interval: float | None
    """Seconds between due times, counted from ``anchor``."""
    zone: str = "UTC"
    """IANA time zone of the cron expression (and of how end dates are shown)."""
    anchor: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    """Interval schedules: the first due time (UTC)."""
    starting_deadline: float | None = None
    """Seconds late a due time may still run; later, it is recorded as missed. None: see ``missed_runs``."""
    end_at: datetime | None = None
    """No due time after this moment (UTC)."""
    max_runs: int | None = None
    """The schedule ends after this many runs created."""
    missed_runs: MissedRunPolicy = MissedRunPolicy.RUN_LATEST


@dataclass(frozen=True)
class Schedule:
    id: str
    name: str
    owner_id: str
    project: str
    timing: Timing
    concurrency: ConcurrencyPolicy
    spec: TemplateSpec | None
    """The sessions' options, when not from a template."""
    template_id: str | None
    """A session template whose values (read at each run) the ``overrides`` go over."""
    overrides: TemplateSpec
    overridden: tuple[str, ...]
    """The ``overrides`` fields given (the others are the template's)."""
    created_at: datetime
    updated_at: datetime
    paused: bool = False
    next_due: datetime | None = None
    """The earliest due time not yet handled (None: paused or finished)."""
    runs_started: int = 0
    """Runs whose sessions were created."""
    last_sessions: tuple[str, ...] = ()
    """The session ids of the latest run created (the concurrency policy looks at them)."""
    trigger_at: datetime | None = None
    """triggerSchedule: run once at this moment (or as soon as the runner sees it), outside the due times."""
    recorded: int = 0
    """History records ever written (``stores.schedules`` trims the history every few)."""

    def evolve(self, **changes: Any) -> Schedule:
        return replace(self, **changes)

    @property
    def index_score(self) -> float | None:
        """When the runner must look at the schedule next (unix seconds); None: never, until changed."""
        moments = [m for m in (None if self.paused else self.next_due, self.trigger_at) if m is not None]
        return min(moments).timestamp() if moments else None


@dataclass(frozen=True)
class Run:
    """One record of a schedule's history."""

    key: str
    """The run key (:func:`run_key`): also the creation's idempotency key."""
    due_at: datetime
    """The due time (UTC): for a MISSED record, the latest of the due times it stands for."""
    at: datetime
    """When the runner handled it."""
    outcome: RunOutcome
    session_ids: tuple[str, ...] = ()
    reason: str | None = None
    missed: int = 0
    """MISSED: how many due times the record stands for."""
    triggered: bool = False
    """Run by triggerSchedule rather than at a due time."""


@dataclass(frozen=True)
class DuePlan:
    """What to do about a schedule whose ``next_due`` has come."""

    run_due: datetime | None
    """The due time to run now; None: none (all missed)."""
    missed: int
    """Due times passed without a run (recorded as one MISSED record)."""
    last_missed: datetime | None
    next_due: datetime | None
    """The first due time after ``now`` (None: the schedule is over)."""


# -- checking input --


def zone_of(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(
            f"unknown time zone {name[:64]!r}: give an IANA name such as Europe/Berlin", field="timeZone"
        ) from exc


def check_cron(expression: str) -> str:
    """A five-field expression or a shorthand, as croniter reads it; INVALID_INPUT on ``cron`` otherwise."""
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in SHORTHANDS:
            raise InvalidInput(f"unknown shorthand {text[:32]!r}: one of {', '.join(SHORTHANDS)}", field="cron")
        return text.lower()
    if len(text.split(" ")) != 5:
        raise InvalidInput(
            "a cron expression has five fields: minute hour day-of-month month day-of-week", field="cron"
        )
    try:
        croniter(text)
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        raise InvalidInput(f"bad cron expression {text[:64]!r}: {exc}", field="cron") from exc
    return text


def check_timing(
    *,
    cron: str | None,
    interval: float | None,
    zone: str,
    now: datetime,
    starting_deadline: float | None = None,
    end_at: datetime | None = None,
    max_runs: int | None = None,
    missed_runs: MissedRunPolicy = MissedRunPolicy.RUN_LATEST,
    anchor: datetime | None = None,
) -> Timing:
    """The timing of a new or changed schedule, every rule checked (errors name the field)."""
    if (cron is None) == (interval is None):
        raise InvalidInput("give exactly one of cron and interval", field="cron")
    zone_of(zone)
    if interval is not None and not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise InvalidInput(f"interval must be between {MIN_INTERVAL:g}s and {MAX_INTERVAL:g}s", field="interval")
    if starting_deadline is not None and starting_deadline <= 0:
        raise InvalidInput("startingDeadline must be positive", field="startingDeadline")
    if end_at is not None and end_at <= now:
        raise InvalidInput("endAt must be in the future", field="endAt")
    if max_runs is not None and max_runs < 1:
        raise InvalidInput("maxRuns must be at least 1", field="maxRuns")
    return Timing(
        cron=check_cron(cron) if cron is not None else None,
        interval=interval,
        zone=zone,
        anchor=anchor if anchor is not None else now + timedelta(seconds=interval or 0),
        starting_deadline=starting_deadline,
        end_at=end_at,
        max_runs=max_runs,
        missed_runs=missed_runs,
    )


def check_schedule_name(name: str) -> None:
    if not SCHEDULE_NAME_RULE.match(name):
        raise InvalidInput("name must be 4-40 characters: letters, digits, '_', and '.' or '-' inside", field="name")


# -- due times --


def due_times(timing: Timing, after: datetime) -> Iterator[datetime]:
    """The due times strictly after ``after``, in order, each a distinct UTC instant (``end_at`` and ``max_runs``
    aside: see :func:`following`)."""
    if timing.interval is not None:
        step = timedelta(seconds=timing.interval)
        k = 0 if after < timing.anchor else int((after - timing.anchor) / step) + 1
        while True:
            if (moment := timing.anchor + k * step) > after:
                yield moment
            k += 1
    else:
        assert timing.cron is not None
        found: datetime | None = after
        while found is not None and (found := _cron_next(timing.cron, timing.zone, found)) is not None:
            yield found


@lru_cache(maxsize=1024)
def _parsed(cron: str) -> croniter:
    return croniter(cron)


@lru_cache(maxsize=16384)
def _cron_next(cron: str, zone_name: str, after: datetime) -> datetime | None:
    """The first due time of ``cron`` in ``zone_name`` strictly after ``after`` (None: none within
    ``MAX_CRON_STEPS``). Cached: schedules due together share their ``after`` (``bench/schedules``)."""
    zone = ZoneInfo(zone_name)
    walls = copy.copy(_parsed(cron))  # parsing an expression is the costly part: once per expression
    walls.set_current(after.astimezone(zone).replace(tzinfo=None), force=True)
    for _ in range(MAX_CRON_STEPS):
        wall: datetime = walls.get_next(datetime)
        moment = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)  # fold=0: see the module's docstring
        if moment > after:
            return moment
    return None


def following(timing: Timing, after: datetime, runs_started: int) -> datetime | None:
    """The first due time after ``after``; None when the schedule is over (past ``end_at``, ``max_runs`` reached)."""
    if timing.max_runs is not None and runs_started >= timing.max_runs:
        return None
    moment = next(due_times(timing, after), None)
    if moment is None or (timing.end_at is not None and moment > timing.end_at):
        return None
    return moment


def next_run_times(schedule: Schedule, count: int) -> list[datetime]:
    """The schedule's next ``count`` due times (fewer when it ends first; none while paused)."""
    if schedule.paused or schedule.next_due is None:
        return []
    timing = schedule.timing
    left = count if timing.max_runs is None else min(count, timing.max_runs - schedule.runs_started)
    found = [schedule.next_due][: max(left, 0)]
    for moment in due_times(timing, schedule.next_due):
        if len(found) >= left or (timing.end_at is not None and moment > timing.end_at):
            break
        found.append(moment)
    return found


def deadline_of(timing: Timing) -> float | None:
    """Seconds late a due time may still run (None: any)."""
    if timing.starting_deadline is not None:
        return timing.starting_deadline
    return SKIP_GRACE if timing.missed_runs is MissedRunPolicy.SKIP else None


def plan_due(schedule: Schedule, now: datetime) -> DuePlan | None:
    """What to do now about ``schedule``: None while none of its due times has come. Of the passed due times, the
    latest runs (within the deadline) and the others are missed; the next due time is the first after ``now``."""
    first = None if schedule.paused else schedule.next_due
    if first is None or first > now:
        return None
    timing = schedule.timing
    passed = [first]
    for moment in due_times(timing, first):
        if moment > now or (timing.end_at is not None and moment > timing.end_at):
            break
        passed.append(moment)
        if len(passed) > MAX_CRON_STEPS:
            passed = passed[-1:]  # only the count of the older ones matters, and only roughly past this
    latest = passed[-1]
    deadline = deadline_of(timing)
    run_due = latest if deadline is None or (now - latest).total_seconds() <= deadline else None
    missed = len(passed) - (1 if run_due else 0)
    last_missed = (passed[-2] if run_due else latest) if missed else None
    runs_after = schedule.runs_started + (1 if run_due else 0)
    return DuePlan(run_due, missed, last_missed, following(timing, now, runs_after))


def run_key(schedule_id: str, due: datetime, *, triggered: bool = False) -> str:
    """The idempotency key of the run of ``schedule_id`` due at ``due``: one due instant, one key, one run."""
    kind = "trigger" if triggered else "due"
    return f"{RUN_TOKEN_PREFIX}{schedule_id}:{kind}:{due.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"


def run_session_name(schedule: Schedule, due: datetime, *, triggered: bool = False) -> str:
    """``<schedule name>-<due time, UTC>``: unique per due time, so runs that overlap do not clash on the name."""
    return f"{schedule.name}-{due.astimezone(UTC):%Y%m%d-%H%M%S}{'-m' if triggered else ''}"


# -- the sessions' options --


def resolved_spec(schedule: Schedule, template_spec: TemplateSpec | None) -> TemplateSpec:
    """The options a run's sessions are created with: the schedule's own spec, or the template's values (read at
    this run) with the overrides given over them (environment variables and slots merged one by one)."""
    if schedule.spec is not None:
        return schedule.spec
    assert template_spec is not None
    changes: dict[str, Any] = {}
    for name in schedule.overridden:
        value = getattr(schedule.overrides, name)
        if name in MERGED:
            value = {**getattr(template_spec, name), **value}
        changes[name] = value
    return replace(template_spec, **changes)


def run_request(schedule: Schedule, spec: TemplateSpec, *, name: str, key: str) -> SessionRequest:
    """The createSession request of one run: the spec's options, the run's session name and idempotency key, the
    schedule's project."""
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    return SessionRequest(name=name, client_token=key, project=schedule.project, **values)


def new_schedule(
    *,
    name: str,
    owner_id: str,
    project: str,
    timing: Timing,
    concurrency: ConcurrencyPolicy,
    now: datetime,
    spec: TemplateSpec | None = None,
    template_id: str | None = None,
    overrides: TemplateSpec | None = None,
    overridden: tuple[str, ...] = (),
) -> Schedule:
    """A schedule to store, once the caller checked its spec (or template) and project; its first due time set."""
    check_schedule_name(name)
    if (spec is None) == (template_id is None):
        raise InvalidInput("give exactly one of spec and template", field="spec")
    schedule = Schedule(
        id=str(uuid.uuid4()),
        name=name,
        owner_id=owner_id,
        project=project,
        timing=timing,
        concurrency=concurrency,
        spec=spec,
        template_id=template_id,
        overrides=overrides or TemplateSpec(),
        overridden=overridden,
        created_at=now,
        updated_at=now,
    )
    return restarted(schedule, now)


def restarted(schedule: Schedule, now: datetime) -> Schedule:
    """The schedule with its next due time counted from ``now`` (created, resumed, or its timing changed): the due
    times that passed meanwhile are not runs."""
    return schedule.evolve(next_due=following(schedule.timing, now - timedelta(microseconds=1), schedule.runs_started))
