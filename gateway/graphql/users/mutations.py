"""User and token mutations: create, update, deactivate and reactivate users; issue and revoke API tokens."""

from __future__ import annotations

import strawberry

from core.clock import utcnow
from core.errors import NotFound
from domain.access import can_see_user, manages_user
from domain.user_requests import (
    MAX_PROJECTS,
    NAME_HELP,
    check_acts_for,
    check_deactivation,
    checked_expiry,
    checked_label,
    new_user,
    reactivated,
    updated_user,
)
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.users.queries import visible_user
from gateway.graphql.users.types import ApiToken, IssuedToken, Role, UserType, token_type_of, user_type_of


@strawberry.input
class CreateUserInput:
    name: str = strawberry.field(
        description=f"{NAME_HELP[0].upper()}{NAME_HELP[1:]}. Also the user's id: unique and "
        "fixed, and kept by a deactivated user (reactivateUser brings them back)."
    )
    role: Role = Role.USER
    projects: list[str] = strawberry.field(
        default_factory=lambda: ["default"], description=f"1-{MAX_PROJECTS} project names, each {NAME_HELP}."
    )


@strawberry.input
class UpdateUserInput:
    id: strawberry.ID
    role: Role | None = None
    projects: list[str] | None = strawberry.field(
        default=None, description=f"Replaces the user's projects: 1-{MAX_PROJECTS} names, each {NAME_HELP}."
    )


@strawberry.type
class UserMutations:
    @fields.mutation(description="SUPERADMIN: any user. ADMIN: USERs in projects they administer.")
    async def create_user(self, info: Info, input: CreateUserInput) -> UserType:
        ctx = info.context
        user = new_user(ctx.viewer, input.name, input.role, input.projects)
        return user_type_of(await ctx.users.create(user))

    @fields.mutation(
        description="Change a user's role and/or projects, under the rules of createUser; nobody raises themself."
    )
    async def update_user(self, info: Info, input: UpdateUserInput) -> UserType:
        ctx = info.context
        viewer = ctx.viewer
        await visible_user(ctx, str(input.id), "id")

        def change(target: User) -> User:  # decided again on the stored user, inside the transaction
            if not can_see_user(viewer, target):
                raise NotFound(f"no user {input.id}", field="id")
            return updated_user(viewer, target, input.role, input.projects)

        updated = await ctx.users.update(str(input.id), change)
        if updated is None:
            raise NotFound(f"no user {input.id}", field="id")
        return user_type_of(updated)

    @fields.mutation(
        description="Revoke all of a user's tokens and refuse new ones. Their sessions are left "
        "running: destroy them separately if they must end."
    )
    async def deactivate_user(self, info: Info, id: strawberry.ID) -> UserType:
        ctx = info.context
        viewer = ctx.viewer
        target = await visible_user(ctx, str(id), "id")
        check_deactivation(viewer, target)
        deactivated = await ctx.users.deactivate(target.id, lambda stored: check_deactivation(viewer, stored))
        if deactivated is None:
            raise NotFound(f"no user {id}", field="id")
        return user_type_of(deactivated)

    @fields.mutation(
        description="Make a deactivated user active again (who may deactivate them may "
        "reactivate them). The tokens revoked at deactivation stay revoked: issue new "
        "ones."
    )
    async def reactivate_user(self, info: Info, id: strawberry.ID) -> UserType:
        ctx = info.context
        viewer = ctx.viewer
        await visible_user(ctx, str(id), "id")

        def reactivate(stored: User) -> User:  # decided on the stored user, inside the transaction
            if not can_see_user(viewer, stored):
                raise NotFound(f"no user {id}", field="id")
            return reactivated(viewer, stored)

        updated = await ctx.users.update(str(id), reactivate)
        if updated is None:
            raise NotFound(f"no user {id}", field="id")
        return user_type_of(updated)

    @fields.mutation(
        description="A new API token for you, or for a user you manage. Its secret is returned "
        "only now. expiresIn: a duration such as '30d'; none: it never expires."
    )
    async def issue_token(
        self, info: Info, label: str, user_id: strawberry.ID | None = None, expires_in: str | None = None
    ) -> IssuedToken:
        ctx = info.context
        now = utcnow()
        target = await visible_user(ctx, str(user_id) if user_id is not None else ctx.viewer.id, "userId")
        check_acts_for(ctx.viewer, target, "userId")
        secret, token = await ctx.users.new_token(
            target.id, checked_label(label), expires_at=checked_expiry(expires_in, now), now=now
        )
        return IssuedToken(token=token_type_of(token), secret=secret)

    @fields.mutation(description="Revoke a token (yours, or one of a user you manage): refused from now on.")
    async def revoke_token(self, info: Info, id: strawberry.ID) -> ApiToken:
        ctx = info.context
        viewer = ctx.viewer
        token = await ctx.users.token(str(id))
        owner = await ctx.users.get(token.user_id) if token is not None else None
        # A token of a user one does not manage is not shown to exist, even to an admin who sees that user.
        if token is None or owner is None or not (owner.id == viewer.id or manages_user(viewer, owner)):
            raise NotFound(f"no token {id}", field="id")
        revoked = await ctx.users.revoke_token(token.id)
        if revoked is None:
            raise NotFound(f"no token {id}", field="id")
        return token_type_of(revoked)
