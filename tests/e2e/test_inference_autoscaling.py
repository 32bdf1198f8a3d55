"""Autoscaled INFERENCE endpoints on real Nomad: replicas added, drained and stopped, to zero and back.

The scheduler under test runs its autoscaler (``scheduler.autoscaler``); the load it reads is written the way the
ingress writes it (``stores.endpoint_traffic.record_loads``), and a wake is asked the way the activator asks it
(``request_wake``): that is the contract between the two, not a fake of either side. Each replica answers GET / with
its own hostname, so a test can tell which replicas serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from stores.endpoint_traffic import EndpointLoad, record_loads, request_wake
from tests.e2e.test_inference import SERVE, answer, caravan, create, destroy, eventually
from tests.harness import Caravan

__all__ = ["caravan"]  # the fixture, with a quick reconciliation (replica health reaches endpoints at once)

SCALING = """
query($id: ID!) { session(id: $id) {
  id status replicas endpoints
  kernels { hostname status statusInfo }
  autoscaling { desiredReplicas currentReplicas readyReplicas drainingReplicas lastDecisionReason panicking
                revision replicasBehind
                rules { minReplicas maxReplicas target metric drainTimeout } }
} }
"""
UPDATE = """
mutation($id: ID!, $rules: AutoscalingInput) {
  updateEndpointScaling(id: $id, autoscaling: $rules) { desiredReplicas rules { minReplicas maxReplicas } }
}
"""
QUICK = {"drainTimeout": "2s", "scaleDownDelay": "0s", "stableWindow": "4s", "panicWindow": "2s"}
"""Short windows, so a test waits for Nomad rather than for the policy."""


async def scaling(caravan: Caravan, session_id: str) -> dict[str, Any]:
    session: dict[str, Any] = (await caravan.gql(SCALING, {"id": session_id}))["session"]
    return session


async def alloc_id(caravan: Caravan, session_id: str, hostname: str) -> str:
    stored = await caravan.store.get(session_id)
    assert stored is not None
    found = next(k.alloc_id for k in stored.kernels if k.hostname == hostname)
    assert found
    return found


async def replicas_serving(caravan: Caravan, session_id: str, hostnames: list[str]) -> dict[str, Any]:
    """The session once exactly ``hostnames`` take traffic, each answering as itself, and no other replica is left."""

    async def probe() -> dict[str, Any] | None:
        session = await scaling(caravan, session_id)
        if session["status"] != "RUNNING" or [k["hostname"] for k in session["kernels"]] != hostnames:
            return None
        answers = [await answer(caravan.http, e) for e in session["endpoints"]]
        return session if answers == [f"replica {h}\n" for h in hostnames] else None

    return await eventually(probe, f"replicas {hostnames} serving", timeout=120)


@contextlib.asynccontextmanager
async def load(caravan: Caravan, session_id: str, sample: Callable[[], tuple[int, int]]) -> AsyncIterator[None]:
    """Write the endpoint's load as the ingress does, every half second: ``sample()`` gives (in flight, held)."""
    redis, keys = caravan.store.redis, caravan.store.keys
    total = 0

    async def write() -> None:
        nonlocal total
        while True:
            in_flight, held = sample()
            total += in_flight
            loads = [EndpointLoad(session_id, in_flight, total, time.time(), held)]
            await record_loads(redis, keys, loads)
            await asyncio.sleep(0.5)

    task = asyncio.create_task(write())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_raising_then_lowering_replicas_places_then_drains_and_stops(caravan: Caravan) -> None:
    rules = {"minReplicas": 1, "maxReplicas": 1, "target": 10, **QUICK}
    session_id = await create(caravan, startupCommand=SERVE, healthCheckPath="/", autoscaling=rules)
    first = await replicas_serving(caravan, session_id, ["main1"])
    assert first["autoscaling"]["rules"]["minReplicas"] == 1
    main1_alloc = await alloc_id(caravan, session_id, "main1")

    raised = await caravan.gql(UPDATE, {"id": session_id, "rules": {**rules, "minReplicas": 2, "maxReplicas": 2}})
    assert raised["updateEndpointScaling"]["rules"] == {"minReplicas": 2, "maxReplicas": 2}
    both = await replicas_serving(caravan, session_id, ["main1", "main2"])
    assert both["autoscaling"]["desiredReplicas"] == 2
    assert "raised to min 2" in both["autoscaling"]["lastDecisionReason"]
    assert await alloc_id(caravan, session_id, "main1") == main1_alloc  # the replica that stays was left running
    main2_alloc = await alloc_id(caravan, session_id, "main2")
    job = await caravan.nomad.job((await caravan.nomad.allocation(main2_alloc))["JobID"])
    assert [g["Name"] for g in job["TaskGroups"]] == ["main1", "main2"]

    await caravan.gql(UPDATE, {"id": session_id, "rules": rules})
    one = await replicas_serving(caravan, session_id, ["main1"])
    assert await alloc_id(caravan, session_id, "main1") == main1_alloc
    assert (one["replicas"], one["autoscaling"]["currentReplicas"], one["autoscaling"]["readyReplicas"]) == (1, 1, 1)

    async def stopped() -> dict[str, Any] | None:
        alloc = await caravan.nomad.allocation(main2_alloc)
        return alloc if alloc["DesiredStatus"] == "stop" and alloc["ClientStatus"] != "running" else None

    await eventually(stopped, "the drained replica's allocation stopped")
    await destroy(caravan, session_id)


async def test_an_idle_endpoint_goes_to_zero_and_a_wake_brings_a_replica_back(caravan: Caravan) -> None:
    rules = {"minReplicas": 0, "maxReplicas": 2, "target": 10, "scaleToZeroAfter": "3s", **QUICK}
    session_id = await create(caravan, startupCommand=SERVE, healthCheckPath="/", autoscaling=rules)
    await replicas_serving(caravan, session_id, ["main1"])
    demand = {"in_flight": 0, "held": 0}
    async with load(caravan, session_id, lambda: (demand["in_flight"], demand["held"])):

        async def at_zero() -> dict[str, Any] | None:
            session = await scaling(caravan, session_id)
            (main1,) = session["kernels"]
            return session if main1["statusInfo"] == "scaled-to-zero" else None

        zero = await eventually(at_zero, "the idle endpoint at zero replicas", timeout=120)
        assert zero["status"] == "RUNNING"  # a live endpoint with no replica, not an ended session
        assert (zero["replicas"], zero["endpoints"]) == (0, [])
        assert zero["autoscaling"]["desiredReplicas"] == 0
        assert "scaled to zero" in zero["autoscaling"]["lastDecisionReason"]
        stored = await caravan.store.get(session_id)
        assert stored is not None and stored.nomad_job_id is not None

        async def no_allocation() -> bool | None:
            job = await caravan.nomad.job(stored.nomad_job_id or "")
            allocs = await caravan.nomad.job_allocations(stored.nomad_job_id or "")
            running = [a for a in allocs if a["ClientStatus"] == "running"]
            return True if job["TaskGroups"][0]["Count"] == 0 and not running else None

        await eventually(no_allocation, "no allocation left at zero")

        demand["held"] = 1  # the activator holds a request...
        await request_wake(caravan.store.redis, caravan.store.keys, session_id)  # ...and asks for a replica
        woken = await replicas_serving(caravan, session_id, ["main1"])
        assert "woken" in woken["autoscaling"]["lastDecisionReason"] or woken["autoscaling"]["desiredReplicas"] == 1
        assert (await scaling(caravan, session_id))["status"] == "RUNNING"
    await destroy(caravan, session_id)


async def test_an_endpoint_at_zero_is_destroyed_like_any_other(caravan: Caravan) -> None:
    rules = {"minReplicas": 0, "maxReplicas": 1, "target": 10, "scaleToZeroAfter": "2s", **QUICK}
    session_id = await create(caravan, startupCommand=SERVE, healthCheckPath="/", autoscaling=rules)
    await replicas_serving(caravan, session_id, ["main1"])
    async with load(caravan, session_id, lambda: (0, 0)):

        async def at_zero() -> dict[str, Any] | None:
            session = await scaling(caravan, session_id)
            return (
                session
                if session["replicas"] == 0 and session["kernels"][0]["statusInfo"] == "scaled-to-zero"
                else None
            )

        await eventually(at_zero, "the endpoint at zero", timeout=120)
        final = await destroy(caravan, session_id)
    assert (final["status"], final["statusInfo"]) == ("TERMINATED", "user-requested")


async def test_load_scales_replicas_up_and_after_it_stops_down(caravan: Caravan) -> None:
    rules = {"minReplicas": 1, "maxReplicas": 3, "target": 1, **QUICK}
    session_id = await create(caravan, startupCommand=SERVE, healthCheckPath="/", autoscaling=rules)
    await replicas_serving(caravan, session_id, ["main1"])
    demand = {"in_flight": 3}
    async with load(caravan, session_id, lambda: (demand["in_flight"], 0)):
        busy = await replicas_serving(caravan, session_id, ["main1", "main2", "main3"])
        assert busy["autoscaling"]["desiredReplicas"] == 3
        demand["in_flight"] = 0
        calm = await replicas_serving(caravan, session_id, ["main1"])
        assert calm["autoscaling"]["desiredReplicas"] == 1
    await destroy(caravan, session_id)


VERSIONED = (
    'mkdir -p /tmp/www && echo "$VERSION $CARAVAN_CLUSTER_HOST" > /tmp/www/index.html && '
    'exec httpd -f -p "$CARAVAN_SERVICE_PORT" -h /tmp/www'
)
"""Each replica answers with the version its environment names, and its hostname."""
UPDATE_ENDPOINT = """
mutation($id: ID!, $input: EndpointUpdateInput!) {
  updateEndpoint(id: $id, input: $input) { revision replicasBehind }
}
"""


async def test_a_rolling_update_replaces_every_replica_while_the_endpoint_keeps_serving(caravan: Caravan) -> None:
    session_id = await create(
        caravan,
        startupCommand=VERSIONED,
        healthCheckPath="/",
        replicas=2,
        environ=[{"name": "VERSION", "value": "v1"}],
        autoscaling={"minReplicas": 2, "maxReplicas": 2, "target": 10, **QUICK},
    )

    async def answers() -> list[str | None]:
        session = await scaling(caravan, session_id)
        return [await answer(caravan.http, e) for e in session["endpoints"]]

    assert sorted(await eventually(lambda: _all_answer(answers, "v1", 2), "two v1 replicas serving")) == [
        "v1 main1\n",
        "v1 main2\n",
    ]
    started = await caravan.gql(
        UPDATE_ENDPOINT,
        {"id": session_id, "input": {"startupCommand": VERSIONED, "environ": [{"name": "VERSION", "value": "v2"}]}},
    )
    assert started["updateEndpoint"] == {"revision": 1, "replicasBehind": 2}
    seen: list[list[str | None]] = []

    async def updated() -> list[str] | None:
        served = await answers()
        seen.append(served)
        assert served and all(served), f"the endpoint stopped serving during the update: {seen[-5:]}"
        done = all(a is not None and a.startswith("v2 ") for a in served) and len(served) == 2
        session = await scaling(caravan, session_id)
        return [a for a in served if a] if done and session["autoscaling"]["replicasBehind"] == 0 else None

    final = await eventually(updated, "every replica at v2", timeout=180)
    assert len(final) == 2
    assert any(any(a and a.startswith("v2 ") for a in s) and any(a and a.startswith("v1 ") for a in s) for s in seen)
    await destroy(caravan, session_id)


async def _all_answer(answers: Callable[[], Awaitable[list[str | None]]], version: str, count: int) -> list[str] | None:
    served = await answers()
    ok = len(served) == count and all(a is not None and a.startswith(f"{version} ") for a in served)
    return [a for a in served if a] if ok else None
