"""Session queries. A user sees only their own sessions; admins see all."""

from __future__ import annotations

import strawberry

from common.access import can_access
from common.errors import InvalidInput, NotFound
from common.model import Session as SessionModel
from common.users import User
from gateway.graphql.context import Info
from gateway.graphql.sessions.types import Session, session_type_of

MAX_PAGE = 100


def visible(session: SessionModel | None, viewer: User) -> bool:
    return session is not None and can_access(viewer, session.owner_id, session.project)


@strawberry.type
class SessionQueries:
    @strawberry.field(description="One session by id; NOT_FOUND when it does not exist or is not yours.")
    async def session(self, info: Info, id: strawberry.ID) -> Session:
        viewer = info.context.viewer
        found = await info.context.sessions.get(str(id))
        if not visible(found, viewer):
            raise NotFound(f"no session {id}", field="id")
        assert found is not None
        return session_type_of(found)

    @strawberry.field(description="Your sessions, newest first (all sessions for admins).")
    async def sessions(self, info: Info, first: int = 50) -> list[Session]:
        viewer = info.context.viewer
        if not 1 <= first <= MAX_PAGE:
            raise InvalidInput(f"first must be between 1 and {MAX_PAGE}", field="first")
        store = info.context.sessions
        ids = await store.session_ids(owner_id=None if viewer.is_admin else viewer.id)
        found = await store.get_many(ids[:first])
        return [session_type_of(s) for s in found if s is not None]
