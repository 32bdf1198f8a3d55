"""User and token queries. A USER sees only themself; an ADMIN the members of their projects; a SUPERADMIN all."""

from __future__ import annotations

import strawberry

from core.errors import Forbidden, NotFound
from domain.access import can_see_user
from domain.user_requests import check_acts_for
from domain.users import Role, User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.users.types import ApiToken, UserType, token_type_of, user_type_of


async def visible_user(ctx: Context, user_id: str, field: str) -> User:
    """The user ``user_id`` if the viewer may see them; NOT_FOUND otherwise, as if there were none."""
    viewer = ctx.viewer
    found = viewer if user_id == viewer.id else await ctx.users.get(user_id)
    if found is None or not can_see_user(viewer, found):
        raise NotFound(f"no user {user_id}", field=field)
    return found


@strawberry.type
class UserQueries:
    @fields.field(description="Administrators: the users they may see (an ADMIN: the members of their projects).")
    async def users(self, info: Info) -> list[UserType]:
        viewer = info.context.viewer
        if viewer.role is Role.USER:
            raise Forbidden("only administrators list users")
        store = info.context.users
        ids = await store.ids(None if viewer.role is Role.SUPERADMIN else viewer.projects)
        return [user_type_of(u) for u in await store.get_many(ids) if can_see_user(viewer, u)]

    @fields.field(description="One user by id; NOT_FOUND unless it is you or a user you may see.")
    async def user(self, info: Info, id: strawberry.ID) -> UserType:
        return user_type_of(await visible_user(info.context, str(id), "id"))

    @fields.field(description="The API tokens of a user (default: yours), oldest first; never their secrets.")
    async def tokens(self, info: Info, user_id: strawberry.ID | None = None) -> list[ApiToken]:
        ctx = info.context
        target = await visible_user(ctx, str(user_id) if user_id is not None else ctx.viewer.id, "userId")
        check_acts_for(ctx.viewer, target, "userId")
        return [token_type_of(t) for t in await ctx.users.tokens_of(target.id)]
