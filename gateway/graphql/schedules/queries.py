"""Schedule queries: the viewer's schedules (admins: their projects'; superadmins: all), one by id."""

from __future__ import annotations

import base64
import binascii

import strawberry
from strawberry.relay import PageInfo

from core.errors import InvalidInput, NotFound
from domain.access import can_access
from domain.schedules import Schedule as ScheduleModel
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.schedules.types import Schedule, ScheduleConnection, ScheduleEdge, schedule_type_of
from stores.schedules import ScheduleStore

DEFAULT_PAGE = 50
MAX_PAGE = 500


def store_of(ctx: Context) -> ScheduleStore:
    return ScheduleStore(ctx.sessions.redis, ctx.sessions.keys, history=ctx.settings.scheduler.schedule_history)


async def owned(ctx: Context, schedule_id: str, viewer: User) -> ScheduleModel:
    """The schedule, when ``viewer`` may see and change it; NOT_FOUND (on ``id``) otherwise."""
    found = await store_of(ctx).visible(viewer, schedule_id)
    if found is None:
        raise NotFound(f"no schedule {schedule_id[:64]}", field="id")
    return found


def cursor_of(schedule_id: str) -> str:
    return base64.urlsafe_b64encode(f"schedule:{schedule_id}".encode()).decode()


def id_of_cursor(cursor: str) -> str:
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput("after is not a cursor of this listing", field="after") from exc
    if not text.startswith("schedule:"):
        raise InvalidInput("after is not a cursor of this listing", field="after")
    return text.removeprefix("schedule:")


@strawberry.type
class ScheduleQueries:
    @fields.field(description="Your schedules, newest first (admins: also their projects' members'; superadmins: all).")
    async def schedules(self, info: Info, first: int = DEFAULT_PAGE, after: str | None = None) -> ScheduleConnection:
        ctx = info.context
        if not 0 <= first <= MAX_PAGE:
            raise InvalidInput(f"first must be between 0 and {MAX_PAGE}", field="first")
        store = store_of(ctx)
        ids = await store.visible_ids(ctx.viewer)
        found = [s for s in await store.get_many(ids) if s and can_access(ctx.viewer, s.owner_id, s.project)]
        start = 0
        if after is not None:
            after_id = id_of_cursor(after)
            start = next((i + 1 for i, s in enumerate(found) if s.id == after_id), -1)
            if start < 0:
                raise InvalidInput("after is not a cursor of this listing", field="after")
        page = found[start : start + first]
        edges = [ScheduleEdge(cursor=cursor_of(s.id), node=schedule_type_of(s)) for s in page]
        return ScheduleConnection(
            edges=edges,
            page_info=PageInfo(
                has_next_page=start + first < len(found),
                has_previous_page=start > 0,
                start_cursor=edges[0].cursor if edges else None,
                end_cursor=edges[-1].cursor if edges else None,
            ),
            total_count=len(found),
        )

    @fields.field(description="One schedule; NOT_FOUND when it does not exist or is not yours.")
    async def schedule(self, info: Info, id: strawberry.ID) -> Schedule:
        return schedule_type_of(await owned(info.context, str(id), info.context.viewer))
