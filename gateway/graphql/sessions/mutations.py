"""Session mutations."""

from __future__ import annotations

import strawberry

from common.clock import utcnow
from common.model import Driver as DriverModel
from gateway.graphql.context import Info
from gateway.graphql.sessions.types import Driver, Session, SessionType, session_type_of
from gateway.session_requests import SessionRequest, build_sessions


@strawberry.input
class EnvVarInput:
    name: str
    value: str


@strawberry.input
class ResourceInput:
    slot: str = strawberry.field(description="Slot name: cpu (cores), mem (bytes), cuda.device, …")
    amount: str = strawberry.field(description="Amount, with units for bytes: '1.5', '512m', '2g'.")


@strawberry.input
class CreateSessionInput:
    name: str
    type: SessionType
    driver: Driver = Driver.DOCKER
    image: str | None = None
    startup_command: str | None = None
    environ: list[EnvVarInput] = strawberry.field(default_factory=list)
    resources: list[ResourceInput] = strawberry.field(default_factory=list)
    resource_group: str = "default"
    client_token: str | None = strawberry.field(
        default=None, description="Idempotency key: repeating a request with the same token returns the same session."
    )


@strawberry.type
class CreateSessionPayload:
    sessions: list[Session]


@strawberry.type
class SessionMutations:
    @strawberry.mutation(description="Queue a new session; it starts PENDING.")
    async def create_session(self, info: Info, input: CreateSessionInput) -> CreateSessionPayload:
        ctx = info.context
        request = SessionRequest(
            name=input.name,
            type=input.type,
            driver=DriverModel(input.driver.value),
            image=input.image,
            startup_command=input.startup_command,
            environ={e.name: e.value for e in input.environ},
            resources={r.slot: r.amount for r in input.resources},
            resource_group=input.resource_group,
            client_token=input.client_token,
        )
        sessions = build_sessions(
            request,
            viewer=ctx.viewer,
            now=utcnow(),
            allow_raw_exec_for_users=ctx.settings.allow_raw_exec_for_users,
            default_image=ctx.settings.default_image,
        )
        stored = await ctx.sessions.create(sessions, client_token=input.client_token)
        return CreateSessionPayload(sessions=[session_type_of(s) for s in stored])
