"""INFERENCE replicas as task groups: service port, health check, restart and reschedule (pure rendering, read back
with python-hcl2; tests/e2e/test_inference.py runs them on Nomad). And how their allocations read as observations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import hcl2
import pytest

from domain.inference import replicas_of
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from nomad_jobs.observe import is_superseded, observe_allocation, restarts_of
from nomad_jobs.replica_service import RESCHEDULE, RESTART, service_name
from nomad_jobs.session_job import JobContext, render_session_job

MAIN = Kernel(role="main", index=1, hostname="main1", image="", resources={"cpu": "1", "mem": "268435456"})


def session(type: SessionType = SessionType.INFERENCE, replicas: int = 2, **fields: Any) -> Session:
    service = {"service_port": 8000} if type is SessionType.INFERENCE else {}
    return Session(
        id="0b9e3c4a-1111-4222-8333-944445555666",
        name="serve",
        owner_id="u",
        type=type,
        driver=Driver.EXEC,
        image="",
        resources=MAIN.resources,
        kernels=replicas_of(MAIN, replicas),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        startup_command="serve",
        **{**service, **fields},
    )


def plain(value: Any) -> Any:
    """python-hcl2's reading as plain values: it keeps string quotes and template escapes, and marks blocks."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace("$${", "${")
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def groups(s: Session) -> dict[str, dict[str, Any]]:
    """Task groups by name."""
    [job] = plain(hcl2.loads(render_session_job(s, JobContext(job_prefix="cv")).hcl))["job"][0].values()
    return {name: body for g in job["group"] for name, body in g.items()}


def task(group: dict[str, Any]) -> dict[str, Any]:
    [body] = group["task"][0].values()
    return body  # type: ignore[no-any-return]


def ports(group: dict[str, Any]) -> list[str]:
    return [label for network in group.get("network", []) for p in network.get("port", []) for label in p]


def check_of(group: dict[str, Any]) -> dict[str, Any]:
    [service] = task(group)["service"]
    [check] = service["check"]
    return check  # type: ignore[no-any-return]


def test_every_replica_is_a_group_serving_the_service_port() -> None:
    rendered = groups(session(replicas=3))
    assert list(rendered) == ["main1", "main2", "main3"]
    for hostname, group in rendered.items():
        assert group["count"] == 1
        assert ports(group) == ["p8000"]
        body = task(group)
        assert body["env"][0]["CARAVAN_SERVICE_PORT"] == "${NOMAD_PORT_p8000}"  # Nomad's client fills it in
        [service] = body["service"]
        assert (service["provider"], service["port"], service["tags"]) == ("nomad", "p8000", [hostname])
        assert service["name"] == "caravan-0b9e3c4a-1111-4222-8333-944445555666"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"type": "tcp", "interval": "2s", "timeout": "1s"}),
        ({"health_check_path": "/healthz?deep=1"}, {"type": "http", "path": "/healthz?deep=1"}),
    ],
    ids=["tcp-by-default", "http-with-a-path"],
)
def test_health_check(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    check = check_of(groups(session(**fields))["main1"])
    assert {k: check.get(k) for k in expected} == expected
    assert ("path" in check) == ("health_check_path" in fields)


@pytest.mark.parametrize(("grace", "rendered"), [(None, "30000ms"), (2.5, "2500ms"), (600.0, "600000ms")])
def test_check_restart_waits_the_grace_then_restarts_after_three_failures(grace: float | None, rendered: str) -> None:
    [restart] = check_of(groups(session(health_check_grace=grace))["main2"])["check_restart"]
    assert restart == {"limit": 3, "grace": rendered, "ignore_warnings": False}


def test_replicas_restart_in_place_then_reschedule_without_limit() -> None:
    group = groups(session())["main1"]
    assert group["restart"] == [RESTART]
    assert group["reschedule"] == [RESCHEDULE]
    assert RESTART["mode"] == "fail" and RESCHEDULE["unlimited"] is True


@pytest.mark.parametrize(
    ("type", "context", "expected"),
    [
        (SessionType.BATCH, JobContext(job_prefix="cv"), {"attempts": 0, "mode": "fail"}),
        (  # Nomad's policy for a service job, written in the job
            SessionType.INTERACTIVE,
            JobContext(job_prefix="cv"),
            {"attempts": 2, "interval": "30m", "delay": "15000ms", "mode": "fail"},
        ),
        (
            SessionType.SYSTEM,
            JobContext(job_prefix="cv", restart_delay=2.5),
            {"attempts": 2, "interval": "30m", "delay": "2500ms", "mode": "fail"},
        ),
    ],
)
def test_a_long_running_kernel_is_restarted_twice_after_the_operators_delay(
    type: SessionType, context: JobContext, expected: dict[str, Any]
) -> None:
    [job] = plain(hcl2.loads(render_session_job(session(type, replicas=1), context).hcl))["job"][0].values()
    [group] = job["group"][0].values()
    assert group["restart"] == [expected]


def test_a_preopened_service_port_is_allocated_once() -> None:
    group = groups(session(preopen_ports=(9000, 8000)))["main1"]
    assert ports(group) == ["p9000", "p8000"]


@pytest.mark.parametrize("type", [SessionType.INTERACTIVE, SessionType.BATCH])
def test_other_types_have_no_service(type: SessionType) -> None:
    group = groups(session(type, replicas=1))["main1"]
    assert "service" not in task(group) and "CARAVAN_SERVICE_PORT" not in task(group)["env"][0]
    assert group["network"] == [{"mode": "cni/caravan"}]  # a namespace of its own, nothing published
    assert (group.get("reschedule") == [{"attempts": 0, "unlimited": False}]) == (type is SessionType.BATCH)


@pytest.mark.parametrize(
    ("session_id", "name"),
    [
        ("0b9e3c4a-1111-4222-8333-944445555666", "caravan-0b9e3c4a-1111-4222-8333-944445555666"),
        ("Odd_Id.With$chars", "caravan-odd-id-with-chars"),
        ("x" * 80, "caravan-" + "x" * 55),
    ],
)
def test_service_names_are_dns_labels(session_id: str, name: str) -> None:
    assert service_name(replace(session(), id=session_id)) == name


# -- allocations of replicas, observed --------------------------------------------------------------------------


def alloc(client: str, desired: str = "run", restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "ID": "a1",
        "TaskGroup": "main2",
        "NodeID": "n1",
        "ClientStatus": client,
        "DesiredStatus": desired,
        "TaskStates": {"kernel": {"Restarts": restarts, "Events": []}},
        "AllocatedResources": {"Shared": {"Ports": [{"Label": "p8000", "Value": 23456, "HostIP": "127.0.0.1"}]}},
        **extra,
    }


@pytest.mark.parametrize(
    ("allocation", "status", "reason"),
    [
        (alloc("pending"), SessionStatus.PREPARING, "allocation-pending"),
        (alloc("pending", restarts=2), SessionStatus.PREPARING, "restarting"),
        (alloc("running", restarts=2), SessionStatus.RUNNING, "kernel-running"),
        (alloc("pending", "stop", restarts=1), SessionStatus.TERMINATING, "stopping"),
    ],
    ids=["first-start", "between-restarts", "back-after-restarts", "stopped-while-restarting"],
)
def test_a_restarting_replica_is_observed_restarting(
    allocation: dict[str, Any], status: SessionStatus, reason: str
) -> None:
    seen = observe_allocation(allocation)
    assert (seen.status, seen.reason, seen.restarts) == (status, reason, restarts_of(allocation))
    assert seen.ports == ("8000=127.0.0.1:23456",)


def test_a_replaced_allocation_is_superseded() -> None:
    assert not is_superseded(alloc("failed"))
    assert not is_superseded(alloc("failed", NextAllocation=""))
    assert is_superseded(alloc("failed", NextAllocation="a2"))
