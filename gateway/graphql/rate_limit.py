"""The per-user request rate limit, counted in Redis by the script that checks the request's token.

The rate limit counts per user, whatever token they send (ten tokens get one budget), and per client address for
requests without a valid token (a made-up token does not buy a fresh budget). It needs the token's user, so the
token check and the count run in one Redis script (:data:`ADMIT`, with the reads the result cache wants): one round
trip per request for all three. HTTP requests are admitted by :class:`gateway.graphql.guard.Guard`, WebSocket
operations by :mod:`gateway.graphql.websocket`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from starlette.requests import Request

from core.keys import Keys
from stores.users import AUTHENTICATE_FUNCTION, Authenticated, authenticated, token_check_args

# KEYS[1]: the token record (Keys.no_token without a token); KEYS[2..]: keys to read. ARGV[1..3]: the token
# check's (see stores.users); ARGV[4]: the rate-limit key prefix, ARGV[5]: the window's number, ARGV[6]: its length
# in seconds, ARGV[7]: the limit (0: count nothing), ARGV[8]: the subject without a valid token (the client's address).
# Returns {the user's document or false, the token's expiry or false, the count (0 when not counted), the reads...}.
ADMIT = (
    AUTHENTICATE_FUNCTION
    + """
local doc, user, expires = authenticate(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
local count = 0
if tonumber(ARGV[7]) > 0 then
  local key = ARGV[4] .. (user and ('user:' .. user) or ARGV[8]) .. ':' .. ARGV[5]
  count = redis.call('INCR', key)
  if count == 1 then redis.call('EXPIRE', key, tonumber(ARGV[6]) + 1) end
end
local reply = {doc, expires, count}
for i = 2, #KEYS do reply[#reply + 1] = redis.call('GET', KEYS[i]) end
return reply
"""
)


@dataclass(frozen=True)
class Admission:
    """What the admission script found for one request."""

    viewer: Authenticated | None
    """The token's user and expiry; None without a token, for an unknown, revoked or expired one, or a deactivated
    user."""
    retry_after: float | None
    """Over the rate limit: seconds until the window ends; else None."""
    values: list[Any]
    """The keys asked to be read, in order."""


class RateLimiter:
    """A fixed-window request counter in Redis (``Keys.rate_limit``) per user, or per client address for requests
    without a valid token, counted by the script that checks the token."""

    def __init__(self, redis: Callable[[], Redis], keys: Keys, limit: int, window: int) -> None:
        self.redis = redis
        self.keys = keys
        self.limit = limit
        """Requests per window; 0: the token is checked and the keys read, but nothing is counted."""
        self.window = window
        self._script: AsyncScript | None = None

    async def admit(self, token: str, anonymous: str, read: Sequence[str] = (), now: float | None = None) -> Admission:
        """Check ``token`` and count one request against its user (against ``anonymous`` without a valid token),
        reading the keys ``read`` too: one round trip."""
        now = time.time() if now is None else now
        window = int(now // self.window)
        redis = self.redis()
        if self._script is None:
            self._script = redis.register_script(ADMIT)
        token_key, token_args = token_check_args(self.keys, token, datetime.fromtimestamp(now, UTC))
        doc, expires, count, *values = await self._script(
            keys=[token_key, *read],
            client=redis,
            args=[*token_args, self.keys.rate_limit_prefix, window, self.window, self.limit, anonymous],
        )
        over = self.limit and count > self.limit
        return Admission(authenticated(doc, expires), (window + 1) * self.window - now if over else None, values)

    async def count_more(self, subject: str, requests: int, now: float | None = None) -> float | None:
        """Count ``requests`` more against ``subject`` (a batch's operations beyond the request admitted); seconds to
        wait when that goes over the limit, else None."""
        now = time.time() if now is None else now
        window = int(now // self.window)
        key = f"{self.keys.rate_limit_prefix}{subject}:{window}"
        async with self.redis().pipeline(transaction=True) as pipe:
            pipe.incrby(key, requests)
            pipe.expire(key, self.window + 1)
            count, _ = await pipe.execute()
        return (window + 1) * self.window - now if count > self.limit else None

    def refusal(self, wait: float) -> tuple[str, int]:
        """The message of a refusal over the limit, and the whole seconds to wait (``Retry-After``)."""
        seconds = max(1, math.ceil(wait))
        return f"more than {self.limit} requests in {self.window} s; retry in {seconds} s", seconds


def client_subject(address: str | None) -> str:
    """Whom a request without a valid token is counted against: its client address."""
    return "addr:" + (address or "unknown")


def rate_subject(viewer: Authenticated | None, request: Request) -> str:
    """Whom a request is counted against, as the admission script keys it: its user, else its client address."""
    if viewer is not None:
        return "user:" + viewer.user.id
    return client_subject(request.client.host if request.client else None)
