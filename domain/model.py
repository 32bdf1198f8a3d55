"""The session model: sessions and their kernels.

A session is what a user asks for; each kernel is one isolated unit of it (a Docker container,
an ``exec`` process, a QEMU VM), run as one task group of the session's Nomad job. The dataclasses are also the
schema of the documents kept in Redis (``core.codec``): a field added here needs a default, so that documents
written before it read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from domain.apps import App
from domain.autoscaling import ScalingRules
from domain.storage import Mount

DEFAULT_GROUP = "default"
"""The resource group sessions go to when they name none (Nomad's default node pool): always known."""


class SessionType(StrEnum):
    INTERACTIVE = "INTERACTIVE"
    BATCH = "BATCH"
    INFERENCE = "INFERENCE"
    SYSTEM = "SYSTEM"


class SessionStatus(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


DEFAULT_PRIORITY = 10
"""A session's priority unless it asks for another; a USER may not go above it without a policy's ``max_priority``."""
MAX_PRIORITY = 100
"""Priorities are 0 (last) to this (first)."""

TERMINAL_STATUSES = frozenset({SessionStatus.TERMINATED, SessionStatus.CANCELLED})
"""No way out of these. ERROR is not terminal: an errored session can still be destroyed."""

KernelStatus = SessionStatus
"""Kernels move through the same statuses; a session's status is derived from its kernels'."""


class SessionResult(StrEnum):
    UNDEFINED = "UNDEFINED"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


class ClusterMode(StrEnum):
    SINGLE_NODE = "SINGLE_NODE"
    MULTI_NODE = "MULTI_NODE"


class Driver(StrEnum):
    DOCKER = "docker"
    EXEC = "exec"
    QEMU = "qemu"
    RAW_EXEC = "raw_exec"


@dataclass(frozen=True)
class StatusChange:
    """One entry of a session's history: a status change, or (while PREPARING) a change of the reason it waits."""

    status: SessionStatus
    at: datetime
    reason: str
    """A short machine-readable code (``failed-to-start``, ``task-failed``, ``user-requested``…)."""
    detail: str | None = None
    """Why, for a person: what Nomad reported (its task event, its placement failure); None when the code says all."""


@dataclass(frozen=True)
class Kernel:
    """One isolated unit of a session; ``hostname`` is ``main1``, ``sub1`` … and names its task group."""

    role: str
    index: int
    hostname: str
    image: str
    resources: dict[str, str]
    status: SessionStatus = SessionStatus.PENDING
    agent: str | None = None
    alloc_id: str | None = None
    exit_code: int | None = None
    status_info: str = ""
    status_detail: str | None = None
    """What Nomad last reported about this kernel that its status code does not say (a driver failure, an exit code
    and its cause, why it cannot be placed, why it restarts); None when there is nothing to add."""
    started_at: datetime | None = None
    """When the kernel's task first started, by Nomad's task state (not when Caravan noticed)."""
    finished_at: datetime | None = None
    """When the kernel's task ended for good, by Nomad's task state; None while it runs or may run again."""
    ports: tuple[str, ...] = ()
    """Preopened ports as ``port=host:port`` (the Nomad dynamic host port the kernel listens on)."""
    restarts: int = 0
    """Times Nomad restarted the kernel's task in its current allocation (a crash, or a failing health check)."""
    healthy: bool | None = None
    """INFERENCE: whether this run of the replica passes its service check (None: not known yet, or not a replica);
    read from Nomad at each reconciliation, forgotten when the replica stops, restarts or moves (domain.inference)."""
    draining_since: datetime | None = None
    """INFERENCE: when the autoscaler took this replica out of traffic, to stop it once its requests ended
    (``domain.endpoint_scaling``); None: serving as usual."""
    parked: bool = False
    """INFERENCE at zero replicas: the last replica, kept as the template of the next one with no allocation (its task
    group rendered with ``count = 0``); woken, it runs again."""
    revision: int = 0
    """INFERENCE: the endpoint revision this replica runs (``Session.revision``); an older one is replaced by a rolling
    update (``domain.endpoint_scaling``)."""
    alloc_index: int = 0
    """Nomad's ``CreateIndex`` of ``alloc_id`` (0: not known): a failed set-up of an allocation created before it is a
    late report, not one more failed start (``domain.lifecycle``)."""

    @property
    def is_main(self) -> bool:
        return self.role == "main"


KERNEL_ROLES = ("main", "sub")
"""The roles a request may give their own image and resources: ``main`` (main1) and ``sub`` (every sub kernel)."""


@dataclass(frozen=True)
class RoleSpec:
    """What a request (or a template) asks for the kernels of one role, over the session's image and resources."""

    image: str | None = None
    """None: the session's image."""
    resources: dict[str, str] = field(default_factory=dict)
    """Slot -> amount as the user wrote it; these slots replace the session's for this role's kernels."""


@dataclass(frozen=True)
class ReplicaSpec:
    """What an inference endpoint's replicas of one revision run, beyond their kernel's image and slots."""

    startup_command: str | None
    environ: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    """How many replicas served when the update began: the rolling update keeps that many, one more while a new
    replica starts."""


@dataclass(frozen=True)
class ScalingStatus:
    """An inference endpoint's last scaling decision, as the autoscaler recorded it."""

    desired: int
    reason: str
    at: datetime
    panicking: bool = False


@dataclass(frozen=True)
class Session:
    id: str
    name: str
    owner_id: str
    type: SessionType
    driver: Driver
    image: str
    resources: dict[str, str]
    """Requested slots per kernel, as exact decimal strings (``{"cpu": "1", "mem": "268435456"}``)."""
    kernels: tuple[Kernel, ...]
    created_at: datetime
    status: SessionStatus = SessionStatus.PENDING
    status_info: str = "created"
    status_detail: str | None = None
    """The detail of the latest status change (``StatusChange.detail``)."""
    status_history: tuple[StatusChange, ...] = ()
    resource_group: str = "default"
    project: str = "default"
    startup_command: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    result: SessionResult = SessionResult.UNDEFINED
    exit_code: int | None = None
    nomad_job_id: str | None = None
    job_hcl: str | None = None
    client_token: str | None = None
    priority: int = DEFAULT_PRIORITY
    retries: int = 0
    """Failed scheduling attempts, shown to the owner (head-of-line avoidance counts them)."""
    wait_reasons: tuple[str, ...] = ()
    """Why a PENDING session still waits: the checks that held it back at the last pass."""
    queue_position: int | None = None
    """1-based position in its resource group's queue at the last pass (PENDING only)."""
    starts_at: datetime | None = None
    """BATCH: never started before this moment."""
    batch_timeout: float | None = None
    """BATCH: seconds the startup command may run before the session ends FAILED with task-timeout."""
    dependencies: tuple[str, ...] = ()
    """BATCH: ids of sessions that must end TERMINATED with SUCCESS first."""
    designated_agent: str | None = None
    """Admins only: the Nomad node id the session must run on."""
    preopen_ports: tuple[int, ...] = ()
    """Container ports to expose (1024-65535); each gets a Nomad dynamic host port."""
    shared_memory: str | None = None
    """Bytes of /dev/shm for Docker kernels, as an exact decimal string."""
    started_at: datetime | None = None
    """When its first kernel's task started, by Nomad's task state (a quick BATCH may end before Caravan sees it
    run); failing that, when it was seen RUNNING."""
    service_port: int | None = None
    """INFERENCE: the port each replica serves (a Nomad dynamic host port, health-checked); see domain.inference."""
    health_check_path: str | None = None
    """INFERENCE: the HTTP path the health check GETs; None: a TCP connect check."""
    health_check_grace: float | None = None
    """INFERENCE: seconds after a replica (re)starts before failing checks count against it."""
    apps: tuple[App, ...] = ()
    """Named ports of the main kernel the gateway proxies (``domain.apps``); preopened ports are apps too."""
    mounts: tuple[Mount, ...] = ()
    """Storage folders mounted into every kernel (``domain.storage``); the session runs on their node."""
    autoscaling: ScalingRules | None = None
    """INFERENCE: the endpoint's autoscaling rules (``domain.autoscaling``); None: a fixed number of replicas."""
    scaling: ScalingStatus | None = None
    """INFERENCE: the autoscaler's last decision that changed something (``domain.endpoint_scaling``)."""
    revision: int = 0
    """INFERENCE: bumped by each update of the replicas' command or environment (``updateEndpoint``)."""
    previous: ReplicaSpec | None = None
    """INFERENCE, during a rolling update: what the replicas of the previous revision run (rendered so for them)."""
    preferred_ports_taken: tuple[str, ...] = ()
    """The apps whose preferred host port (``App.preferred_port``) another allocation held on the main kernel's node
    when the session was placed: each got a dynamic host port instead (the others got theirs)."""

    @property
    def main_kernel(self) -> Kernel:
        return next(k for k in self.kernels if k.is_main)

    @property
    def cluster_size(self) -> int:
        return len(self.kernels)

    @property
    def terminated_at(self) -> datetime | None:
        if not self.status.is_terminal:
            return None
        return self.status_history[-1].at if self.status_history else None

    def evolve(self, **changes: Any) -> Session:
        return replace(self, **changes)


@dataclass(frozen=True)
class KernelObservation:
    """What the executor says about one kernel right now (from a Nomad allocation)."""

    hostname: str
    status: SessionStatus
    reason: str
    agent: str | None = None
    alloc_id: str | None = None
    exit_code: int | None = None
    ports: tuple[str, ...] = ()
    restarts: int = 0
    detail: str | None = None
    """What Nomad said beyond the status (its failure event, why it cannot place the kernel); None: nothing."""
    started_at: datetime | None = None
    """When the task last (re)started in this allocation (Nomad's ``TaskState.StartedAt``)."""
    finished_at: datetime | None = None
    """When the task ended for good (Nomad's ``TaskState.FinishedAt``); None while it runs or may restart."""
    placed: bool = True
    """False: read from an evaluation that could not place the kernel (there is no allocation to speak for it)."""
    setup_failed: bool = False
    """True: the allocation failed in Nomad's own set-up (a ``Setup Failure`` event: its network, its volumes), before
    its task started or at its client's restart (then Nomad killed the task), so no exit code is the command's
    (``domain.start_retry``)."""
    command_started: bool = False
    """With ``setup_failed``: the task had started before Nomad failed the set-up and killed it (its command ran in
    part: placing it again runs it a second time)."""
    alloc_index: int = 0
    """Nomad's ``CreateIndex`` of the allocation (0: none, or not known)."""
