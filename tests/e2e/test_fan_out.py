"""Issue 10: one user's fan-out of Nomad calls cannot starve the gateway, other users, or the leases.

The real process model (``caravan dev``: gateway, scheduler and idle checker in processes of their own) on the real
Redis and Nomad, with sessions whose allocations are real, so that every ``logs`` field is a real Nomad call:

- the fan-out of the issue (15 aliases × a page of 100 sessions × kernel logs) is refused before it runs;
- while the same user keeps many of the heaviest queries the limit admits in flight (thousands of Nomad calls), another
  user's ordinary request, logs included, keeps answering within a liveness bound;
- afterwards the gateway's Nomad client still answers at once, and the scheduler and the idle checker never lost
  their leases (no new lease term started).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from gateway.graphql.limits import Limits
from tests.dev_process import caravan_dev
from tests.harness import Caravan, running_caravan

pytestmark = pytest.mark.nomad

SESSIONS = 20
"""Alice's sessions: each of her heavy queries reads the logs of every one of them."""
STORM = 8.0
"""Seconds Alice keeps heavy queries in flight."""
HEAVY_AT_ONCE = 12
"""Alice's heavy queries in flight at any moment."""
LIVENESS = 5.0
"""Seconds within which Bob's ordinary request must answer, however busy Alice keeps the gateway (not a speed claim:
alone it answers in milliseconds; a starved gateway took 18-54 s, or never)."""

LOGS = "mainKernel { logs { stdout stderr } }"
FAN_OUT = "{ " + " ".join(f"a{i}: sessions(first: 100) {{ edges {{ node {{ {LOGS} }} }} }}" for i in range(15)) + " }"
ADMITTED = (
    "{ " + " ".join(f"a{i}: sessions(first: 100) {{ edges {{ node {{ id {LOGS} }} }} }}" for i in range(2)) + " }"
)
"""The heaviest shape the default cost limit admits: 2 × (1 + 100 × 21) = 4202."""
BOBS = "query($id: ID!) { session(id: $id) { status mainKernel { logs { stdout } } } }"


def batch(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "BATCH",
        "driver": "RAW_EXEC",
        "startupCommand": command,
        "resources": [{"slot": "cpu", "amount": "0.1"}, {"slot": "mem", "amount": "32m"}],
        **fields,
    }


@contextlib.asynccontextmanager
async def dev_stack(settings: Settings) -> AsyncIterator[Caravan]:
    """``caravan dev`` for this namespace, and a client of it (its stores and Nomad client are the test's own)."""
    async with running_caravan(settings, scheduler=False, serve=False) as local, caravan_dev(settings) as dev:
        try:
            yield dataclasses.replace(local, url=dev.url)
        finally:
            for job in await local.nomad.jobs(settings.nomad.job_prefix + "-"):
                await local.nomad.deregister(job["ID"], purge=True)


async def lease_terms(redis: Redis, keys: Keys) -> dict[str, str | None]:
    """The holder and fencing number of the scheduler's and the idle checker's leases."""
    keys_ = [keys.scheduler_lease, keys.scheduler_fence, keys.idle_lease, keys.idle_fence]
    return dict(zip(keys_, await redis.mget(keys_), strict=True))


async def test_one_users_fan_out_is_bounded_and_starves_nobody(settings: Settings, redis: Redis, keys: Keys) -> None:
    assert Limits().max_cost >= 4202  # ADMITTED is admitted by the default limit
    async with dev_stack(settings) as caravan:
        alice, bob = await caravan.user("alice"), await caravan.user("bob")
        created = await caravan.gql(
            "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }",
            {"input": batch("alice-batch", "echo alice-was-here", owner="alice", count=SESSIONS)},
        )
        bobs = await caravan.gql(
            "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }",
            {"input": batch("bob-batch", "echo bob-was-here", owner="bob")},
        )
        [bob_session] = [s["id"] for s in bobs["createSession"]["sessions"]]
        for session in [*created["createSession"]["sessions"], {"id": bob_session}]:
            await caravan.wait_for(session["id"], "TERMINATED", timeout=180)
        bob_sees = {"session": {"status": "TERMINATED", "mainKernel": {"logs": {"stdout": "bob-was-here\n"}}}}
        assert await caravan.gql(BOBS, {"id": bob_session}, token=bob) == bob_sees

        # the fan-out of the issue never runs
        refused = await caravan.post(FAN_OUT, token=alice)
        assert [e["extensions"]["code"] for e in refused["errors"]] == ["QUERY_TOO_COSTLY"] and "data" not in refused

        terms = await lease_terms(redis, keys)
        assert all(terms.values()), terms  # both lead
        answered: list[dict[str, Any]] = []
        stop = time.monotonic() + STORM

        async def alice_keeps_asking() -> None:
            while time.monotonic() < stop:
                answered.append(await caravan.post(ADMITTED, token=alice))

        storm = [asyncio.create_task(alice_keeps_asking()) for _ in range(HEAVY_AT_ONCE)]
        bob_waited: list[float] = []
        while not answered:  # the storm is under way
            await asyncio.sleep(0.01)
        while time.monotonic() < stop:
            asked = time.monotonic()
            async with asyncio.timeout(30):
                assert await caravan.gql(BOBS, {"id": bob_session}, token=bob) == bob_sees
            bob_waited.append(time.monotonic() - asked)
            await asyncio.sleep(0.2)
        await asyncio.gather(*storm)

        assert max(bob_waited) < LIVENESS, bob_waited
        full = [a for a in answered if "errors" not in a]
        assert len(full) >= HEAVY_AT_ONCE, f"only {len(full)} of Alice's {len(answered)} queries answered"
        for answer in full:
            nodes = [edge["node"] for alias in answer["data"].values() for edge in alias["edges"]]
            assert len(nodes) == 2 * SESSIONS
            assert {n["mainKernel"]["logs"]["stdout"] for n in nodes} == {"alice-was-here\n"}
        assert {e["extensions"]["code"] for a in answered for e in a.get("errors", ())} <= {"UNAVAILABLE"}
        print(
            f"alice: {len(answered)} heavy queries ({len(full)} whole, {len(full) * 4 * SESSIONS} log reads); "
            f"bob: {len(bob_waited)} requests, slowest {max(bob_waited):.3f} s"
        )

        # the gateway's Nomad client is whole afterwards, and no lease changed hands or term
        async with asyncio.timeout(LIVENESS):
            assert await caravan.gql(BOBS, {"id": bob_session}, token=bob) == bob_sees
            assert "errors" not in await caravan.post(ADMITTED, token=alice)
        assert await lease_terms(redis, keys) == terms
