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

from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from gateway.apps.control import ControlPlane
from gateway.apps.ingress_config import IngressPaths
from gateway.endpoints.control import EndpointControl
from stores.sessions import SessionStore
from stores.users import UserStore


async def prefilled(
    settings: Settings, redis: Redis, sessions: SessionStore, users: UserStore
) -> dict[str, dict[str, str]]:
    """The apps' maps as Redis has them now, for a HAProxy about to start (``start_haproxy(maps=...)``), under a mark
    no plane left: the new HAProxy routes apps and checks tokens from its first connection (an upgrade's new HAProxy
    shares the port with the old one at once), and the lock's holder still rebuilds it whole at its next check,
    atomically, so nothing written meanwhile is missed. The endpoints' maps start empty (503 until rebuilt)."""
    keys, paths = Keys(settings.redis.prefix), IngressPaths(settings.ingress_dir)
    apps = ControlPlane(redis, keys, sessions, users, paths, settings.gateway.apps_domain)
    return {**await apps.desired(), "meta": {"generation": f"prefilled-{uuid.uuid4().hex}"}}


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
