"""The idle checks over GraphQL: reports, the effective policy and who may read it, activity from the gateway.

A real gateway (no scheduler: the sessions are stored directly) with a real idle checker, Redis and Nomad.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from core.clock import utcnow
from core.settings import Settings
from domain.model import SessionType
from tests.harness import Caravan, GraphQLErrors, running_caravan
from tests.idle.running import OWNER, eventually, policy_file, running_idle, stored_session

POLICY = """
check_interval = "0.2s"
defaults {
  max_session_lifetime = "1h"
  network_idle_timeout = "10m"
  utilization {
    grace_period = "5m"
    window = "30m"
    operator = "any"
    thresholds {
      cpu_util = 2
      cuda_util = 1
    }
  }
}
"""
IDLE_CHECKS = """
query($id: ID!) { session(id: $id) { idleChecks {
  checkedAt terminate reason
  checks { name expired remaining measuredAgainst note operator utilization { metric average threshold } }
} } }
"""
EFFECTIVE = """
query($id: ID!) { effectiveIdlePolicy(sessionId: $id) {
  source checkInterval maxSessionLifetime networkIdleTimeout exemptFrom
  utilization { gracePeriod window operator thresholds { metric threshold } }
} }
"""
LOGS = "query($id: ID!) { session(id: $id) { mainKernel { logs { stdout } } } }"


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with running_caravan(settings, scheduler=False) as running:
        yield running


async def test_idle_checks_are_the_last_stored_verdict(caravan: Caravan, tmp_path: Path) -> None:
    session = await stored_session(caravan.store, running_since=utcnow() - timedelta(seconds=60))
    before = await caravan.gql(IDLE_CHECKS, {"id": session.id})
    assert before["session"]["idleChecks"] is None  # no checker has judged it yet
    async with running_idle(caravan.settings, policy_file(tmp_path, POLICY)) as service:
        await eventually(lambda: service.idle_store.verdict(session.id), timeout=30)
        report = (await caravan.gql(IDLE_CHECKS, {"id": session.id}))["session"]["idleChecks"]
    assert (report["terminate"], report["reason"]) == (False, None)
    lifetime, network, utilization = report["checks"]
    assert (lifetime["name"], lifetime["expired"], lifetime["measuredAgainst"]) == (
        "SESSION_LIFETIME",
        False,
        "LIFETIME",
    )
    assert 3530 < lifetime["remaining"] <= 3540
    assert (network["name"], network["measuredAgainst"]) == ("NETWORK_TIMEOUT", "IDLENESS")
    assert 530 < network["remaining"] <= 540
    assert utilization == {
        "name": "UTILIZATION",
        "expired": False,
        "remaining": pytest.approx(240, abs=2),
        "measuredAgainst": "GRACE_PERIOD",
        "note": "in grace period",
        "operator": "ANY",
        "utilization": [{"metric": "cpu_util", "average": None, "threshold": 2.0}],  # no cuda: not judged
    }


async def test_admins_read_the_effective_policy_of_a_session(caravan: Caravan, tmp_path: Path) -> None:
    batch = await stored_session(caravan.store, type=SessionType.BATCH)
    assert (await caravan.gql(EFFECTIVE, {"id": batch.id}))["effectiveIdlePolicy"] is None  # no checker yet
    path = policy_file(tmp_path, POLICY)
    async with running_idle(caravan.settings, path) as service:
        await eventually(service.idle_store.published_policy, timeout=30)
    effective = (await caravan.gql(EFFECTIVE, {"id": batch.id}))["effectiveIdlePolicy"]
    assert effective == {
        "source": str(path),
        "checkInterval": 0.2,
        "maxSessionLifetime": 3600.0,
        "networkIdleTimeout": 600.0,
        "exemptFrom": ["SESSION_LIFETIME", "NETWORK_TIMEOUT"],
        "utilization": {
            "gracePeriod": 300.0,
            "window": 1800.0,
            "operator": "ANY",
            "thresholds": [{"metric": "cpu_util", "threshold": 2.0}],
        },
    }


@pytest.mark.parametrize(("viewer", "code"), [("alice", "FORBIDDEN"), ("bob", "NOT_FOUND")], ids=["owner", "other"])
async def test_others_may_not_read_the_effective_policy(caravan: Caravan, viewer: str, code: str) -> None:
    session = await stored_session(caravan.store, owner=OWNER)
    token = await caravan.user(viewer)
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(EFFECTIVE, {"id": session.id}, token=token)
    assert refused.value.codes == [code]
    with pytest.raises(GraphQLErrors) as missing:
        await caravan.gql(EFFECTIVE, {"id": "no-such-session"})
    assert missing.value.codes == ["NOT_FOUND"]


async def test_reading_a_kernels_logs_is_activity(caravan: Caravan) -> None:
    session = await stored_session(caravan.store)
    keys = caravan.store.keys
    assert await caravan.store.redis.zscore(keys.idle_last_activity, session.id) is None
    before = utcnow().timestamp()
    logs = await caravan.gql(LOGS, {"id": session.id})
    assert logs["session"]["mainKernel"]["logs"] is None  # Nomad does not know this allocation
    recorded = await caravan.store.redis.zscore(keys.idle_last_activity, session.id)
    assert recorded is not None and before <= recorded <= utcnow().timestamp()
