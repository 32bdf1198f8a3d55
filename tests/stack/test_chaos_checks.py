"""bench/chaos's check of a session's final state: a batch session that ran out of its start retries is right only
in the one coherent state Caravan gives it (pure: the check alone, on the states the long run saw)."""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import sys
import uuid
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx2
import pytest

DETAIL = 'sub1: Setup Failure: failed to setup alloc: pre-run hook "network" failed (not started after 4 attempts)'


@cache
def chaos_module() -> ModuleType:
    """bench/chaos (a script without a .py suffix)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos"
    loader = importlib.machinery.SourceFileLoader("bench_chaos", str(path))
    spec = importlib.util.spec_from_loader("bench_chaos", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


def shown(status: str, info: str, detail: str | None, exit_code: int | None) -> dict[str, Any]:
    return {"status": status, "statusInfo": info, "statusDetail": detail, "exitCode": exit_code}


@pytest.mark.parametrize(
    ("session", "right"),
    [
        (shown("ERROR", "failed-to-start", DETAIL, None), True),
        # the three wrong_final of the 1,100-fault run of session 13: the same give-up, ended otherwise
        (shown("TERMINATED", "terminating", None, None), False),
        (shown("TERMINATED", "task-failed", "main1: Terminated: Exit Code: 143", 143), False),
        (shown("ERROR", "failed-to-start", DETAIL, 143), False),  # a stray exit code from Caravan's own stop
        (shown("ERROR", "failed-to-start", "sub1: Driver Failure: image not found", None), False),  # not a give-up
        (shown("ERROR", "job-lost", DETAIL, None), False),
    ],
)
def test_only_the_coherent_give_up_is_a_true_final_state(session: dict[str, Any], right: bool) -> None:
    assert chaos_module().gave_up(session) is right


async def test_a_wrong_final_state_keeps_its_allocations_events(nomad_agent: Any, tmp_path: Path) -> None:
    """bench/chaos keeps, for a session in a wrong final state, every allocation of its Nomad job with the task's
    events (their exit codes and signals): the long run's next wrong final state can be explained (real Nomad)."""
    chaos = chaos_module()
    prefix, session = "chaoskeep", uuid.uuid4().hex
    job = {
        "ID": f"{prefix}-{session}",
        "Type": "batch",
        "Datacenters": ["*"],
        "TaskGroups": [
            {
                "Name": "main1",
                "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
                "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
                "Tasks": [
                    {
                        "Name": "kernel",
                        "Driver": "raw_exec",
                        "Config": {"command": "/bin/sh", "args": ["-c", "exit 3"]},
                        "Resources": {"CPU": 20, "MemoryMB": 16},
                    }
                ],
            }
        ],
    }
    headers = {"X-Nomad-Token": nomad_agent.token} if nomad_agent.token else {}
    async with httpx2.AsyncClient(base_url=nomad_agent.addr, headers=headers, timeout=10) as client:
        (await client.post("/v1/jobs", json={"Job": job})).raise_for_status()
        try:
            while not [
                a
                for a in (await client.get(f"/v1/job/{job['ID']}/allocations")).json()
                if a["ClientStatus"] == "failed"
            ]:
                await asyncio.sleep(0.2)
            stack = SimpleNamespace(root=tmp_path, prefix=prefix, cluster=nomad_agent)
            await chaos.keep_allocations(stack, [session])
        finally:
            await client.delete(f"/v1/job/{job['ID']}", params={"purge": "true"})
    (alloc,) = json.loads((tmp_path / "wrong_final" / f"{session}.json").read_text())
    events = alloc["TaskStates"]["kernel"]["Events"]
    assert [e["Details"].get("exit_code") for e in events if e["Type"] == "Terminated"] == ["3"]


def test_a_dependent_of_a_session_that_gave_up_is_rightly_cancelled() -> None:
    """The long run of session 15: 7 batch sessions CANCELLED ``dependency-failed`` because the session they depend on
    ran out of its start retries (or was itself so cancelled) were counted as wrong final states."""
    chaos = chaos_module()
    parent, child, grandchild, other = (
        chaos.Expected(f"s{i}", f"n{i}", "batch", 0, depends) for i, depends in enumerate((None, "s0", "s1", None))
    )
    orphan_of_a_result = chaos.Expected("s4", "n4", "batch", 3, "s3")
    cancelled = shown("CANCELLED", "dependency-failed", "", None)
    states = {
        "s0": shown("ERROR", "failed-to-start", DETAIL, None),
        "s1": cancelled,
        "s2": cancelled,
        "s3": shown("TERMINATED", "task-finished", None, 0),
        "s4": cancelled,  # its dependency ended with 0: it had to run
    }
    work = SimpleNamespace(sessions=[parent, child, grandchild, other, orphan_of_a_result])
    lost, wrong, given_up, dependents = chaos.final_states(work, states)
    assert (len(lost), len(given_up), len(dependents)) == (0, 1, 2)
    assert [line.split()[2] for line in wrong] == ["s4:"]
