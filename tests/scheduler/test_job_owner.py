"""The scheduler's job owner, the one writer of sessions' Nomad jobs, on a real Nomad: a session destroyed before its
job is registered is never registered (no "destroyed while registering"), and a restart asked through the store
restarts the kernels in place."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import Settings
from domain.model import SessionStatus
from domain.scheduling_config import SchedulingConfig
from nomad_jobs.client import NomadClient, NomadNotFound
from scheduler.job_owner import JobOwner
from scheduler.placer import Placer
from stores.sessions import SessionStore
from tests.harness import CREATE, running_caravan
from tests.scheduler.test_snapshot_io import new_session

S = SessionStatus
T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while (found := await probe()) is None:
        assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
        await asyncio.sleep(0.2)
    return found


async def test_a_session_destroyed_before_its_job_is_registered_is_never_registered(
    redis: Redis, keys: Keys, settings: Settings
) -> None:
    store = SessionStore(redis, keys)
    nomad = NomadClient(settings.for_role("scheduler").nomad)
    try:
        session = new_session()
        await store.create([session])
        await Placer(store, nomad, None, settings, SchedulingConfig()).run_pass()  # placed: its job is to register
        placed = await store.get(session.id)
        assert placed is not None and placed.status is S.SCHEDULED and placed.nomad_job_id
        assert await store.ids_to_submit() == {session.id}
        ended = await store.request_termination(session.id, reason="user-requested", at=utcnow())  # a destroy
        assert ended is not None and ended.status is S.TERMINATING
        await JobOwner(store, nomad, None).act()
        try:
            await nomad.job(placed.nomad_job_id)
            raise AssertionError("the job of a session destroyed before its registration was registered")
        except NomadNotFound:
            pass
        assert await store.owner_work() == (set(), {}, set())  # nothing left to do, nothing repeated later
    finally:
        await nomad.aclose()


async def test_restart_session_restarts_the_kernels_in_place(settings: Settings) -> None:
    async with running_caravan(settings) as caravan:
        data = await caravan.gql(
            CREATE, {"input": {"name": "restarted-" + uuid.uuid4().hex[:6], "type": "INTERACTIVE", "driver": "EXEC"}}
        )
        [created] = data["createSession"]["sessions"]
        await caravan.wait_for(created["id"], "RUNNING")
        before = await caravan.store.get(created["id"])
        assert before is not None
        restarted = await caravan.gql(
            "mutation($id: ID!) { restartSession(id: $id) { id status } }", {"id": created["id"]}
        )
        assert restarted["restartSession"]["status"] == "RUNNING"

        async def restarted_once() -> bool | None:
            session = await caravan.store.get(created["id"])
            kernel = session.main_kernel if session else None
            return True if kernel and kernel.restarts >= 1 and kernel.status is S.RUNNING else None

        await eventually(restarted_once, "the kernel restarted once, in its allocation, and running again")
        after = await caravan.store.get(created["id"])
        assert after is not None and after.main_kernel.alloc_id == before.main_kernel.alloc_id  # in place
