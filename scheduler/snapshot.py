"""A pass's input, read from Redis and Nomad: three Nomad calls (nodes, live allocations, the namespace's drivers) and a
handful of Redis reads per pass, however many sessions wait.

Agents are Nomad client nodes, their capacity and occupancy read as ``nomad_jobs.agents`` reads them. On top:

- drivers: a session needs its task driver detected and healthy on the node, and allowed in Caravan's namespace (a
  node runs raw_exec for the platform's jobs even where the users' namespace disables it). Like a designated agent, it
  asks for one unit of a slot ``driver:<name>`` that only such agents have (added only for drivers some pending
  session wants, and never recorded as a slot type), so a session whose driver no agent offers waits with
  ``never-fits: no schedulable agent of resource group … has driver:docker``, and blocks nobody. Unlike a device kind,
  an offered driver does not make an agent rank later for sessions that do not use it (``scheduler.agents.ranking``).

A session designated to an agent (admins) asks for one unit of a slot ``designated:<node id>`` that only that agent
has, so the pass places it there or explains why not; while it waits, other sessions prefer other agents (an agent
with a kind of slot a session does not use ranks after those without).

The live sessions are kept between passes: each read takes only those the change feed (``stores.session_changes``)
names since the last one, and reads them all at a leader's first pass, every :data:`RESYNC_INTERVAL` and when the
feed cannot vouch for what changed (at 100,000 live sessions, reading and decoding them all is seconds per pass).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from core.collector import collector_paused
from core.replies import text_hash
from devices.catalog import DeviceAsk, device_asks
from domain.model import ClusterMode as SessionClusterMode
from domain.model import Session, SessionResult, SessionStatus
from domain.scheduling_config import SchedulingConfig
from domain.slots import ResourceSlots, SlotType, accumulate_slot_types
from nomad_jobs.agents import (
    OCCUPYING,
    agents_of,
    allowed_drivers,
    devices_of,
    healthy_drivers,
    host_ports_in_use,
    kernel_request,
    mhz_per_core,
)
from nomad_jobs.client import NomadClient
from scheduler.agents.ranking import DRIVER_MARKER
from scheduler.pass_model import (
    Agent,
    ClusterMode,
    DependencyState,
    KernelRequest,
    PendingSession,
    ProjectPolicy,
    RunningSession,
    Snapshot,
    UserPolicy,
)
from stores.resource_policies import PolicyStore
from stores.session_changes import Follower
from stores.sessions import SessionStore

__all__ = [
    "PassInput",
    "SnapshotReader",
    "dependency_state",
    "pending_session",
    "requiring_driver",
    "timed_out",
    "with_wanted_slots",
]

S = SessionStatus
DESIGNATED = "designated:"
DESIGNATED_CAPACITY = 1_000_000
DRIVER = DRIVER_MARKER
T = TypeVar("T")
RESYNC_INTERVAL = timedelta(minutes=10)
"""How long the reader keeps its live sessions, following the change feed, before it reads them all again."""
FEED_READ_LIMIT = 20_000
"""Writes since the last read above which the reader reads every live session again instead."""
Json = Mapping[str, Any]


# -- Nomad's view, converted --


# -- Caravan's sessions, converted --


def pending_session(session: Session, *, driver: str | None = None) -> PendingSession:
    """The session as the pass takes it; with ``driver``, asking for it as :func:`requiring_driver` does."""
    markers: tuple[str, ...] = (f"{DESIGNATED}{session.designated_agent}",) if session.designated_agent else ()
    if driver is not None:
        markers += (f"{DRIVER}{driver}",)
    return PendingSession(
        id=session.id,
        user=session.owner_id,
        resource_group=session.resource_group,
        created_at=session.created_at,
        kernels=tuple(KernelRequest(k.hostname, with_markers(kernel_request(k), markers)) for k in session.kernels),
        project=session.project,
        priority=session.priority,
        cluster_mode=ClusterMode.MULTI_NODE
        if session.cluster_mode is SessionClusterMode.MULTI_NODE
        else ClusterMode.SINGLE_NODE,
        starts_at=session.starts_at,
        dependencies=session.dependencies,
        retries=session.retries,
    )


def requiring_driver(pending: PendingSession, driver: str) -> PendingSession:
    """The session asking every kernel's agent for one unit of ``driver:<driver>`` (see ``with_wanted_slots``)."""
    needs = {f"{DRIVER}{driver}": Decimal(1)}
    return replace(pending, kernels=tuple(replace(k, requested=k.requested + needs) for k in pending.kernels))


@functools.lru_cache(maxsize=4096)
def with_markers(requested: ResourceSlots, markers: tuple[str, ...]) -> ResourceSlots:
    """``requested`` and one unit of each marker slot (``designated:``, ``driver:``): requests repeat, and slots are
    immutable, so each distinct one is made once."""
    return requested + dict.fromkeys(markers, Decimal(1)) if markers else requested


def running_session(session: Session) -> RunningSession:
    requests = [kernel_request(kernel) for kernel in session.kernels]
    occupied = requests[0] if len(requests) == 1 else sum(requests, ResourceSlots())
    return RunningSession(session.id, session.owner_id, session.resource_group, occupied, session.project)


def as_pending(session: Session) -> PendingSession:
    """A PENDING session as the pass takes it, asking for its driver."""
    return pending_session(session, driver=session.driver.value)


def kept_converted(
    sessions: Iterable[Session], convert: Callable[[Session], T], last: Mapping[str, tuple[Session, T]]
) -> tuple[list[T], dict[str, tuple[Session, T]]]:
    """``convert`` of each session, reusing ``last``'s for the very same session object (sessions and what the pass
    takes of them are immutable, and the reader hands back the same object while a session is unchanged); with what
    to pass as ``last`` next time."""
    kept: dict[str, tuple[Session, T]] = {}
    converted = []
    with collector_paused():  # many objects, no cycles (core.collector)
        for session in sessions:
            before = last.get(session.id)
            value = before[1] if before is not None and before[0] is session else convert(session)
            kept[session.id] = (session, value)
            converted.append(value)
    return converted, kept


def dependency_state(session: Session | None) -> DependencyState:
    """DONE once TERMINATED with SUCCESS; a dependency that failed, errored, was cancelled or is gone is FAILED."""
    if session is None:
        return DependencyState.FAILED
    if session.status is S.TERMINATED:
        return DependencyState.DONE if session.result is SessionResult.SUCCESS else DependencyState.FAILED
    if session.status in (S.CANCELLED, S.ERROR):
        return DependencyState.FAILED
    return DependencyState.WAITING


def timed_out(session: Session, config: SchedulingConfig, now: datetime) -> bool:
    """PENDING for longer than its group's pending timeout, counted from its start time when it has one."""
    timeout = config.pending_timeout(session.resource_group)
    waiting_since = max(session.created_at, session.starts_at or session.created_at)
    return timeout is not None and now - waiting_since > timeout


def timed_out_ids(waiting: Iterable[Session], config: SchedulingConfig, now: datetime) -> tuple[str, ...]:
    """The ids of those of ``waiting`` (PENDING sessions) that have :func:`timed_out`, each group's timeout looked up
    once (none at all without a timeout)."""
    waiting = list(waiting)
    cutoffs = {}
    for group in {s.resource_group for s in waiting}:
        timeout = config.pending_timeout(group)
        if timeout is not None:
            cutoffs[group] = now - timeout
    if not cutoffs:
        return ()
    return tuple(
        s.id
        for s in waiting
        if (cutoff := cutoffs.get(s.resource_group)) is not None
        and max(s.created_at, s.starts_at or s.created_at) < cutoff
    )


def with_wanted_slots(
    agents: tuple[Agent, ...], drivers: Mapping[str, frozenset[str]], pending: Iterable[PendingSession]
) -> tuple[Agent, ...]:
    """Agents with the marker slots pending sessions ask for: ``designated:<own id>``, and ``driver:<name>`` for each
    wanted driver that ``drivers`` (agent id -> healthy drivers) says the agent has. Unlimited: only presence counts."""
    wanted = {
        slot
        for session in pending
        for kernel in session.kernels
        for slot in kernel.requested
        if slot.startswith((DESIGNATED, DRIVER))
    }
    if not wanted:
        return agents
    marked = []
    for a in agents:
        offered = {f"{DESIGNATED}{a.id}", *(f"{DRIVER}{name}" for name in drivers.get(a.id, ()))} & wanted
        extra = {slot: Decimal(DESIGNATED_CAPACITY) for slot in offered}
        marked.append(replace(a, capacity=a.capacity + extra) if extra else a)
    return tuple(marked)


# -- reading it all --


@dataclass(frozen=True)
class PassInput:
    snapshot: Snapshot
    sessions: Mapping[str, Session]
    """Every live session as read for this pass (the pending ones are written back against it)."""
    timed_out: tuple[str, ...]
    """PENDING sessions past their group's pending timeout: to cancel, left out of the snapshot."""
    mhz_per_core: int
    slot_types: Mapping[str, SlotType]
    """Slot types of every agent's capacity (to record for the gateway)."""
    device_asks: Mapping[str, DeviceAsk]
    """Device slot -> how a job asks Nomad for it, for the jobs' ``device`` blocks (``devices.catalog.device_asks``)."""
    host_ports: Mapping[str, Set[int]] = field(default_factory=dict)
    """Node id -> the host ports held there: its live allocations' and the preferred ports granted to the sessions
    placed whose allocation Nomad does not show yet (where an app's preferred port may go, ``domain.apps``)."""


class SnapshotReader:
    def __init__(
        self, store: SessionStore, policies: PolicyStore, nomad: NomadClient, config: SchedulingConfig, job_prefix: str
    ) -> None:
        self.store, self.policies, self.nomad = store, policies, nomad
        self.config, self.job_prefix = config, job_prefix
        self.feed = Follower(store.redis, store.keys, resync_every=RESYNC_INTERVAL, limit=FEED_READ_LIMIT)
        """Where the last read stopped in the change feed (``stores.session_changes``)."""
        self._live: dict[str, Session] = {}
        """Every live session as the last read left it (sessions are immutable: shared across passes)."""
        self._pending: dict[str, tuple[Session, PendingSession]] = {}
        self._running: dict[str, tuple[Session, RunningSession]] = {}
        """The last read's sessions as the pass takes them, each kept with the very session it was made from."""

    async def read(self, now: datetime) -> PassInput:
        sessions = await self._live_sessions(now)
        live = list(sessions.values())
        waiting = sorted((s for s in live if s.status is S.PENDING), key=lambda s: (s.created_at, s.id))
        expired = timed_out_ids(waiting, self.config, now)
        gone = set(expired)
        waited, self._pending = kept_converted((s for s in waiting if s.id not in gone), as_pending, self._pending)
        pending = tuple(waited)
        nodes = await self.nomad.nodes()
        mhz = mhz_per_core(nodes, self.config.cpu_mhz_per_core)
        allocs = await self.nomad.live_allocations() if pending else []
        capabilities = await self.nomad.namespace_capabilities() if pending else {}
        drivers = {str(n["ID"]): allowed_drivers(healthy_drivers(n), capabilities) for n in nodes}
        agents = agents_of(nodes, allocs, sessions, self.job_prefix, mhz, self.config.devices)
        occupying = (s for s in live if s.status in OCCUPYING)
        running, self._running = kept_converted(occupying, running_session, self._running)
        snapshot = Snapshot(
            agents=with_wanted_slots(agents, drivers, pending),
            pending=pending,
            running=tuple(running),
            **(await self._checks_input(pending, sessions) if pending else {}),
            roundrobin_state=await self._roundrobin(),
        )
        slot_types = accumulate_slot_types(agent.capacity for agent in agents)
        return PassInput(
            snapshot,
            sessions,
            expired,
            mhz,
            slot_types,
            device_asks(self.config.devices, devices_of(nodes)),
            host_ports(allocs, live) if pending else {},
        )

    async def _live_sessions(self, now: datetime) -> dict[str, Session]:
        """Every live session, by id (in the order of their ids): the last read's, with those the change feed names
        since read again; or all of them read (the first read, every :data:`RESYNC_INTERVAL`, or when the feed cannot
        vouch for what changed)."""
        changed = await self.feed.changed(now)
        if changed is None:
            await self.feed.resyncing(now)
            live = [s for s in await self.store.get_many(sorted(await self.store.live_ids())) if s is not None]
            self._live = {s.id: s for s in live}
            self.feed.caught_up()
            return dict(self._live)
        ids = sorted(changed)
        kept = self._live
        added = False
        for session_id, session in zip(ids, await self.store.get_many(ids), strict=True):
            if session is None or session.status.is_terminal:
                kept.pop(session_id, None)
            else:
                added = added or session_id not in kept
                kept[session_id] = session
        if added:  # a session written in place keeps its place; a new one goes where its id sorts
            self._live = kept = {i: kept[i] for i in sorted(kept)}
        self.feed.caught_up()
        return dict(kept)

    async def _checks_input(self, pending: Sequence[PendingSession], sessions: Mapping[str, Session]) -> dict[str, Any]:
        wanted = {dep for session in pending for dep in session.dependencies}
        missing = sorted(wanted - sessions.keys())
        found = {i: s for i, s in zip(missing, await self.store.get_many(missing), strict=True) if s}
        users = await self.policies.users(s.user for s in pending)
        projects = await self.policies.projects(s.project for s in pending if s.project)
        return {
            "dependency_states": {dep: dependency_state(sessions.get(dep) or found.get(dep)) for dep in wanted},
            "user_policies": {
                u: UserPolicy(p.max_concurrent_sessions, p.total_resource_slots) for u, p in users.items()
            },
            "project_policies": {name: ProjectPolicy(p.total_resource_slots) for name, p in projects.items()},
        }

    async def _roundrobin(self) -> dict[str, int]:
        stored = text_hash(await self.store.redis.hgetall(self.store.keys.scheduler_roundrobin))
        return {group: int(index) for group, index in stored.items()}


def host_ports(allocs: Sequence[Json], live: Sequence[Session]) -> dict[str, set[int]]:
    """Node id -> the host ports held there (:attr:`PassInput.host_ports`)."""
    used = host_ports_in_use(allocs)
    for session in live:
        if session.status not in OCCUPYING or not session.kernels:
            continue
        main = session.main_kernel
        if main.agent and main.alloc_id is None:
            taken = set(session.preferred_ports_taken)
            granted = {a.preferred_port for a in session.apps if a.preferred_port is not None and a.name not in taken}
            used.setdefault(main.agent, set()).update(granted)
    return used
