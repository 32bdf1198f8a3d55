"""The scheduler's job owner, the one writer of sessions' Nomad jobs, on a real Nomad: a session destroyed before its
job is registered is never registered (no "destroyed while registering"), and a restart asked through the store
restarts the kernels in place."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import NomadSettings, Settings
from domain.lifecycle import transition
from domain.model import Session, SessionStatus
from domain.scheduling_config import SchedulingConfig
from domain.start_retry import START_RETRIED, awaits_start_retry
from nomad_jobs.client import NomadClient, NomadNotFound
from scheduler.job_owner import JobOwner
from scheduler.placer import Placer
from scheduler.submitter import place_again
from stores.owner_requests import OwnerRequests
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
        assert await store.requests.owner_work() == (set(), {}, set())  # nothing left to do, nothing repeated later
    finally:
        await nomad.aclose()


class EndsTheSessionWhileParsing(NomadClient):
    """Fault injector (a timing the real parts give only rarely): the session's batch ends while the owner is in
    Nomad's parse call, as on a loaded machine after Redis lost the owner's "registered" (the request repeated)."""

    def __init__(self, settings: NomadSettings, store: SessionStore, session_id: str) -> None:
        super().__init__(settings)
        self.store, self.session_id = store, session_id

    async def parse(self, hcl: str) -> dict[str, Any]:
        await self.store.update(self.session_id, ended)
        return await super().parse(hcl)


def ended(session: Session) -> Session:
    """The session as its batch's end leaves it."""
    return transition(session, S.TERMINATED, reason="batch-completed", at=utcnow())


async def test_a_registration_asked_again_after_the_job_ran_leaves_the_job_alone(
    redis: Redis, keys: Keys, settings: Settings
) -> None:
    """Redis restarted after the owner registered a job but before it forgot the request: the request comes again,
    for a session already past SCHEDULED (here: its batch ends meanwhile). The job is neither registered again nor
    purged: a job is stopped only when asked (and purged only when a destroy is forced)."""
    store = SessionStore(redis, keys)
    as_scheduler = settings.for_role("scheduler").nomad
    nomad = NomadClient(as_scheduler)
    session = new_session()
    await store.create([session])
    await Placer(store, nomad, None, settings, SchedulingConfig()).run_pass()
    await JobOwner(store, nomad, None).act()  # registered: PREPARING
    registered = await store.get(session.id)
    assert registered is not None and registered.status is S.PREPARING and registered.nomad_job_id
    version = (await nomad.job(registered.nomad_job_id))["Version"]
    await redis.sadd(keys.work_to_submit, session.id)  # the request's removal, lost with Redis
    injector = EndsTheSessionWhileParsing(as_scheduler, store, session.id)
    try:
        await JobOwner(store, injector, None).act()  # (the fixed owner does not even parse: nothing to inject)
        job = await nomad.job(registered.nomad_job_id)  # still there, not purged (NomadNotFound if it were)
        assert job["Version"] == version  # and not registered again
        assert session.id not in await store.ids_to_submit()
    finally:
        await injector.aclose()
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


class SwallowsOneCancel(OwnerRequests):
    """Fault injector (redis-py loses a cancellation now and then: ``core.retry.stop_if_cancelled``): the owner's wait
    for work swallows the first cancellation and returns as if woken."""

    swallowed = 0

    async def wait_for_owner_work(self, timeout: float) -> None:
        try:
            await super().wait_for_owner_work(timeout)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1


async def test_the_owner_stops_even_when_its_cancellation_is_lost(redis: Redis, keys: Keys, settings: Settings) -> None:
    store = SessionStore(redis, keys)
    store.requests = requests = SwallowsOneCancel(redis, keys)
    nomad = NomadClient(settings.for_role("scheduler").nomad)
    try:
        running = asyncio.create_task(JobOwner(store, nomad, None).run_forever())
        await asyncio.sleep(0.3)  # in its wait for work
        running.cancel()
        done, _ = await asyncio.wait({running}, timeout=10)
        assert done == {running} and running.cancelled(), "the owner went on after its stop was lost"
        assert requests.swallowed == 1
    finally:
        await nomad.aclose()


async def test_a_kernel_is_not_placed_again_into_a_job_that_was_stopped(
    redis: Redis, keys: Keys, settings: Settings
) -> None:
    """A kernel waits to be placed again (its set-up failed) when its job is stopped (the session's end, carried out by
    a new leader's job owner while a deposed one still holds the request it read). Placing it again must not register
    the job again: a plain register brings a stopped job back to life, a pending job of an ended session (bench/chaos
    found two)."""
    store = SessionStore(redis, keys)
    nomad = NomadClient(settings.for_role("scheduler").nomad)
    try:
        session = new_session()
        await store.create([session])
        await Placer(store, nomad, None, settings, SchedulingConfig()).run_pass()
        await JobOwner(store, nomad, None).act()  # registered: PREPARING
        registered = await store.get(session.id)
        assert registered is not None and registered.status is S.PREPARING and registered.nomad_job_id
        [kernel] = registered.kernels
        waiting = registered.evolve(kernels=(dataclasses.replace(kernel, status_info=START_RETRIED),))
        assert awaits_start_retry(waiting)
        await nomad.deregister(registered.nomad_job_id)  # stopped (not purged), as a session's end stops it
        stopped = await nomad.job(registered.nomad_job_id)
        assert stopped["Stop"] is True
        await place_again(store, nomad, waiting)  # the deposed owner, with the session as it read it
        job = await nomad.job(registered.nomad_job_id)
        assert job["Stop"] is True and job["Version"] == stopped["Version"], "a stopped job was registered again"
    finally:
        await nomad.aclose()
