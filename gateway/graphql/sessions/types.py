"""GraphQL types of sessions and kernels."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from core.clock import utcnow
from domain import model
from domain.endpoint_scaling import replicas_now
from domain.inference import endpoints_of, is_inference
from domain.sftp import sftp_address
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.folders.mounts import SessionMount, session_mounts_of
from gateway.graphql.idle.checks import idle_checks_of, utilization_of
from gateway.graphql.idle.types import IdleChecks, UtilizationSeries
from gateway.graphql.sessions.apps import SessionApp, session_app_types
from gateway.graphql.sessions.endpoints import Endpoint, endpoint_of, endpoint_url_of
from gateway.graphql.sessions.log_tail import checked_tail_bytes
from gateway.graphql.sessions.scaling import EndpointScaling, scaling_of
from nomad_jobs.client import NomadNotFound
from nomad_jobs.meta import TASK_NAME
from stores.activity import record_activity

# The domain's enums are the GraphQL enums: strawberry.enum marks the class itself (and returns it), so the
# aliases below are plain classes, usable as annotations.
SessionType = model.SessionType
strawberry.enum(SessionType, name="SessionType")
SessionStatus = model.SessionStatus
strawberry.enum(SessionStatus, name="SessionStatus")
SessionResult = model.SessionResult
strawberry.enum(SessionResult, name="SessionResult")
ClusterMode = model.ClusterMode
strawberry.enum(ClusterMode, name="ClusterMode")


@strawberry.enum(name="Driver")
class Driver(Enum):
    DOCKER = "docker"
    EXEC = "exec"
    QEMU = "qemu"
    RAW_EXEC = "raw_exec"


DETAIL = (
    "Why, for a person, in Nomad's words when Nomad said it: a task event ('Driver Failure: Failed to pull ...; "
    "not restarted: ...', 'Terminated: Exit Code: 127 (...)'), why it cannot place a kernel ('Nomad cannot place "
    "it: constraint ... excluded 1 node'), or its refusal of the job; null when the code says all. Free text: "
    "match on the code, not on this."
)


@strawberry.type(
    description="One entry of a session's history: a status change, or a PREPARING session's new "
    "reason (why it does not start yet)."
)
class StatusChange:
    status: SessionStatus
    at: datetime = strawberry.field(
        description="When, by Nomad's task times where they say (a kernel's start or end), "
        "else when Caravan saw it; never before the previous entry."
    )
    reason: str = strawberry.field(
        description="A short machine-readable code: created, scheduled, job-registered, "
        "unplaceable, restarting, kernels-running, task-finished, task-failed, "
        "failed-to-start, job-lost, user-requested, ..."
    )
    detail: str | None = strawberry.field(description=DETAIL)


@strawberry.type
class Resource:
    slot: str
    amount: str


@strawberry.type
class EnvVar:
    name: str
    value: str


@strawberry.type
class KernelLogs:
    stdout: str
    stderr: str


@strawberry.type
class Kernel:
    role: str
    index: int
    hostname: str
    image: str = strawberry.field(
        description="docker: the image; qemu: the VM image; '' for exec and raw_exec, which run none."
    )
    status: SessionStatus
    status_info: str = strawberry.field(
        description="A short machine-readable code of the kernel's status: "
        "allocation-pending, unplaceable, restarting, kernel-running, task-finished, "
        "task-failed, failed-to-start, job-lost, ..."
    )
    status_detail: str | None = strawberry.field(
        description="What Nomad last said about this kernel beyond its code. " + DETAIL
    )
    started_at: datetime | None = strawberry.field(
        description="When the kernel's task first started, by Nomad's task state (also for a kernel that ran and ended "
        "between two observations); null: not started."
    )
    finished_at: datetime | None = strawberry.field(
        description="When the kernel's task ended for good, by Nomad's task state; null while it runs or may run again."
    )
    agent: str | None
    alloc_id: strawberry.Private[str | None]
    session_id: strawberry.Private[str]
    exit_code: int | None
    ports: list[str] = strawberry.field(
        description="Preopened ports (and an INFERENCE service port) as 'port=host:hostPort', once Nomad "
        "allocated them."
    )
    restarts: int = strawberry.field(
        description="Times Nomad restarted this kernel's task in its current allocation (a crash, a failing "
        "health check)."
    )
    healthy: bool | None = strawberry.field(
        description="INFERENCE: whether this run of the replica passes its service health check, as last read from "
        "Nomad; null: not known yet (just started or restarted, checks not run since) or not a replica."
    )
    resources: list[Resource] = strawberry.field(
        default_factory=list, description="This kernel's slots (a cluster's main and sub kernels may differ)."
    )

    @fields.field(
        description="The kernel's stdout and stderr from Nomad: the last tailBytes (0 to 4 MiB) of each; "
        "null before the kernel has run."
    )
    async def logs(self, info: Info, tail_bytes: int = 65536) -> KernelLogs | None:
        tail = checked_tail_bytes(tail_bytes)
        if not self.alloc_id:
            return None
        sessions = info.context.sessions
        await record_activity(sessions.redis, sessions.keys, self.session_id, utcnow())  # reading logs is using it
        if tail == 0:
            return KernelLogs(stdout="", stderr="")  # (Nomad reads an offset of 0 from the end as the whole last file)
        nomad = info.context.nomad
        try:
            stdout = await nomad.logs(self.alloc_id, TASK_NAME, "stdout", tail_bytes=tail)
            stderr = await nomad.logs(self.alloc_id, TASK_NAME, "stderr", tail_bytes=tail)
        except NomadNotFound:
            return None  # the task never started, or Nomad has collected its allocation
        return KernelLogs(stdout=stdout, stderr=stderr)


@strawberry.type(description="Who owns a session.")
class SessionOwner:
    id: strawberry.ID
    name: str


@strawberry.type
class Session:
    id: strawberry.ID
    name: str
    type: SessionType
    status: SessionStatus
    status_info: str = strawberry.field(
        description="The reason of the latest status change: a short machine-readable code (see StatusChange.reason)."
    )
    status_detail: str | None = strawberry.field(description="The detail of the latest status change. " + DETAIL)
    status_history: list[StatusChange]
    result: SessionResult
    exit_code: int | None
    created_at: datetime
    terminated_at: datetime | None
    owner_id: str
    project: str
    resource_group: str
    driver: Driver
    image: str = strawberry.field(
        description="docker: the image; qemu: the VM image; '' for exec and raw_exec, "
        "which run none (main1's: a kernel role may have its own)."
    )
    startup_command: str | None
    environ: list[EnvVar]
    resources: list[Resource]
    kernels: list[Kernel]
    nomad_job_id: str | None
    job_hcl: str | None
    retries: int = strawberry.field(description="Scheduling attempts that found no agent with room (PENDING).")
    wait_reasons: list[str] = strawberry.field(
        description="Why a PENDING session still waits, one line per check that held it back at the last pass."
    )
    queue_position: int | None = strawberry.field(
        description="1-based position in its resource group's queue at the last pass; null unless PENDING."
    )
    priority: int
    cluster_mode: ClusterMode
    cluster_size: int
    starts_at: datetime | None
    started_at: datetime | None = strawberry.field(
        description="When its first kernel's task started, by Nomad (set even for a session that ended before Caravan "
        "saw it RUNNING); null: none started."
    )
    batch_timeout: float | None = strawberry.field(description="Seconds a BATCH session may run.")
    dependencies: list[strawberry.ID]
    preopen_ports: list[int]
    mounts: list[SessionMount] = strawberry.field(description="Storage folders mounted into its kernels.")
    sftp_address: str | None = strawberry.field(
        description="SFTP system sessions (requestSftp), once RUNNING: host:port of the server."
    )
    apps: list[SessionApp] = strawberry.field(
        description="Named ports of the main kernel the gateway proxies (declared apps, then one 'p<port>' per "
        "preopened port), each on an origin of its own."
    )
    designated_agent: str | None
    replicas: int = strawberry.field(
        description="INFERENCE: replicas of the main kernel (main1 … mainN) not draining nor parked (0 at zero); 1 "
        "otherwise."
    )
    service_port: int | None = strawberry.field(description="INFERENCE: the port each replica serves.")
    health_check_path: str | None = strawberry.field(
        description="INFERENCE: the HTTP path of the replicas' health check; null: a TCP check."
    )
    health_check_grace: float | None = strawberry.field(
        description="INFERENCE: seconds after a (re)start before failing checks count; null: the default."
    )
    endpoints: list[str] = strawberry.field(
        description="INFERENCE: 'host:port' of the service port of every RUNNING replica whose health check is known "
        "to pass (kernel.healthy); one loading, failing or recovering drops out until its check passes again."
    )
    autoscaling: EndpointScaling | None = strawberry.field(
        description="INFERENCE: the endpoint's autoscaling rules, replicas desired, current, ready and draining, and "
        "the last scaling decision with its reason; null otherwise."
    )
    endpoint_url: str | None = strawberry.field(
        resolver=endpoint_url_of,
        description="INFERENCE: the session's stable address, balanced over its routable replicas (README "
        "'Inference endpoints'); null otherwise.",
    )
    endpoint: Endpoint | None = strawberry.field(
        resolver=endpoint_of, description="INFERENCE: the endpoint's access, traffic and cold starts; null otherwise."
    )

    @fields.field(description="The owner's user record (batched over a page); null if it no longer exists.")
    async def owner(self, info: Info) -> SessionOwner | None:
        user = await info.context.loaders.users.load(self.owner_id)
        return SessionOwner(id=strawberry.ID(user.id), name=user.name) if user is not None else None

    @fields.field(description="The main kernel (main1): the one users interact with.")
    def main_kernel(self) -> Kernel:
        return next(k for k in self.kernels if k.role == "main")

    @fields.field(
        description="The idle checker's last verdict: per check the time left and what it counts down to, and "
        "utilization averages against thresholds. Null when no sweep judged the session lately (not RUNNING)."
    )
    async def idle_checks(self, info: Info) -> IdleChecks | None:
        return await idle_checks_of(info, str(self.id))

    @fields.field(
        description="One kernel's CPU, memory and accelerator utilization over the session's life as the idle checker "
        "sampled it (kernel: a hostname; null: the first kernel with samples), at a bounded resolution (older points "
        "average more sweeps), with the idle thresholds judged (none when no threshold applies to it). Empty before "
        "its first sample or once the series expired (a day after the last sample)."
    )
    async def utilization(self, info: Info, kernel: str | None = None) -> UtilizationSeries:
        return await utilization_of(info, str(self.id), kernel)


def session_type_of(s: model.Session) -> Session:
    return Session(
        id=strawberry.ID(s.id),
        name=s.name,
        type=s.type,
        status=s.status,
        status_info=s.status_info,
        status_detail=s.status_detail,
        status_history=[
            StatusChange(status=c.status, at=c.at, reason=c.reason, detail=c.detail) for c in s.status_history
        ],
        result=s.result,
        exit_code=s.exit_code,
        created_at=s.created_at,
        terminated_at=s.terminated_at,
        owner_id=s.owner_id,
        project=s.project,
        resource_group=s.resource_group,
        driver=Driver(s.driver.value),
        image=s.image,
        startup_command=s.startup_command,
        environ=[EnvVar(name=k, value=v) for k, v in s.environ.items()],
        resources=[Resource(slot=k, amount=v) for k, v in s.resources.items()],
        kernels=[
            Kernel(
                role=k.role,
                index=k.index,
                hostname=k.hostname,
                image=k.image,
                status=k.status,
                status_info=k.status_info,
                status_detail=k.status_detail,
                started_at=k.started_at,
                finished_at=k.finished_at,
                agent=k.agent,
                alloc_id=k.alloc_id,
                session_id=s.id,
                exit_code=k.exit_code,
                ports=list(k.ports),
                restarts=k.restarts,
                healthy=k.healthy,
                resources=[Resource(slot=slot, amount=amount) for slot, amount in k.resources.items()],
            )
            for k in s.kernels
        ],
        nomad_job_id=s.nomad_job_id,
        job_hcl=s.job_hcl,
        retries=s.retries,
        wait_reasons=list(s.wait_reasons),
        queue_position=s.queue_position,
        priority=s.priority,
        cluster_mode=s.cluster_mode,
        cluster_size=s.cluster_size,
        starts_at=s.starts_at,
        started_at=s.started_at,
        batch_timeout=s.batch_timeout,
        dependencies=[strawberry.ID(d) for d in s.dependencies],
        preopen_ports=list(s.preopen_ports),
        apps=session_app_types(s),
        mounts=session_mounts_of(s),
        sftp_address=sftp_address(s.main_kernel.ports) if s.type is model.SessionType.SYSTEM else None,
        designated_agent=s.designated_agent,
        replicas=replicas_now(s).current if is_inference(s) else 1,
        service_port=s.service_port,
        health_check_path=s.health_check_path,
        health_check_grace=s.health_check_grace,
        endpoints=list(endpoints_of(s)),
        autoscaling=scaling_of(s),
    )
