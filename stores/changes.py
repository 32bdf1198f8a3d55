"""The counters a write of a session, user or token bumps, and the wake-up it leaves for readers that block.

Every such write calls one of these in its MULTI: ``Keys.sessions_version`` / ``Keys.users_version`` /
``Keys.endpoints_version`` move (the GraphQL result cache and the control planes compare them), and an entry is
appended to ``Keys.route_changes``, which the apps' and the endpoints' control planes (``gateway.apps.plane``) read
with ``XREAD BLOCK``: they learn of the change at once, without polling Redis.
"""

from __future__ import annotations

from redis.asyncio import Redis

from core.keys import Keys
from stores.coalesced import Coalesced

CHANGES_KEPT = 100
"""Entries kept in ``Keys.route_changes`` (about): a reader only needs to know that something changed."""


def sessions_changed(pipe: Redis | Coalesced, keys: Keys) -> None:
    """In the MULTI of a write of session documents or listing indexes."""
    pipe.incr(keys.sessions_version)
    pipe.xadd(keys.route_changes, {"what": "sessions"}, maxlen=CHANGES_KEPT, approximate=True)


def endpoints_changed(pipe: Redis, keys: Keys) -> None:
    """In the MULTI of a write of an endpoint's access (public flag, endpoint token)."""
    pipe.incr(keys.endpoints_version)
    pipe.xadd(keys.route_changes, {"what": "endpoints"}, maxlen=CHANGES_KEPT, approximate=True)


def users_changed(pipe: Redis, keys: Keys) -> None:
    """In the MULTI of a write of a user, a token or a revocation."""
    pipe.incr(keys.users_version)
    pipe.xadd(keys.route_changes, {"what": "users"}, maxlen=CHANGES_KEPT, approximate=True)
