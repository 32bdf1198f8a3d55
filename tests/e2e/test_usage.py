"""Usage on the real stack: two users' sessions run on Nomad while the scheduler process is killed (SIGKILL) and
started again, mid-session and after the end; the report matches their status histories to the second, counting
nothing twice."""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from core.settings import Settings
from domain.model import SessionStatus
from domain.usage import days_of, epoch_seconds, held_intervals, rollup
from tests.e2e.test_crash_recovery import start_scheduler
from tests.e2e.test_restarts import OwnStack, batch, converged, own_settings, own_stack  # noqa: F401 (fixtures)
from tests.harness import CREATE, Caravan, running_caravan

USAGE = """
query Usage($from: Date!, $to: Date!) {
  usage(from: $from, to: $to, groupBy: [USER, PROJECT]) {
    rows { user project seconds kernelSeconds slots { slot resourceSeconds } }
  }
}
"""
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status } }"
HISTORY = "query($id: ID!) { session(id: $id) { status statusHistory { status at } } }"


async def create(caravan: Caravan, token: str, **fields: Any) -> str:
    name = "usage-" + uuid.uuid4().hex[:8]
    data = await caravan.gql(CREATE, {"input": {"name": name, "driver": "EXEC", **fields}}, token=token)
    session_id: str = data["createSession"]["sessions"][0]["id"]
    return session_id


async def held_seconds(caravan: Caravan, session_id: str, token: str) -> int:
    """From the session's own history as the API shows it: RUNNING until the next status that holds nothing."""
    history = (await caravan.gql(HISTORY, {"id": session_id}, token=token))["session"]["statusHistory"]
    total, start = 0, None
    for change in history:
        at = epoch_seconds(datetime.fromisoformat(change["at"]))
        if start is None and change["status"] == "RUNNING":
            start = at
        elif start is not None and change["status"] not in ("RUNNING", "TERMINATING"):
            total, start = total + at - start, None
    assert start is None, history
    return total


async def test_two_users_usage_matches_their_histories_across_scheduler_kills(settings: Settings) -> None:
    log = (settings.home / "scheduler-usage.log").open("ab")
    async with running_caravan(settings, scheduler=False) as caravan:
        alice = await caravan.user("alice", projects=("p1",))
        bob = await caravan.user("bob", projects=("p2",))
        process = await start_scheduler(settings, log)
        try:
            interactive = await create(caravan, alice, type="INTERACTIVE", resources=[{"slot": "cpu", "amount": "0.5"}])
            batch = await create(
                caravan, bob, type="BATCH", startupCommand="sleep 6", resources=[{"slot": "cpu", "amount": "0.25"}]
            )
            await caravan.wait_for(interactive, "RUNNING")
            await caravan.wait_for(batch, "RUNNING", "TERMINATED")
            process.send_signal(signal.SIGKILL)  # mid-session
            await process.wait()
            process = await start_scheduler(settings, log)
            await caravan.gql(DESTROY, {"ids": [interactive]}, token=alice)
            await caravan.wait_for(interactive, "TERMINATED")
            await caravan.wait_for(batch, "TERMINATED")
            process.send_signal(signal.SIGKILL)  # after the end: a new leader reconciles the ended sessions again
            await process.wait()
            process = await start_scheduler(settings, log)
            await caravan.wait_for(interactive, "TERMINATED")
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()
            log.close()

        alice_seconds = await held_seconds(caravan, interactive, alice)
        bob_seconds = await held_seconds(caravan, batch, bob)
        assert alice_seconds > 0 and bob_seconds > 0
        today = datetime.now(UTC).date()
        period = {"from": (today - timedelta(days=1)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}
        rows = (await caravan.gql(USAGE, period))["usage"]["rows"]
        by_user = {(r["user"], r["project"]): r for r in rows}
        assert set(by_user) == {("alice", "p1"), ("bob", "p2")}
        assert by_user["alice", "p1"]["seconds"] == alice_seconds
        assert by_user["bob", "p2"]["seconds"] == bob_seconds
        cpu = {key: {s["slot"]: s["resourceSeconds"] for s in r["slots"]}["cpu"] for key, r in by_user.items()}
        assert Decimal(cpu["alice", "p1"]) == alice_seconds * Decimal("0.5")
        assert Decimal(cpu["bob", "p2"]) == bob_seconds * Decimal("0.25")
        # each user sees their own, and only their own
        own = (await caravan.gql(USAGE, period, token=bob))["usage"]["rows"]
        assert [(r["user"], r["seconds"]) for r in own] == [("bob", bob_seconds)]


@pytest.mark.nomad
@pytest.mark.redis  # a Redis and a Nomad agent of its own (tests/e2e/test_restarts.py), Redis killed
async def test_redis_killed_mid_session_counts_each_session_once(
    own_stack: OwnStack,  # noqa: F811 (the fixture imported above)
    own_settings: Settings,  # noqa: F811
) -> None:
    async with running_caravan(own_settings) as caravan:
        ids = []
        for n in range(3):
            data = await caravan.gql(CREATE, {"input": batch(f"usage-{n}", f"sleep {4 + n}")})
            ids.append(data["createSession"]["sessions"][0]["id"])
        for session_id in ids:
            await caravan.wait_for(session_id, "RUNNING", "TERMINATED")
        own_stack.redis.kill()  # mid-session: the sessions end while Redis is down or after it is back
        await asyncio.to_thread(own_stack.redis.start)
        sessions = {s.id: s for s in await converged(caravan)}
        records = [await caravan.store.usage.record(session_id) for session_id in ids]
        days = days_of(date.today() - timedelta(days=1), date.today() + timedelta(days=1))
        stored, _ = await caravan.store.usage.stored_rollup(days)
    assert all(sessions[i].status is SessionStatus.TERMINATED for i in ids)
    for session_id, record in zip(ids, records, strict=True):
        assert record is not None, f"the usage of {session_id} was lost"
        held = held_intervals(sessions[session_id].status_history, now=datetime.now(UTC))
        assert record.intervals == held and record.seconds > 0
    assert stored == rollup(r for r in records if r is not None)  # each counted once, nothing else
