"""What an inference endpoint's traffic is, as the ingress measures it and the autoscaler reads it (Redis).

The contract between the data plane's control plane (the gateway's owner of HAProxy, which alone reads HAProxy's
counters) and the autoscaler (a leader elsewhere, which alone changes replica counts). They meet here, in Redis:

* **load samples**: one per endpoint, the latest only (``Keys.endpoint_loads``). ``requests_total`` is a counter that
  only grows while one HAProxy process lives (a restart starts it again from 0: the reader takes a drop as a restart,
  never as negative traffic); ``in_flight`` is the requests being served or queued at that instant.
* **wake requests**: the activator, holding a request for an endpoint with no ready replica, pushes the endpoint's id
  (``Keys.endpoint_wakes``); the autoscaler blocks on that list, so a scale-up from zero is asked at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from redis.asyncio import Redis

from core.codec import MalformedDocument, decode, encode
from core.keys import Keys
from core.replies import text


class EndpointLoad(msgspec.Struct, frozen=True):
    """One endpoint's traffic at one instant, as HAProxy counted it."""

    session_id: str
    in_flight: int
    """Requests being served by a replica or queued for one (HAProxy's ``scur`` + ``qcur`` of the endpoint)."""
    requests_total: int
    """Requests the endpoint received since this HAProxy process started (its backend's ``req_tot``/``stot``)."""
    sampled_at: float
    """Unix seconds when the counters were read."""
    held: int = 0
    """Requests the activator holds right now, waiting for a replica to be ready (cold start)."""


async def record_loads(redis: Redis, keys: Keys, loads: Iterable[EndpointLoad]) -> None:
    """Store the latest sample of each endpoint (one write for all of them)."""
    samples = list(loads)
    if samples:
        await redis.hset(keys.endpoint_loads, mapping={load.session_id: encode(load) for load in samples})


async def read_loads(redis: Redis, keys: Keys) -> dict[str, EndpointLoad]:
    """The latest sample of every endpoint; an unreadable one is skipped (a sample is replaced within a second)."""
    raw = await redis.hgetall(keys.endpoint_loads)
    loads: dict[str, EndpointLoad] = {}
    for key, value in raw.items():
        try:
            loads[text(key)] = decode(value, EndpointLoad)
        except MalformedDocument:
            continue
    return loads


async def forget_loads(redis: Redis, keys: Keys, session_ids: Iterable[str]) -> None:
    """Drop the samples of endpoints that ended."""
    ids = list(session_ids)
    if ids:
        await redis.hdel(keys.endpoint_loads, *ids)


async def request_wake(redis: Redis, keys: Keys, session_id: str) -> None:
    """Ask the autoscaler for a replica of ``session_id`` now (its endpoint has a request and no ready replica)."""
    await redis.rpush(keys.endpoint_wakes, session_id)


async def next_wakes(redis: Redis, keys: Keys, *, timeout: float) -> set[str]:
    """The endpoints asked to wake: waits up to ``timeout`` seconds for the first, then takes every other one queued."""
    first = await redis.blpop([keys.endpoint_wakes], timeout=timeout)
    if first is None:
        return set()
    woken = {text(first[1])}
    async with redis.pipeline(transaction=True) as pipe:
        pipe.lrange(keys.endpoint_wakes, 0, -1)
        pipe.delete(keys.endpoint_wakes)
        rest, _ = await pipe.execute()
    woken.update(text(item) for item in rest)
    return woken
