"""Resource policies enforced end to end: real Nomad, Redis, scheduler, gateway and idle checker.

An admin sets a user's policy through the API; the idle checker, whose file sets no limit, reclaims that user's idle
session at the policy's idle timeout while an unlimited user's session keeps running.
"""

from __future__ import annotations

from pathlib import Path

from core.clock import utcnow
from domain.model import SessionStatus
from domain.users import Role
from tests.harness import CREATE, Caravan
from tests.idle.running import policy_file, running_idle, swept_since

SET_USER = """mutation($user: String!, $policy: UserResourcePolicyInput!) {
  setUserResourcePolicy(userId: $user, policy: $policy) { idleTimeout } }"""
EFFECTIVE = "query($id: ID!) { effectiveIdlePolicy(sessionId: $id) { maxSessionLifetime networkIdleTimeout } }"


async def start(caravan: Caravan, name: str, token: str) -> str:
    fields = {
        "type": "INTERACTIVE",
        "name": name,
        "driver": "EXEC",
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "32m"}],
    }
    data = await caravan.gql(CREATE, {"input": fields}, token=token)
    session_id = str(data["createSession"]["sessions"][0]["id"])
    await caravan.wait_for(session_id, "RUNNING", timeout=60)
    return session_id


async def test_a_users_idle_timeout_reclaims_their_idle_session(caravan: Caravan, tmp_path: Path) -> None:
    alice = await caravan.user("alice")
    bob = await caravan.user("bob")
    await caravan.user("ada", Role.ADMIN)
    assert (await caravan.gql(SET_USER, {"user": "alice", "policy": {"idleTimeout": "3s"}}))[
        "setUserResourcePolicy"
    ] == {"idleTimeout": 3.0}
    limited = await start(caravan, "limited", alice)
    unlimited = await start(caravan, "unlimited", bob)
    path = policy_file(tmp_path, 'check_interval = "1s"\ndefaults {\n  max_session_lifetime = "1h"\n}\n')
    async with running_idle(caravan.settings, path) as service:
        ended = await caravan.wait_for(limited, "TERMINATED", "ERROR", timeout=30)
        effective = (await caravan.gql(EFFECTIVE, {"id": limited}))["effectiveIdlePolicy"]
        await swept_since(service.idle_store, unlimited, utcnow())  # judged since, and acted on
        still = await caravan.store.get(unlimited)
    assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "idle-timeout")
    assert effective == {"maxSessionLifetime": 3600.0, "networkIdleTimeout": 3.0}
    assert still is not None and still.status is SessionStatus.RUNNING
