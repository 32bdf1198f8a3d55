"""Task drivers in the snapshot: a session goes only to agents whose node has its driver detected and healthy, and a
session no agent can run says which driver is missing (and blocks nobody).

Nodes are shaped as ``/v1/nodes?resources=true`` returns them (only the fields read); the pass is the real pure core.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.scheduling_config import SchedulingConfig
from nomad_jobs.agents import agents_of, healthy_drivers
from scheduler.config import pass_config
from scheduler.pass_model import PassResult, Snapshot, WaitKind
from scheduler.scheduling_pass import run_pass
from scheduler.snapshot import pending_session, requiring_driver, with_wanted_slots

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = SchedulingConfig()
OK = {"Detected": True, "Healthy": True}
UNHEALTHY = {"Detected": True, "Healthy": False, "HealthDescription": "Docker is unhealthy"}
UNDETECTED = {"Detected": False, "Healthy": False}


def node(
    node_id: str,
    drivers: dict[str, dict[str, bool | str]],
    *,
    shares: int = 4000,
    devices: tuple[tuple[str, str, str], ...] = (),
) -> dict[str, Any]:
    return {
        "ID": node_id,
        "NodePool": "default",
        "Status": "ready",
        "SchedulingEligibility": "eligible",
        "Drain": False,
        "Drivers": drivers,
        "NodeResources": {
            "Cpu": {"CpuShares": shares, "TotalCpuCores": 4},
            "Memory": {"MemoryMB": 4096},
            "Devices": [
                {"Vendor": v, "Type": t, "Name": n, "Instances": [{"ID": "i", "Healthy": True}]} for v, t, n in devices
            ],
        },
    }


def session(session_id: str, driver: Driver, *, cpu: str = "1", at: int = 0) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources={"cpu": cpu, "mem": "268435456"})
    return Session(
        id=session_id,
        name=session_id,
        owner_id="u",
        type=SessionType.BATCH,
        driver=driver,
        image="",
        resources={},
        kernels=(kernel,),
        created_at=T0 + timedelta(seconds=at),
        status=SessionStatus.PENDING,
    )


def schedule(nodes: list[dict[str, Any]], sessions: list[Session]) -> PassResult:
    """What the snapshot reader does with these nodes and sessions, then one pass."""
    pending = tuple(requiring_driver(pending_session(s), s.driver.value) for s in sessions)
    agents = agents_of(nodes, [], {s.id: s for s in sessions}, "cv", 1000, CONFIG.devices)
    drivers = {str(n["ID"]): healthy_drivers(n) for n in nodes}
    return run_pass(
        Snapshot(with_wanted_slots(agents, drivers, pending), pending), pass_config(CONFIG), T0 + timedelta(1)
    )


@pytest.mark.parametrize(
    ("drivers", "healthy"),
    [
        ({"raw_exec": OK, "exec": OK}, {"raw_exec", "exec"}),
        ({"raw_exec": OK, "docker": UNHEALTHY}, {"raw_exec"}),
        ({"qemu": UNDETECTED}, set()),
        ({"docker": {"Detected": True}}, set()),  # health not reported yet
        ({}, set()),
    ],
)
def test_healthy_drivers(drivers: dict[str, dict[str, bool]], healthy: set[str]) -> None:
    assert healthy_drivers({"ID": "n", "Drivers": drivers}) == healthy
    assert healthy_drivers({"ID": "n"}) == frozenset()


@pytest.mark.parametrize(
    ("nodes", "driver", "placed_on"),
    [
        # the bigger node would win (dispersed), but its driver is unhealthy / not there
        ([node("big", {"docker": UNHEALTHY}, shares=8000), node("small", {"docker": OK})], Driver.DOCKER, "small"),
        ([node("big", {"raw_exec": OK}, shares=8000), node("small", {"qemu": OK})], Driver.QEMU, "small"),
        ([node("big", {"exec": UNDETECTED}, shares=8000), node("small", {"exec": OK})], Driver.EXEC, "small"),
        ([node("big", {"raw_exec": OK}, shares=8000), node("small", {"raw_exec": OK})], Driver.RAW_EXEC, "big"),
    ],
    ids=["docker-unhealthy", "qemu-elsewhere", "exec-undetected", "both-fine"],
)
def test_a_session_goes_only_where_its_driver_is_healthy(
    nodes: list[dict[str, Any]], driver: Driver, placed_on: str
) -> None:
    result = schedule(nodes, [session("s", driver)])
    assert [k.agent_id for k in result.placements["s"]] == [placed_on]


def test_a_session_no_agent_can_run_names_the_driver_and_blocks_nobody() -> None:
    nodes = [node("a", {"raw_exec": OK, "docker": UNHEALTHY}), node("b", {"raw_exec": OK})]
    result = schedule(
        nodes, [session("docker-first", Driver.DOCKER, at=0), session("raw-later", Driver.RAW_EXEC, at=1)]
    )
    waits = result.waiting["docker-first"]
    assert waits.kind is WaitKind.NEVER_FITS
    assert "driver:docker" in waits.message
    assert "raw-later" in result.placements  # strict FIFO, yet the hopeless session holds nobody back


def test_sessions_of_different_drivers_share_a_pass() -> None:
    nodes = [node("vm", {"qemu": OK, "raw_exec": OK}), node("plain", {"raw_exec": OK})]
    result = schedule(nodes, [session("q", Driver.QEMU), session("r1", Driver.RAW_EXEC, at=1)])
    assert result.placements["q"][0].agent_id == "vm"
    assert "r1" in result.placements


def test_driver_marker_slots_are_only_added_when_wanted() -> None:
    agents = agents_of([node("a", {"docker": OK})], [], {}, "cv", 1000, CONFIG.devices)
    assert with_wanted_slots(agents, {"a": frozenset({"docker"})}, ()) == agents


def test_a_driver_is_not_an_accelerator_kind_agents_are_spared_for() -> None:
    # the docker session fits nowhere; the raw_exec one still takes the roomier agent (dispersed), although that agent
    # also offers docker: unlike a GPU, a healthy driver is no scarce resource to keep free
    nodes = [node("big", {"raw_exec": OK, "docker": OK}, shares=8000), node("small", {"raw_exec": OK})]
    result = schedule(nodes, [session("huge", Driver.DOCKER, cpu="64"), session("raw", Driver.RAW_EXEC, at=1)])
    assert result.waiting["huge"].kind is WaitKind.NEVER_FITS
    assert result.placements["raw"][0].agent_id == "big"
