"""HAProxy's two control planes, apps (``gateway.apps.control``) and endpoints (``gateway.endpoints.control``), run
together by whichever process keeps HAProxy's maps:

- on one machine (``./ops/dev``, the tests), the gateway itself (``CARAVAN_GATEWAY_KEEPS_MAPS``, on by default when
  ``CARAVAN_INGRESS_PORT`` is set);
- deployed (``caravan deploy``), the ingress job's ``caravan ingress --keep-maps``, beside HAProxy on its client:
  the gateways then need neither HAProxy's runtime socket nor its state directory, and run on any client.

Either way the holder of each plane's lock (a file in HAProxy's state directory) keeps HAProxy, the others wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from gateway.apps.control import ControlPlane
from gateway.apps.ingress_config import IngressPaths
from gateway.endpoints.control import EndpointControl
from gateway.endpoints.ingress import META_MAP
from stores.sessions import SessionStore
from stores.users import UserStore


@dataclass(frozen=True)
class Prefill:
    """What a new HAProxy starts with (``start_haproxy(maps=...)``, ``IngressConfig.endpoint_servers``)."""

    maps: dict[str, dict[str, str]]
    endpoint_servers: tuple[tuple[int, str, str], ...]


async def prefilled(settings: Settings, redis: Redis, sessions: SessionStore, users: UserStore) -> Prefill:
    """Both planes' maps and the endpoints' replicas as Redis has them now, for a HAProxy about to start, under marks
    no plane left: the new HAProxy routes apps and endpoints and checks tokens from its first connection (an
    upgrade's new HAProxy shares the port with the old one at once), and each lock's holder still rebuilds it whole
    at its next check (it looks for a new HAProxy before each change it applies: ``gateway.apps.plane``), so nothing
    written meanwhile is missed. Both marks are set from one read: an endpoint request needs both (its admission
    reads the apps' token maps too), and a HAProxy started without this prefill still answers 503 until both planes
    built it. The endpoint plane's rebuild keeps the mark while HAProxy routes endpoints as Redis says; when Redis
    moved on since this read, it takes the mark away first (503 while it refills the backends, never a request sent
    to another endpoint's replicas)."""
    keys, paths, domain = Keys(settings.redis.prefix), IngressPaths(settings.ingress_dir), settings.gateway.apps_domain
    apps = ControlPlane(redis, keys, sessions, users, paths, domain)
    endpoints = EndpointControl(redis, keys, sessions, paths, domain, settings.endpoints.backends)
    generation = {"generation": f"prefilled-{uuid.uuid4().hex}"}
    endpoint_maps, servers = await endpoints.prefill()
    maps = {**await apps.desired(), "meta": generation, **endpoint_maps, META_MAP: generation}
    return Prefill(maps, tuple(servers))


@contextlib.asynccontextmanager
async def planes_running(
    settings: Settings, redis: Redis, sessions: SessionStore, users: UserStore
) -> AsyncIterator[tuple[ControlPlane, EndpointControl]]:
    """Both planes running as tasks of this process for the block; cancelled (and awaited) after it."""
    keys, paths, domain = Keys(settings.redis.prefix), IngressPaths(settings.ingress_dir), settings.gateway.apps_domain
    apps = ControlPlane(redis, keys, sessions, users, paths, domain)
    endpoints = EndpointControl(redis, keys, sessions, paths, domain, settings.endpoints.backends)
    tasks = [asyncio.create_task(plane.run(), name=plane.name) for plane in (apps, endpoints)]
    try:
        yield apps, endpoints
    finally:
        for task in tasks:
            # cancelled again until it ends: Python 3.11's asyncio.wait_for (the runtime API's, redis-py's) may
            # swallow a cancellation that lands as the awaited call finishes, and the loop would go on
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
