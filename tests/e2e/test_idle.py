"""Idle sessions reclaimed end to end: real Nomad, Redis, scheduler, gateway and idle checker, seconds-scale policies.

Every session is INTERACTIVE on the exec driver: without a startup command its kernel idles in the job
renderer's keep-alive loop, with ``BUSY`` it keeps a core busy. Each test runs its own idle checker on a
policy file in the test's directory, sweeping every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.clock import utcnow
from domain.model import SessionStatus
from tests.harness import Caravan
from tests.idle.running import BUSY, eventually, policy_file, running_idle, start_interactive, swept_since

SWEEP = 'check_interval = "1s"\n'

IDLE_CHECKS = """
query($id: ID!) { session(id: $id) { status idleChecks {
  checkedAt terminate reason
  checks { name expired remaining measuredAgainst note operator utilization { metric average threshold } }
} } }
"""
LOGS = "query($id: ID!) { session(id: $id) { mainKernel { logs(tailBytes: 64) { stdout } } } }"
EFFECTIVE = "query($id: ID!) { effectiveIdlePolicy(sessionId: $id) { source maxSessionLifetime } }"


def policy(body: str) -> str:
    return SWEEP + "defaults {\n" + body + "\n}\n"


async def ended(caravan: Caravan, session_id: str) -> dict[str, Any]:
    return await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=30)


async def status(caravan: Caravan, session_id: str) -> SessionStatus:
    found = await caravan.store.get(session_id)  # from Redis: a GraphQL read of logs would count as activity
    assert found is not None
    return found.status


async def check(caravan: Caravan, session_id: str, name: str) -> dict[str, Any]:
    session = (await caravan.gql(IDLE_CHECKS, {"id": session_id}))["session"]
    assert session["idleChecks"] is not None, "no idle report"
    [found] = [c for c in session["idleChecks"]["checks"] if c["name"] == name]
    return dict(found)


def seconds_between(session: dict[str, Any], first: str, then: str) -> float:
    at = {change["status"]: datetime.fromisoformat(change["at"]) for change in session["statusHistory"]}
    return (at[then] - at[first]).total_seconds()


@contextlib.asynccontextmanager
async def using(caravan: Caravan, session_id: str) -> AsyncIterator[None]:
    """Read the session's logs through the gateway twice a second: a user at work."""

    async def poll() -> None:
        while True:
            await caravan.gql(LOGS, {"id": session_id})
            await asyncio.sleep(0.5)

    task = asyncio.create_task(poll())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_busy_session_survives_the_utilization_check_while_an_idle_one_is_reclaimed(
    caravan: Caravan, tmp_path: Path
) -> None:
    body = 'utilization {\n  window = "2s"\n  thresholds {\n    cpu_util = 10\n  }\n}'
    busy = await start_interactive(caravan, "busy", BUSY)
    idle = await start_interactive(caravan, "idle")
    async with running_idle(caravan.settings, policy_file(tmp_path, policy(body))) as service:
        session = await ended(caravan, idle)
        assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-utilization")
        await swept_since(service.idle_store, busy, utcnow() + timedelta(seconds=2))  # a window on, judged and acted on
        assert await status(caravan, busy) is SessionStatus.RUNNING
        utilization = await check(caravan, busy, "UTILIZATION")
    assert (utilization["expired"], utilization["measuredAgainst"], utilization["note"]) == (
        False,
        "WINDOW",
        "utilized",
    )
    [reading] = utilization["utilization"]
    assert reading["metric"] == "cpu_util" and reading["threshold"] == 10 and reading["average"] >= 10


async def test_a_session_without_traffic_is_reclaimed_while_one_in_use_survives(
    caravan: Caravan, tmp_path: Path
) -> None:
    used = await start_interactive(caravan, "used")
    unused = await start_interactive(caravan, "unused")
    path = policy_file(tmp_path, policy('network_idle_timeout = "3s"'))
    async with running_idle(caravan.settings, path) as service, using(caravan, used):
        session = await ended(caravan, unused)
        assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-timeout")
        await swept_since(service.idle_store, used, utcnow())  # judged since, and acted on
        assert await status(caravan, used) is SessionStatus.RUNNING
        network = await check(caravan, used, "NETWORK_TIMEOUT")
    assert (network["expired"], network["measuredAgainst"]) == (False, "IDLENESS")
    assert 1.5 < network["remaining"] <= 3  # the last read was at most half a second (plus a sweep) ago


async def test_a_session_past_its_lifetime_is_reclaimed(caravan: Caravan, tmp_path: Path) -> None:
    session_id = await start_interactive(caravan, "short-lived")
    async with running_idle(caravan.settings, policy_file(tmp_path, policy('max_session_lifetime = "3s"'))):
        session = await ended(caravan, session_id)
    assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-session-lifetime")
    assert 3 <= seconds_between(session, "RUNNING", "TERMINATING") < 5  # counted from RUNNING


async def test_a_policy_edit_takes_effect_without_a_restart(caravan: Caravan, tmp_path: Path) -> None:
    session_id = await start_interactive(caravan, "long-lived")
    path = policy_file(tmp_path, policy("max_session_lifetime = 0"))
    async with running_idle(caravan.settings, path) as service:
        await swept_since(service.idle_store, session_id, utcnow())  # judged by the first policy, and acted on
        assert await status(caravan, session_id) is SessionStatus.RUNNING
        path.write_text(policy('max_session_lifetime = "2s"'))
        session = await ended(caravan, session_id)
        assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-session-lifetime")
        effective = (await caravan.gql(EFFECTIVE, {"id": session_id}))["effectiveIdlePolicy"]
    assert effective == {"source": str(path), "maxSessionLifetime": 2.0}


async def test_a_broken_policy_file_is_refused_and_the_old_policy_keeps_working(
    caravan: Caravan, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = policy_file(tmp_path, policy('max_session_lifetime = "3s"'))
    async with running_idle(caravan.settings, path):
        path.write_text(policy('max_session_lifetime = "3s"\n  utilization {\n    operator = "most"\n  }'))

        async def refused() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "idle.reload" and r.levelno == logging.ERROR]

        [refusal] = await eventually(refused, timeout=5)
        assert refusal.endswith(f'{path}:5: defaults.utilization.operator: expected "all" or "any", got \'most\'')
        session_id = await start_interactive(caravan, "after-the-breakage")
        session = await ended(caravan, session_id)  # only the old policy reclaims anything
        effective = (await caravan.gql(EFFECTIVE, {"id": session_id}))["effectiveIdlePolicy"]
    assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-session-lifetime")
    assert 3 <= seconds_between(session, "RUNNING", "TERMINATING") < 5
    assert effective == {"source": str(path), "maxSessionLifetime": 3.0}
