"""Session mutations: create, destroy, rename, restart."""

from __future__ import annotations

import strawberry

from core.clock import utcnow
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from domain.access import may_create_for
from domain.model import Session as SessionModel
from domain.model import SessionStatus as Status
from domain.session_requests import (
    NAME_RULE,
    SessionRequest,
    build_sessions,
    check_users_client_token,
    named_images,
)
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.inputs import CreateSessionInput, options_of
from gateway.graphql.sessions.queries import session_visible
from gateway.graphql.sessions.scaling import scaling_request_of
from gateway.graphql.sessions.types import Session, session_type_of
from stores.activity import record_activity

MAX_DESTROY = 100


@strawberry.type
class CreateSessionPayload:
    sessions: list[Session]


async def _owned(ctx: Context, session_id: str, viewer: User) -> SessionModel:
    found = await ctx.sessions.get(session_id)
    if found is None or not session_visible(found, viewer):
        raise NotFound(f"no session {session_id}", field="id")
    return found


async def _owner_of_new(ctx: Context, viewer: User, owner_id: str | None) -> User:
    """Whom new sessions are for: the viewer, or the active user a SUPERADMIN names in ``owner``."""
    if owner_id is None or owner_id == viewer.id:
        return viewer
    if not may_create_for(viewer, owner_id):
        raise Forbidden("only a SUPERADMIN creates sessions for another user", field="owner")
    owner = await ctx.users.get(owner_id)
    if owner is None:
        raise NotFound(f"no user {owner_id}", field="owner")
    if not owner.active:
        raise Conflict(f"user {owner_id} is deactivated", field="owner")
    return owner


async def create_from_input(ctx: Context, input: CreateSessionInput) -> list[SessionModel]:
    """The one creation path: ``createSession``, and ``createSessionFromTemplate`` with the template's values under
    the overrides."""
    viewer = ctx.viewer
    check_users_client_token(input.client_token)
    owner = await _owner_of_new(ctx, viewer, str(input.owner) if input.owner is not None else None)
    dependencies = [str(d) for d in input.dependencies]
    for dependency_id, found in zip(dependencies, await ctx.sessions.get_many(dependencies), strict=True):
        if not session_visible(found, viewer):
            raise NotFound(f"dependency {dependency_id} does not exist", field="dependencies")
    request = SessionRequest(
        name=input.name,
        client_token=input.client_token,
        dependencies=dependencies,
        project=input.project,
        autoscaling=scaling_request_of(input.autoscaling),
        **options_of(input),
    )
    rules = await ctx.creation.rules(
        resource_group=input.resource_group,
        preset=input.preset,
        folders=[str(m.folder) for m in input.mounts],
        images=[reference for _, reference in named_images(request)],
        users=(viewer.id, owner.id),
    )
    sessions = build_sessions(request, viewer=viewer, now=utcnow(), rules=rules, owner=owner)
    return await ctx.creation.store(sessions, viewer=viewer, client_token=input.client_token)


@strawberry.type
class SessionMutations:
    @fields.mutation(description="Queue new sessions; they start PENDING.")
    async def create_session(self, info: Info, input: CreateSessionInput) -> CreateSessionPayload:
        stored = await create_from_input(info.context, input)
        return CreateSessionPayload(sessions=[session_type_of(s) for s in stored])

    @fields.mutation(description="End sessions: TERMINATING until Nomad has stopped them; forced ends at once.")
    async def destroy_session(self, info: Info, ids: list[strawberry.ID], forced: bool = False) -> list[Session]:
        ctx = info.context
        viewer = ctx.viewer
        if not 1 <= len(ids) <= MAX_DESTROY:
            raise InvalidInput(f"give between 1 and {MAX_DESTROY} ids", field="ids")
        for session_id in ids:
            await _owned(ctx, str(session_id), viewer)
        ended = []
        for session_id in ids:  # the scheduler's job owner stops the jobs, asked in the same write
            after = await ctx.sessions.request_termination(
                str(session_id), reason="user-requested", at=utcnow(), forced=forced
            )
            if after is not None:
                ended.append(session_type_of(after))
        await ctx.sessions.wake_scheduler("destroyed")
        return ended

    @fields.mutation(description="Rename a session; names are unique per owner among live sessions.")
    async def rename_session(self, info: Info, id: strawberry.ID, name: str) -> Session:
        ctx = info.context
        session = await _owned(ctx, str(id), ctx.viewer)
        if not NAME_RULE.match(name):
            raise InvalidInput(
                "name must be 4-64 characters: letters, digits, '_', and '.' or '-' inside", field="name"
            )
        if session.status.is_terminal:
            raise Conflict("an ended session cannot be renamed", field="id")
        renamed = await ctx.sessions.update(session.id, lambda s: s.evolve(name=name))
        assert renamed is not None
        return session_type_of(renamed)

    @fields.mutation(
        description="Restart the kernels of a RUNNING session in place (within a second or so: the "
        "scheduler restarts them; see each kernel's restarts)."
    )
    async def restart_session(self, info: Info, id: strawberry.ID) -> Session:
        ctx = info.context
        session = await _owned(ctx, str(id), ctx.viewer)
        if session.status is not Status.RUNNING:
            raise Conflict(f"only a RUNNING session can be restarted; this one is {session.status.value}", field="id")
        now = utcnow()
        await record_activity(ctx.sessions.redis, ctx.sessions.keys, session.id, now)  # using it, for idleness
        await ctx.sessions.requests.request_restart(session.id, now)  # the scheduler's job owner restarts its kernels
        return session_type_of(session)
