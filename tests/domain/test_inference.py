"""INFERENCE replicas as the lifecycle reads them: a replica going down is recovering, not the session ending."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from domain.inference import (
    HealthReading,
    endpoints_of,
    forget_stale_health,
    replica_health,
    replica_observation,
    replicas_of,
    why_cold,
    with_replica_health,
)
from domain.lifecycle import observe_kernel, transition
from domain.model import Driver, Kernel, KernelObservation, Session, SessionType, StatusChange
from domain.model import SessionStatus as S
from nomad_jobs.meta import TASK_NAME
from nomad_jobs.replica_service import run_started_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MAIN = Kernel(role="main", index=1, hostname="main1", image="img", resources={"cpu": "1"})


def inference(
    status: S = S.RUNNING,
    *,
    replicas: int = 2,
    started: bool = True,
    type: SessionType = SessionType.INFERENCE,
    healthy: bool | None = True,
) -> Session:
    kernels = tuple(
        replace(k, status=status, ports=(f"8000=127.0.0.1:{20000 + k.index}",), alloc_id=f"a{k.index}", healthy=healthy)
        for k in replicas_of(MAIN, replicas)
    )
    return Session(
        id="s",
        name="name",
        owner_id="u",
        type=type,
        driver=Driver.EXEC,
        image="",
        resources={},
        kernels=kernels,
        created_at=T0,
        status=status,
        service_port=8000,
        status_history=(StatusChange(S.PENDING, T0, "created"),),
        started_at=T0 if started else None,
    )


def seen(status: S, reason: str, hostname: str = "main2", **fields: object) -> KernelObservation:
    return KernelObservation(hostname=hostname, status=status, reason=reason, **fields)  # type: ignore[arg-type]


def test_replicas_copy_the_main_kernel() -> None:
    kernels = replicas_of(replace(MAIN, image="server:1", resources={"cpu": "2"}), 3)
    assert [(k.hostname, k.index, k.role, k.image, k.resources) for k in kernels] == [
        (f"main{i}", i, "main", "server:1", {"cpu": "2"}) for i in (1, 2, 3)
    ]
    assert kernels[0].resources is not kernels[1].resources


CASES = [
    # (case, session status, started, observation, expected status, expected reason)
    ("task crashed", S.RUNNING, True, seen(S.TERMINATED, "task-failed"), S.PREPARING, "recovering: task-failed"),
    ("allocation stopped", S.RUNNING, True, seen(S.TERMINATING, "stopping"), S.PREPARING, "recovering: stopping"),
    ("node lost", S.RUNNING, True, seen(S.ERROR, "job-lost"), S.PREPARING, "recovering: job-lost"),
    (
        "failed to start after running",
        S.RUNNING,
        True,
        seen(S.ERROR, "failed-to-start"),
        S.PREPARING,
        "recovering: failed-to-start",
    ),
    ("never started", S.PREPARING, False, seen(S.ERROR, "failed-to-start"), S.ERROR, "failed-to-start"),
    ("running is running", S.RUNNING, True, seen(S.RUNNING, "kernel-running"), S.RUNNING, "kernel-running"),
    ("restarting", S.RUNNING, True, seen(S.PREPARING, "restarting"), S.PREPARING, "restarting"),
    ("being destroyed", S.TERMINATING, True, seen(S.TERMINATED, "task-finished"), S.TERMINATED, "task-finished"),
    ("already errored", S.ERROR, True, seen(S.TERMINATED, "task-failed"), S.TERMINATED, "task-failed"),
]


@pytest.mark.parametrize(
    ("status", "started", "observation", "expected", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_live_replica_going_down_is_recovering(
    status: S, started: bool, observation: KernelObservation, expected: S, reason: str
) -> None:
    read = replica_observation(inference(status, started=started), observation)
    assert (read.status, read.reason) == (expected, reason)


@pytest.mark.parametrize("type", [SessionType.INTERACTIVE, SessionType.BATCH])
def test_other_session_types_read_observations_as_they_are(type: SessionType) -> None:
    observation = seen(S.TERMINATED, "task-failed", hostname="main1")
    assert replica_observation(inference(type=type), observation) is observation


def test_killed_replica_keeps_the_session_running_until_it_is_back() -> None:
    running = inference()
    crashed = observe_kernel(running, seen(S.TERMINATED, "task-failed", exit_code=137), at=T0)
    assert crashed is not None
    assert crashed.status is S.RUNNING and crashed.status_history == running.status_history
    assert crashed.kernels[1].status is S.PREPARING and crashed.kernels[1].status_info == "recovering: task-failed"
    restarting = observe_kernel(crashed, seen(S.PREPARING, "restarting", restarts=1), at=T0)
    assert restarting is not None and restarting.status is S.RUNNING and restarting.kernels[1].restarts == 1
    back = observe_kernel(restarting, seen(S.RUNNING, "kernel-running", restarts=1), at=T0)
    assert back is not None and back.status is S.RUNNING and back.kernels[1].status is S.RUNNING
    assert back.status_history == running.status_history  # no transition was written: nothing flapped


def test_destroyed_session_still_ends_terminated() -> None:
    stopping = transition(inference(), S.TERMINATING, reason="user-requested", at=T0 + timedelta(seconds=1))
    after = stopping
    for hostname in ("main1", "main2"):
        step = observe_kernel(after, seen(S.TERMINATED, "task-finished", hostname=hostname), at=T0)
        assert step is not None
        after = step
    assert (after.status, after.status_info) == (S.TERMINATED, "user-requested")


def test_endpoints_are_those_of_running_replicas_known_healthy() -> None:
    session = inference()
    assert endpoints_of(session) == ("127.0.0.1:20001", "127.0.0.1:20002")
    recovering = session.evolve(kernels=(session.kernels[0], replace(session.kernels[1], status=S.PREPARING)))
    assert endpoints_of(recovering) == ("127.0.0.1:20001",)
    for health in (False, None):
        unhealthy = session.evolve(kernels=(replace(session.kernels[0], healthy=health), session.kernels[1]))
        assert endpoints_of(unhealthy) == ("127.0.0.1:20002",)
    assert endpoints_of(inference(healthy=None)) == ()
    unallocated = session.evolve(kernels=tuple(replace(k, ports=("9000=127.0.0.1:1",)) for k in session.kernels))
    assert endpoints_of(unallocated) == ()
    assert endpoints_of(inference(type=SessionType.INTERACTIVE)) == ()
    assert endpoints_of(transition(session, S.TERMINATED, reason="x", at=T0)) == ()


RUN = 1_800_000_000
"""When the replica's current run started (unix seconds, as Nomad stamps check results)."""


def result(status: str, at: int = RUN + 5, mode: str = "healthiness") -> dict[str, object]:
    return {"Status": status, "Mode": mode, "Timestamp": at, "Output": "nomad: …", "Check": "health"}


HEALTH = [
    # (case, check results, expected)
    ("passing", [result("success")], True),
    ("passing in the second the run started", [result("success", at=RUN)], True),
    ("failing", [result("failure")], False),
    ("not run yet", [result("pending", at=RUN - 3)], None),
    ("pending after the start", [result("pending")], None),
    ("no checks", [], None),
    ("a success from before a restart", [result("success", at=RUN - 1)], None),
    ("a failure from before a restart", [result("failure", at=RUN - 4)], None),
    ("one of two failing", [result("success"), result("failure")], False),
    ("one of two pending", [result("success"), result("pending")], None),
    ("one of two stale", [result("success"), result("success", at=RUN - 10)], None),
    ("failing beside a stale one", [result("failure"), result("success", at=RUN - 10)], False),
    ("readiness failing", [result("success"), result("failure", mode="readiness")], False),
    ("all passing", [result("success"), result("success", mode="readiness")], True),
    ("unknown status", [result("warning")], None),
    ("no timestamp", [{"Status": "success"}], None),
]


@pytest.mark.parametrize(("results", "expected"), [c[1:] for c in HEALTH], ids=[c[0] for c in HEALTH])
def test_replica_health_from_check_results(results: list[dict[str, object]], expected: bool | None) -> None:
    assert replica_health(results, run_started=RUN) is expected


def test_replica_health_without_a_run_start_takes_every_result() -> None:
    assert replica_health([result("success", at=0)], run_started=None) is True


def reading(
    hostname: str = "main2", healthy: bool | None = True, alloc_id: str = "a2", restarts: int = 0
) -> HealthReading:
    return HealthReading(hostname=hostname, alloc_id=alloc_id, restarts=restarts, healthy=healthy)


def test_a_health_reading_is_recorded_on_its_replica() -> None:
    session = inference(healthy=None)
    after = with_replica_health(session, [reading(healthy=True), reading("main1", healthy=False, alloc_id="a1")])
    assert after is not None
    assert [k.healthy for k in after.kernels] == [False, True]
    assert endpoints_of(after) == ("127.0.0.1:20002",)


STALE_READINGS = [
    # (case, replica as stored now, reading)
    ("unchanged", {}, reading(healthy=True)),
    ("replica moved to a new allocation", {"alloc_id": "a9"}, reading(healthy=False)),
    ("replica restarted since", {"restarts": 1}, reading(healthy=False)),
    ("replica no longer running", {"status": S.PREPARING, "healthy": None}, reading(healthy=True)),
    ("no such replica", {}, reading("main7", alloc_id="a7", healthy=False)),
]


@pytest.mark.parametrize(("stored", "read"), [c[1:] for c in STALE_READINGS], ids=[c[0] for c in STALE_READINGS])
def test_a_reading_changes_nothing_unless_new_and_of_the_current_run(
    stored: dict[str, object], read: HealthReading
) -> None:
    session = inference()
    changed = replace(session.kernels[1], **stored)  # type: ignore[arg-type]
    session = session.evolve(kernels=(session.kernels[0], changed))
    assert with_replica_health(session, [read]) is None


def test_health_readings_are_for_live_inference_sessions_only() -> None:
    assert with_replica_health(inference(type=SessionType.INTERACTIVE, healthy=None), [reading()]) is None
    ended = transition(inference(healthy=None), S.TERMINATED, reason="x", at=T0)
    assert with_replica_health(ended, [reading()]) is None


FORGOTTEN = [
    # (case, observation of main2, health afterwards)
    ("still running the same run", seen(S.RUNNING, "kernel-running", alloc_id="a2"), True),
    ("killed", seen(S.TERMINATED, "task-failed", alloc_id="a2", exit_code=137), None),
    ("restarting", seen(S.PREPARING, "restarting", alloc_id="a2", restarts=1), None),
    ("restarted and running again", seen(S.RUNNING, "kernel-running", alloc_id="a2", restarts=1), None),
    ("rescheduled to a new allocation", seen(S.RUNNING, "kernel-running", alloc_id="a3"), None),
]


@pytest.mark.parametrize(("observation", "healthy"), [c[1:] for c in FORGOTTEN], ids=[c[0] for c in FORGOTTEN])
def test_health_is_forgotten_when_the_replica_stops_restarts_or_moves(
    observation: KernelObservation, healthy: bool | None
) -> None:
    before = inference()
    after = observe_kernel(before, observation, at=T0)
    after = forget_stale_health(before, after if after is not None else before)
    assert [k.healthy for k in after.kernels] == [True, healthy]
    assert ("127.0.0.1:20002" in endpoints_of(after)) is bool(healthy)


def test_forgetting_nothing_returns_the_session_itself() -> None:
    session = inference()
    assert forget_stale_health(session, session) is session


RUN_STARTS = [
    # (case, the kernel task's state in the allocation, expected)
    ("Nomad's nanoseconds", {"StartedAt": "2027-01-15T08:00:00.999999999Z"}, 1_800_000_000),
    ("another offset", {"StartedAt": "2027-01-15T09:00:00.5+01:00"}, 1_800_000_000),
    ("not started: Go's zero time", {"StartedAt": "0001-01-01T00:00:00Z"}, None),
    ("not started: no state", None, None),
]


@pytest.mark.parametrize(("state", "expected"), [c[1:] for c in RUN_STARTS], ids=[c[0] for c in RUN_STARTS])
def test_run_start_is_read_from_the_task_state(state: dict[str, str] | None, expected: int | None) -> None:
    alloc = {"TaskStates": {TASK_NAME: state} if state is not None else None}
    assert run_started_at(alloc) == expected


def test_why_an_endpoint_is_cold_is_said_from_its_queue_reasons_or_its_replicas() -> None:
    waiting = replace(inference(S.PENDING), wait_reasons=("no-agent-fits: short of sim.shares 0.5",))
    assert why_cold(waiting) == "the endpoint waits in the queue: no-agent-fits: short of sim.shares 0.5"
    assert why_cold(replace(waiting, wait_reasons=())) == "the endpoint waits in the queue: not placed yet"
    starting = inference(healthy=None)
    starting = replace(starting, kernels=(starting.kernels[0], replace(starting.kernels[1], status=S.PREPARING)))
    assert why_cold(starting) == "its replicas: main1 running, its check not passed yet, main2 preparing"
    assert why_cold(replace(inference(), kernels=(replace(MAIN, parked=True),))) == "its replicas: main1 parked"
    assert why_cold(inference(S.TERMINATED)) == why_cold(None) == "the endpoint ended"
