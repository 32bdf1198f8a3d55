"""Prometheus metrics at ``/metrics``: GraphQL requests as they happen, sessions and queues at scrape time.

Each app has a registry of its own (several apps may live in one process, as in the tests).
Session and queue gauges are read from Redis when scraped, within fixed bounds: one ZCARD per
resource group, and the statuses of at most ``MAX_SCRAPED_SESSIONS`` live sessions.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from domain.model import SessionStatus
from domain.usage import SECONDS, SLOT, resource_seconds
from gateway.endpoints.metrics import EndpointCollector
from stores.endpoint_access import EndpointAccessStore
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

MAX_SCRAPED_SESSIONS = 5000
"""Above this many live sessions, ``caravan_sessions`` is left out of a scrape (only the total is given)."""
MAX_SCRAPED_GROUPS = 100
"""Queue depth is reported for the deepest this-many resource groups; the total covers all of them."""
CHUNK = 500
LIVE_STATUSES = [s for s in SessionStatus if not s.is_terminal]


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        labels = ["operation", "status"]
        self.requests = Counter(
            "caravan_graphql_requests",
            "GraphQL HTTP requests by operation type and HTTP status.",
            labels,
            registry=registry,
        )
        self.latency = Histogram(
            "caravan_graphql_request_duration_seconds",
            "Time to answer a GraphQL HTTP request, by operation type and HTTP status.",
            labels,
            registry=registry,
        )
        self.sessions = Gauge(
            "caravan_sessions", "Live (not terminal) sessions by status.", ["status"], registry=registry
        )
        self.live = Gauge("caravan_sessions_live", "Live (not terminal) sessions.", registry=registry)
        self.queue = Gauge(
            "caravan_queue_depth",
            "PENDING sessions waiting in a resource group's queue.",
            ["resource_group"],
            registry=registry,
        )
        self.queued = Gauge("caravan_queue_depth_total", "PENDING sessions waiting in all queues.", registry=registry)
        self.usage = UsageCounters()
        registry.register(self.usage)
        self.endpoints = EndpointCollector()
        registry.register(self.endpoints)
        self.store_up = Gauge(
            "caravan_metrics_store_up", "1 if the last scrape could read Redis, else 0.", registry=registry
        )

    def observe(self, operation: str, status: int, seconds: float) -> None:
        self.requests.labels(operation, str(status)).inc()
        self.latency.labels(operation, str(status)).observe(seconds)

    async def refresh(self, store: SessionStore) -> None:
        """Read session and queue gauges from Redis; on an outage, mark the store down and keep going."""
        try:
            depths = await queue_depths(store)
            live, statuses = await live_statuses(store)
            self.usage.totals = await store.usage.totals()
            self.endpoints.stats = await EndpointAccessStore(store.redis, store.keys).stats()
        except (RedisError, OSError) as exc:
            log.warning("metrics: cannot read Redis: %s", exc)
            self.store_up.set(0)
            return
        self.store_up.set(1)
        self.queue.clear()
        for group, depth in sorted(depths.items(), key=lambda item: -item[1])[:MAX_SCRAPED_GROUPS]:
            self.queue.labels(group).set(depth)
        self.queued.set(sum(depths.values()))
        self.live.set(live)
        self.sessions.clear()
        if statuses is not None:
            for status in LIVE_STATUSES:
                self.sessions.labels(status.value).set(statuses[status.value])

    def endpoint(self, store: Callable[[], SessionStore]) -> Callable[[Request], Awaitable[Response]]:
        async def metrics(request: Request) -> Response:
            await self.refresh(store())
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

        return metrics


class UsageCounters(Collector):
    """``caravan_usage_resource_seconds_total{slot,project}`` and ``caravan_usage_session_seconds_total{project}``:
    what every ended session held (``stores.usage``), read from Redis at each scrape (every gateway worker answers
    the same, and a restart loses nothing)."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        slots = CounterMetricFamily(
            "caravan_usage_resource_seconds",
            "Resource-seconds ended sessions held, by slot (cpu-seconds, device- or share-seconds, byte-seconds).",
            labels=["slot", "project"],
        )
        sessions = CounterMetricFamily(
            "caravan_usage_session_seconds", "Seconds ended sessions held their slots.", labels=["project"]
        )
        for (project, measure), amount in sorted(self.totals.items()):
            if measure == SECONDS:
                sessions.add_metric([project], amount)
            elif measure.startswith(SLOT):
                for slot, seconds in resource_seconds({measure: amount}).items():
                    slots.add_metric([slot, project], float(seconds))
        yield slots
        yield sessions


async def queue_depths(store: SessionStore) -> dict[str, int]:
    groups = sorted(await store.resource_groups())
    async with store.redis.pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.zcard(store.keys.pending_queue(group))
        return dict(zip(groups, await pipe.execute(), strict=True))


async def live_statuses(store: SessionStore) -> tuple[int, Tally[str] | None]:
    """How many sessions are live, and by status unless there are more than ``MAX_SCRAPED_SESSIONS``."""
    total: int = await store.redis.scard(store.keys.sessions_live)
    if total > MAX_SCRAPED_SESSIONS:
        return total, None
    ids = sorted(await store.live_ids())
    statuses: Tally[str] = Tally()
    for start in range(0, len(ids), CHUNK):
        statuses.update(s.status.value for s in await store.get_many(ids[start : start + CHUNK]) if s is not None)
    return total, statuses
