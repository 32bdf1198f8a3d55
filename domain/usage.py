"""Usage accounting: who held what, for how long, split into days. Pure: the clock is passed in.

How a session's usage is counted:

* **When**: a session holds its slots from each RUNNING entry of its status history until the next entry that is
  neither RUNNING nor TERMINATING (TERMINATED, CANCELLED, ERROR, PREPARING again after a restart...); a session that
  still holds them counts up to ``now``. Instants are whole seconds (floored), so a day's share of a record is exact.
* **What**: every kernel's own slots (``Kernel.resources``), summed over the session's kernels (a cluster session of
  three kernels holds three kernels' slots), as integers: a count slot (cpu, accelerators, shares of an accelerator)
  in thousandths (``cpu 0.5`` → 500), a bytes slot in bytes.
* **How much**: each record is its own rate × its own seconds, split at the midnights of the zone asked for (a DST
  day has 23 or 25 hours of seconds), never a sum of amounts times a sum of durations (Backend.AI's bug).
* **Used**: the idle checker's average utilization of a metric over the session (percent), kept in tenths of a
  percent, × the seconds it was measured; its average over any rollup is ``used / measured / 10``.

Every measure of a record is ``rate × seconds`` with an integer rate, so a day's rollup is a sum of integers and
recomputing it from the raw records gives the stored value exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from decimal import Decimal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import InvalidInput
from domain.access import Scope
from domain.model import Session, SessionStatus, StatusChange
from domain.slots import SlotType, guess_slot_type

HOLDING = frozenset({SessionStatus.RUNNING, SessionStatus.TERMINATING})
"""Statuses in which a session that reached RUNNING still holds its slots."""
SLOT = "slot:"
"""Measure prefix of a slot's resource-seconds (``slot:cpu``: milli-cpu-seconds; ``slot:mem``: bytes-seconds)."""
SECONDS = "time:seconds"
"""Measure: seconds the session held its slots (wall time, once per session whatever its kernels)."""
KERNEL_SECONDS = "time:kernel-seconds"
"""Measure: kernel-seconds (a cluster of three kernels for an hour: 10800)."""
USED = "used:"
"""Measure prefix: a metric's measured average in tenths of a percent × seconds (``used:cpu_util``)."""
MEASURED = "measured:"
"""Measure prefix: the seconds a metric was measured (the denominator of ``used:``)."""
COUNT_SCALE = 1000
"""A count slot's unit: thousandths (slots keep counts to 0.001, ``domain.slots``)."""
USED_SCALE = 10
"""Utilization kept in tenths of a percent."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


class GroupBy:
    """What a report may be grouped by (any combination)."""

    USER = "user"
    PROJECT = "project"
    RESOURCE_GROUP = "resource_group"
    TYPE = "type"
    DAY = "day"
    ALL = (USER, PROJECT, RESOURCE_GROUP, TYPE, DAY)


def epoch_seconds(at: datetime) -> int:
    """Whole seconds since the epoch, floored (an aware datetime)."""
    return (at - _EPOCH) // _SECOND


def slot_units(slot: str, amount: Decimal, slot_type: SlotType | None = None) -> int:
    """One slot's amount as the integer unit usage counts it in: thousandths of a count, or bytes."""
    if (slot_type or guess_slot_type(slot)) is SlotType.BYTES:
        return int(amount)
    return int(amount * COUNT_SCALE)


def held_intervals(history: Iterable[StatusChange], *, now: datetime) -> tuple[tuple[int, int], ...]:
    """The stretches (epoch seconds, end excluded) a session held its slots: from RUNNING to the next status that
    holds nothing; a stretch still open ends at ``now``."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for change in history:
        if start is None and change.status is SessionStatus.RUNNING:
            start = epoch_seconds(change.at)
        elif start is not None and change.status not in HOLDING:
            spans.append((start, max(start, epoch_seconds(change.at))))
            start = None
    if start is not None:
        spans.append((start, max(start, epoch_seconds(now))))
    return tuple((a, b) for a, b in spans if b > a)


def rates_of(session: Session, used: Mapping[str, float] | None = None) -> dict[str, int]:
    """What the session counts per second it holds its slots: every kernel's slots summed (in their units), one
    second of wall time, one per kernel, and the measured utilization (tenths of a percent) of each metric."""
    rates: dict[str, int] = {SECONDS: 1, KERNEL_SECONDS: len(session.kernels)}
    for kernel in session.kernels:
        for slot, raw in kernel.resources.items():
            units = slot_units(slot, Decimal(raw))
            if units:
                rates[SLOT + slot] = rates.get(SLOT + slot, 0) + units
    for metric, percent in sorted((used or {}).items()):
        rates[USED + metric] = round(percent * USED_SCALE)
        rates[MEASURED + metric] = 1
    return rates


@dataclass(frozen=True)
class UsageRecord:
    """One session's usage as recorded when it ended (or as counted now, while it runs)."""

    session_id: str
    owner_id: str
    project: str
    resource_group: str
    session_type: str
    intervals: tuple[tuple[int, int], ...]
    """Epoch-second stretches it held its slots (``held_intervals``)."""
    rates: dict[str, int] = field(default_factory=dict)
    """Measure -> integer amount per second (``rates_of``)."""
    ended: bool = True
    """False: a live session counted up to the moment of the query."""

    @property
    def seconds(self) -> int:
        return sum(end - start for start, end in self.intervals)

    def totals(self) -> dict[str, int]:
        """Each measure over the whole record: its rate × its own seconds."""
        seconds = self.seconds
        return {measure: rate * seconds for measure, rate in self.rates.items()} if seconds else {}


def record_of(session: Session, *, now: datetime, used: Mapping[str, float] | None = None) -> UsageRecord:
    """A session's usage: ended when it is terminal (its history's last entry), else counted up to ``now``."""
    return UsageRecord(
        session_id=session.id,
        owner_id=session.owner_id,
        project=session.project,
        resource_group=session.resource_group,
        session_type=session.type.value,
        intervals=held_intervals(session.status_history, now=now),
        rates=rates_of(session, used),
        ended=session.status.is_terminal,
    )


def split_days(start: int, end: int, zone: tzinfo = UTC) -> list[tuple[date, int]]:
    """The seconds of ``[start, end)`` that fall in each calendar day of ``zone`` (a DST day has 23 or 25 hours)."""
    parts: list[tuple[date, int]] = []
    at = start
    while at < end:
        day = datetime.fromtimestamp(at, zone).date()
        next_midnight = int(datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone).timestamp())
        upto = min(end, max(next_midnight, at + 1))
        parts.append((day, upto - at))
        at = upto
    return parts


@dataclass(frozen=True)
class RollupKey:
    """One row of a daily rollup: a day and who, where and what kind of session."""

    day: date
    user: str
    project: str
    resource_group: str
    session_type: str

    def field(self, measure: str) -> str:
        """The rollup hash's field of one measure of this row (the day is the hash's key)."""
        return FIELD_SEPARATOR.join((self.user, self.project, self.resource_group, self.session_type, measure))


FIELD_SEPARATOR = "\x1f"
"""Between the parts of a rollup field (a unit separator: never in a user id, project, group or measure)."""


def row_key(day: date, row: str) -> RollupKey | None:
    """The row of a rollup field's part before its measure (``user␟project␟group␟type``); None if malformed."""
    parts = row.split(FIELD_SEPARATOR)
    if len(parts) != 4:
        return None
    return RollupKey(day, parts[0], parts[1], parts[2], parts[3])


Rollup = dict[RollupKey, dict[str, int]]


def record_rollup(record: UsageRecord, zone: tzinfo = UTC) -> Rollup:
    """One record's share of each day of ``zone``: every measure's rate × the seconds it held in that day."""
    rows: Rollup = {}
    for start, end in record.intervals:
        for day, seconds in split_days(start, end, zone):
            key = RollupKey(day, record.owner_id, record.project, record.resource_group, record.session_type)
            row = rows.setdefault(key, {})
            for measure, rate in record.rates.items():
                row[measure] = row.get(measure, 0) + rate * seconds
    return rows


def add_rollups(into: Rollup, more: Rollup) -> Rollup:
    for key, row in more.items():
        target = into.setdefault(key, {})
        for measure, amount in row.items():
            target[measure] = target.get(measure, 0) + amount
    return into


def rollup(records: Iterable[UsageRecord], zone: tzinfo = UTC) -> Rollup:
    """Many records' daily rollup in ``zone``."""
    rows: Rollup = {}
    for record in records:
        add_rollups(rows, record_rollup(record, zone))
    return rows


@dataclass(frozen=True)
class ReportRow:
    """One row of a report: the grouped-by parts (None where not grouped by) and each measure's total."""

    day: date | None
    user: str | None
    project: str | None
    resource_group: str | None
    session_type: str | None
    measures: dict[str, int]


GroupKey = tuple[date | None, str | None, str | None, str | None, str | None]
"""A report row's grouped-by parts: day, user, project, resource group, session type (None: not grouped by)."""


class Grouping:
    """A report being summed: rollup rows (or a stored day's fields, parsed as they are summed) grouped by
    ``group_by`` (``GroupBy``), keeping only what ``scope`` lets the viewer see (``domain.access.listing_scope``)."""

    def __init__(self, group_by: Iterable[str], scope: Scope | None = None) -> None:
        self.by = set(group_by)
        unknown = self.by - set(GroupBy.ALL)
        if unknown:
            raise ValueError(f"cannot group usage by {', '.join(sorted(unknown))}")
        self.scope = scope or Scope(everything=True)
        self.owners, self.projects = set(self.scope.owners), set(self.scope.projects)
        self.grouped: dict[GroupKey, dict[str, int]] = {}

    def visible(self, user: str, project: str) -> bool:
        return self.scope.everything or user in self.owners or project in self.projects

    def _target(self, day: date, user: str, project: str, group: str, session_type: str) -> dict[str, int] | None:
        if not self.visible(user, project):
            return None
        by = self.by
        key = (
            day if GroupBy.DAY in by else None,
            user if GroupBy.USER in by else None,
            project if GroupBy.PROJECT in by else None,
            group if GroupBy.RESOURCE_GROUP in by else None,
            session_type if GroupBy.TYPE in by else None,
        )
        return self.grouped.setdefault(key, {})

    def add_rows(self, rows: Rollup, first: date, last: date) -> Grouping:
        for key, measures in rows.items():
            if not first <= key.day <= last:
                continue
            target = self._target(key.day, key.user, key.project, key.resource_group, key.session_type)
            if target is not None:
                for measure, amount in measures.items():
                    target[measure] = target.get(measure, 0) + amount
        return self

    def add_compact(self, day: date, rows: Iterable[tuple[str, Mapping[str, int]]]) -> Grouping:
        """A stored day's rows (``user␟project␟group␟type`` -> measures) summed."""
        for row, measures in rows:
            parts = row.split(FIELD_SEPARATOR)
            target = self._target(day, *parts) if len(parts) == 4 else None
            if target is not None:
                for measure, amount in measures.items():
                    target[measure] = target.get(measure, 0) + amount
        return self

    def rows(self) -> list[ReportRow]:
        ordered = sorted(self.grouped.items(), key=lambda item: tuple("" if p is None else str(p) for p in item[0]))
        return [ReportRow(*group, measures=measures) for group, measures in ordered]


def report(
    rows: Rollup, *, first: date, last: date, group_by: Iterable[str], scope: Scope | None = None
) -> list[ReportRow]:
    """The rollup rows of days ``first``..``last`` grouped by ``group_by`` (``GroupBy``), in a stable order."""
    return Grouping(group_by, scope).add_rows(rows, first, last).rows()


def days_of(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def utc_span(first: date, last: date, zone: tzinfo) -> tuple[int, int]:
    """Epoch seconds from the start of ``first`` to the end of ``last`` in ``zone``."""
    start = int(datetime.combine(first, time(0), tzinfo=zone).timestamp())
    end = int(datetime.combine(last + timedelta(days=1), time(0), tzinfo=zone).timestamp())
    return start, end


MAX_REPORT_DAYS = 400
"""The longest period one report covers (a year and a bit: last year's month-by-month)."""


@dataclass(frozen=True)
class Period:
    """A report's days (``first``..``last``, both included) in a viewer's time zone."""

    first: date
    last: date
    zone: tzinfo
    zone_name: str

    @property
    def is_utc(self) -> bool:
        return self.zone_name == "UTC"


def check_period(first: date, last: date, zone_name: str | None) -> Period:
    """A report's period as asked, checked: ``InvalidInput`` names the field that is wrong."""
    name = (zone_name or "UTC").strip() or "UTC"
    if name in {"UTC", "Etc/UTC", "Z"}:
        zone: tzinfo = UTC
        name = "UTC"
    else:
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            message = f"unknown time zone {name[:60]!r} (an IANA name such as Europe/Berlin)"
            raise InvalidInput(message, field="timeZone") from None
    if last < first:
        raise InvalidInput("the period ends before it starts", field="to")
    if (last - first).days + 1 > MAX_REPORT_DAYS:
        raise InvalidInput(f"a report covers at most {MAX_REPORT_DAYS} days", field="to")
    return Period(first, last, zone, name)


def resource_seconds(measures: Mapping[str, int]) -> dict[str, Decimal]:
    """Slot -> resource-seconds in the slot's own unit, exact (cpu-seconds, GPU-seconds, byte-seconds)."""
    seconds = {}
    for measure, amount in measures.items():
        if measure.startswith(SLOT):
            slot = measure.removeprefix(SLOT)
            scale = 1 if guess_slot_type(slot) is SlotType.BYTES else COUNT_SCALE
            seconds[slot] = Decimal(amount) / scale
    return dict(sorted(seconds.items()))


def utilization(measures: Mapping[str, int]) -> dict[str, tuple[float, int]]:
    """Metric -> (average percent, seconds measured) of what the idle checker measured."""
    averages = {}
    for measure, measured in measures.items():
        if measure.startswith(MEASURED) and measured > 0:
            metric = measure.removeprefix(MEASURED)
            averages[metric] = (measures.get(USED + metric, 0) / measured / USED_SCALE, measured)
    return dict(sorted(averages.items()))


GROUP_COLUMNS = (
    (GroupBy.DAY, "day"),
    (GroupBy.USER, "user"),
    (GroupBy.PROJECT, "project"),
    (GroupBy.RESOURCE_GROUP, "resource_group"),
    (GroupBy.TYPE, "session_type"),
)


def report_table(rows: Iterable[ReportRow], group_by: Iterable[str]) -> list[list[str]]:
    """A report as a table (header first): the grouped-by columns, seconds, kernel-seconds, each slot's
    resource-seconds and hours, each metric's average utilization."""
    listed = list(rows)
    by = set(group_by)
    slots = sorted({slot for row in listed for slot in resource_seconds(row.measures)})
    metrics = sorted({metric for row in listed for metric in utilization(row.measures)})
    columns = [column for group, column in GROUP_COLUMNS if group in by]
    header = [*columns, "seconds", "kernel_seconds"]
    header += [f"{slot}_seconds" for slot in slots] + [f"{slot}_hours" for slot in slots]
    header += [f"{metric}_average_percent" for metric in metrics]
    table = [header]
    for row in listed:
        parts = {"day": row.day, "user": row.user, "project": row.project}
        parts |= {"resource_group": row.resource_group, "session_type": row.session_type}
        amounts = resource_seconds(row.measures)
        used = utilization(row.measures)
        line = [str(parts[column]) for column in columns]
        line += [str(row.measures.get(SECONDS, 0)), str(row.measures.get(KERNEL_SECONDS, 0))]
        line += [format(amounts.get(slot, Decimal(0)), "f") for slot in slots]
        line += [f"{amounts.get(slot, Decimal(0)) / 3600:.4f}" for slot in slots]
        line += [f"{used[metric][0]:.1f}" if metric in used else "" for metric in metrics]
        table.append(line)
    return table


def parse_group_by(names: Iterable[str]) -> tuple[str, ...]:
    """Group-by names as a user wrote them (``user``, ``resource_group``...); ``InvalidInput`` on ``groupBy``."""
    chosen = []
    for name in names:
        text = name.strip().lower()
        if text not in GroupBy.ALL:
            raise InvalidInput(
                f"cannot group usage by {name[:40]!r} (one of {', '.join(GroupBy.ALL)})", field="groupBy"
            )
        if text not in chosen:
            chosen.append(text)
    return tuple(chosen)
