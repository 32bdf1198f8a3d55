"""Open WebSocket connections closed within seconds when their token stops being valid.

A connection's token is checked when it is opened and again at each operation it sends; a subscription that
streams for hours sends none. So every token revocation (``revokeToken``, ``deactivateUser``, a replaced bootstrap
token) also appends the token's hash to one Redis stream (``Keys.token_revocations``, in the same MULTI as the
revocation: ``stores.users``), and each gateway process has one :class:`RevocationWatch`: a single reader task
blocking in ``XREAD`` on that stream (one Redis connection per process, not one poll per connection) that trips the
local connections of each revoked token. A token's expiry needs no Redis at all: a timer of the event loop trips
the connection at that moment.

No revocation slips between a connection's token check and its registration: the reader's position is fixed before
the first registration, and a connection registers (by token hash) *before* its token is checked. A revocation that
committed before the check makes the check fail; one that committed after it is in the stream after the reader's
position, and finds the connection registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core.clock import utcnow
from core.keys import Keys
from core.replies import stream_reads
from core.retry import stop_if_cancelled
from domain.users import hash_token
from stores import events

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
"""Pause of the reader after a failed read (Redis unreachable); nothing is missed, it resumes from its position."""


@dataclass(eq=False)
class Watched:
    """One connection's token, watched: ``tripped`` is set when it is revoked or expires."""

    token_hash: str
    tripped: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    """``revoked`` or ``expired``, once tripped."""
    _timer: asyncio.TimerHandle | None = None

    def trip(self, reason: str) -> None:
        if not self.tripped.is_set():
            self.reason = reason
            self.tripped.set()


class RevocationWatch:
    def __init__(self, redis: Redis, keys: Keys, *, block_ms: int = events.BLOCK_MS) -> None:
        self.redis = redis
        self.stream = keys.token_revocations
        self.block_ms = block_ms
        self._watched: dict[str, set[Watched]] = {}
        self._position: str | None = None
        """The id of the last stream entry the reader handled (the stream's end when it started)."""
        self._reader: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[str | None], None]] = []
        self._reading = False

    def listen(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener`` with each revoked token's hash as it is read, and with None when a read fails (what
        was revoked meanwhile is only known once reads succeed again): how a cache of tokens forgets them."""
        self._listeners.append(listener)

    @property
    def reading(self) -> bool:
        """The reader runs and its last read succeeded (or it has just started from a fixed position)."""
        return self._reading and self._reader is not None and not self._reader.done()

    async def open(self) -> None:
        """Make sure the reader runs, from a position fixed now (before the caller registers anything)."""
        if self._position is None:
            end = await events.last_id(self.redis, self.stream)
            if self._position is None:  # another connection may have fixed it meanwhile: the earlier one stays
                self._position = end
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="token-revocations")
            self._reading = True

    def watch(self, token: str) -> Watched:
        """Register a connection's token (call :meth:`open` first, and this before checking the token)."""
        return self.watch_hash(hash_token(token))

    def watch_hash(self, token_hash: str) -> Watched:
        """``watch`` by the token's SHA-256 (an app cookie's token)."""
        watched = Watched(token_hash)
        self._watched.setdefault(watched.token_hash, set()).add(watched)
        return watched

    def expire_at(self, watched: Watched, moment: datetime | None) -> None:
        """Trip ``watched`` at ``moment`` (the token's expiry), by a timer of this process's event loop."""
        if moment is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, (moment - utcnow()).total_seconds())
        watched._timer = loop.call_at(loop.time() + delay, watched.trip, "expired")

    def forget(self, watched: Watched) -> None:
        if watched._timer is not None:
            watched._timer.cancel()
        same = self._watched.get(watched.token_hash, set())
        same.discard(watched)
        if not same:
            self._watched.pop(watched.token_hash, None)

    @property
    def watching(self) -> int:
        """Connections registered now."""
        return sum(len(same) for same in self._watched.values())

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read(self) -> None:
        while True:
            stop_if_cancelled()  # aclose's cancel, lost inside redis-py (core.retry), would otherwise hang the shutdown
            assert self._position is not None
            try:
                reply = await self.redis.xread({self.stream: self._position}, count=500, block=self.block_ms)
            except (RedisError, OSError) as exc:
                self._reading = False
                for listener in self._listeners:
                    listener(None)
                log.warning("token revocations unreadable (%s); retrying in %s s", exc, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self._reading = True
            for entry_id, fields in (entry for _stream, entries in stream_reads(reply) for entry in entries):
                self._position = entry_id
                token_hash = fields.get("token", "")
                for listener in self._listeners:
                    listener(token_hash)
                for watched in list(self._watched.get(token_hash, ())):
                    watched.trip("revoked")
