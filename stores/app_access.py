"""How a browser reaches an app without its API token in a URL: launch codes and app cookies (Redis).

1. ``launchApp`` (GraphQL, with the token) stores a **launch code**: random, single use, valid
   :data:`LAUNCH_TTL` seconds, keyed by its SHA-256 and holding the token's hash and the app's host.
2. The browser opens ``http://<app host>/.caravan/launch?code=…``; the gateway takes the code (``GETDEL``: a second
   use finds nothing), checks it was made for this host, and answers with an **app cookie**: a JWT signed for that
   host, the token's hash and user, and an expiry (``gateway.apps.headers.signed_cookie_value``), HttpOnly,
   SameSite=Lax, host-only (no ``Domain``).
3. HAProxy checks the cookie at each request itself (``gateway.apps.ingress_config``): its signature, host and
   expiry, and that the token it stands for is still in its map of valid tokens (a revoked token or a deactivated
   user is refused within milliseconds, the control plane's next edit).

Only hashes are stored: a leak of Redis' contents opens no app.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from redis.asyncio import Redis

from core.keys import Keys
from core.replies import text_hash
from domain.users import hash_token

LAUNCH_TTL = 60
"""Seconds a launch code may wait to be used."""


@dataclass(frozen=True)
class AppGrant:
    """What a launch code or an app cookie stands for."""

    token_hash: str
    host: str
    """The app's host name (no port): the one host the grant is valid on."""


class AppAccessStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def new_launch_code(self, token: str, host: str) -> str:
        code = secrets.token_urlsafe(32)
        key = self.keys.app_launch(hash_token(code))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"token": hash_token(token), "host": host})
            pipe.expire(key, LAUNCH_TTL)
            await pipe.execute()
        return code

    async def take_launch_code(self, code: str) -> AppGrant | None:
        """The code's grant, once: the code is gone after this call."""
        key = self.keys.app_launch(hash_token(code))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(key)
            pipe.delete(key)
            reply, _ = await pipe.execute()
        found = text_hash(reply)
        return AppGrant(found["token"], found["host"]) if found else None
