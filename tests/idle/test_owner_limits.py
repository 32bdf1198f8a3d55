"""Resource-policy limits in the idle checks: the strictest of the file's policy, the owner's and the project's.

The pure rule as a table; then the real idle service (real Redis and Nomad agent) on stored sessions without a job.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import Settings
from domain.idle.config import CheckName, EffectivePolicy
from domain.idle.owner_limits import tightened
from domain.model import SessionStatus
from domain.resource_policies import ProjectResourcePolicy, SessionLimits, UserResourcePolicy
from domain.users import Role, User
from stores.resource_policies import PolicyStore
from stores.sessions import SessionStore
from tests.idle.running import eventually, policy_file, running_idle, stored_session

ALL = frozenset(CheckName)
FILE = EffectivePolicy(check_interval=1.0, max_session_lifetime=600.0, network_idle_timeout=None, utilization=None)


@pytest.mark.parametrize(
    ("limits", "enabled", "lifetime", "network"),
    [
        (None, ALL, 600.0, None),
        (SessionLimits(None, None), ALL, 600.0, None),
        (SessionLimits(60.0, None), ALL, 60.0, None),  # stricter than the file
        (SessionLimits(3600.0, None), ALL, 600.0, None),  # never longer than the file
        (SessionLimits(None, 30.0), ALL, 600.0, 30.0),  # a check the file leaves off
        (SessionLimits(60.0, 30.0), frozenset({CheckName.UTILIZATION}), 600.0, None),  # the operator's switch wins
    ],
)
def test_the_stricter_deadline_wins(
    limits: SessionLimits | None, enabled: frozenset[CheckName], lifetime: float | None, network: float | None
) -> None:
    policy = tightened(FILE, limits, enabled)
    assert (policy.max_session_lifetime, policy.network_idle_timeout) == (lifetime, network)
    assert (policy.check_interval, policy.utilization) == (FILE.check_interval, FILE.utilization)


async def test_the_owners_and_the_projects_policies_reclaim_sessions_the_file_would_keep(
    settings: Settings, redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    store, policies = SessionStore(redis, keys), PolicyStore(redis, keys)
    alice = User("alice", "alice", Role.USER)
    bob = User("bob", "bob", Role.USER)
    carol = User("carol", "carol", Role.USER, projects=("physics",))
    await policies.put_user("alice", UserResourcePolicy(max_session_lifetime=2))
    await policies.put_project("physics", ProjectResourcePolicy(idle_timeout=2))
    await policies.put_user("bob", UserResourcePolicy(max_session_lifetime=3600, idle_timeout=3600))
    since = utcnow() - timedelta(seconds=5)
    limited = await stored_session(store, owner=alice, name="alice-s", running_since=since)
    unlimited = await stored_session(store, owner=bob, name="bob-s", running_since=since)
    in_project = await stored_session(store, owner=carol, name="carol-s", running_since=since)
    assert in_project.project == "physics"
    path = policy_file(tmp_path, 'check_interval = "0.2s"\ndefaults {\n  max_session_lifetime = "1h"\n}\n')

    async def reason(session_id: str) -> str | None:
        found = await store.get(session_id)
        return found.status_info if found and found.status is SessionStatus.TERMINATING else None

    async with running_idle(settings, path):
        assert await eventually(lambda: reason(limited.id), timeout=30) == "idle-session-lifetime"
        assert await eventually(lambda: reason(in_project.id), timeout=30) == "idle-timeout"
    after = await store.get(unlimited.id)
    assert after is not None and after.status is SessionStatus.RUNNING
