"""Recurring schedules end to end on the real stack (Redis, Nomad, the exec driver): a few seconds' interval
schedule produces real batch sessions whose results show in its history; FORBID skips an overlapping run; pause
and resume; and the scheduler process killed at a due instant leaves exactly one run per due time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from caravan.stack.processes import free_port
from core.settings import Settings
from domain.users import BOOTSTRAP_ADMIN_ID
from stores.schedules import ScheduleStore
from tests.e2e.test_restarts import CaravanProcess
from tests.harness import KILLED_SCHEDULERS, Caravan, caravan_env, running_caravan

pytestmark = [pytest.mark.nomad, pytest.mark.redis]

CREATE = "mutation($input: CreateScheduleInput!) { createSchedule(input: $input) { id nextDue } }"
HISTORY = """query($id: ID!) { schedule(id: $id) { paused nextDue runsStarted
  history(limit: 100) { key outcome dueAt reason missed sessionIds sessions { id status result } } } }"""


async def create_schedule(caravan: Caravan, **fields: Any) -> dict[str, Any]:
    spec = {"type": "BATCH", "driver": "EXEC", "startupCommand": fields.pop("command", "echo scheduled")}
    made: dict[str, Any] = (await caravan.gql(CREATE, {"input": {"name": "every-few", "spec": spec, **fields}}))[
        "createSchedule"
    ]
    return made


async def schedule_of(caravan: Caravan, schedule_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await caravan.gql(HISTORY, {"id": schedule_id}))["schedule"]
    return found


async def until(caravan: Caravan, schedule_id: str, done: Any, timeout: float = 120.0) -> dict[str, Any]:
    """The schedule as soon as ``done(schedule)`` holds (polled), failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = await schedule_of(caravan, schedule_id)
        if done(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"schedule {schedule_id} did not get there in {timeout}s: {found}")
        await asyncio.sleep(0.5)


def finished_runs(schedule: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        r
        for r in schedule["history"]
        if r["outcome"] == "CREATED" and r["sessions"] and all(s["status"] == "TERMINATED" for s in r["sessions"])
    ]


async def test_an_interval_schedule_runs_batch_sessions_and_pauses(caravan: Caravan) -> None:
    made = await create_schedule(caravan, interval="3s")
    done = await until(caravan, made["id"], lambda s: len(finished_runs(s)) >= 2)
    for run in finished_runs(done):
        [session] = run["sessions"]
        assert session["result"] == "SUCCESS"
    due_times = [datetime.fromisoformat(r["dueAt"]) for r in done["history"] if r["outcome"] == "CREATED"]
    assert len(set(due_times)) == len(due_times)  # one run per due time
    assert all((b - a).total_seconds() % 3 == 0 for a, b in zip(due_times[1:], due_times, strict=False))

    paused = await caravan.gql("mutation($id: ID!) { pauseSchedule(id: $id) { paused nextDue } }", made)
    assert paused["pauseSchedule"] == {"paused": True, "nextDue": None}
    store = ScheduleStore(caravan.store.redis, caravan.store.keys)
    assert made["id"] not in await store.due(datetime.now(UTC).replace(year=2100), 100)  # nothing left to run
    runs_when_paused = (await schedule_of(caravan, made["id"]))["runsStarted"]

    await caravan.gql("mutation($id: ID!) { resumeSchedule(id: $id) { paused } }", made)
    resumed = await until(caravan, made["id"], lambda s: s["runsStarted"] > runs_when_paused)
    assert resumed["paused"] is False and resumed["history"][0]["outcome"] == "CREATED"


async def test_forbid_skips_an_overlapping_run(caravan: Caravan) -> None:
    made = await create_schedule(caravan, interval="2s", concurrency="FORBID", command="sleep 7")
    found = await until(caravan, made["id"], lambda s: any(r["outcome"] == "SKIPPED" for r in s["history"]))
    skipped = next(r for r in found["history"] if r["outcome"] == "SKIPPED")
    created = [r for r in found["history"] if r["outcome"] == "CREATED"]
    assert created and created[-1]["sessionIds"][0] in skipped["reason"]  # the live run it made way for
    assert skipped["sessionIds"] == []
    await caravan.gql("mutation($id: ID!) { pauseSchedule(id: $id) { paused } }", made)


async def test_the_scheduler_killed_at_the_due_instant_leaves_one_run_per_due_time(settings: Settings) -> None:
    port = free_port()
    async with running_caravan(settings, scheduler=False, serve=True) as caravan:
        env = {**caravan_env(settings, port), "CARAVAN_SCHEDULE_HISTORY": "100", **KILLED_SCHEDULERS}
        scheduler = CaravanProcess("scheduler", env, settings.home / "scheduler.log")
        await scheduler.start()
        try:
            made = await create_schedule(caravan, interval="4s", command="true")
            await until(caravan, made["id"], lambda s: s["runsStarted"] >= 1, timeout=60)
            for _ in range(2):  # kill -9 exactly at a due instant, twice, and start a new scheduler process
                due = datetime.fromisoformat((await schedule_of(caravan, made["id"]))["nextDue"])
                await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
                await scheduler.kill()
                await scheduler.start()
                runs = (await schedule_of(caravan, made["id"]))["runsStarted"]
                await until(caravan, made["id"], lambda s, before=runs: s["runsStarted"] > before, timeout=90)
            await caravan.gql("mutation($id: ID!) { pauseSchedule(id: $id) { paused } }", made)
            final = await schedule_of(caravan, made["id"])
        finally:
            await scheduler.stop()
        created = [r for r in final["history"] if r["outcome"] == "CREATED"]
        assert len(created) == final["runsStarted"] >= 3
        assert len({r["key"] for r in created}) == len(created)  # one run per due time
        assert len({r["dueAt"] for r in final["history"] if r["outcome"] != "MISSED"}) == len(
            [r for r in final["history"] if r["outcome"] != "MISSED"]
        )
        # every session the schedule made belongs to exactly one recorded run, created with its run key
        ids = await caravan.store.session_ids(owner_id=BOOTSTRAP_ADMIN_ID)
        sessions = [s for s in await caravan.store.get_many(ids) if s and s.name.startswith("every-few-")]
        tokens = Counter(s.client_token for s in sessions)
        assert all(count == 1 for count in tokens.values()), tokens
        assert sorted(s.id for s in sessions) == sorted(r["sessionIds"][0] for r in created)
        assert set(tokens) == {r["key"] for r in created}
