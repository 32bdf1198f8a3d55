"""A pass's input, read from Redis and Nomad: two Nomad calls (nodes, live allocations) and a handful of Redis reads
per pass, however many sessions wait.

Agents are Nomad client nodes; an agent's resource group is its node pool.

- capacity: ``cpu`` = (CpuShares − reserved) / MHz per core, ``mem`` = (MemoryMB − reserved) MiB, and per device
  group its healthy instances, as the slot ``SchedulingConfig.device_slot`` names (``nomad/file/mock`` ->
  ``mock.device``). MHz per core is the configured ``cpu_mhz_per_core`` or the smallest CpuShares / TotalCpuCores any
  node reports, so a core asked for is the MHz the job asks Nomad for and both count alike.
- occupied: every allocation Nomad counts on the node (Caravan's or not, any namespace); a Caravan kernel's
  allocation counts at least what the kernel asked for (what Nomad does not track, such as a rounding, still counts),
  and the kernels of SCHEDULED / PREPARING sessions whose allocation Nomad does not show yet count on their agent.
- schedulable: ready, eligible and not draining.
- drivers: a session needs its task driver detected and healthy on the node. Like a designated agent, it asks for one
  unit of a slot ``driver:<name>`` that only such agents have (added only for drivers some pending session wants, and
  never recorded as a slot type), so a session whose driver no agent offers waits with ``never-fits: no schedulable
  agent of resource group … has driver:docker``, and blocks nobody. Unlike a device kind, an offered driver does not
  make an agent rank later for sessions that do not use it (``scheduler.agents.ranking``).

A session designated to an agent (admins) asks for one unit of a slot ``designated:<node id>`` that only that agent
has, so the pass places it there or explains why not; while it waits, other sessions prefer other agents (an agent
with a kind of slot a session does not use ranks after those without).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from domain.model import ClusterMode as SessionClusterMode
from domain.model import Kernel, Session, SessionResult, SessionStatus
from stores.resource_policies import PolicyStore
from stores.sessions import SessionStore
from nomad_jobs.client import NomadClient
from nomad_jobs.meta import session_id_of
from scheduler.agents.ranking import DRIVER_MARKER
from domain.scheduling_config import SchedulingConfig
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
from domain.slots import ResourceSlots, SlotType, accumulate_slot_types

__all__ = ["PassInput", "SnapshotReader", "agents_of", "alloc_slots", "dependency_state", "device_ids",
           "healthy_drivers", "is_schedulable", "kernel_request", "mhz_per_core", "node_capacity", "pending_session",
           "requiring_driver", "timed_out", "with_wanted_slots"]

S = SessionStatus
MIB = 1024 * 1024
MIN_MEM_MIB = 16
DEFAULT_MHZ_PER_CORE = 1000
OCCUPYING = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATING})
NOT_YET_VISIBLE = frozenset({S.SCHEDULED, S.PREPARING})
DESIGNATED = "designated:"
DESIGNATED_CAPACITY = 1_000_000
DRIVER = DRIVER_MARKER
Json = Mapping[str, Any]


# -- Nomad's view, converted --


def mhz_per_core(nodes: Iterable[Json], configured: int | None) -> int:
    if configured:
        return configured
    ratios = [
        int(cpu["CpuShares"]) // int(cpu["TotalCpuCores"])
        for cpu in (_dig(node, "NodeResources", "Cpu") for node in nodes)
        if cpu.get("CpuShares") and cpu.get("TotalCpuCores")
    ]
    return max(1, min(ratios)) if ratios else DEFAULT_MHZ_PER_CORE


def is_schedulable(node: Json) -> bool:
    return node.get("Status") == "ready" and node.get("SchedulingEligibility") == "eligible" and not node.get("Drain")


def healthy_drivers(node: Json) -> frozenset[str]:
    """Task drivers the node has detected and reports healthy (``/v1/nodes`` carries them per node)."""
    drivers: Json = node.get("Drivers") or {}
    return frozenset(name for name, info in drivers.items()
                     if isinstance(info, Mapping) and info.get("Detected") and info.get("Healthy"))


def device_ids(nodes: Iterable[Json], config: SchedulingConfig) -> dict[str, str]:
    """Device slot -> the Nomad device id a job asks for to reserve it: ``vendor/type/name`` when every device
    counted as that slot is the same, else the part they share (``vendor/type``, then ``type``)."""
    seen: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for node in nodes:
        for group in _dig(node, "NodeResources").get("Devices") or []:
            device = (str(group.get("Vendor")), str(group.get("Type")), str(group.get("Name")))
            seen[config.device_slot(*device)].add(device)
    found: dict[str, str] = {}
    for slot, devices in seen.items():
        vendors, kinds = {d[0] for d in devices}, {d[1] for d in devices}
        if len(kinds) != 1:
            continue  # different kinds of device under one slot: no single device block asks for them
        (vendor, kind, name) = next(iter(devices))
        found[slot] = (f"{vendor}/{kind}/{name}" if len(devices) == 1 else
                       f"{vendor}/{kind}" if len(vendors) == 1 else kind)
    return found


def node_capacity(node: Json, mhz: int, config: SchedulingConfig) -> ResourceSlots:
    shares = int(_dig(node, "NodeResources", "Cpu").get("CpuShares") or 0)
    shares -= int(_dig(node, "ReservedResources", "Cpu").get("CpuShares") or 0)
    memory = int(_dig(node, "NodeResources", "Memory").get("MemoryMB") or 0)
    memory -= int(_dig(node, "ReservedResources", "Memory").get("MemoryMB") or 0)
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    amounts["cpu"] = Decimal(max(shares, 0)) / mhz
    amounts["mem"] = Decimal(max(memory, 0) * MIB)
    for group in _dig(node, "NodeResources").get("Devices") or []:
        slot = config.device_slot(str(group.get("Vendor")), str(group.get("Type")), str(group.get("Name")))
        amounts[slot] += sum(1 for instance in group.get("Instances") or [] if instance.get("Healthy"))
    return ResourceSlots(amounts)


def alloc_slots(alloc: Json, mhz: int, config: SchedulingConfig) -> ResourceSlots:
    """What an allocation holds on its node (every task; Nomad's ``MB`` are MiB)."""
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    for task in (_dig(alloc, "AllocatedResources").get("Tasks") or {}).values():
        amounts["cpu"] += Decimal(int(_dig(task, "Cpu").get("CpuShares") or 0)) / mhz
        amounts["mem"] += int(_dig(task, "Memory").get("MemoryMB") or 0) * MIB
        for device in task.get("Devices") or []:
            slot = config.device_slot(str(device.get("Vendor")), str(device.get("Type")), str(device.get("Name")))
            amounts[slot] += len(device.get("DeviceIDs") or [])
    return ResourceSlots(amounts)


# -- Caravan's sessions, converted --


def kernel_request(kernel: Kernel) -> ResourceSlots:
    """What the kernel takes on its agent: its slots, with ``mem`` as Nomad reserves it (whole MiB, at least 16)."""
    requested = ResourceSlots.from_json(kernel.resources)
    mem = requested.amount("mem")
    reserved = max(MIN_MEM_MIB, math.ceil(mem / MIB)) * MIB
    return requested + {"mem": Decimal(reserved) - mem}


def pending_session(session: Session) -> PendingSession:
    designated = {f"{DESIGNATED}{session.designated_agent}": Decimal(1)} if session.designated_agent else {}
    return PendingSession(
        id=session.id,
        user=session.owner_id,
        resource_group=session.resource_group,
        created_at=session.created_at,
        kernels=tuple(KernelRequest(k.hostname, kernel_request(k) + designated) for k in session.kernels),
        project=session.project,
        priority=session.priority,
        cluster_mode=ClusterMode.MULTI_NODE if session.cluster_mode is SessionClusterMode.MULTI_NODE
        else ClusterMode.SINGLE_NODE,
        starts_at=session.starts_at,
        dependencies=session.dependencies,
        retries=session.retries,
    )


def requiring_driver(pending: PendingSession, driver: str) -> PendingSession:
    """The session asking every kernel's agent for one unit of ``driver:<driver>`` (see ``with_wanted_slots``)."""
    needs = {f"{DRIVER}{driver}": Decimal(1)}
    return replace(pending, kernels=tuple(replace(k, requested=k.requested + needs) for k in pending.kernels))


def running_session(session: Session) -> RunningSession:
    occupied = ResourceSlots()
    for kernel in session.kernels:
        occupied += kernel_request(kernel)
    return RunningSession(session.id, session.owner_id, session.resource_group, occupied, session.project)


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


def agents_of(nodes: Sequence[Json], allocs: Iterable[Json], sessions: Mapping[str, Session], job_prefix: str,
              mhz: int, config: SchedulingConfig) -> tuple[Agent, ...]:
    occupied: dict[str, ResourceSlots] = defaultdict(ResourceSlots)
    seen: set[tuple[str, str]] = set()  # (session id, kernel hostname) whose allocation Nomad shows
    for alloc in allocs:
        used = alloc_slots(alloc, mhz, config)
        session = sessions.get(session_id_of(job_prefix, str(alloc.get("JobID", ""))) or "")
        kernel = _kernel(session, str(alloc.get("TaskGroup"))) if session and session.status in OCCUPYING else None
        if session is not None and kernel is not None:
            used = _at_least(used, kernel_request(kernel))
            seen.add((session.id, kernel.hostname))
        occupied[str(alloc.get("NodeID"))] += used
    for session in sessions.values():
        if session.status in NOT_YET_VISIBLE:
            for kernel in session.kernels:
                if kernel.agent and (session.id, kernel.hostname) not in seen:
                    occupied[kernel.agent] += kernel_request(kernel)
    return tuple(
        Agent(str(node["ID"]), str(node.get("NodePool") or "default"), node_capacity(node, mhz, config),
              occupied[str(node["ID"])], is_schedulable(node))
        for node in sorted(nodes, key=lambda n: str(n["ID"]))
    )


def with_wanted_slots(agents: tuple[Agent, ...], drivers: Mapping[str, frozenset[str]],
                      pending: Iterable[PendingSession]) -> tuple[Agent, ...]:
    """Agents with the marker slots pending sessions ask for: ``designated:<own id>``, and ``driver:<name>`` for each
    wanted driver that ``drivers`` (agent id -> healthy drivers) says the agent has. Unlimited: only presence counts."""
    wanted = {slot for session in pending for kernel in session.kernels for slot in kernel.requested
              if slot.startswith((DESIGNATED, DRIVER))}
    if not wanted:
        return agents
    marked = []
    for a in agents:
        offered = {f"{DESIGNATED}{a.id}", *(f"{DRIVER}{name}" for name in drivers.get(a.id, ()))} & wanted
        extra = {slot: Decimal(DESIGNATED_CAPACITY) for slot in offered}
        marked.append(replace(a, capacity=a.capacity + extra) if extra else a)
    return tuple(marked)


def _kernel(session: Session, hostname: str) -> Kernel | None:
    return next((k for k in session.kernels if k.hostname == hostname), None)


def _at_least(a: ResourceSlots, b: ResourceSlots) -> ResourceSlots:
    return ResourceSlots({slot: max(a.amount(slot), b.amount(slot)) for slot in {*a, *b}})


def _dig(doc: Json, *path: str) -> Json:
    for key in path:
        doc = doc.get(key) or {}
    return doc


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
    device_ids: Mapping[str, str]
    """Device slot -> Nomad device id, for the jobs' ``device`` blocks (see ``device_ids``)."""


class SnapshotReader:
    def __init__(self, store: SessionStore, policies: PolicyStore, nomad: NomadClient, config: SchedulingConfig,
                 job_prefix: str) -> None:
        self.store, self.policies, self.nomad = store, policies, nomad
        self.config, self.job_prefix = config, job_prefix

    async def read(self, now: datetime) -> PassInput:
        live = [s for s in await self.store.get_many(sorted(await self.store.live_ids())) if s is not None]
        sessions = {s.id: s for s in live}
        waiting = sorted((s for s in live if s.status is S.PENDING), key=lambda s: (s.created_at, s.id))
        expired = tuple(s.id for s in waiting if timed_out(s, self.config, now))
        pending = tuple(requiring_driver(pending_session(s), s.driver.value)
                        for s in waiting if s.id not in expired)
        nodes = await self.nomad.nodes()
        mhz = mhz_per_core(nodes, self.config.cpu_mhz_per_core)
        allocs = await self.nomad.live_allocations() if pending else []
        agents = agents_of(nodes, allocs, sessions, self.job_prefix, mhz, self.config)
        snapshot = Snapshot(
            agents=with_wanted_slots(agents, {str(n["ID"]): healthy_drivers(n) for n in nodes}, pending),
            pending=pending,
            running=tuple(running_session(s) for s in live if s.status in OCCUPYING),
            **(await self._checks_input(pending, sessions) if pending else {}),
            roundrobin_state=await self._roundrobin(),
        )
        slot_types = accumulate_slot_types(agent.capacity for agent in agents)
        return PassInput(snapshot, sessions, expired, mhz, slot_types, device_ids(nodes, self.config))

    async def _checks_input(self, pending: Sequence[PendingSession], sessions: Mapping[str, Session]) -> dict[str, Any]:
        wanted = {dep for session in pending for dep in session.dependencies}
        missing = sorted(wanted - sessions.keys())
        found = {**sessions, **{i: s for i, s in zip(missing, await self.store.get_many(missing), strict=True) if s}}
        users = await self.policies.users(s.user for s in pending)
        projects = await self.policies.projects(s.project for s in pending if s.project)
        return {
            "dependency_states": {dep: dependency_state(found.get(dep)) for dep in wanted},
            "user_policies": {u: UserPolicy(p.max_concurrent_sessions, p.total_resource_slots) for u, p in users.items()},
            "project_policies": {name: ProjectPolicy(p.total_resource_slots) for name, p in projects.items()},
        }

    async def _roundrobin(self) -> dict[str, int]:
        stored: dict[str, str] = await self.store.redis.hgetall(self.store.keys.scheduler_roundrobin)
        return {group: int(index) for group, index in stored.items()}


async def current_agents(store: SessionStore, nomad: NomadClient, config: SchedulingConfig,
                         job_prefix: str) -> tuple[list[Json], tuple[Agent, ...]]:
    """Nomad's client nodes and the agents they are now, occupancy counted as a pass counts it. Read-only: for the
    gateway's ``resourceGroups`` (two Nomad calls and two Redis reads)."""
    live = [s for s in await store.get_many(sorted(await store.live_ids())) if s is not None]
    nodes = await nomad.nodes()
    mhz = mhz_per_core(nodes, config.cpu_mhz_per_core)
    agents = agents_of(nodes, await nomad.live_allocations(), {s.id: s for s in live}, job_prefix, mhz, config)
    return list(nodes), agents
