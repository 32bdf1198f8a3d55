"""GraphQL types of usage reports (``domain.usage``)."""

from __future__ import annotations

from datetime import date
from enum import Enum

import strawberry

from domain.usage import KERNEL_SECONDS, SECONDS, GroupBy, ReportRow, resource_seconds, utilization


@strawberry.enum(description="What a usage report's rows are grouped by.")
class UsageGroupBy(Enum):
    USER = GroupBy.USER
    PROJECT = GroupBy.PROJECT
    RESOURCE_GROUP = GroupBy.RESOURCE_GROUP
    TYPE = GroupBy.TYPE
    DAY = GroupBy.DAY


@strawberry.type(description="What one slot was allocated for: resource-seconds in the slot's own unit.")
class SlotUsage:
    slot: str
    resource_seconds: str = strawberry.field(
        description="Exact decimal: cpu-seconds, device- or share-seconds (sim.shares 0.5 for an hour: 1800), "
        "byte-seconds for a bytes slot (mem)."
    )
    hours: float = strawberry.field(description="resourceSeconds / 3600: CPU-hours, GPU-hours, byte-hours.")


@strawberry.type(description="What the idle checker measured of one metric while the sessions held their slots.")
class MeasuredUtilization:
    metric: str
    average_percent: float
    measured_seconds: float


@strawberry.type(description="One row of a usage report; a part not grouped by is null.")
class UsageRow:
    day: date | None
    user: str | None
    project: str | None
    resource_group: str | None
    session_type: str | None
    seconds: float = strawberry.field(description="Seconds sessions held their slots (once per session).")
    kernel_seconds: float = strawberry.field(description="Seconds × kernels (a cluster of 3 for 1 s: 3).")
    slots: list[SlotUsage]
    utilization: list[MeasuredUtilization]


@strawberry.type(description="Usage of the days asked, in the time zone asked, that the viewer may see.")
class UsageReport:
    first_day: date
    last_day: date
    time_zone: str
    group_by: list[UsageGroupBy]
    rows: list[UsageRow]


def row_type_of(row: ReportRow) -> UsageRow:
    return UsageRow(
        day=row.day,
        user=row.user,
        project=row.project,
        resource_group=row.resource_group,
        session_type=row.session_type,
        seconds=row.measures.get(SECONDS, 0),
        kernel_seconds=row.measures.get(KERNEL_SECONDS, 0),
        slots=[
            SlotUsage(slot=slot, resource_seconds=format(amount, "f"), hours=float(amount / 3600))
            for slot, amount in resource_seconds(row.measures).items()
        ],
        utilization=[
            MeasuredUtilization(metric=metric, average_percent=average, measured_seconds=seconds)
            for metric, (average, seconds) in utilization(row.measures).items()
        ],
    )
