"""Inference endpoints' access and what the ingress measured of them (Redis): public flags, endpoint tokens, the
requests the activator holds, cold starts, the latest counters.

Tokens are stored by the SHA-256 of their secret only (a leak of Redis' contents opens no endpoint); every write of a
flag or a token bumps ``Keys.endpoints_version`` and appends to ``Keys.route_changes`` in the same transaction
(``stores.changes.endpoints_changed``), which wakes the endpoint control plane (``gateway.endpoints.control``): an
issued token passes, a revoked one is refused (and its open WebSockets closed), within milliseconds.

The requests the activator holds are counted per gateway process (its activator's instance id) under a lease
(:data:`HELD_LEASE`) the process renews while it holds any: a process killed while holding leaves a count that lapses
at its lease's end, never one that stays (a shared counter would keep the crashed process's increments for ever).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable
from datetime import datetime

import msgspec
from redis.asyncio import Redis

from core.codec import MalformedDocument, decode, encode
from core.keys import Keys
from core.replies import text
from domain.app_routes import FIELD
from domain.endpoint_routes import TokenGrant
from domain.endpoint_series import MAX_POINTS, EndpointPoint
from domain.users import hash_token
from stores.changes import endpoints_changed

TOKEN_PREFIX = "cep_"
"""Endpoint tokens start with this (told apart from API tokens at a glance)."""
MAX_TOKENS = 100
"""Live tokens per endpoint."""
COLD_STARTS_KEPT = 20
LATENCY_WINDOW = 1024
"""Requests whose response times make an endpoint's p50 and p99."""
HELD_LEASE = 10.0
"""Seconds a gateway process's count of held requests stands without being renewed (it renews it every third of
this while it holds any)."""


def _held_field(field: str) -> tuple[str, str]:
    session_id, _, instance = field.partition(FIELD)
    return session_id, instance


class EndpointToken(msgspec.Struct, frozen=True):
    id: str
    session_id: str
    name: str
    created_at: datetime


class ColdStart(msgspec.Struct, frozen=True):
    """One request the activator held: when it arrived, when the first replica's task started (placed and running),
    when the endpoint first had a routable replica (its health check passed), when the replica's first byte came back
    (unix seconds); ``outcome``: SERVED, TIMED_OUT, FAILED."""

    arrived_at: float
    routable_at: float | None
    first_byte_at: float | None
    outcome: str
    started_at: float | None = None


class EndpointStats(msgspec.Struct, frozen=True):
    """One endpoint's counters as HAProxy showed them at ``sampled_at`` (the control plane reads them each second)."""

    sampled_at: float
    requests_per_second: float
    in_flight: int
    requests_total: int
    errors_total: int
    """Answers 5xx, failed connections and failed responses since this HAProxy started."""
    avg_response_ms: int
    """HAProxy's average time to the response's headers over the backend's last 1024 requests."""
    avg_total_ms: int
    """HAProxy's average total time of a request over the backend's last 1024 requests."""
    replicas_routable: int
    held: int
    p50_ms: float | None = None
    """Median time to the response's headers over the endpoint's last :data:`LATENCY_WINDOW` requests (HAProxy)."""
    p99_ms: float | None = None


class EndpointAccessStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def set_public(self, session_id: str, public: bool) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            if public:
                pipe.sadd(self.keys.endpoint_public, session_id)
            else:
                pipe.srem(self.keys.endpoint_public, session_id)
            endpoints_changed(pipe, self.keys)
            await pipe.execute()

    async def public(self) -> set[str]:
        return {text(m) for m in await self.redis.smembers(self.keys.endpoint_public)}

    async def is_public(self, session_id: str) -> bool:
        return bool(await self.redis.sismember(self.keys.endpoint_public, session_id))

    async def _all_tokens(self) -> dict[str, EndpointToken]:
        found = {}
        for key, value in (await self.redis.hgetall(self.keys.endpoint_tokens)).items():
            try:
                found[text(key)] = decode(value, EndpointToken)
            except MalformedDocument:
                continue
        return found

    async def grants(self) -> list[TokenGrant]:
        return [TokenGrant(h, t.session_id) for h, t in (await self._all_tokens()).items()]

    async def tokens_of(self, session_id: str) -> list[EndpointToken]:
        return sorted(
            (t for t in (await self._all_tokens()).values() if t.session_id == session_id), key=lambda t: t.created_at
        )

    async def issue(self, session_id: str, name: str, now: datetime) -> tuple[EndpointToken, str] | None:
        """A new token of ``session_id``'s endpoint and its secret (shown once), or None at :data:`MAX_TOKENS`."""
        if len(await self.tokens_of(session_id)) >= MAX_TOKENS:
            return None
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = EndpointToken(uuid.uuid4().hex[:16], session_id, name, now)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.endpoint_tokens, hash_token(secret), encode(token))
            endpoints_changed(pipe, self.keys)
            await pipe.execute()
        return token, secret

    async def revoke(self, session_id: str, token_id: str) -> bool:
        found = [h for h, t in (await self._all_tokens()).items() if t.session_id == session_id and t.id == token_id]
        if not found:
            return False
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.endpoint_tokens, *found)
            endpoints_changed(pipe, self.keys)
            await pipe.execute()
        return True

    async def forget(self, session_ids: Iterable[str]) -> None:
        """Drop what ended endpoints left: flags, tokens, stats, held counts, cold starts."""
        ids = set(session_ids)
        if not ids:
            return
        hashes = [h for h, t in (await self._all_tokens()).items() if t.session_id in ids]
        held = [f for f in await self.redis.hkeys(self.keys.endpoint_held) if _held_field(text(f))[0] in ids]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.keys.endpoint_public, *ids)
            if hashes:
                pipe.hdel(self.keys.endpoint_tokens, *hashes)
            pipe.hdel(self.keys.endpoint_stats, *ids)
            if held:
                pipe.hdel(self.keys.endpoint_held, *held)
            for session_id in ids:
                pipe.delete(self.keys.endpoint_cold_starts(session_id), self.keys.endpoint_series(session_id))
            endpoints_changed(pipe, self.keys)
            await pipe.execute()

    async def set_held(self, instance: str, session_id: str, count: int, now: float) -> None:
        """``instance`` (one gateway process's activator) holds ``count`` requests for ``session_id`` now; the count
        stands until ``now`` + :data:`HELD_LEASE` unless set again."""
        field = f"{session_id}{FIELD}{instance}"
        if count > 0:
            await self.redis.hset(self.keys.endpoint_held, field, f"{count}{FIELD}{now + HELD_LEASE}")
        else:
            await self.redis.hdel(self.keys.endpoint_held, field)

    async def all_held(self, now: float) -> dict[str, int]:
        """Session id -> requests held for it by every gateway process whose lease runs at ``now``; lapsed counts
        (a process that died holding) are dropped."""
        found: dict[str, int] = {}
        lapsed = []
        for key, value in (await self.redis.hgetall(self.keys.endpoint_held)).items():
            session_id, _ = _held_field(text(key))
            count, _, until = text(value).partition(FIELD)
            try:
                live = float(until) > now
                held = max(0, int(count))
            except ValueError:
                live, held = False, 0
            if live:
                found[session_id] = found.get(session_id, 0) + held
            else:
                lapsed.append(key)
        if lapsed:
            await self.redis.hdel(self.keys.endpoint_held, *lapsed)
        return found

    async def record_cold_start(self, session_id: str, cold: ColdStart) -> None:
        key = self.keys.endpoint_cold_starts(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, encode(cold))
            pipe.ltrim(key, 0, COLD_STARTS_KEPT - 1)
            await pipe.execute()

    async def cold_starts(self, session_id: str) -> list[ColdStart]:
        found = []
        for raw in await self.redis.lrange(self.keys.endpoint_cold_starts(session_id), 0, -1):
            try:
                found.append(decode(raw, ColdStart))
            except MalformedDocument:
                continue
        return found

    async def record_points(self, points: dict[str, EndpointPoint]) -> None:
        """Append one point to each endpoint's series, which keeps its last ``MAX_POINTS``."""
        if not points:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id, point in points.items():
                key = self.keys.endpoint_series(session_id)
                pipe.rpush(key, encode(point))
                pipe.ltrim(key, -MAX_POINTS, -1)
            await pipe.execute()

    async def series(self, session_id: str) -> list[EndpointPoint]:
        found = []
        for raw in await self.redis.lrange(self.keys.endpoint_series(session_id), 0, -1):
            try:
                found.append(decode(raw, EndpointPoint))
            except MalformedDocument:
                continue
        return found

    async def record_stats(self, stats: dict[str, EndpointStats]) -> None:
        if stats:
            await self.redis.hset(self.keys.endpoint_stats, mapping={k: encode(v) for k, v in stats.items()})

    async def stats(self) -> dict[str, EndpointStats]:
        found = {}
        for key, value in (await self.redis.hgetall(self.keys.endpoint_stats)).items():
            try:
                found[text(key)] = decode(value, EndpointStats)
            except MalformedDocument:
                continue
        return found
