"""Why a session did not start, when it ran, and how it ends: what Nomad knows, in GraphQL and in the event stream.

Real Redis, Nomad and Docker. The Docker engine ``ops/`` starts cannot pull (its proxy is ``127.0.0.1:1``), so an image
it lacks fails to pull at once, as an unreachable registry would make it fail anywhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import datetime
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.clock import utcnow
from core.errors import TransientError
from core.settings import Settings
from domain.lifecycle import transition
from domain.model import SessionStatus
from nomad_jobs.client import Json, NomadClient
from nomad_jobs.meta import TASK_NAME
from nomad_jobs.session_job import JobContext, render_session_job
from scheduler.follower import Follower
from scheduler.submitter import submit
from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan, running_caravan
from tests.ws_client import authenticated_socket

MISSING_IMAGE = "caravan/does-not-exist:1"
PULL_FAILED = (
    f"Driver Failure: Failed to pull `{MISSING_IMAGE}`: Error response from daemon: Get "
    '"https://registry-1.docker.io/v2/": proxyconnect tcp: dial tcp 127.0.0.1:1: connect: connection refused'
)
SESSION = """query($id: ID!) { session(id: $id) {
  id name status statusInfo statusDetail exitCode startedAt terminatedAt
  statusHistory { status at reason detail }
  kernels { hostname status statusInfo statusDetail exitCode startedAt finishedAt logs { stderr } } } }"""
EVENTS = "subscription($id: ID!) { sessionEvents(sessionId: $id) { status reason detail at } }"
ENDED = ("TERMINATED", "CANCELLED", "ERROR")
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status statusInfo terminatedAt } }"


async def create(caravan: Caravan, **fields: Any) -> str:
    name = fields.pop("name", "s-" + uuid.uuid4().hex[:8])
    data = await caravan.gql(CREATE, {"input": {"name": name, "type": "BATCH", **fields}})
    return str(data["createSession"]["sessions"][0]["id"])


async def session_of(caravan: Caravan, session_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await caravan.gql(SESSION, {"id": session_id}))["session"]
    return found


async def events_until(
    caravan: Caravan, session_id: str, last: dict[str, str | None], timeout: float = 60.0
) -> list[dict[str, Any]]:
    """The session's events from its creation, read from the subscription until one has ``last``'s fields."""
    found: list[dict[str, Any]] = []
    async with authenticated_socket(caravan.url, "test-admin-token") as socket:
        operation = await socket.subscribe(EVENTS, {"id": session_id})
        async for payload in socket.results(operation, timeout):
            found.append(event := payload["data"]["sessionEvents"])
            if all(event[k] == v for k, v in last.items()):
                return found
    raise AssertionError(f"the events of {session_id} ended without {last}: {found}")


async def until(caravan: Caravan, session_id: str, ready: Any, timeout: float = 60.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready(found := await session_of(caravan, session_id)):
        assert loop.time() < deadline, f"not reached in {timeout}s: {found}"
        await asyncio.sleep(0.2)
    return found


def when(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def task_state(caravan: Caravan, session_id: str) -> dict[str, Any]:
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.nomad_job_id
    [alloc] = await caravan.nomad.job_allocations(stored.nomad_job_id)
    state: dict[str, Any] = alloc["TaskStates"][TASK_NAME]
    return state


async def live_metrics(caravan: Caravan) -> tuple[float, float]:
    """``caravan_sessions_live`` and ``caravan_sessions{status="ERROR"}`` as /metrics shows them now."""
    response = await caravan.http.get(caravan.url.replace("/graphql", "/metrics"))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return samples.get(("caravan_sessions_live", ()), 0.0), samples.get(
        ("caravan_sessions", (("status", "ERROR"),)), 0.0
    )


# -- 1. a session that fails to start says why ---------------------------------------------------------------------


@pytest.mark.docker
async def test_an_image_the_engine_lacks_fails_with_nomads_pull_failure(caravan: Caravan) -> None:
    session_id = await create(caravan, driver="DOCKER", image=MISSING_IMAGE, startupCommand="true")
    await caravan.wait_for(session_id, "ERROR", "TERMINATED")
    found = await session_of(caravan, session_id)
    detail = f"{PULL_FAILED}; not restarted: Policy allows no restarts"
    assert (found["status"], found["statusInfo"], found["statusDetail"]) == ("ERROR", "failed-to-start", detail)
    [kernel] = found["kernels"]
    assert (kernel["status"], kernel["statusInfo"], kernel["statusDetail"]) == ("ERROR", "failed-to-start", detail)
    assert kernel["startedAt"] is None and kernel["finishedAt"] is not None  # it never started; Nomad gave up then
    assert found["startedAt"] is None
    assert found["statusHistory"][-1] == {
        "status": "ERROR",
        "reason": "failed-to-start",
        "detail": detail,
        "at": found["statusHistory"][-1]["at"],
    }
    events = await events_until(caravan, session_id, {"status": "ERROR"})
    assert events[-1] == {**found["statusHistory"][-1]}


@pytest.mark.docker
async def test_an_interactive_session_says_why_it_restarts_then_why_it_failed(caravan: Caravan) -> None:
    # Nomad restarts a long-running session's task twice (CARAVAN_NOMAD_RESTART_DELAY apart: 2 s in the tests) before
    # it gives up: the session, PREPARING meanwhile, says what failed as soon as the first attempt did.
    session_id = await create(caravan, type="INTERACTIVE", driver="DOCKER", image=MISSING_IMAGE)
    events = await events_until(caravan, session_id, {"status": "ERROR"}, timeout=120)
    preparing = [(e["reason"], e["detail"]) for e in events if e["status"] == "PREPARING"]
    assert preparing == [("job-registered", None), ("restarting", PULL_FAILED)], events
    assert (events[-1]["reason"], events[-1]["detail"]) == (
        "failed-to-start",
        f'{PULL_FAILED}; not restarted: Exceeded allowed attempts 2 in interval 30m0s and mode is "fail"',
    )
    found = await session_of(caravan, session_id)
    assert [(c["status"], c["reason"], c["detail"]) for c in found["statusHistory"]][-3:] == [
        (e["status"], e["reason"], e["detail"]) for e in events[-3:]
    ]


async def test_an_exec_command_that_cannot_start_says_so(caravan: Caravan) -> None:
    session_id = await create(caravan, driver="EXEC", startupCommand="no-such-command --help")
    await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    found = await session_of(caravan, session_id)
    detail = (
        "Terminated: Exit Code: 127 (the shell's code for a command not found); "
        "not restarted: Policy allows no restarts"
    )
    assert (found["status"], found["statusInfo"], found["exitCode"], found["statusDetail"]) == (
        "TERMINATED",
        "task-failed",
        127,
        detail,
    )
    [kernel] = found["kernels"]
    assert kernel["statusDetail"] == detail and "no-such-command: not found" in kernel["logs"]["stderr"]
    events = await events_until(caravan, session_id, {"status": "TERMINATED"})
    assert (events[-1]["reason"], events[-1]["detail"]) == ("task-failed", detail)


class NodeLeftAfterThePass(NomadClient):
    """FAULT INJECTION: the scheduler's Nomad client lists, besides the real nodes, a copy of the first under another
    id: a node that left the cluster between the scheduler's pass and Nomad's evaluation of the job placed on it (a
    race the real parts cannot be made to lose on demand). Every other call reaches the real Nomad."""

    GONE = "0bad0000-0000-4000-8000-000000000000"

    async def nodes(self) -> list[Json]:
        real = await super().nodes()
        return [*real, {**real[0], "ID": self.GONE, "Name": "gone"}]


async def test_a_kernel_nomad_cannot_place_waits_saying_why(settings: Settings) -> None:
    async with running_caravan(settings, scheduler_nomad=NodeLeftAfterThePass) as caravan:
        session_id = await create(
            caravan, driver="EXEC", startupCommand="true", designatedAgent=NodeLeftAfterThePass.GONE
        )
        detail = (
            f"Nomad cannot place it: constraint '${{node.unique.id}} = {NodeLeftAfterThePass.GONE}' excluded 1 node"
        )
        events = await events_until(caravan, session_id, {"reason": "unplaceable"})
        assert (events[-1]["status"], events[-1]["detail"]) == ("PREPARING", detail)
        found = await session_of(caravan, session_id)
        assert (found["status"], found["statusInfo"], found["statusDetail"]) == ("PREPARING", "unplaceable", detail)
        assert (found["kernels"][0]["statusInfo"], found["kernels"][0]["statusDetail"]) == ("unplaceable", detail)
        # Destroyed, it ends: its job is stopped, and it never had an allocation.
        await caravan.gql(DESTROY, {"ids": [session_id]})
        ended = await until(caravan, session_id, lambda s: s["status"] == "TERMINATED", timeout=30)
        assert ended["statusInfo"] == "user-requested" and ended["terminatedAt"]


async def test_reconciliation_finds_why_a_kernel_is_not_placed(caravan: Caravan) -> None:
    # The evaluation's event was missed (Caravan was down): the job summary's queued group makes reconciliation read
    # the job's evaluations. The session is registered here as the submitter would, pinned to a node that is gone.
    session_id = await create(caravan, driver="EXEC", startupCommand="true", startsAt="1h")  # the scheduler keeps it
    stored = await caravan.store.get(session_id)
    assert stored is not None
    job = render_session_job(
        stored,
        JobContext(job_prefix=caravan.settings.nomad.job_prefix, pinned_nodes={"main1": NodeLeftAfterThePass.GONE}),
    )
    await caravan.nomad.register(await caravan.nomad.parse(job.hcl))
    await caravan.store.update(
        session_id,
        lambda s: transition(
            transition(
                s.evolve(nomad_job_id=job.job_id, job_hcl=job.hcl, starts_at=None),
                SessionStatus.SCHEDULED,
                reason="scheduled",
                at=utcnow(),
            ),
            SessionStatus.PREPARING,
            reason="job-registered",
            at=utcnow(),
        ),
    )
    follower = Follower(caravan.store, caravan.nomad, None)
    for _ in range(50):  # until Nomad has evaluated the job
        await follower.reconcile()
        if (after := await caravan.store.get(session_id)) and after.status_info == "unplaceable":
            break
        await asyncio.sleep(0.1)
    found = await session_of(caravan, session_id)
    assert (found["status"], found["statusInfo"]) == ("PREPARING", "unplaceable"), found
    assert "excluded 1 node" in found["statusDetail"]


async def test_a_job_nomad_refuses_fails_with_nomads_answer_and_a_destroy_ends_it(settings: Settings) -> None:
    async with running_caravan(settings, scheduler=False) as caravan:
        session_id = await create(caravan, driver="EXEC", startupCommand="true")
        stored = await caravan.store.get(session_id)
        assert stored is not None
        job = render_session_job(stored, JobContext(job_prefix=caravan.settings.nomad.job_prefix))
        refusable = job.hcl.replace("memory = 256", "memory = 1")  # FAULT: below Nomad's minimum, which Caravan keeps
        assert refusable != job.hcl
        scheduled = await caravan.store.update(
            session_id,
            lambda s: transition(
                s.evolve(nomad_job_id=job.job_id, job_hcl=refusable),
                SessionStatus.SCHEDULED,
                reason="scheduled",
                at=utcnow(),
            ),
        )
        assert scheduled is not None
        await submit(caravan.store, caravan.nomad, scheduled, None)
        found = await session_of(caravan, session_id)
        assert (found["status"], found["statusInfo"]) == ("ERROR", "failed-to-start")
        assert found["statusDetail"].startswith("Nomad refused the job: Nomad POST /v1/jobs refused: ")
        assert "MemoryMB" in found["statusDetail"], found["statusDetail"]
        assert found["kernels"][0]["statusDetail"] == found["statusDetail"]
        [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
        assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "user-requested") and ended["terminatedAt"]


# -- 2. start and end times are Nomad's ----------------------------------------------------------------------------


async def test_a_batch_that_ends_before_any_reconciliation_has_nomads_start_and_end(settings: Settings) -> None:
    slow = dataclasses.replace(settings, scheduler=dataclasses.replace(settings.scheduler, reconcile_interval=3600))
    async with running_caravan(slow) as caravan:  # the event stream alone sees it
        session_id = await create(caravan, driver="EXEC", startupCommand="true")
        await caravan.wait_for(session_id, "TERMINATED", "ERROR")
        found = await session_of(caravan, session_id)
        state = await task_state(caravan, session_id)
    [kernel] = found["kernels"]
    started, finished = when(state["StartedAt"]), when(state["FinishedAt"])
    assert (found["status"], found["statusInfo"]) == ("TERMINATED", "task-finished")
    assert when(found["startedAt"]) == when(kernel["startedAt"]) == started
    assert when(kernel["finishedAt"]) == finished
    assert started <= finished <= when(found["terminatedAt"])
    stamps = [when(c["at"]) for c in found["statusHistory"]]
    assert stamps == sorted(stamps)


# -- 3. a plain destroy ends an ERROR session ----------------------------------------------------------------------


@pytest.mark.docker
async def test_destroying_a_session_that_failed_to_start_ends_it_and_frees_its_name(caravan: Caravan) -> None:
    session_id = await create(caravan, name="will-fail", driver="DOCKER", image=MISSING_IMAGE, startupCommand="true")
    await caravan.wait_for(session_id, "ERROR")
    assert await live_metrics(caravan) == (1, 1)
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "user-requested") and ended["terminatedAt"]
    witness = await create(caravan, driver="EXEC", startupCommand="true")
    await caravan.wait_for(witness, "TERMINATED")  # its events came through the event stream after the destroy's
    found = await session_of(caravan, session_id)
    assert (found["status"], found["terminatedAt"]) == ("TERMINATED", ended["terminatedAt"])
    assert await live_metrics(caravan) == (0, 0)
    again = await create(caravan, name="will-fail", driver="EXEC", startupCommand="true")  # the name is free again
    assert again != session_id


@pytest.mark.docker
async def test_a_batch_whose_kernel_failed_to_start_stops_the_others_and_a_destroy_then_ends_it(
    caravan: Caravan,
) -> None:
    # sub1's image is missing, main1 runs: the session is ERROR, and main1, whose result nobody can have any more, is
    # stopped with its job (it ran on until a destroy before; bench/chaos found such a job left running); a destroy
    # then ends the session at once.
    session_id = await create(
        caravan,
        driver="DOCKER",
        image=DEFAULT_IMAGE,
        clusterSize=2,
        startupCommand="sleep 300",
        kernelRoles=[{"role": "SUB", "image": MISSING_IMAGE}],
        resources=[{"slot": "cpu", "amount": "0.25"}],
    )
    errored = await until(caravan, session_id, lambda s: s["status"] == "ERROR", timeout=60)
    assert errored["statusDetail"].startswith(f"sub1: {PULL_FAILED}")
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.nomad_job_id
    job_id = stored.nomad_job_id
    deadline = asyncio.get_running_loop().time() + 60
    while (job := await caravan.nomad.job(job_id))["Status"] != "dead":
        assert asyncio.get_running_loop().time() < deadline, f"the job of the ERROR session runs on: {job['Status']}"
        await asyncio.sleep(0.5)
    assert job["Stop"] is True
    settled = await until(caravan, session_id, lambda s: all(k["status"] in ENDED for k in s["kernels"]), timeout=60)
    assert (settled["status"], settled["statusInfo"]) == ("ERROR", "failed-to-start")  # it stays failed, and says why
    # main1's end is Caravan's stop, not a result (bench/chaos: a stray 143 on a cluster that ran out of start retries)
    main1 = next(k for k in settled["kernels"] if k["hostname"] == "main1")
    assert main1["exitCode"] is not None and (settled["exitCode"], settled["statusDetail"]) == (
        None,
        errored["statusDetail"],
    ), settled
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "user-requested") and ended["terminatedAt"]
    assert await live_metrics(caravan) == (0, 0)


async def test_a_registration_nomad_denies_for_now_keeps_the_session_for_the_next_round(settings: Settings) -> None:
    """A 403 on the job owner's registration (a restarted Nomad server answers so until its ACL state is back, as
    bench/chaos found) is an outage, not a refusal: the session stays SCHEDULED and the request stays. Here a token
    that may not register jobs (the gateway's) stands in for that server: a real 403 from Nomad."""
    async with running_caravan(settings, scheduler=False) as caravan:
        session_id = await create(caravan, driver="EXEC", startupCommand="true")
        stored = await caravan.store.get(session_id)
        assert stored is not None
        job = render_session_job(stored, JobContext(job_prefix=caravan.settings.nomad.job_prefix))
        scheduled = await caravan.store.update(
            session_id,
            lambda s: transition(
                s.evolve(nomad_job_id=job.job_id, job_hcl=job.hcl), SessionStatus.SCHEDULED, reason="s", at=utcnow()
            ),
        )
        assert scheduled is not None
        denied = NomadClient(caravan.settings.for_role("gateway").nomad)
        try:
            with pytest.raises(TransientError, match="denied"):
                await submit(caravan.store, denied, scheduled, None)
        finally:
            await denied.aclose()
        found = await session_of(caravan, session_id)
        assert (found["status"], found["statusInfo"]) == ("SCHEDULED", "s"), found
