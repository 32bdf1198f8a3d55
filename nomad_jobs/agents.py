"""Nomad's client nodes and allocations read as Caravan agents (capacity and occupancy in slots). Pure.

- capacity: ``cpu`` = (CpuShares − reserved) / MHz per core, ``mem`` = (MemoryMB − reserved) MiB, and per device
  group its healthy instances, as the slot ``devices.catalog`` names (``caravan-sim/gpu`` -> ``sim.device``), a share
  counting 1/K (``caravan-sim/gpu-share`` -> ``sim.shares``: four healthy shares of one device are 1). MHz
  per core is the configured ``cpu_mhz_per_core`` or the smallest CpuShares / TotalCpuCores any node reports, so a
  core asked for is the MHz the job asks Nomad for and both count alike.
- occupied: every allocation Nomad counts on the node (Caravan's or not, any namespace); a Caravan kernel's
  allocation counts at least what the kernel asked for (what Nomad does not track, such as a rounding, still counts),
  and the kernels of SCHEDULED / PREPARING sessions whose allocation Nomad does not show yet count on their agent.
- schedulable: ready, eligible and not draining.

The scheduler's pass reads them (``scheduler.snapshot``), and so does the gateway's ``resourceGroups``: both count
alike.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from devices.catalog import Device, DeviceCatalog, units_of
from domain.agents import Agent
from domain.model import Kernel, Session, SessionStatus, SessionType
from domain.slots import ResourceSlots
from nomad_jobs.meta import session_id_of

S = SessionStatus
MIB = 1024 * 1024
MIN_MEM_MIB = 16
DEFAULT_MHZ_PER_CORE = 1000
OCCUPYING = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATING})
NOT_YET_VISIBLE = frozenset({S.SCHEDULED, S.PREPARING})
Json = Mapping[str, Any]


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
    return frozenset(
        name
        for name, info in drivers.items()
        if isinstance(info, Mapping) and info.get("Detected") and info.get("Healthy")
    )


def allowed_drivers(drivers: frozenset[str], capabilities: Json) -> frozenset[str]:
    """Those of ``drivers`` a job may use in a namespace with ``capabilities`` (``GET /v1/namespace/:name``), by
    Nomad's own rule: only the enabled ones when some are listed, never a disabled one (``raw_exec`` on a stack that
    runs it only for the platform's jobs)."""
    enabled = set(capabilities.get("EnabledTaskDrivers") or ())
    disabled = set(capabilities.get("DisabledTaskDrivers") or ())
    return frozenset(d for d in drivers if (not enabled or d in enabled) and d not in disabled)


def node_capacity(node: Json, mhz: int, devices: DeviceCatalog) -> ResourceSlots:
    shares = int(_dig(node, "NodeResources", "Cpu").get("CpuShares") or 0)
    shares -= int(_dig(node, "ReservedResources", "Cpu").get("CpuShares") or 0)
    memory = int(_dig(node, "NodeResources", "Memory").get("MemoryMB") or 0)
    memory -= int(_dig(node, "ReservedResources", "Memory").get("MemoryMB") or 0)
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    amounts["cpu"] = Decimal(max(shares, 0)) / mhz
    amounts["mem"] = Decimal(max(memory, 0) * MIB)
    for group in _dig(node, "NodeResources").get("Devices") or []:
        slot = devices.slot_of(*_device(group))
        healthy = sum(1 for instance in group.get("Instances") or [] if instance.get("Healthy"))
        amounts[slot] += Decimal(healthy) / units_of(group.get("Attributes"))
    return ResourceSlots(amounts)


DeviceUnits = Mapping[tuple[str, Device], int]
"""(node id, device group) -> instances per device (:func:`devices.catalog.units_of`), for the groups that are not 1."""


def device_units(nodes: Iterable[Json]) -> dict[tuple[str, Device], int]:
    return {
        (str(node.get("ID")), _device(group)): units
        for node in nodes
        for group in _dig(node, "NodeResources").get("Devices") or []
        if (units := units_of(group.get("Attributes"))) != 1
    }


def alloc_slots(alloc: Json, mhz: int, devices: DeviceCatalog, units: DeviceUnits | None = None) -> ResourceSlots:
    """What an allocation holds on its node (every task; Nomad's ``MB`` are MiB; a share counts 1/K of a device,
    ``units`` saying K per node and group)."""
    node = str(alloc.get("NodeID"))
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    for task in (_dig(alloc, "AllocatedResources").get("Tasks") or {}).values():
        amounts["cpu"] += Decimal(int(_dig(task, "Cpu").get("CpuShares") or 0)) / mhz
        amounts["mem"] += int(_dig(task, "Memory").get("MemoryMB") or 0) * MIB
        for device in task.get("Devices") or []:
            slot = devices.slot_of(*_device(device))
            per_device = (units or {}).get((node, _device(device)), 1)
            amounts[slot] += Decimal(len(device.get("DeviceIDs") or [])) / per_device
    return ResourceSlots(amounts)


def devices_of(nodes: Iterable[Json]) -> list[tuple[Device, int]]:
    """Every device group the nodes report, as (vendor, type, name) with its instances per device."""
    return [
        (_device(group), units_of(group.get("Attributes")))
        for node in nodes
        for group in _dig(node, "NodeResources").get("Devices") or []
    ]


def _device(group: Json) -> Device:
    return str(group.get("Vendor")), str(group.get("Type")), str(group.get("Name"))


def kernel_request(kernel: Kernel) -> ResourceSlots:
    """What the kernel takes on its agent: its slots, with ``mem`` as Nomad reserves it (whole MiB, at least 16)."""
    return _request(tuple(kernel.resources.items()))


@functools.lru_cache(maxsize=4096)
def _request(resources: tuple[tuple[str, str], ...]) -> ResourceSlots:
    # kernels' resources repeat (presets) and slots are immutable: each distinct request is parsed once (at 100,000
    # live sessions, parsing them was most of the scheduler's first read, bench/scale_redis)
    requested = ResourceSlots.from_json(dict(resources))
    mem = requested.amount("mem")
    reserved = max(MIN_MEM_MIB, math.ceil(mem / MIB)) * MIB
    return requested + {"mem": Decimal(reserved) - mem}


def agents_of(
    nodes: Sequence[Json],
    allocs: Iterable[Json],
    sessions: Mapping[str, Session],
    job_prefix: str,
    mhz: int,
    devices: DeviceCatalog,
) -> tuple[Agent, ...]:
    occupied: dict[str, ResourceSlots] = defaultdict(ResourceSlots)
    seen: set[tuple[str, str]] = set()  # (session id, kernel hostname) whose allocation Nomad shows
    units = device_units(nodes)
    for alloc in allocs:
        used = alloc_slots(alloc, mhz, devices, units)
        session = sessions.get(session_id_of(job_prefix, str(alloc.get("JobID", ""))) or "")
        kernel = _kernel(session, str(alloc.get("TaskGroup"))) if session and session.status in OCCUPYING else None
        if session is not None and kernel is not None:
            used = _at_least(used, kernel_request(kernel))
            seen.add((session.id, kernel.hostname))
        occupied[str(alloc.get("NodeID"))] += used
    for session in sessions.values():
        # A live endpoint's new replica holds its agent from the autoscaler's placement on, as a new session does.
        scaling = session.type is SessionType.INFERENCE and session.status in OCCUPYING
        if session.status in NOT_YET_VISIBLE or scaling:
            for kernel in session.kernels:
                if kernel.agent and not kernel.parked and (session.id, kernel.hostname) not in seen:
                    occupied[kernel.agent] += kernel_request(kernel)
    return tuple(
        Agent(
            str(node["ID"]),
            str(node.get("NodePool") or "default"),
            node_capacity(node, mhz, devices),
            occupied[str(node["ID"])],
            is_schedulable(node),
        )
        for node in sorted(nodes, key=lambda n: str(n["ID"]))
    )


def host_ports_in_use(allocs: Iterable[Json]) -> dict[str, set[int]]:
    """Node id -> the host ports its live allocations hold (any job, any namespace; static and dynamic alike): the
    group's ports (``Shared.Ports``, ``Shared.Networks``) and the tasks' (``Tasks.*.Networks``)."""
    used: dict[str, set[int]] = {}
    for alloc in allocs:
        resources = _dig(alloc, "AllocatedResources")
        shared = resources.get("Shared") or {}
        networks = [*(shared.get("Networks") or ())]
        for task in (resources.get("Tasks") or {}).values():
            networks += (task or {}).get("Networks") or ()
        ports = [*(shared.get("Ports") or ())]
        for network in networks:
            ports += [*((network or {}).get("ReservedPorts") or ()), *((network or {}).get("DynamicPorts") or ())]
        held = used.setdefault(str(alloc.get("NodeID")), set())
        held.update(int(port["Value"]) for port in ports if isinstance(port, dict) and port.get("Value"))
    return used


def _kernel(session: Session, hostname: str) -> Kernel | None:
    return next((k for k in session.kernels if k.hostname == hostname), None)


def _at_least(a: ResourceSlots, b: ResourceSlots) -> ResourceSlots:
    return ResourceSlots({slot: max(a.amount(slot), b.amount(slot)) for slot in {*a, *b}})


def _dig(doc: Json, *path: str) -> Json:
    for key in path:
        doc = doc.get(key) or {}
    return doc
