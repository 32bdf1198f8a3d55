"""The snapshot's conversions, pure: Nomad nodes and allocations into agents, Caravan sessions into the pass's input.

Node and allocation documents have the shapes Nomad 1.11 returns for ``/v1/nodes?resources=true`` and
``/v1/allocations?resources=true`` (only the fields read are kept).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from domain.model import ClusterMode as SessionClusterMode
from domain.model import Driver, Kernel, Session, SessionResult, SessionStatus, SessionType
from domain.scheduling_config import SchedulingConfig, parse_scheduling_config
from domain.slots import ResourceSlots
from nomad_jobs.agents import agents_of, alloc_slots, is_schedulable, kernel_request, mhz_per_core, node_capacity
from scheduler.pass_model import ClusterMode, DependencyState
from scheduler.snapshot import (
    dependency_state,
    pending_session,
    requiring_driver,
    running_session,
    timed_out,
    timed_out_ids,
)

S = SessionStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIB = 1024 * 1024
PREFIX = "cv"
CONFIG = SchedulingConfig()


def node(
    node_id: str,
    *,
    shares: int = 4000,
    cores: int = 4,
    mem_mb: int = 4096,
    pool: str = "default",
    status: str = "ready",
    eligibility: str = "eligible",
    drain: bool = False,
    reserved_shares: int = 0,
    reserved_mb: int = 0,
    mock: tuple[bool, ...] = (),
) -> dict[str, Any]:
    devices = (
        [
            {
                "Vendor": "nomad",
                "Type": "file",
                "Name": "mock",
                "Instances": [{"ID": f"d{i}", "Healthy": healthy} for i, healthy in enumerate(mock)],
            }
        ]
        if mock
        else None
    )
    return {
        "ID": node_id,
        "Name": node_id,
        "NodePool": pool,
        "Status": status,
        "SchedulingEligibility": eligibility,
        "Drain": drain,
        "NodeResources": {
            "Cpu": {"CpuShares": shares, "TotalCpuCores": cores},
            "Memory": {"MemoryMB": mem_mb},
            "Devices": devices,
        },
        "ReservedResources": {"Cpu": {"CpuShares": reserved_shares}, "Memory": {"MemoryMB": reserved_mb}},
    }


def alloc(
    node_id: str,
    job: str,
    group: str = "main1",
    *,
    shares: int = 1000,
    mem_mb: int = 256,
    mock_ids: tuple[str, ...] = (),
) -> dict[str, Any]:
    devices = [{"Vendor": "nomad", "Type": "file", "Name": "mock", "DeviceIDs": list(mock_ids)}] if mock_ids else None
    task = {"Cpu": {"CpuShares": shares}, "Memory": {"MemoryMB": mem_mb}, "Devices": devices}
    return {"NodeID": node_id, "JobID": job, "TaskGroup": group, "AllocatedResources": {"Tasks": {"kernel": task}}}


def kernel(hostname: str = "main1", *, agent: str | None = None, cpu: str = "1", mem: int = 256 * MIB) -> Kernel:
    return Kernel(
        role="main" if hostname == "main1" else "sub",
        index=1,
        hostname=hostname,
        image="",
        resources={"cpu": cpu, "mem": str(mem)},
        agent=agent,
    )


def session(session_id: str, status: S = S.PENDING, *kernels: Kernel, **fields: Any) -> Session:
    return Session(
        id=session_id,
        name=session_id,
        owner_id="u",
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="",
        resources={},
        kernels=kernels or (kernel(),),
        created_at=T0,
        status=status,
        **fields,
    )


def slots(**amounts: object) -> ResourceSlots:
    return ResourceSlots.of(amounts)  # type: ignore[arg-type]


# -- nodes --


def test_capacity_is_what_the_node_reports_minus_its_reservation() -> None:
    reported = node("n1", shares=5000, mem_mb=4096, reserved_shares=1000, reserved_mb=1024, mock=(True, False, True))
    assert node_capacity(reported, 1000, CONFIG.devices) == slots(
        cpu=4, mem="3g", **{"mock.device": 2}
    )  # unhealthy: not


def test_cpu_cores_are_mhz_over_the_clusters_mhz_per_core() -> None:
    assert mhz_per_core([node("a", shares=4890, cores=2), node("b", shares=8000, cores=4)], None) == 2000
    assert mhz_per_core([node("a", shares=4890, cores=2)], configured=1000) == 1000
    assert mhz_per_core([], None) == 1000
    assert node_capacity(node("a", shares=4890, cores=2), 2445, CONFIG.devices).amount("cpu") == 2


def shares_node(node_id: str, healthy: tuple[bool, ...], *, devices: int = 2) -> dict[str, Any]:
    """A node offering ``devices`` simulated devices of ``len(healthy)`` shares each, as Caravan's plugin reports."""
    reported = node(node_id)
    reported["NodeResources"]["Devices"] = [
        {
            "Vendor": "caravan-sim",
            "Type": "gpu-share",
            "Name": f"SimGPU@gpu{d}",
            "Attributes": {"shares": {"Int": len(healthy)}, "model": {"String": "SimGPU"}},
            "Instances": [{"ID": f"gpu{d}-s{i}", "Healthy": ok} for i, ok in enumerate(healthy)],
        }
        for d in range(devices)
    ]
    return reported


def test_a_share_counts_one_kth_of_a_device() -> None:
    reported = shares_node("n", (True, True, True, False))
    assert node_capacity(reported, 1000, CONFIG.devices).amount("sim.shares") == Decimal(
        "1.5"
    )  # 3 healthy of 4 shares, on each of 2 devices
    held = alloc("n", "etl")
    held["AllocatedResources"]["Tasks"]["kernel"]["Devices"] = [
        {"Vendor": "caravan-sim", "Type": "gpu-share", "Name": "SimGPU@gpu1", "DeviceIDs": ["gpu1-s0", "gpu1-s1"]}
    ]
    [agent] = agents_of([reported], [held], {}, PREFIX, 1000, CONFIG.devices)
    assert agent.occupied.amount("sim.shares") == Decimal("0.5")


def test_configured_device_names_are_used() -> None:
    config = parse_scheduling_config('device_slots = { "nomad/file" = "fpga.device" }', "s.hcl")
    assert node_capacity(node("n", mock=(True,)), 1000, config.devices).amount("fpga.device") == 1


@pytest.mark.parametrize(
    ("status", "eligibility", "drain", "schedulable"),
    [
        ("ready", "eligible", False, True),
        ("down", "eligible", False, False),
        ("initializing", "eligible", False, False),
        ("ready", "ineligible", False, False),
        ("ready", "eligible", True, False),
        ("disconnected", "eligible", False, False),
    ],
)
def test_only_ready_eligible_undrained_nodes_take_sessions(
    status: str, eligibility: str, drain: bool, schedulable: bool
) -> None:
    assert is_schedulable(node("n", status=status, eligibility=eligibility, drain=drain)) is schedulable


# -- occupancy --


def test_allocations_count_whoever_started_them() -> None:
    assert alloc_slots(alloc("n", "etl", shares=500, mem_mb=100, mock_ids=("d0",)), 1000, CONFIG.devices) == slots(
        cpu="0.5", mem=100 * MIB, **{"mock.device": 1}
    )
    [agent] = agents_of(
        [node("n")],
        [alloc("n", "etl", shares=1500, mem_mb=512), alloc("n", "web", shares=500)],
        {},
        PREFIX,
        1000,
        CONFIG.devices,
    )
    assert agent.occupied == slots(cpu=2, mem=768 * MIB)


def test_a_caravan_kernel_counts_at_least_what_it_asked_for() -> None:
    # Nomad tracks the MHz and MiB it was given; a device the job does not claim would be missed
    running = session(
        "s1",
        S.RUNNING,
        Kernel(
            role="main",
            index=1,
            hostname="main1",
            image="",
            resources={"cpu": "2", "mem": str(100 * MIB), "mock.device": "1"},
        ),
    )
    [agent] = agents_of(
        [node("n", mock=(True, True))],
        [alloc("n", f"{PREFIX}-s1", shares=1999, mem_mb=100)],
        {"s1": running},
        PREFIX,
        1000,
        CONFIG.devices,
    )
    assert agent.occupied == slots(cpu=2, mem=100 * MIB, **{"mock.device": 1})


def test_placements_nomad_does_not_show_yet_count_on_their_agent() -> None:
    scheduled = session(
        "s1",
        S.SCHEDULED,
        kernel(agent="a"),
        kernel("sub1", agent="b", cpu="2"),
        cluster_mode=SessionClusterMode.MULTI_NODE,
    )
    preparing_visible = session("s2", S.PREPARING, kernel(agent="a"))
    running_gone = session("s3", S.RUNNING, kernel(agent="a"))  # its allocation ended: nothing held
    pending = session("s4", S.PENDING, kernel(agent=None))
    other_prefix = alloc("a", "other-s2", shares=500, mem_mb=16)  # another Caravan's job: foreign work
    agents = agents_of(
        [node("a"), node("b")],
        [alloc("a", f"{PREFIX}-s2"), other_prefix],
        {s.id: s for s in (scheduled, preparing_visible, running_gone, pending)},
        PREFIX,
        1000,
        CONFIG.devices,
    )
    occupied = {a.id: a.occupied for a in agents}
    assert occupied["a"] == slots(cpu="2.5", mem=528 * MIB)  # s1's main1 + s2 once + the foreign job
    assert occupied["b"] == slots(cpu=2, mem=256 * MIB)


def test_agents_are_sorted_and_carry_their_node_pool() -> None:
    agents = agents_of([node("b", pool="gpu"), node("a", drain=True)], [], {}, PREFIX, 1000, CONFIG.devices)
    assert [(a.id, a.resource_group, a.schedulable) for a in agents] == [("a", "default", False), ("b", "gpu", True)]


# -- sessions --


def test_memory_is_counted_as_nomad_reserves_it() -> None:
    assert kernel_request(kernel(mem=100 * MIB + 1)).amount("mem") == 101 * MIB
    assert kernel_request(kernel(mem=MIB)).amount("mem") == 16 * MIB


def test_a_pending_session_keeps_its_scheduling_fields() -> None:
    kernels = (kernel(cpu="0.5"), kernel("sub1", cpu="0.5"))
    stored = session(
        "s",
        S.PENDING,
        *kernels,
        cluster_mode=SessionClusterMode.MULTI_NODE,
        priority=30,
        project="p",
        retries=2,
        starts_at=T0 + timedelta(hours=1),
        dependencies=("d1",),
    )
    pending = pending_session(stored)
    assert [k.role for k in pending.kernels] == ["main1", "sub1"]
    assert pending.requested == slots(cpu=1, mem="512m")
    assert (pending.cluster_mode, pending.priority, pending.project, pending.retries) == (
        ClusterMode.MULTI_NODE,
        30,
        "p",
        2,
    )
    assert (pending.starts_at, pending.dependencies, pending.user) == (T0 + timedelta(hours=1), ("d1",), "u")


def test_a_designated_session_asks_for_its_agents_own_slot() -> None:
    pending = pending_session(session("s", designated_agent="n2"))
    assert pending.kernels[0].requested.amount("designated:n2") == Decimal(1)


def test_a_session_asking_for_its_driver_in_one_step_asks_as_in_two() -> None:
    # the snapshot's as_pending makes each distinct request once (memoized): the same request, made of the same slots
    # as the reference's two steps, for repeated, designated and multi-kernel sessions alike
    stored = [
        session("a"),
        session("b"),
        session("c", designated_agent="n2"),
        session("d", S.PENDING, kernel(cpu="0.5", mem=MIB), kernel("sub1", cpu="2")),
    ]
    for one in stored:
        assert pending_session(one, driver="docker") == requiring_driver(pending_session(one), "docker")
    first, second = (pending_session(one, driver="docker") for one in stored[:2])
    assert first.kernels[0].requested is second.kernels[0].requested  # one request shared: slots are immutable
    assert stored[0].kernels[0].resources == {"cpu": "1", "mem": str(256 * MIB)}  # the session's own left as it was


def test_a_running_session_occupies_the_sum_of_its_kernels_requests() -> None:
    two = session("s", S.RUNNING, kernel(cpu="0.5", mem=MIB), kernel("sub1", cpu="2"))
    assert running_session(two).occupied == slots(cpu="2.5", mem=str(16 * MIB + 256 * MIB))
    assert running_session(session("t", S.RUNNING)).occupied == kernel_request(kernel())


@pytest.mark.parametrize(
    ("status", "result", "state"),
    [
        (S.TERMINATED, SessionResult.SUCCESS, DependencyState.DONE),
        (S.TERMINATED, SessionResult.FAILURE, DependencyState.FAILED),
        (S.TERMINATED, SessionResult.UNDEFINED, DependencyState.FAILED),
        (S.CANCELLED, SessionResult.UNDEFINED, DependencyState.FAILED),
        (S.ERROR, SessionResult.UNDEFINED, DependencyState.FAILED),
        (S.PENDING, SessionResult.UNDEFINED, DependencyState.WAITING),
        (S.RUNNING, SessionResult.UNDEFINED, DependencyState.WAITING),
        (S.TERMINATING, SessionResult.UNDEFINED, DependencyState.WAITING),
    ],
    ids=lambda v: getattr(v, "value", str(v)),
)
def test_dependency_states(status: S, result: SessionResult, state: DependencyState) -> None:
    assert dependency_state(session("d", status, result=result)) is state


def test_a_vanished_dependency_has_failed() -> None:
    assert dependency_state(None) is DependencyState.FAILED


def test_pending_timeout_counts_from_the_start_time() -> None:
    config = parse_scheduling_config(
        'default {\n pending_timeout = "10m"\n}\nresource_group "slow" {\n pending_timeout = 0\n}', "s.hcl"
    )
    later = T0 + timedelta(minutes=11)
    assert timed_out(session("s"), config, later)
    assert not timed_out(session("s"), config, T0 + timedelta(minutes=10))
    assert not timed_out(session("s", resource_group="slow"), config, later)
    assert not timed_out(session("s", starts_at=T0 + timedelta(minutes=5)), config, later)
    # the snapshot's reading of many at once (each group's timeout looked up once): the same sessions, in order
    waiting = [
        session("a"),
        session("b", resource_group="slow"),
        session("c", starts_at=T0 + timedelta(minutes=5)),
        session("d", starts_at=T0 - timedelta(minutes=1)),
    ]
    for moment in (T0 + timedelta(minutes=10), later, T0 + timedelta(minutes=16)):
        assert timed_out_ids(waiting, config, moment) == tuple(s.id for s in waiting if timed_out(s, config, moment))
    assert timed_out_ids(waiting, CONFIG, later) == ()  # no timeout at all
