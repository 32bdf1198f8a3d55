"""The apps' control plane: one task in the gateway process that keeps HAProxy's maps (``gateway.apps.ingress_config``)
equal to what Redis says, through HAProxy's runtime API (no reload, ever).

- **Changes.** The loop of ``gateway.apps.plane`` (blocks on ``Keys.route_changes``, a stream every session, user,
  token or revocation write appends to in its MULTI, ``stores.changes``); its sync reads two counters in one ``MGET``:
  ``Keys.sessions_version`` and ``Keys.users_version``. When one moved it reads what changed (sessions
  by their revision, ``Keys.session_revisions``; users and tokens whole) and sends HAProxy only the edits
  (``domain.app_routes.edits``): a session started, ended, changed apps or went public/private, a token issued or
  revoked, a user deactivated: in effect at HAProxy's next request, within a few tens of milliseconds, also on a
  kept-alive connection (maps are read per request).
- **Restarts.** HAProxy starts with empty maps (nobody passes). A HAProxy without the plane's mark (``meta.map``:
  ``generation``) is rebuilt whole from Redis, each map swapped atomically, the mark last. A restarted gateway
  rebuilds once (it has no memory of what HAProxy holds); HAProxy keeps serving meanwhile with what it had.
- **Open WebSockets.** HAProxy keeps them itself, in a stick table (``ingress_config.WS_TABLE``) keyed by who opened
  each (client address, host, token hash, user); the plane closes those that no longer pass
  (``domain.app_routes.may_pass``, ``gateway.apps.plane``).
- **Traffic as activity.** Every :data:`SAMPLE_INTERVAL` seconds it reads HAProxy's per-host stick table: a host
  whose request or byte counters moved is the session's activity (``stores.activity``), and a host with connections
  open (a WebSocket, a long download) holds an open connection record, as the idle checker expects.

Where it runs (``gateway.planes``): a task of the gateway on one machine; deployed, a task of the ingress job's
``caravan ingress --keep-maps`` beside HAProxy, so that the gateways can run on other clients. It needs the gateway's
Redis user and nothing else. With several processes, one holds the control plane's lock and keeps HAProxy; the others
take over when its holder dies (the new holder rebuilds HAProxy once: it cannot know what the old one sent).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core.clock import utcnow
from core.keys import Keys
from domain.app_routes import (
    SESSION_MAPS,
    USER_MAPS,
    Maps,
    edits,
    may_pass,
    next_expiry,
    session_maps,
    user_maps,
)
from domain.apps import parse_app_host
from domain.model import Session
from gateway.apps.ingress_config import STATS_TABLE, WS_TABLE, IngressPaths
from gateway.apps.plane import OpenSocket, Plane
from gateway.apps.runtime_api import MapEdit, RuntimeApi
from stores.activity import close_connection, open_connection, record_activity
from stores.sessions import SessionStore
from stores.users import UserStore

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 2.0
"""Seconds between samples of HAProxy's traffic counters."""
CONNECTION_ID = "haproxy"


@dataclass
class _Traffic:
    counters: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Host -> (requests, bytes in, bytes out) at the last sample."""
    open: set[str] = field(default_factory=set)
    """Session ids with an open connection record of ours."""


class ControlPlane(Plane):
    name = "app control plane"
    sockets_table = WS_TABLE
    sample_interval = SAMPLE_INTERVAL

    def __init__(
        self, redis: Redis, keys: Keys, sessions: SessionStore, users: UserStore, paths: IngressPaths, domain: str
    ) -> None:
        super().__init__(redis, keys, RuntimeApi(paths.socket), str(paths.state_dir / "control.lock"))
        self.sessions = sessions
        self.users = users
        self.paths = paths
        self.domain = domain
        self.applied: Maps = {}
        """What HAProxy holds, as far as this task knows (empty: unknown, rebuild)."""
        self._cached: dict[str, tuple[str, Session]] = {}
        """Live session id -> (revision, session) as last read."""
        self._versions: list[str | None] = [None, None]
        self._expiry: datetime | None = None
        self._traffic = _Traffic()
        self.rebuilds = 0
        """Complete rebuilds done (tests and logs)."""

    async def mark(self) -> str | None:
        return (await self.api.show_map(self.paths.map("meta"))).get("generation")

    async def rebuild(self) -> None:
        """HAProxy's maps whole, from Redis; the mark last (until then a restart check rebuilds again)."""
        self._versions = [None, None]
        self._cached = {}
        self.applied = {}
        desired = await self.desired()
        for name in (*USER_MAPS, *SESSION_MAPS):
            await self.api.replace_map(self.paths.map(name), desired[name])
            self.applied[name] = desired[name]
        generation = uuid.uuid4().hex
        await self.api.replace_map(self.paths.map("meta"), {"generation": generation})
        self.generation = generation
        self.rebuilds += 1
        log.info("app control plane: HAProxy rebuilt (%d routes)", len(desired["routes"]))

    async def desired(self) -> Maps:
        """Every map this plane keeps, as Redis has it now."""
        return {**await self._session_maps(), **await self._user_maps()}

    async def sync(self) -> None:
        """Send HAProxy what changed in Redis since the last call."""
        versions = [v.decode() if isinstance(v, bytes) else v for v in await self.redis.mget(
            [self.keys.sessions_version, self.keys.users_version]
        )]  # fmt: skip
        expired = self._expiry is not None and utcnow() >= self._expiry
        if versions[1] != self._versions[1] or expired:
            await self._apply(await self._user_maps())
            self._versions[1] = versions[1]
        if versions[0] != self._versions[0]:
            await self._apply(await self._session_maps())
            self._versions[0] = versions[0]

    async def _apply(self, desired: Maps) -> None:
        changed = {name: edits(self.applied.get(name, {}), content) for name, content in desired.items()}
        changed = {name: change for name, change in changed.items() if change}
        if changed:  # one batch: one connection to HAProxy for every map a write touched
            batch = [MapEdit(self.paths.map(n), c.add, c.change, c.delete) for n, c in changed.items()]
            await self.api.edit_maps(batch)
            self.applied.update({name: desired[name] for name in changed})
        await self.close_refused()

    async def refused(self, sockets: dict[str, OpenSocket]) -> set[str]:
        """The open WebSockets whose token, user or app stopped passing (``domain.app_routes.may_pass``)."""
        return {c for c, s in sockets.items() if not may_pass(self.applied, s.host, s.user, s.token_hash)}

    async def _session_maps(self) -> Maps:
        revisions = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (await self.redis.hgetall(self.keys.session_revisions)).items()
        }
        self._cached = {i: c for i, c in self._cached.items() if i in revisions}
        stale = sorted(i for i, r in revisions.items() if self._cached.get(i, ("",))[0] != r)
        for session_id, session in zip(stale, await self.sessions.get_many(stale), strict=True):
            if session is not None:
                self._cached[session_id] = (revisions[session_id], session)
        return session_maps((s for _, s in self._cached.values()), self.domain)

    async def _user_maps(self) -> Maps:
        now = utcnow()
        tokens = await self.users.live_tokens()
        self._expiry = next_expiry(tokens, now)
        return user_maps(await self.users.all(), tokens, now)

    async def sample(self) -> None:
        """HAProxy's per-host counters into the sessions' activity records (``stores.activity``)."""
        now = utcnow()
        seen: set[str] = set()
        for entry in await self.api.table(STATS_TABLE):
            found = parse_app_host(entry.get("key", ""), self.domain)
            if found is None:
                continue
            host, session_id = entry["key"], found[1]
            counters = tuple(int(entry.get(k, "0")) for k in ("http_req_cnt", "bytes_in_cnt", "bytes_out_cnt"))
            if self._traffic.counters.get(host) != counters:
                await record_activity(self.redis, self.keys, session_id, now)
            self._traffic.counters[host] = counters  # type: ignore[assignment]
            if int(entry.get("conn_cur", "0")) > 0:
                seen.add(session_id)
                await open_connection(self.redis, self.keys, session_id, CONNECTION_ID, now)
        for session_id in self._traffic.open - seen:
            with contextlib.suppress(RedisError, OSError):
                await close_connection(self.redis, self.keys, session_id, CONNECTION_ID, now)
        self._traffic.open = seen
