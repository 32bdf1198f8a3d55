"""GraphQL types of users and API tokens."""

from __future__ import annotations

from datetime import datetime

import strawberry

from domain import users

# The domain's enums are the GraphQL enums: strawberry.enum marks the class itself (and returns it), so the
# aliases below are plain classes, usable as annotations.
Role = users.Role
strawberry.enum(Role, name="Role")


@strawberry.type(name="User")
class UserType:
    id: strawberry.ID
    name: str
    role: Role
    projects: list[str] = strawberry.field(description="The projects the user belongs to (an ADMIN administers them).")
    active: bool = strawberry.field(
        description="False once deactivated: no tokens; their sessions are left running. "
        "reactivateUser makes them active again."
    )


@strawberry.type(description="An API token's record; its secret is shown only once, by issueToken.")
class ApiToken:
    id: strawberry.ID
    user_id: strawberry.ID
    label: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None = strawberry.field(description="Updated at most once a minute.")


@strawberry.type
class IssuedToken:
    token: ApiToken
    secret: str = strawberry.field(description="Send as 'Authorization: Bearer <secret>'. Shown only now: store it.")


def user_type_of(user: users.User) -> UserType:
    return UserType(
        id=strawberry.ID(user.id), name=user.name, role=user.role, projects=list(user.projects), active=user.active
    )


def token_type_of(token: users.ApiToken) -> ApiToken:
    return ApiToken(
        id=strawberry.ID(token.id),
        user_id=strawberry.ID(token.user_id),
        label=token.label,
        created_at=token.created_at,
        expires_at=token.expires_at,
        last_used_at=token.last_used_at,
    )
