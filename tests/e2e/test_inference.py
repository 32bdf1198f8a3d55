"""INFERENCE sessions on real Nomad: replicas serving HTTP on their service port, and coming back on their own.

A replica killed for real (SIGKILL through Nomad's signal API) is restarted in place; one killed until its restarts
are used up gets a new allocation; one whose health check fails is restarted by the check. Throughout, the session
stays RUNNING with no user action, and it ends TERMINATED only when destroyed. ``endpoints`` lists a replica only
while its Nomad check passes: one still loading, or back from a kill but not listening yet, is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import httpx2
import pytest

from core.errors import PermanentError, TransientError
from core.settings import Settings
from nomad_jobs.meta import TASK_NAME
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan

T = TypeVar("T")

DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status } }"
VIEW = """
query($id: ID!) { session(id: $id) {
  id status statusInfo replicas servicePort healthCheckPath endpoints
  statusHistory { status reason }
  kernels { hostname status statusInfo restarts ports healthy }
} }
"""
SERVE = (
    'mkdir -p /tmp/www && echo "replica $CARAVAN_CLUSTER_HOST" > /tmp/www/index.html && '
    'exec httpd -f -p "$CARAVAN_SERVICE_PORT" -h /tmp/www'
)
"""Each replica answers GET / with its own hostname, on its service port (Nomad publishes it on a host port)."""
UNHEALTHY_FIRST = (
    f'if [ -e "$NOMAD_TASK_DIR/ran-once" ]; then {SERVE}; else touch "$NOMAD_TASK_DIR/ran-once"; exec sleep 3600; fi'
)
"""Listens on nothing in its first run (the task dir outlives a restart), serves from its second run on."""
LOADING_SECONDS = 6
LOADING_MAIN2 = f'if [ "$CARAVAN_CLUSTER_HOST" = main2 ]; then sleep {LOADING_SECONDS}; fi; {SERVE}'
"""main2 listens only after a while in each of its runs (a model loading); main1 at once."""
RECONCILE_INTERVAL = 1.0
"""Check results reach ``endpoints`` at reconciliation: often here, so that tests wait for Nomad, not for Caravan."""


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    scheduler = replace(settings.scheduler, reconcile_interval=RECONCILE_INTERVAL)
    async with running_caravan(replace(settings, scheduler=scheduler)) as running:
        yield running


RUNNING_HISTORY = ["PENDING", "SCHEDULED", "PREPARING", "RUNNING"]


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 90.0) -> T:
    """``probe()``'s first non-None answer; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.25)


async def create(caravan: Caravan, **fields: Any) -> str:
    request = {
        "name": "inf-" + uuid.uuid4().hex[:8],
        "type": "INFERENCE",
        "driver": "EXEC",
        "servicePort": 8000,
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}],
        **fields,
    }
    data = await caravan.gql(CREATE, {"input": request})
    [session] = data["createSession"]["sessions"]
    return str(session["id"])


async def view(caravan: Caravan, session_id: str) -> dict[str, Any]:
    session: dict[str, Any] = (await caravan.gql(VIEW, {"id": session_id}))["session"]
    return session


async def answer(http: httpx2.AsyncClient, endpoint: str) -> str | None:
    try:
        response = await http.get(f"http://{endpoint}/", timeout=2)
    except httpx2.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


async def serving(caravan: Caravan, session_id: str, replicas: int) -> dict[str, Any]:
    """The session once RUNNING with ``replicas`` endpoints that all answer, each with its own replica's name."""

    async def probe() -> dict[str, Any] | None:
        session = await view(caravan, session_id)
        if session["status"] != "RUNNING" or len(session["endpoints"]) != replicas:
            return None
        answers = [await answer(caravan.http, e) for e in session["endpoints"]]
        return session if answers == [f"replica main{i}\n" for i in range(1, replicas + 1)] else None

    return await eventually(probe, f"{replicas} replicas serving")


def kernel(session: dict[str, Any], hostname: str) -> dict[str, Any]:
    return next(k for k in session["kernels"] if k["hostname"] == hostname)


def endpoint_of(session: dict[str, Any], hostname: str) -> str:
    """The replica's service endpoint from its ports, whether or not ``endpoints`` lists it."""
    [port] = kernel(session, hostname)["ports"]
    return str(port).split("=", 1)[1]


def task_state(alloc: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = alloc["TaskStates"][TASK_NAME]
    return state


async def alloc_of(caravan: Caravan, session_id: str, hostname: str) -> dict[str, Any]:
    stored = await caravan.store.get(session_id)
    assert stored is not None
    alloc_id = next(k.alloc_id for k in stored.kernels if k.hostname == hostname)
    assert alloc_id
    return await caravan.nomad.allocation(alloc_id)


async def kill(caravan: Caravan, alloc_id: str) -> None:
    await caravan.nomad.signal_allocation(alloc_id, TASK_NAME, "SIGKILL")


async def destroy(caravan: Caravan, session_id: str) -> dict[str, Any]:
    await caravan.gql(DESTROY, {"ids": [session_id]})
    return await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=60)


async def test_killed_replica_is_restarted_and_serves_again(caravan: Caravan) -> None:
    session_id = await create(caravan, replicas=2, healthCheckPath="/", healthCheckGrace="5s", startupCommand=SERVE)
    before = await serving(caravan, session_id, 2)
    assert (before["replicas"], before["servicePort"], before["healthCheckPath"]) == (2, 8000, "/")
    assert [k["hostname"] for k in before["kernels"]] == ["main1", "main2"]
    for k, endpoint in zip(before["kernels"], before["endpoints"], strict=True):
        assert k["ports"] == [f"8000={endpoint}"] and k["restarts"] == 0 and k["healthy"] is True
    killed = await alloc_of(caravan, session_id, "main2")
    job = await caravan.nomad.job(killed["JobID"])
    services = [s for g in job["TaskGroups"] for s in g["Tasks"][0]["Services"]]
    assert {(s["Provider"], s["Checks"][0]["Type"], s["Checks"][0]["Path"]) for s in services} == {
        ("nomad", "http", "/")
    }

    await kill(caravan, killed["ID"])

    async def restarted() -> dict[str, Any] | None:
        alloc = await caravan.nomad.allocation(killed["ID"])
        return alloc if task_state(alloc)["Restarts"] >= 1 and alloc["ClientStatus"] == "running" else None

    alloc = await eventually(restarted, "Nomad restarting the killed replica in place")
    terminated = [e for e in task_state(alloc)["Events"] if e["Type"] == "Terminated"]
    assert terminated and terminated[-1]["Details"].get("signal") == "9", terminated  # it was really killed
    after = await serving(caravan, session_id, 2)
    assert kernel(after, "main2")["restarts"] >= 1 and kernel(after, "main1")["restarts"] == 0
    assert [c["status"] for c in after["statusHistory"]] == RUNNING_HISTORY  # stayed RUNNING: nothing flapped

    final = await destroy(caravan, session_id)
    assert (final["status"], final["statusInfo"]) == ("TERMINATED", "user-requested")
    assert (await view(caravan, session_id))["endpoints"] == []


async def test_replica_killed_past_its_restarts_gets_a_new_allocation(caravan: Caravan) -> None:
    # One replica: without the recovery rule its failed allocation would end the whole session.
    session_id = await create(caravan, replicas=1, startupCommand=SERVE)
    await serving(caravan, session_id, 1)
    first = await alloc_of(caravan, session_id, "main1")
    saw_recovering: set[str] = set()

    async def replaced() -> dict[str, Any] | None:
        current = await alloc_of(caravan, session_id, "main1")
        if current["ID"] != first["ID"]:
            return current
        session = await view(caravan, session_id)
        assert session["status"] == "RUNNING", session
        saw_recovering.add(kernel(session, "main1")["statusInfo"])
        if current["ClientStatus"] == "running":
            with contextlib.suppress(PermanentError, TransientError):  # it may be between two runs right now
                await kill(caravan, current["ID"])  # again, until the in-place restarts are used up
            await asyncio.sleep(0.5)
        return None

    second = await eventually(replaced, "a new allocation for the replica", timeout=150)
    assert (await caravan.nomad.allocation(first["ID"]))["ClientStatus"] == "failed"
    after = await serving(caravan, session_id, 1)
    stored = await caravan.store.get(session_id)
    assert stored is not None and stored.main_kernel.alloc_id == second["ID"]
    assert kernel(after, "main1")["restarts"] == 0  # the count is per allocation
    assert [c["status"] for c in after["statusHistory"]] == RUNNING_HISTORY
    assert any(info.startswith("recovering") or info == "restarting" for info in saw_recovering), saw_recovering

    final = await destroy(caravan, session_id)
    assert (final["status"], final["statusInfo"]) == ("TERMINATED", "user-requested")


async def test_replica_failing_its_health_check_is_restarted(caravan: Caravan) -> None:
    session_id = await create(caravan, replicas=1, healthCheckGrace="2s", startupCommand=UNHEALTHY_FIRST)
    running = await caravan.wait_for(session_id, "RUNNING")
    assert running["status"] == "RUNNING"  # the task runs; only the check knows it serves nothing
    after = await serving(caravan, session_id, 1)
    assert kernel(after, "main1")["restarts"] == 1
    alloc = await alloc_of(caravan, session_id, "main1")
    signalled = [e for e in task_state(alloc)["Events"] if e["Type"] == "Restart Signaled"]
    assert signalled and "unhealthy" in signalled[0]["Details"].get("restart_reason", ""), signalled
    assert [c["status"] for c in after["statusHistory"]] == RUNNING_HISTORY

    final = await destroy(caravan, session_id)
    assert final["status"] == "TERMINATED"


async def test_replica_is_an_endpoint_only_while_its_check_passes(caravan: Caravan) -> None:
    session_id = await create(
        caravan, replicas=2, healthCheckPath="/", healthCheckGrace="30s", startupCommand=LOADING_MAIN2
    )

    async def loading() -> dict[str, Any] | None:
        session = await view(caravan, session_id)
        main1, main2 = kernel(session, "main1"), kernel(session, "main2")
        return session if (main1["healthy"], main2["status"], main2["healthy"]) == (True, "RUNNING", False) else None

    first = await eventually(loading, "main2 running but failing its check while main1 passes")
    assert first["status"] == "RUNNING"
    main1_endpoint, main2_endpoint = endpoint_of(first, "main1"), endpoint_of(first, "main2")
    assert first["endpoints"] == [main1_endpoint]
    assert await answer(caravan.http, main2_endpoint) is None  # really not serving yet
    await serving(caravan, session_id, 2)  # once its check passes, main2 is listed too

    await kill(caravan, (await alloc_of(caravan, session_id, "main2"))["ID"])

    async def dropped_out() -> dict[str, Any] | None:
        session = await view(caravan, session_id)
        return session if main2_endpoint not in session["endpoints"] else None

    gone = await eventually(dropped_out, "the killed replica leaving endpoints")
    assert gone["endpoints"] == [main1_endpoint] and gone["status"] == "RUNNING"
    running_unlisted = []

    async def listed_again() -> dict[str, Any] | None:
        session = await view(caravan, session_id)
        main2 = kernel(session, "main2")
        if main2_endpoint in session["endpoints"]:
            # listed again only once it serves: not on the strength of a check that passed before the kill
            assert await answer(caravan.http, main2_endpoint) == "replica main2\n", session
            return session
        if main2["status"] == "RUNNING" and main2["restarts"] >= 1:
            running_unlisted.append(main2["healthy"])
        return None

    back = await eventually(listed_again, "the restarted replica back in endpoints once its check passes")
    assert running_unlisted and set(running_unlisted) <= {None, False}  # ran again, loading, and was left out
    assert back["endpoints"] == [main1_endpoint, main2_endpoint]
    assert (kernel(back, "main2")["healthy"], kernel(back, "main2")["restarts"]) == (True, 1)
    assert [c["status"] for c in back["statusHistory"]] == RUNNING_HISTORY

    final = await destroy(caravan, session_id)
    assert final["status"] == "TERMINATED"
    assert (await view(caravan, session_id))["endpoints"] == []


async def test_an_inference_session_from_a_template_serves(caravan: Caravan) -> None:
    """A template holds every INFERENCE option (servicePort, replicas, the health check); a creation from it runs
    replicas that serve, with an override of the replica count."""
    spec = {
        "type": "INFERENCE",
        "driver": "EXEC",
        "startupCommand": SERVE,
        "servicePort": 8000,
        "replicas": 1,
        "healthCheckPath": "/",
        "healthCheckGrace": "5s",
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}],
    }
    created = await caravan.gql(
        """mutation($input: CreateSessionTemplateInput!) { createSessionTemplate(input: $input) {
             id spec { servicePort replicas healthCheckPath healthCheckGrace } } }""",
        {"input": {"name": "web server", "spec": spec}},
    )
    template = created["createSessionTemplate"]
    assert template["spec"] == {"servicePort": 8000, "replicas": 1, "healthCheckPath": "/", "healthCheckGrace": "5s"}
    data = await caravan.gql(
        """mutation($id: ID!, $overrides: SessionOverridesInput!) {
             createSessionFromTemplate(templateId: $id, overrides: $overrides) { sessions { id } } }""",
        {"id": template["id"], "overrides": {"name": "inf-" + uuid.uuid4().hex[:8], "replicas": 2}},
    )
    session_id = data["createSessionFromTemplate"]["sessions"][0]["id"]
    running = await serving(caravan, session_id, 2)
    assert (running["replicas"], running["servicePort"], running["healthCheckPath"]) == (2, 8000, "/")
    final = await destroy(caravan, session_id)
    assert final["status"] == "TERMINATED"


REFUSED = [
    ("INFERENCE without a service port", {"servicePort": None}, "servicePort"),
    ("service port on INTERACTIVE", {"type": "INTERACTIVE"}, "servicePort"),
    ("too many replicas", {"replicas": 17}, "replicas"),
    ("bad health check path", {"healthCheckPath": "/${node.unique.id}"}, "healthCheckPath"),
]


@pytest.mark.parametrize(("change", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_bad_inference_options_are_refused(caravan: Caravan, change: dict[str, Any], field: str) -> None:
    with pytest.raises(GraphQLErrors) as raised:
        await create(caravan, startupCommand=SERVE, **change)
    [error] = raised.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", field)
    assert await caravan.store.session_ids() == []
