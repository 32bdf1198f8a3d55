"""Session lifecycle on real Nomad: interactive sessions, destroy, rename, count, idempotency, timeouts."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from core.clock import utcnow
from core.settings import Settings
from domain.lifecycle import transition
from domain.model import SessionStatus
from domain.scheduling_config import SchedulingConfig
from nomad_jobs.client import NomadClient
from scheduler.follower import Follower
from scheduler.job_owner import JobOwner
from scheduler.placer import Placer
from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

DESTROY = (
    "mutation($ids: [ID!]!, $forced: Boolean! = false) "
    "{ destroySession(ids: $ids, forced: $forced) { id status statusInfo } }"
)
RENAME = "mutation($id: ID!, $name: String!) { renameSession(id: $id, name: $name) { id name } }"


async def create(caravan: Caravan, token: str | None = None, **fields: Any) -> list[str]:
    kwargs = {"token": token} if token else {}
    data = await caravan.gql(
        CREATE, {"input": {"name": "s-" + uuid.uuid4().hex[:8], "driver": "EXEC", **fields}}, **kwargs
    )
    return [s["id"] for s in data["createSession"]["sessions"]]


async def test_interactive_session_runs_until_destroyed(caravan: Caravan) -> None:
    [session_id] = await create(caravan, type="INTERACTIVE")
    running = await caravan.wait_for(session_id, "RUNNING")
    assert running["mainKernel"]["status"] == "RUNNING"
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATING", "user-requested")
    final = await caravan.wait_for(session_id, "TERMINATED")
    assert final["statusInfo"] == "user-requested"
    assert [c["status"] for c in final["statusHistory"]][-2:] == ["TERMINATING", "TERMINATED"]
    job = await caravan.nomad.job(final["nomadJobId"])
    assert job["Stop"] is True


async def test_forced_destroy_does_not_wait(caravan: Caravan) -> None:
    [session_id] = await create(caravan, type="INTERACTIVE")
    await caravan.wait_for(session_id, "RUNNING")
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id], "forced": True}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "user-requested")


async def test_destroying_a_pending_session_cancels_it(caravan: Caravan) -> None:
    [session_id] = await create(caravan, type="BATCH", startupCommand="true", startsAt="1h")
    [ended] = (await caravan.gql(DESTROY, {"ids": [session_id]}))["destroySession"]
    assert (ended["status"], ended["statusInfo"]) == ("CANCELLED", "user-requested")
    [witness] = await create(caravan, type="BATCH", startupCommand="true")
    await caravan.wait_for(witness, "SCHEDULED", "PREPARING", "RUNNING", "TERMINATED")  # placed by a later pass
    session = await caravan.store.get(session_id)  # a pass later, it is still cancelled and never got a job
    assert session and session.status is SessionStatus.CANCELLED and session.nomad_job_id is None


async def test_others_cannot_destroy_or_rename(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    [session_id] = await create(caravan, token=alice, type="BATCH", startupCommand="true", startsAt="1h")
    for query, variables in ((DESTROY, {"ids": [session_id]}), (RENAME, {"id": session_id, "name": "mine-now"})):
        with pytest.raises(GraphQLErrors) as raised:
            await caravan.gql(query, variables, token=bob)
        assert raised.value.codes == ["NOT_FOUND"]
    assert (await caravan.store.get(session_id)).status is SessionStatus.PENDING  # type: ignore[union-attr]


async def test_rename_keeps_names_unique_among_live_sessions(caravan: Caravan) -> None:
    first = (await create(caravan, type="BATCH", startupCommand="true", startsAt="1h", name="alpha"))[0]
    second = (await create(caravan, type="BATCH", startupCommand="true", startsAt="1h", name="beta"))[0]
    with pytest.raises(GraphQLErrors) as raised:
        await caravan.gql(RENAME, {"id": second, "name": "alpha"})
    assert raised.value.codes == ["CONFLICT"]
    with pytest.raises(GraphQLErrors) as raised:
        await create(caravan, type="BATCH", startupCommand="true", name="alpha")
    assert raised.value.codes == ["CONFLICT"]
    renamed = (await caravan.gql(RENAME, {"id": first, "name": "gamma"}))["renameSession"]
    assert renamed["name"] == "gamma"
    # The old name is free again; the new one is taken.
    await create(caravan, type="BATCH", startupCommand="true", startsAt="1h", name="alpha")
    with pytest.raises(GraphQLErrors):
        await create(caravan, type="BATCH", startupCommand="true", name="gamma")
    await caravan.gql(DESTROY, {"ids": [first]})
    await create(caravan, type="BATCH", startupCommand="true", startsAt="1h", name="gamma")


async def test_count_creates_numbered_sessions(caravan: Caravan) -> None:
    ids = await create(caravan, type="BATCH", startupCommand="exit 0", name="many", count=3)
    assert len(set(ids)) == 3
    names = sorted(s.name for s in await caravan.store.get_many(ids) if s)
    assert names == ["many-1", "many-2", "many-3"]
    for session_id in ids:
        assert (await caravan.wait_for(session_id, "TERMINATED"))["result"] == "SUCCESS"


async def test_client_token_makes_creation_idempotent(caravan: Caravan) -> None:
    fields = {"type": "BATCH", "startupCommand": "exit 0", "name": "once-only", "clientToken": "req-42"}
    results = await asyncio.gather(*(create(caravan, **fields) for _ in range(5)), return_exceptions=True)
    ids = {tuple(r) for r in results if not isinstance(r, BaseException)}
    assert len(ids) == 1, results
    [[session_id]] = ids
    await caravan.wait_for(session_id, "TERMINATED")
    assert await create(caravan, **fields) == [session_id]  # even after it ended
    jobs = await caravan.nomad.jobs(caravan.settings.nomad.job_prefix + "-")
    assert [j["ID"] for j in jobs] == [f"{caravan.settings.nomad.job_prefix}-{session_id}"]


async def test_batch_timeout_ends_failed(caravan: Caravan) -> None:
    [session_id] = await create(caravan, type="BATCH", startupCommand="sleep 60", batchTimeout="2s")
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=60)
    assert (session["status"], session["result"], session["statusInfo"]) == ("TERMINATED", "FAILURE", "task-timeout")
    ran = [c for c in session["statusHistory"] if c["status"] in ("RUNNING", "TERMINATING")]
    assert len(ran) == 2


async def test_hpc_thread_variables_default_to_allocated_cores(caravan: Caravan) -> None:
    [session_id] = await create(
        caravan,
        type="BATCH",
        resources=[{"slot": "cpu", "amount": "1.5"}],
        startupCommand='echo "$OMP_NUM_THREADS $MKL_NUM_THREADS $NPROC $OPENBLAS_NUM_THREADS"',
        environ=[{"name": "OPENBLAS_NUM_THREADS", "value": "7"}],
    )
    session = await caravan.wait_for(session_id, "TERMINATED")
    assert session["mainKernel"]["logs"]["stdout"] == "2 2 2 7\n"


async def test_preopen_port_is_reported_and_served(caravan: Caravan) -> None:
    [session_id] = await create(
        caravan,
        type="INTERACTIVE",
        preopenPorts=[8080],
        startupCommand='echo -e "HTTP/1.0 200 OK\\r\\n\\r\\nhello" > /tmp/r; while :; do nc -l -p 8080 < /tmp/r; done',
    )
    await caravan.wait_for(session_id, "RUNNING")
    session = await caravan.store.get(session_id)
    assert session is not None
    [port] = session.main_kernel.ports
    assert port.startswith("8080=127.0.0.1:")
    host_port = int(port.rsplit(":", 1)[1])
    for _ in range(50):
        try:
            response = await caravan.http.get(f"http://127.0.0.1:{host_port}/")
            assert "hello" in response.text
            break
        except Exception:
            await asyncio.sleep(0.2)
    else:
        raise AssertionError("the preopened port never answered")
    await caravan.gql(DESTROY, {"ids": [session_id], "forced": True})


@pytest.mark.docker
async def test_cluster_kernels_resolve_each_other_and_connect(caravan: Caravan) -> None:
    # Every sub kernel serves on port 7000 at its own address; main1 fetches from each by hostname. The
    # subs would serve forever: a BATCH session ends when its main kernel does.
    command = (
        'if [ "$CARAVAN_CLUSTER_ROLE" = sub ]; then mkdir -p /tmp/w'
        ' && echo "from $CARAVAN_CLUSTER_HOST" > /tmp/w/index.html'
        ' && exec httpd -f -p "$CARAVAN_CLUSTER_ADDR:7000" -h /tmp/w; '
        "else for h in sub1 sub2; do for i in $(seq 100); do "
        'wget -q -O - "http://$h:7000/" && break; sleep 0.2; done; done; '
        'echo "hosts=$CARAVAN_CLUSTER_HOSTS size=$CARAVAN_CLUSTER_SIZE"; fi'
    )
    [session_id] = await create(
        caravan,
        type="BATCH",
        driver="DOCKER",
        image=DEFAULT_IMAGE,
        clusterSize=3,
        resources=[{"slot": "cpu", "amount": "0.25"}],
        startupCommand=command,
    )
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=90)
    assert session["result"] == "SUCCESS", session
    out = session["mainKernel"]["logs"]["stdout"].splitlines()
    assert out == ["from sub1", "from sub2", "hosts=main1,sub1,sub2 size=3"]
    assert session["statusInfo"] == "task-finished"
    stored = await caravan.store.get(session_id)
    assert stored and [k.hostname for k in stored.kernels] == ["main1", "sub1", "sub2"]
    assert all(k.status is SessionStatus.TERMINATED for k in stored.kernels)


async def test_jobs_without_a_session_are_stopped(caravan: Caravan) -> None:
    [session_id] = await create(caravan, type="INTERACTIVE")
    await caravan.wait_for(session_id, "RUNNING")
    session = await caravan.store.get(session_id)
    assert session is not None and session.nomad_job_id
    await caravan.store.redis.delete(caravan.store.keys.session(session_id))  # Redis lost it
    await caravan.store.redis.srem(caravan.store.keys.sessions_live, session_id)
    follower = Follower(caravan.store, caravan.nomad, None)
    assert await follower.stop_orphans(set()) == [session.nomad_job_id]
    assert (await caravan.nomad.job(session.nomad_job_id))["Stop"] is True


async def job_stopped(caravan: Caravan, job_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The job once Nomad shows it stopped (``Stop``), within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (job := await caravan.nomad.job(job_id))["Stop"]:
        assert loop.time() < deadline, f"job {job_id} is still wanted after {timeout}s: {job['Status']}"
        await asyncio.sleep(0.2)
    return job


async def test_an_interactive_session_whose_command_fails_ends_and_its_job_is_stopped(caravan: Caravan) -> None:
    # Nomad restarts a long-running session's failed task twice (2 s apart in the tests: CARAVAN_NOMAD_RESTART_DELAY),
    # then fails the allocation and reschedules it without end: the session ends with the failed allocation, and its
    # job must end with it.
    [session_id] = await create(caravan, type="INTERACTIVE", startupCommand="exit 3")
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=120)
    assert (session["status"], session["statusInfo"], session["exitCode"]) == ("TERMINATED", "task-failed", 3)
    await job_stopped(caravan, session["nomadJobId"])
    allocs = await caravan.nomad.job_allocations(session["nomadJobId"])
    assert allocs and all(a["DesiredStatus"] != "run" or a["ClientStatus"] in ("failed", "complete") for a in allocs)


async def test_reconciliation_stops_the_job_of_an_ended_session(settings: Settings) -> None:
    async with running_caravan(settings, scheduler=False) as caravan:  # the scheduler's parts, driven step by step
        scheduler = NomadClient(caravan.settings.for_role("scheduler").nomad)
        owner = JobOwner(caravan.store, scheduler, None)
        follower = Follower(caravan.store, scheduler, None, owner)
        [session_id] = await create(caravan, type="INTERACTIVE")
        await Placer(caravan.store, scheduler, None, caravan.settings, SchedulingConfig()).run_pass()
        await owner.act()  # registered
        for _ in range(150):
            await follower.reconcile()
            if (running := await caravan.store.get(session_id)) and running.status is SessionStatus.RUNNING:
                break
            await asyncio.sleep(0.2)
        # The session ended while its job kept running (its end observed while the scheduler was down, the request
        # to stop its job then lost):
        ended = await caravan.store.update(
            session_id, lambda s: transition(s, SessionStatus.TERMINATED, reason="task-failed", at=utcnow())
        )
        assert ended is not None and ended.nomad_job_id
        await caravan.store.redis.delete(caravan.store.keys.jobs_to_stop)  # lost
        assert (await caravan.nomad.job(ended.nomad_job_id))["Stop"] is False
        await follower.reconcile()  # the safety net asks again,
        await owner.act()  # and the job owner stops it
        await scheduler.aclose()
        await job_stopped(caravan, ended.nomad_job_id, timeout=5.0)


class ListingOvertakenByRegistration(NomadClient):
    """A fault injected by name: Nomad's job listing answered, then (before the reconciliation reads on) the job owner
    registers a session's job and says so. On a loaded machine a Redis or Nomad outage stretches that window to
    seconds; here it is forced on the first listing."""

    def __init__(self, settings: Any, owner: JobOwner) -> None:
        super().__init__(settings)
        self.owner: JobOwner | None = owner

    async def jobs(self, prefix: str) -> list[dict[str, Any]]:
        listing = await super().jobs(prefix)
        if self.owner is not None:
            owner, self.owner = self.owner, None
            await owner.act()  # registered and acknowledged, after the listing
        return listing


async def test_a_registration_acknowledged_after_the_job_listing_is_not_taken_for_a_lost_job(
    settings: Settings,
) -> None:
    async with running_caravan(settings, scheduler=False) as caravan:
        scheduler = NomadClient(caravan.settings.for_role("scheduler").nomad)
        owner = JobOwner(caravan.store, scheduler, None)
        overtaken = ListingOvertakenByRegistration(caravan.settings.for_role("scheduler").nomad, owner)
        follower = Follower(caravan.store, overtaken, None, owner)
        [session_id] = await create(caravan, type="BATCH", startupCommand="exit 0")
        await Placer(caravan.store, scheduler, None, caravan.settings, SchedulingConfig()).run_pass()
        await follower.reconcile()
        assert overtaken.owner is None, "the listing did not run the registration"
        session = await caravan.store.get(session_id)
        assert session is not None and session.status is SessionStatus.PREPARING, session and session.status_history
        await follower.reconcile()  # the next reconciliation sees the job
        session = await caravan.store.get(session_id)
        assert session is not None and session.status is not SessionStatus.ERROR, session.status_history
        await asyncio.gather(scheduler.aclose(), overtaken.aclose())
