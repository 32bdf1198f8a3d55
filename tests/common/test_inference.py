"""INFERENCE replicas as the lifecycle reads them: a replica going down is recovering, not the session ending."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from common.inference import endpoints_of, replica_observation, replicas_of
from common.lifecycle import observe_kernel, transition
from common.model import (Driver, Kernel, KernelObservation, Session, SessionStatus as S, SessionType,
                          StatusChange)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MAIN = Kernel(role="main", index=1, hostname="main1", image="img", resources={"cpu": "1"})


def inference(status: S = S.RUNNING, *, replicas: int = 2, started: bool = True,
              type: SessionType = SessionType.INFERENCE) -> Session:
    kernels = tuple(replace(k, status=status, ports=(f"8000=127.0.0.1:{20000 + k.index}",))
                    for k in replicas_of(MAIN, replicas))
    return Session(id="s", name="name", owner_id="u", type=type, driver=Driver.EXEC, image="", resources={},
                   kernels=kernels, created_at=T0, status=status, service_port=8000,
                   status_history=(StatusChange(S.PENDING, T0, "created"),), started_at=T0 if started else None)


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
    ("failed to start after running", S.RUNNING, True, seen(S.ERROR, "failed-to-start"), S.PREPARING,
     "recovering: failed-to-start"),
    ("never started", S.PREPARING, False, seen(S.ERROR, "failed-to-start"), S.ERROR, "failed-to-start"),
    ("running is running", S.RUNNING, True, seen(S.RUNNING, "kernel-running"), S.RUNNING, "kernel-running"),
    ("restarting", S.RUNNING, True, seen(S.PREPARING, "restarting"), S.PREPARING, "restarting"),
    ("being destroyed", S.TERMINATING, True, seen(S.TERMINATED, "task-finished"), S.TERMINATED, "task-finished"),
    ("already errored", S.ERROR, True, seen(S.TERMINATED, "task-failed"), S.TERMINATED, "task-failed"),
]


@pytest.mark.parametrize(("status", "started", "observation", "expected", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_live_replica_going_down_is_recovering(status: S, started: bool, observation: KernelObservation,
                                                 expected: S, reason: str) -> None:
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


def test_endpoints_are_those_of_running_replicas() -> None:
    session = inference()
    assert endpoints_of(session) == ("127.0.0.1:20001", "127.0.0.1:20002")
    recovering = session.evolve(kernels=(session.kernels[0], replace(session.kernels[1], status=S.PREPARING)))
    assert endpoints_of(recovering) == ("127.0.0.1:20001",)
    unallocated = session.evolve(kernels=tuple(replace(k, ports=("9000=127.0.0.1:1",)) for k in session.kernels))
    assert endpoints_of(unallocated) == ()
    assert endpoints_of(inference(type=SessionType.INTERACTIVE)) == ()
    assert endpoints_of(transition(session, S.TERMINATED, reason="x", at=T0)) == ()
