"""The pure scheduling model: what a pass reads (``Snapshot``) and what it returns (``PassResult``).

The caller (the I/O edge) fills a ``Snapshot`` from Redis and Nomad, calls
``scheduler.scheduling_pass.run_pass(snapshot, config, now)`` and applies the ``PassResult``: submits the placements,
cancels the cancellations, persists the retry increments, the wait explanations, the queue positions and the new
round-robin state. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from domain.agents import Agent
from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.agents.base import AgentSelector

__all__ = [
    "Agent",
    "Cancellation",
    "KernelPlacement",
    "PassResult",
    "Reservation",
    "PassConfig",
    "WaitExplanation",
    "WaitKind",
    "ClusterMode",
    "DependencyState",
    "KernelRequest",
    "PendingSession",
    "ProjectPolicy",
    "RunningSession",
    "Snapshot",
    "UserPolicy",
    "kernel_roles",
]

DEFAULT_PRIORITY = 10
"""Backend.AI's default session priority (range 0..100); higher goes first."""


class ClusterMode(StrEnum):
    SINGLE_NODE = "single-node"
    """All kernels on one agent: their requests are summed and one agent is chosen."""
    MULTI_NODE = "multi-node"
    """Kernels are placed one by one, each against the state after the previous ones; all or nothing."""


class DependencyState(StrEnum):
    DONE = "done"
    """Terminated with result SUCCESS."""
    WAITING = "waiting"
    """Pending, scheduled or running: the dependent waits."""
    FAILED = "failed"
    """Failed, errored or cancelled: the dependent is cancelled with ``dependency-failed``."""


def kernel_roles(cluster_size: int) -> tuple[str, ...]:
    """``main1, sub1, sub2, ...`` as Backend.AI names the kernels of a cluster session."""
    return ("main1",) + tuple(f"sub{n}" for n in range(1, cluster_size))


@dataclass(frozen=True, slots=True)
class KernelRequest:
    role: str
    requested: ResourceSlots


@dataclass(frozen=True, slots=True)
class PendingSession:
    """Slotted, as the other records a snapshot holds one of per session: a session takes 120 bytes before its
    fields' values, where an instance with a ``__dict__`` took 216 (a 100,000-session snapshot holds 100,000). A pass
    reads a dozen fields of each; its time did not change beyond this machine's noise (bench/README.md, tenth round)."""

    id: str
    user: str
    resource_group: str
    created_at: datetime
    kernels: tuple[KernelRequest, ...]
    project: str | None = None
    priority: int = DEFAULT_PRIORITY
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    starts_at: datetime | None = None
    """Batch sessions: never placed before this time."""
    dependencies: tuple[str, ...] = ()
    """Session ids that must be DONE first; their states are in ``Snapshot.dependency_states``."""
    retries: int = 0
    """Scheduling attempts that already failed for lack of resources (persisted by the caller)."""
    _requested: ResourceSlots | None = field(default=None, init=False, repr=False, compare=False)
    """``requested`` once summed."""

    def __post_init__(self) -> None:
        if not self.kernels:
            raise ValueError(f"session {self.id!r} has no kernels")

    @property
    def requested(self) -> ResourceSlots:
        """All kernels together (what a single-node session needs on its one agent); summed when first asked."""
        if len(self.kernels) == 1:
            return self.kernels[0].requested
        if self._requested is None:
            total = ResourceSlots()
            for kernel in self.kernels:
                total = total + kernel.requested
            object.__setattr__(self, "_requested", total)  # frozen: a cache, not a field anyone sets
            return total
        return self._requested

    @classmethod
    def single(
        cls,
        id: str,
        user: str,
        resource_group: str,
        created_at: datetime,
        requested: ResourceSlots,
        *,
        cluster_size: int = 1,
        **fields: object,
    ) -> PendingSession:
        """A session whose ``cluster_size`` kernels all request ``requested`` (the common case)."""
        kernels = tuple(KernelRequest(role, requested) for role in kernel_roles(cluster_size))
        return cls(id, user, resource_group, created_at, kernels, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RunningSession:
    """A session that occupies agents (scheduled, preparing, running, terminating)."""

    id: str
    user: str
    resource_group: str
    occupied: ResourceSlots
    project: str | None = None


@dataclass(frozen=True)
class UserPolicy:
    max_concurrent_sessions: int | None = None
    """None = unlimited; 0 = the user may not run anything."""
    total_resource_slots: Mapping[str, Decimal] | None = None
    """Cluster-wide cap per slot; a slot not listed is unlimited, a listed 0 allows none."""


@dataclass(frozen=True)
class ProjectPolicy:
    total_resource_slots: Mapping[str, Decimal] | None = None
    """Same rule as ``UserPolicy.total_resource_slots``, summed over the project's sessions."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass needs, read at one instant by the caller."""

    agents: tuple[Agent, ...]
    pending: tuple[PendingSession, ...]
    running: tuple[RunningSession, ...] = ()
    dependency_states: Mapping[str, DependencyState] = field(default_factory=dict)
    """State of every session some pending session depends on; a missing id counts as WAITING."""
    user_policies: Mapping[str, UserPolicy] = field(default_factory=dict)
    project_policies: Mapping[str, ProjectPolicy] = field(default_factory=dict)
    roundrobin_state: Mapping[str, int] = field(default_factory=dict)
    """Resource group -> next agent index of the round-robin selector (from the previous ``PassResult``)."""


@dataclass(frozen=True)
class PassConfig:
    """What the pure pass is configured with: the file's groups (``domain.scheduling_config.SchedulingConfig``) with
    their agent selectors resolved, plugins loaded (``scheduler.config.pass_config``)."""

    default: GroupConfig = GroupConfig()
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    """Per resource group overrides of ``default`` (whole configs, not merged field by field)."""
    plugin_selectors: Mapping[str, AgentSelector] = field(default_factory=dict)
    """Custom agent selectors by name, loaded at startup with ``scheduler.agents.load_plugin_selectors``."""

    def for_group(self, group: str) -> GroupConfig:
        return self.groups.get(group, self.default)


# -- what a pass returns --


@dataclass(frozen=True)
class KernelPlacement:
    kernel_index: int
    role: str
    agent_id: str


class WaitKind(StrEnum):
    CHECKS_FAILED = "checks-failed"
    """A non-resource check failed (start time, dependency, concurrency, quota); blocks nobody."""
    NO_AGENT_FITS = "no-agent-fits"
    """Short of resources now; counts as a failed attempt (+1 retry)."""
    NEVER_FITS = "never-fits"
    """No schedulable agent of the group could host it even when empty (or none has a slot it asks for); blocks
    nobody."""
    BLOCKED = "blocked"
    """Not attempted: an earlier session short of resources holds the line."""


@dataclass(frozen=True)
class WaitExplanation:
    kind: WaitKind
    message: str
    failed_checks: tuple[tuple[str, str], ...] = ()
    """(check name, message) of every failed check, all evaluated."""
    shortfall: ResourceSlots = ResourceSlots()
    """What the closest agent lacks, per slot (NO_AGENT_FITS / NEVER_FITS)."""
    best_agent: str | None = None
    blocked_by: str | None = None


@dataclass(frozen=True)
class Reservation:
    """An agent that stops taking sessions that would delay ``session_id`` (one reservation per agent)."""

    session_id: str
    agent_id: str
    held: ResourceSlots


@dataclass(frozen=True)
class Cancellation:
    session_id: str
    reason: str
    message: str


@dataclass(frozen=True)
class PassResult:
    placements: Mapping[str, tuple[KernelPlacement, ...]]
    waiting: Mapping[str, WaitExplanation]
    retry_increments: Mapping[str, int]
    """Session id -> how much to add to its persisted ``retries`` (1 for each failed-for-resources attempt)."""
    reservations: tuple[Reservation, ...]
    cancellations: Mapping[str, Cancellation]
    queue_positions: Mapping[str, int]
    """Still-pending session id -> 1-based position in its group's attempt order of this pass."""
    roundrobin_state: Mapping[str, int]
