"""Rolling updates of an endpoint's image and slots, under constant load through the stack's HAProxy, on real Nomad.

Eight clients send GET / through the endpoint, each on a kept-alive connection, the whole time an update replaces
the replicas one by one (a new one started, healthy, routed; an old one drained, then stopped): not one request may
fail. The replicas are busybox httpd, which answers with its replica's name; the image test runs them in docker
kernels of the tests' busybox image and of the same image under a second tag (no registry is reachable: a tag is how
to get another image), the slots test in exec kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from core.settings import Settings
from tests.conftest import DEFAULT_IMAGE
from tests.e2e.test_inference import SERVE, eventually
from tests.e2e.test_inference_autoscaling import UPDATE_ENDPOINT as UPDATE
from tests.e2e.test_inference_endpoints import VIEW, Endpoint, _settings
from tests.e2e.test_kernel_roles import allocated, second_tag
from tests.harness import ADMIN_TOKEN, CREATE, Caravan, GraphQLErrors
from tests.ingress import caravan_behind_haproxy

__all__ = ["second_tag"]  # the fixture: the busybox image under a second tag

SCALING = """
query($id: ID!) { session(id: $id) {
  status image resources { slot amount }
  kernels { hostname image status resources { slot amount } }
  autoscaling { revision replicasBehind drainingReplicas readyReplicas }
} }
"""
QUICK = {"minReplicas": 2, "maxReplicas": 2, "target": 100, "drainTimeout": "3s", "stableWindow": "4s",
         "panicWindow": "2s", "scaleDownDelay": "0s"}  # fmt: skip
"""Two replicas for good (the load must not scale them), drained for at most 3 s."""
PACE = 0.05
"""Seconds each client waits between two requests: a steady load (at most 160 requests a second), not a flood. On a
quiet machine, 8 clients back to back (about 800 a second, each answer closing its connection) made HAProxy's
frontend refuse the harness's own GraphQL connections for a while; not explained yet (docs/inference.md)."""
WORKERS = 8
SLOTS = [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}]


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    """Caravan behind HAProxy, the per-token rate limit out of the way: the load here is one token's, as fast as the
    machine sends it (a quiet machine sends more than the default 1,000 requests a second: 429s, not failures)."""
    async with caravan_behind_haproxy(_settings(settings, rate_limit=1_000_000)) as (running, _):
        yield running


async def _endpoint(caravan: Caravan, token: str = ADMIN_TOKEN, **fields: Any) -> Endpoint:
    request = {
        "name": "roll-" + uuid.uuid4().hex[:8],
        "type": "INFERENCE",
        "servicePort": 8000,
        "replicas": 2,
        "healthCheckPath": "/",
        "startupCommand": SERVE,
        "autoscaling": QUICK,
        **fields,
    }
    [session] = (await caravan.gql(CREATE, {"input": request}, token=token))["createSession"]["sessions"]
    found = (await caravan.gql(VIEW, {"id": session["id"]}, token=token))["session"]
    endpoint = Endpoint(caravan, session["id"], found["endpointUrl"])

    async def both() -> bool | None:
        answers = {(await endpoint.get("/", token)).text for _ in range(8)}
        return True if answers == {"replica main1\n", "replica main2\n"} else None

    await eventually(both, "both replicas answering through the endpoint", timeout=120)
    return endpoint


@contextlib.asynccontextmanager
async def _constant_load(endpoint: Endpoint, token: str) -> AsyncIterator[list[int | str]]:
    """:data:`WORKERS` clients sending GET / back to back; each answer's status (or the error) is appended."""
    outcomes: list[int | str] = []
    stop = asyncio.Event()

    async def worker() -> None:
        async with httpx2.AsyncClient(timeout=30) as client:
            while not stop.is_set():
                try:
                    outcomes.append((await endpoint.get("/", token, client=client)).status_code)
                except httpx2.HTTPError as exc:
                    outcomes.append(repr(exc))
                await asyncio.sleep(PACE)

    workers = [asyncio.create_task(worker()) for _ in range(WORKERS)]
    try:
        await eventually(lambda: _at_least(outcomes, 50), "the load running")
        yield outcomes
    finally:
        stop.set()
        await asyncio.gather(*workers)


async def _at_least(items: list[Any], count: int) -> bool | None:
    return True if len(items) >= count else None


async def _updated(caravan: Caravan, endpoint: Endpoint, token: str, revision: int) -> dict[str, Any]:
    """The session once every replica runs ``revision``, none is draining and both serve."""

    async def done() -> dict[str, Any] | None:
        session: dict[str, Any] = (await caravan.gql(SCALING, {"id": endpoint.session_id}, token=token))["session"]
        scaling = session["autoscaling"]
        over = scaling["revision"] == revision and scaling["replicasBehind"] == 0
        settled = scaling["drainingReplicas"] == 0 and scaling["readyReplicas"] == 2 and len(session["kernels"]) == 2
        return session if over and settled else None

    return await eventually(done, f"every replica at revision {revision}", timeout=240)


def _refusal(errors: GraphQLErrors) -> tuple[str, str]:
    [error] = errors.errors
    return error["extensions"]["code"], error["extensions"].get("field")


def _failed(outcomes: list[int | str]) -> dict[int | str, int]:
    return {o: outcomes.count(o) for o in set(outcomes) if o != 200}


@pytest.mark.docker
async def test_a_rolling_update_of_the_image_under_load_fails_no_request(caravan: Caravan, second_tag: str) -> None:
    endpoint = await _endpoint(caravan, driver="DOCKER", image=DEFAULT_IMAGE, resources=SLOTS)
    async with _constant_load(endpoint, ADMIN_TOKEN) as outcomes:
        started = await caravan.gql(UPDATE, {"id": endpoint.session_id, "input": {"image": second_tag}})
        assert started["updateEndpoint"] == {"revision": 1, "replicasBehind": 2}
        session = await _updated(caravan, endpoint, ADMIN_TOKEN, 1)
        during = len(outcomes)
        await eventually(lambda: _at_least(outcomes, during + 50), "the load after the update")
    assert not _failed(outcomes), _failed(outcomes)
    assert session["image"] == second_tag
    assert {k["image"] for k in session["kernels"]} == {second_tag}
    stored = await caravan.store.get(endpoint.session_id)
    assert stored is not None and stored.nomad_job_id
    job = await caravan.nomad.job(stored.nomad_job_id)
    assert {g["Tasks"][0]["Config"]["image"] for g in job["TaskGroups"]} == {second_tag}  # what Nomad runs
    # an image outside the allowlist is refused, naming the field, and nothing changes
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(UPDATE, {"id": endpoint.session_id, "input": {"image": "elsewhere/model:1"}})
    assert _refusal(refused.value) == ("INVALID_INPUT", "image")
    after = (await caravan.gql(SCALING, {"id": endpoint.session_id}))["session"]
    assert (after["autoscaling"]["revision"], after["image"]) == (1, second_tag)


async def test_a_rolling_update_of_the_slots_under_load_fails_no_request(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    endpoint = await _endpoint(caravan, alice, driver="EXEC", resources=SLOTS)
    assert {mib for _, mib in (await allocated(caravan, endpoint.session_id)).values()} == {64}
    async with _constant_load(endpoint, alice) as outcomes:
        started = await caravan.gql(
            UPDATE, {"id": endpoint.session_id, "input": {"resources": [{"slot": "mem", "amount": "96m"}]}}, token=alice
        )
        assert started["updateEndpoint"] == {"revision": 1, "replicasBehind": 2}
        session = await _updated(caravan, endpoint, alice, 1)
        during = len(outcomes)
        await eventually(lambda: _at_least(outcomes, during + 50), "the load after the update")
    assert not _failed(outcomes), _failed(outcomes)
    assert {r["slot"]: r["amount"] for r in session["resources"]}["mem"] == str(96 * 1024 * 1024)
    assert {mib for _, mib in (await allocated(caravan, endpoint.session_id)).values()} == {96}  # what Nomad gave
    # slots the owner's resource policy could never hold for both replicas are refused, and nothing changes
    await caravan.gql(
        'mutation { setUserResourcePolicy(userId: "alice", policy: {totalResourceSlots: '
        '[{slot: "mem", amount: "256m"}]}) { idleTimeout } }'
    )
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(
            UPDATE,
            {"id": endpoint.session_id, "input": {"resources": [{"slot": "mem", "amount": "200m"}]}},
            token=alice,
        )
    assert _refusal(refused.value) == ("FORBIDDEN", "resources.mem")
    assert (await caravan.gql(SCALING, {"id": endpoint.session_id}, token=alice))["session"]["autoscaling"][
        "revision"
    ] == 1
