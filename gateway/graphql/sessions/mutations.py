"""Session mutations: create, destroy, rename, restart."""

from __future__ import annotations

from enum import Enum

import strawberry

from common.clock import utcnow
from common.access import may_create_for
from common.errors import Conflict, Forbidden, InvalidInput, NotFound
from common.model import DEFAULT_PRIORITY
from common.model import ClusterMode as ClusterModeModel
from common.model import Driver as DriverModel
from common.model import RoleSpec
from common.model import Session as SessionModel
from common.model import SessionStatus as Status
from common.users import User
from gateway.graphql.context import Context, Info
from gateway.graphql.sessions.creation import admit_and_store, creation_rules
from gateway.graphql.sessions.queries import visible
from gateway.graphql.sessions.types import ClusterMode, Driver, Session, SessionType, session_type_of
from gateway.session_requests import NAME_RULE, SessionRequest, build_sessions
from idle.activity import record_activity
from nomad_jobs.meta import TASK_NAME
from scheduler.termination import terminate

MAX_DESTROY = 100


@strawberry.input
class EnvVarInput:
    name: str
    value: str


@strawberry.input
class ResourceInput:
    slot: str = strawberry.field(description="Slot name: cpu (cores), mem (bytes), cuda.device, …")
    amount: str = strawberry.field(description="Amount, with units for bytes: '1.5', '512m', '2g'.")


@strawberry.enum(name="KernelRole")
class KernelRole(Enum):
    MAIN = "main"
    SUB = "sub"


@strawberry.input(description="The kernels of one role (main1, or every sub kernel) with their own image and slots.")
class KernelRoleInput:
    role: KernelRole
    image: str | None = strawberry.field(default=None, description="Default: the session's image.")
    resources: list[ResourceInput] = strawberry.field(
        default_factory=list, description="Slots replacing the session's for these kernels (others are kept).")


def role_specs_of(roles: list[KernelRoleInput]) -> dict[str, RoleSpec]:
    specs = {r.role.value: RoleSpec(image=r.image, resources={x.slot: x.amount for x in r.resources}) for r in roles}
    if len(specs) != len(roles):
        raise InvalidInput("each kernel role may be given once", field="kernelRoles")
    return specs


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
    starts_at: str | None = strawberry.field(
        default=None, description="BATCH: never start before this ISO 8601 moment, or this duration from now ('90s', '1h')."
    )
    batch_timeout: str | None = strawberry.field(
        default=None, description="BATCH: end as FAILED (task-timeout) after running this long ('30s', '2h')."
    )
    dependencies: list[strawberry.ID] = strawberry.field(
        default_factory=list, description="BATCH: sessions that must end TERMINATED with SUCCESS first."
    )
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    count: int = strawberry.field(default=1, description="Create this many identical sessions (named name-1 …).")
    preopen_ports: list[int] = strawberry.field(default_factory=list)
    shared_memory: str | None = strawberry.field(default=None, description="/dev/shm size for Docker kernels ('64m').")
    designated_agent: str | None = strawberry.field(default=None, description="Admins: the Nomad node id to run on.")
    priority: int = strawberry.field(
        default=DEFAULT_PRIORITY, description="0-100, higher is placed first. A USER may ask for at most their resource "
        "policy's maxPriority, or the default without one; admins for any.")
    preset: str | None = strawberry.field(
        default=None, description="A resource preset: its slots (and shared memory) under the explicit resources.")
    kernel_roles: list[KernelRoleInput] = strawberry.field(
        default_factory=list, description="Cluster sessions: a role's own image and slots (main1, the sub kernels).")
    replicas: int | None = strawberry.field(
        default=None, description="INFERENCE: copies of the main kernel serving servicePort (1-16; default 1)."
    )
    service_port: int | None = strawberry.field(
        default=None, description="INFERENCE (required): the port each replica serves, health-checked; the replica "
        "listens on the host port given in CARAVAN_SERVICE_PORT."
    )
    health_check_path: str | None = strawberry.field(
        default=None, description="INFERENCE: HTTP path the health check GETs (2xx is healthy); default: a TCP check."
    )
    health_check_grace: str | None = strawberry.field(
        default=None, description="INFERENCE: how long after a replica (re)starts failing checks are ignored "
        "('30s' by default, 1s-1h)."
    )
    project: str | None = strawberry.field(
        default=None, description="One of the owner's projects (see viewer.projects); default: their first."
    )
    owner: strawberry.ID | None = strawberry.field(
        default=None, description="SUPERADMIN: create the sessions for this user (owner and project are theirs)."
    )


@strawberry.type
class CreateSessionPayload:
    sessions: list[Session]


async def _owned(ctx: Context, session_id: str, viewer: User) -> SessionModel:
    found = await ctx.sessions.get(session_id)
    if found is None or not visible(found, viewer):
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
    owner = await _owner_of_new(ctx, viewer, str(input.owner) if input.owner is not None else None)
    dependencies = [str(d) for d in input.dependencies]
    for dependency_id, found in zip(dependencies, await ctx.sessions.get_many(dependencies), strict=True):
        if not visible(found, viewer):
            raise NotFound(f"dependency {dependency_id} does not exist", field="dependencies")
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
        starts_at=input.starts_at,
        batch_timeout=input.batch_timeout,
        dependencies=dependencies,
        cluster_size=input.cluster_size,
        cluster_mode=ClusterModeModel(input.cluster_mode.value),
        count=input.count,
        preopen_ports=input.preopen_ports,
        shared_memory=input.shared_memory,
        designated_agent=input.designated_agent,
        priority=input.priority,
        project=input.project,
        preset=input.preset,
        kernel_roles=role_specs_of(input.kernel_roles),
        replicas=input.replicas,
        service_port=input.service_port,
        health_check_path=input.health_check_path,
        health_check_grace=input.health_check_grace,
    )
    rules = await creation_rules(ctx, resource_group=input.resource_group, preset=input.preset)
    sessions = build_sessions(request, viewer=viewer, now=utcnow(), rules=rules, owner=owner)
    return await admit_and_store(ctx, sessions, input.client_token)


@strawberry.type
class SessionMutations:
    @strawberry.mutation(description="Queue new sessions; they start PENDING.")
    async def create_session(self, info: Info, input: CreateSessionInput) -> CreateSessionPayload:
        stored = await create_from_input(info.context, input)
        return CreateSessionPayload(sessions=[session_type_of(s) for s in stored])

    @strawberry.mutation(description="End sessions: TERMINATING until Nomad has stopped them; forced ends at once.")
    async def destroy_session(self, info: Info, ids: list[strawberry.ID], forced: bool = False) -> list[Session]:
        ctx = info.context
        viewer = ctx.viewer
        if not 1 <= len(ids) <= MAX_DESTROY:
            raise InvalidInput(f"give between 1 and {MAX_DESTROY} ids", field="ids")
        for session_id in ids:
            await _owned(ctx, str(session_id), viewer)
        ended = []
        for session_id in ids:
            after = await terminate(ctx.sessions, ctx.nomad, str(session_id), reason="user-requested", forced=forced)
            if after is not None:
                ended.append(session_type_of(after))
        await ctx.sessions.wake_scheduler("destroyed")
        return ended

    @strawberry.mutation(description="Rename a session; names are unique per owner among live sessions.")
    async def rename_session(self, info: Info, id: strawberry.ID, name: str) -> Session:
        ctx = info.context
        session = await _owned(ctx, str(id), ctx.viewer)
        if not NAME_RULE.match(name):
            raise InvalidInput("name must be 4-64 characters: letters, digits, '_', and '.' or '-' inside", field="name")
        if session.status.is_terminal:
            raise Conflict("an ended session cannot be renamed", field="id")
        renamed = await ctx.sessions.update(session.id, lambda s: s.evolve(name=name))
        assert renamed is not None
        return session_type_of(renamed)

    @strawberry.mutation(description="Restart the kernels of a RUNNING interactive session in place.")
    async def restart_session(self, info: Info, id: strawberry.ID) -> Session:
        ctx = info.context
        session = await _owned(ctx, str(id), ctx.viewer)
        if session.status is not Status.RUNNING:
            raise Conflict(f"only a RUNNING session can be restarted; this one is {session.status.value}", field="id")
        await record_activity(ctx.sessions.redis, ctx.sessions.keys, session.id, utcnow())  # using it, for idleness
        for kernel in session.kernels:
            if kernel.alloc_id:
                await ctx.nomad.restart_allocation(kernel.alloc_id, TASK_NAME)
        return session_type_of(session)
