"""``usage``: allocated and used resources per user, project, resource group, session type and day.

A user sees their own usage, an ADMIN also their projects', a SUPERADMIN everyone's (``domain.access``); another's
usage is simply not in the answer.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated

import strawberry

from core.clock import utcnow
from domain.usage import check_period
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.usage.types import UsageGroupBy, UsageReport, row_type_of
from stores.usage import report_for


@strawberry.type
class UsageQueries:
    @fields.field(
        description="Usage of the days from..to (both included) in timeZone (an IANA name; default UTC), grouped by "
        "groupBy; a session still running counts up to now. Days in UTC come from daily rollups kept forever; "
        "another zone's days from the raw records, kept CARAVAN_USAGE_RAW_RETENTION."
    )
    async def usage(
        self,
        info: Info,
        from_: Annotated[date, strawberry.argument(name="from")],
        to: date,
        group_by: list[UsageGroupBy] | None = None,
        time_zone: str = "UTC",
    ) -> UsageReport:
        ctx = info.context
        period = check_period(from_, to, time_zone)
        chosen = list(dict.fromkeys(group_by if group_by is not None else [UsageGroupBy.DAY]))
        rows = await report_for(ctx.sessions.usage, ctx.viewer, period, [g.value for g in chosen], now=utcnow())
        return UsageReport(
            first_day=period.first,
            last_day=period.last,
            time_zone=period.zone_name,
            group_by=chosen,
            rows=[row_type_of(row) for row in rows],
        )
