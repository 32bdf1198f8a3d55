"""Reading Nomad's allocations and evaluations as kernel observations, from answers Nomad 1.11.3 gave here.

The files under ``nomad_answers/`` are Nomad's own answers (``GET /v1/allocation/:id``, ``GET /v1/job/:id/evaluations``)
to the sessions their names describe, cut down to the fields Caravan reads; the Docker engine of ``ops/`` cannot pull,
so an image it lacks fails to pull at once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from domain.model import Driver
from domain.model import SessionStatus as S
from nomad_jobs.explain import MAX_DETAIL, placement_failure, task_failure
from nomad_jobs.observe import for_driver, moment, observe_allocation, observe_unplaced, placement_failures

ANSWERS = Path(__file__).parent / "nomad_answers"
PULL_FAILED = (
    "Driver Failure: Failed to pull `caravan/does-not-exist:1`: Error response from daemon: Get "
    '"https://registry-1.docker.io/v2/": proxyconnect tcp: dial tcp 127.0.0.1:1: connect: connection refused'
)


def answer(name: str) -> Any:
    return json.loads((ANSWERS / f"{name}.json").read_text())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


CASES = [
    # (answer, driver, status, reason, exit code, detail, started, finished)
    (
        "allocation-docker-image-missing-batch",
        Driver.DOCKER,
        S.ERROR,
        "failed-to-start",
        None,
        f"{PULL_FAILED}; not restarted: Policy allows no restarts",
        None,
        at("2026-11-23T23:45:26.005549"),
    ),
    (
        "allocation-docker-image-missing-restarting",
        Driver.DOCKER,
        S.PREPARING,
        "restarting",
        None,
        PULL_FAILED,
        None,
        None,
    ),
    (
        "allocation-docker-image-missing-gave-up",
        Driver.DOCKER,
        S.ERROR,
        "failed-to-start",
        None,
        f'{PULL_FAILED}; not restarted: Exceeded allowed attempts 2 in interval 30m0s and mode is "fail"',
        None,
        at("2026-11-23T23:47:52.318101"),
    ),
    (
        "allocation-exec-command-not-found",
        Driver.EXEC,
        S.TERMINATED,
        "task-failed",
        127,
        "Terminated: Exit Code: 127 (the shell's code for a command not found); "
        "not restarted: Policy allows no restarts",
        at("2026-11-23T23:45:25.950408"),
        at("2026-11-23T23:45:25.968987"),
    ),
    (
        "allocation-exec-true",
        Driver.EXEC,
        S.TERMINATED,
        "task-finished",
        0,
        None,
        at("2026-11-23T23:45:26.494448"),
        at("2026-11-23T23:45:26.505852"),
    ),
    (
        "allocation-docker-oom",
        Driver.DOCKER,
        S.TERMINATED,
        "task-failed",
        137,
        'Terminated: Exit Code: 137, Exit Message: "OOM Killed"; not restarted: Policy allows no restarts',
        at("2026-11-23T23:49:34.870448"),
        at("2026-11-23T23:49:35.392019"),
    ),
    (
        "allocation-exec-oom",
        Driver.EXEC,
        S.TERMINATED,
        "task-failed",
        137,
        "Terminated: Exit Code: 137 (OOM killed: the kernel ran out of memory); "
        "not restarted: Policy allows no restarts",
        at("2026-11-23T23:49:34.561037"),
        at("2026-11-23T23:49:34.979095"),
    ),
]


@pytest.mark.parametrize(
    ("name", "driver", "status", "reason", "code", "detail", "started", "finished"), CASES, ids=[c[0] for c in CASES]
)
def test_an_allocation_says_why_and_when(
    name: str,
    driver: Driver,
    status: S,
    reason: str,
    code: int | None,
    detail: str | None,
    started: datetime | None,
    finished: datetime | None,
) -> None:
    seen = for_driver(observe_allocation(answer(name)), driver)
    assert (seen.status, seen.reason, seen.exit_code) == (status, reason, code)
    assert seen.detail == detail
    assert (seen.started_at, seen.finished_at) == (started, finished)
    assert seen.hostname == "main1" and seen.alloc_id and seen.placed


def test_a_running_or_stopping_kernel_has_no_detail_even_after_a_failure() -> None:
    restarting = answer("allocation-docker-image-missing-restarting")
    for client, desired, status in (("running", "run", S.RUNNING), ("running", "stop", S.TERMINATING)):
        seen = observe_allocation({**restarting, "ClientStatus": client, "DesiredStatus": desired})
        assert (seen.status, seen.detail) == (status, None)


def test_a_lost_allocation_names_its_node_and_says_what_nomad_says_of_it() -> None:
    lost = {
        **answer("allocation-exec-true"),
        "ClientStatus": "lost",
        "NodeName": "edge-1",
        "ClientDescription": "Tasks are running",  # the client's last word, before it went down: stale
        "DesiredDescription": "alloc is lost since its node is down",
    }
    seen = observe_allocation(lost)
    detail = "node edge-1 is down: alloc is lost since its node is down"
    assert (seen.status, seen.reason, seen.detail) == (S.ERROR, "job-lost", detail)


@pytest.mark.parametrize(
    ("event", "text"),
    [
        (
            {
                "Type": "Terminated",
                "DisplayMessage": "Exit Code: 0, Signal: 9",
                "Details": {"exit_code": "0", "signal": "9"},
            },
            "Terminated: Exit Code: 0, Signal: 9",
        ),
        (
            {
                "Type": "Setup Failure",
                "DisplayMessage": "failed to setup alloc: mount failed",
                "Details": {"setup_error": "mount failed"},
            },
            "Setup Failure: failed to setup alloc: mount failed",
        ),
        (
            {
                "Type": "Killing",
                "DisplayMessage": "Sent interrupt",
                "Details": {"kill_reason": "Template failed: key x"},
            },
            "Killing: Template failed: key x",
        ),
        (
            {
                "Type": "Killed",
                "DisplayMessage": "Task successfully killed",
                "Details": {"kill_error": "no such process"},
            },
            "Killed: no such process",
        ),
        ({"Type": "Killing", "DisplayMessage": "Sent interrupt. Waiting 5s before force killing", "Details": {}}, None),
        ({"Type": "Terminated", "DisplayMessage": "Exit Code: 0", "Details": {"exit_code": "0", "signal": "0"}}, None),
    ],
)
def test_which_events_are_a_cause(event: dict[str, Any], text: str | None) -> None:
    assert task_failure({"Events": [{"Type": "Started", "DisplayMessage": "Task started by client"}, event]}) == text


def test_a_long_driver_error_is_clipped() -> None:
    event = {"Type": "Driver Failure", "DisplayMessage": "x" * 5000, "Details": {}}
    detail = task_failure({"Events": [event]})
    assert detail is not None and len(detail) == MAX_DETAIL and detail.endswith("…")


def test_qemu_details_say_the_code_is_qemus() -> None:
    seen = observe_allocation(answer("allocation-exec-command-not-found"))  # QEMU 127: the guest's command said 62
    read = for_driver(seen, Driver.QEMU)
    assert (
        read.exit_code == 62 and read.detail is not None and read.detail.startswith("Terminated: QEMU Exit Code: 127;")
    )


def test_nomad_timestamps() -> None:
    assert moment(None) is None and moment("0001-01-01T00:00:00Z") is None
    assert moment("2026-11-23T23:45:26.494448685Z") == at("2026-11-23T23:45:26.494448")


def test_an_unmet_constraint_is_a_kernel_waiting_unplaceable() -> None:
    failures = placement_failures(answer("evaluations-constraint-unmet"))
    assert failures == {"main1": "Nomad cannot place it: constraint '${node.unique.id} = 0000-nope' excluded 1 node"}
    seen = observe_unplaced("main1", failures["main1"])
    assert (seen.status, seen.reason, seen.alloc_id, seen.placed) == (S.PREPARING, "unplaceable", None, False)


def test_a_newer_evaluation_that_placed_everything_clears_the_failure() -> None:
    evaluations = answer("evaluations-constraint-unmet")
    placed = {**evaluations[0], "ID": "later", "Status": "complete", "FailedTGAllocs": None, "ModifyIndex": 99}
    assert placement_failures([*evaluations, placed]) == {}
    assert placement_failures([]) == {}


@pytest.mark.parametrize(
    ("metric", "text"),
    [
        (
            {
                "NodesEvaluated": 3,
                "NodesExhausted": 2,
                "DimensionExhausted": {"memory": 2},
                "NodesAvailable": {"dc1": 3},
            },
            "resources exhausted on 2 nodes; dimension 'memory' exhausted on 2 nodes",
        ),
        (
            {"NodesEvaluated": 0, "NodesAvailable": {"dc1": 0}},
            "no nodes were eligible for evaluation; no nodes are available in datacenter 'dc1'",
        ),
        (
            {
                "NodesEvaluated": 2,
                "ClassFiltered": {"gpu": 2},
                "QuotaExhausted": ["cpu exhausted (2000 needed > 1000 limit)"],
            },
            "class 'gpu' excluded 2 nodes; quota limit hit 'cpu exhausted (2000 needed > 1000 limit)'",
        ),
        ({"NodesEvaluated": 1}, "no reason given"),
    ],
)
def test_placement_failures_read_as_nomad_job_status_prints_them(metric: dict[str, Any], text: str) -> None:
    assert placement_failure(metric) == f"Nomad cannot place it: {text}"


def test_a_set_up_failure_before_or_after_the_start_is_not_the_commands_result() -> None:
    pulled = answer("allocation-docker-image-missing-batch")  # a driver failure: Nomad's verdict on the task itself
    assert observe_allocation(pulled).setup_failed is False
    setup = {
        "Type": "Setup Failure",
        "Details": {"setup_error": 'failed to setup alloc: pre-run hook "network" failed: network already configured'},
    }
    state = {**pulled["TaskStates"]["kernel"], "Events": [{"Type": "Received"}, setup], "StartedAt": None}
    broken = {**pulled, "TaskStates": {"kernel": state}}
    seen = observe_allocation(broken)
    assert (seen.status, seen.reason, seen.setup_failed, seen.command_started) == (
        S.ERROR,
        "failed-to-start",
        True,
        False,
    )
    # a client killed just after starting the task: at its restart the set-up fails, Nomad kills the task (bench/chaos)
    killed = {"Type": "Terminated", "Details": {"exit_code": "130"}}
    started = {**state, "Events": [{"Type": "Started"}, setup, killed]}
    seen = observe_allocation({**broken, "TaskStates": {"kernel": started}})
    assert (seen.status, seen.exit_code, seen.setup_failed, seen.command_started) == (S.ERROR, None, True, True)
    assert seen.detail is not None and seen.detail.endswith("the task it had started was killed by Nomad"), seen.detail
    ended_first = {**state, "Events": [{"Type": "Started"}, {**killed, "Details": {"exit_code": "3"}}, setup]}
    assert observe_allocation({**broken, "TaskStates": {"kernel": ended_first}}).setup_failed is False


SETUP = {
    "Type": "Setup Failure",
    "Details": {"setup_error": 'failed to setup alloc: pre-run hook "network" failed: network already configured'},
}


def ended(*events: dict[str, Any]) -> Any:
    """A failed BATCH allocation whose kernel task's events are ``events``."""
    pulled = answer("allocation-docker-image-missing-batch")
    state = {**pulled["TaskStates"]["kernel"], "Events": [{"Type": "Received"}, *events]}
    return observe_allocation({**pulled, "TaskStates": {"kernel": state}})


def terminated(code: int) -> dict[str, Any]:
    return {"Type": "Terminated", "Details": {"exit_code": str(code)}}


@pytest.mark.parametrize(
    "events",
    [
        # the client killed again between Nomad's kill (after the first set-up failure) and the task's dead state: at
        # the next restart the task is restored "running" with those events, and its set-up fails once more
        # (Nomad 1.11.3's EmitEvent persists each event; bench/chaos session 14: `wrong_final` exit 143)
        [{"Type": "Started"}, SETUP, terminated(143), {"Type": "Restore Failed"}, SETUP],
        [{"Type": "Started"}, SETUP, terminated(143), SETUP],
        # an earlier run ended (restarted in place), the last run failed its set-up before it ended
        [{"Type": "Started"}, terminated(143), {"Type": "Restarting"}, {"Type": "Started"}, SETUP],
    ],
)
def test_nomads_kill_after_a_set_up_failure_is_never_the_commands_result(events: list[dict[str, Any]]) -> None:
    seen = ended(*events)
    assert (seen.status, seen.reason, seen.exit_code, seen.setup_failed, seen.command_started) == (
        S.ERROR,
        "failed-to-start",
        None,
        True,
        True,
    )


def test_a_commands_own_end_before_a_set_up_failure_stays_its_result() -> None:
    # the command ended on its own (even with 143, `exit 143`), then its client restarted and failed the set-up
    for code in (3, 143):
        seen = ended({"Type": "Started"}, terminated(code), SETUP)
        assert (seen.status, seen.exit_code, seen.setup_failed) == (S.TERMINATED, code, False)
    # a set-up failure of an earlier run is not the last run's end
    seen = ended(SETUP, {"Type": "Started"}, terminated(0))
    assert (seen.status, seen.exit_code, seen.setup_failed) == (S.TERMINATED, 0, False)
