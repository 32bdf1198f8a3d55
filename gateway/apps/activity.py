"""Proxied traffic as the session's activity (``stores.activity``), the idle checker's network-idle evidence.

Writing on every request or chunk would put a Redis write on the proxy's hot path; instead each gateway process
records a session's activity at most once per :data:`RECORD_INTERVAL` (the decision is pure: :meth:`ActivityGate.due`),
and an open WebSocket counts as an open connection, refreshed well within its TTL.
"""

from __future__ import annotations

from datetime import datetime

from redis.asyncio import Redis

from core.keys import Keys
from stores.activity import CONNECTION_TTL, record_activity

RECORD_INTERVAL = 2.0
"""Seconds: a session's proxied traffic is written at most this often per gateway process."""
REFRESH_INTERVAL = CONNECTION_TTL / 3
"""Seconds between refreshes of an open WebSocket's connection record."""
MAX_TRACKED = 100_000
"""Sessions remembered at once; beyond, the memory is cleared (at worst one extra write per session)."""


class ActivityGate:
    """When a session's traffic was last written by this process."""

    def __init__(self, interval: float = RECORD_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        """Session id -> the monotonic second of its last write."""

    def due(self, session_id: str, now: float) -> bool:
        """Whether traffic at monotonic ``now`` should be written (and, if so, it counts as written)."""
        last = self._last.get(session_id)
        if last is not None and now - last < self.interval:
            return False
        if len(self._last) >= MAX_TRACKED:
            self._last.clear()
        self._last[session_id] = now
        return True


class TrafficRecorder:
    def __init__(self, redis: Redis, keys: Keys, gate: ActivityGate | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.gate = gate or ActivityGate()

    async def traffic(self, session_id: str, monotonic: float, now: datetime) -> None:
        """Bytes moved for ``session_id``: written if due."""
        if self.gate.due(session_id, monotonic):
            await record_activity(self.redis, self.keys, session_id, now)
