"""``caravan deploy`` on the tests' Nomad agent: Caravan's own jobs come up, GraphQL answers through the deployed
HAProxy (whose gateway backend lists every replica), a session reaches RUNNING, one scheduler of two leads, and a
stopped leader hands over (the time it took is printed: speed is bench/'s business)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from core.settings import Settings
from tests.deployed import Deployed, config_for, deployed

pytestmark = [pytest.mark.nomad, pytest.mark.redis]

CREATE = """mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"""
STATUS = """query($id: ID!) { session(id: $id) { status waitReasons } }"""
DESTROY = """mutation($id: ID!) { destroySession(ids: [$id]) { id } }"""


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def one_leader(stack: Deployed, job: str, count: int) -> str:
    """The allocation id of the one replica of ``job`` that leads, once all ``count`` answer and one leads."""

    def settled() -> dict[str, bool | None] | None:
        health = stack.health(job)
        return health if len(health) == count and any(health.values()) else None

    health = until(settled, 60, f"{count} {job} replicas, one leading")
    leaders = [alloc for alloc, leading in health.items() if leading]
    assert len(leaders) == 1, health
    return leaders[0]


def test_deploy_brings_caravan_up_on_nomad(settings: Settings) -> None:
    with deployed(settings, config_for(settings)) as stack:
        assert stack.gql("{ viewer { id } }") == {"viewer": {"id": "admin"}}
        # HAProxy's gateway backend: every replica Nomad runs, and nothing else
        replicas = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 30, "two gateways")
        until(lambda: stack.backend() == replicas, 30, f"HAProxy's backend to list {replicas}")

        session = stack.gql(CREATE, {"input": {"name": "deployed", "type": "INTERACTIVE", "driver": "EXEC"}})
        session_id = session["createSession"]["sessions"][0]["id"]
        until(lambda: stack.gql(STATUS, {"id": session_id})["session"]["status"] == "RUNNING", 120, "RUNNING")

        leader = one_leader(stack, "scheduler", 2)
        one_leader(stack, "idle", 2)
        stopped = time.monotonic()
        stack.nomad.call("POST", f"/v1/allocation/{leader}/stop?namespace={stack.config.namespace}")
        successor = until(
            lambda: next((a for a, leading in stack.health("scheduler").items() if leading and a != leader), None),
            60,
            "another scheduler to lead",
        )
        print(f"scheduler leadership handed over in {time.monotonic() - stopped:.2f} s (allocation stopped)")
        assert successor != leader
        # the new leader schedules: a session created now runs too
        session = stack.gql(CREATE, {"input": {"name": "after", "type": "INTERACTIVE", "driver": "EXEC"}})
        after = session["createSession"]["sessions"][0]["id"]
        until(lambda: stack.gql(STATUS, {"id": after})["session"]["status"] == "RUNNING", 120, "RUNNING after")
        for sid in (session_id, after):
            stack.gql(DESTROY, {"id": sid})
