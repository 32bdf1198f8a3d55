"""``caravan deploy --wait`` on a job Nomad could not place everywhere: a system job's deployment (the namespace
keepers) succeeds with the nodes that had no room left out (Nomad 1.11: ``DesiredTotal`` 0, one allocation queued, a
blocked evaluation), so the deploy says which and why instead of reporting success alone."""

from __future__ import annotations

import time

import pytest

from caravan.deploy import DeployConfig, job_id, placement_failures, unplaced_because
from caravan.stack.nomad_acl import NomadAdmin
from core.settings import Settings

BLOCKED = {
    "Status": "blocked",
    "ModifyIndex": 14,
    "FailedTGAllocs": {
        "namespace-keeper": {
            "NodesEvaluated": 2,
            "NodesExhausted": 1,
            "DimensionExhausted": {"memory": 1},
            "ConstraintFiltered": {"missing drivers": 1},
        }
    },
}


def test_a_blocked_evaluation_says_which_nodes_had_no_room_and_why() -> None:
    assert placement_failures(BLOCKED) == (
        "group namespace-keeper not placed everywhere: 1 node(s) without room (memory on 1); "
        "filtered: missing drivers on 1"
    )
    assert "no reason given" in placement_failures({"Status": "blocked"})


@pytest.mark.nomad
def test_a_system_job_without_room_on_a_node_is_found_unplaced(settings: Settings, namespace: str) -> None:
    config = DeployConfig(name=namespace, namespace="default")
    nomad = NomadAdmin(settings.nomad.addr, settings.nomad.token)
    keepers = job_id(config, "namespace-keeper")
    task = {"Name": "k", "Driver": "exec", "Config": {"command": "/bin/sleep", "args": ["60"]}}
    task["Resources"] = {"CPU": 20, "MemoryMB": 64 * 1024 * 1024}  # 64 TiB: no node has room for it
    job = {"ID": keepers, "Type": "system", "Datacenters": ["*"], "TaskGroups": [{"Name": "k", "Tasks": [task]}]}
    nomad.call("POST", "/v1/jobs", {"Job": job})
    try:
        unplaced = unplaced_because(nomad, config, "namespace-keeper", time.monotonic() + 30)
        assert unplaced is not None and "1 node(s) without room (memory on 1)" in unplaced, unplaced
        task["Resources"] = {"CPU": 20, "MemoryMB": 32}
        nomad.call("POST", "/v1/jobs", {"Job": job})  # room now: placed, nothing blocked
        deadline = time.monotonic() + 30
        while (
            unplaced := unplaced_because(nomad, config, "namespace-keeper", deadline)
        ) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert unplaced is None
    finally:
        nomad.call("DELETE", f"/v1/job/{keepers}?purge=true")
