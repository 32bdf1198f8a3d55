"""The apps' control plane: one task in the gateway process that keeps HAProxy's maps (``gateway.apps.ingress_config``)
equal to what Redis says, through HAProxy's runtime API (no reload, ever).

- **Changes.** It blocks reading ``Keys.route_changes`` (``XREAD BLOCK``), a stream every session, user, token or
  revocation write appends to in its MULTI (``stores.changes``), for at most :data:`CHECK_INTERVAL` seconds (the
  bounded fallback: a change is seen within it even if the stream were lost), then reads two counters in one
  ``MGET``: ``Keys.sessions_version`` and ``Keys.users_version``. When one moved it reads what changed (sessions
  by their revision, ``Keys.session_revisions``; users and tokens whole) and sends HAProxy only the edits
  (``domain.app_routes.edits``): a session started, ended, changed apps or went public/private, a token issued or
  revoked, a user deactivated: in effect at HAProxy's next request, within a few tens of milliseconds, also on a
  kept-alive connection (maps are read per request).
- **Restarts.** HAProxy starts with empty maps (nobody passes). Every :data:`CHECK_INTERVAL` seconds the task asks for
  its mark (``meta.map``: ``generation``); a HAProxy without it (restarted, or new) is rebuilt whole from Redis, each
  map swapped atomically, the mark last. A restarted gateway rebuilds once (it has no memory of what HAProxy holds);
  HAProxy keeps serving meanwhile with what it had.
- **Open WebSockets.** HAProxy keeps them itself, in a stick table (``ingress_config.WS_TABLE``) keyed by who opened
  each (client address, host, token hash, user): after every change it applied, and every :data:`CHECK_INTERVAL`
  seconds, the task reads the open ones and shuts down those that no longer pass. Nothing of it lives in this
  process, so a restarted gateway closes the WebSockets opened before it as well.
- **Traffic as activity.** Every :data:`SAMPLE_INTERVAL` seconds it reads HAProxy's per-host stick table: a host
  whose request or byte counters moved is the session's activity (``stores.activity``), and a host with connections
  open (a WebSocket, a long download) holds an open connection record, as the idle checker expects.

Why a task in the gateway rather than a process of its own: it needs the gateway's Redis user and nothing else, and
lives and dies with the process that serves the launch exchange. With several gateway workers, one holds the control
plane's lock (``flock`` on a file in HAProxy's state directory) and keeps HAProxy; the others wait for the lock and
take over when its holder dies (the new holder rebuilds HAProxy once: it cannot know what the old one sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core.clock import utcnow
from core.keys import Keys
from core.replies import stream_reads
from core.retry import stop_if_cancelled
from domain.app_routes import (
    FIELD,
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
from gateway.apps.runtime_api import MapEdit, RuntimeApi, RuntimeApiError
from stores.activity import close_connection, open_connection, record_activity
from stores.events import last_id
from stores.sessions import SessionStore
from stores.users import UserStore

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.25
"""Seconds between checks that HAProxy still has the control plane's mark (else: restarted, rebuild) and sweeps of
its open WebSockets; also the longest wait for a change (``Keys.route_changes``) before the counters are read anyway."""
SAMPLE_INTERVAL = 2.0
"""Seconds between samples of HAProxy's traffic counters."""
LOCK_RETRY = 1.0
"""Seconds between a waiting worker's attempts at the control plane's lock."""
RETRY = 0.5
"""Seconds to wait after Redis or HAProxy failed to answer."""
CONNECTION_ID = "haproxy"


@dataclass(frozen=True)
class OpenSocket:
    """A WebSocket HAProxy admitted to an app: who opened it, with which token."""

    host: str
    user: str | None
    token_hash: str | None


def parse_socket(key: str) -> tuple[str, OpenSocket] | None:
    """``(client address:port, socket)`` of a key of HAProxy's table of open WebSockets (``ingress_config.WS_TABLE``:
    ``<client>|<host>|<token hash>|<user>``, ``-`` or nothing for none), or None."""
    parts = key.split(FIELD, 3)
    if len(parts) != 4:
        return None
    client, host, token, user = parts
    return client, OpenSocket(host, user if user not in ("", "-") else None, token if token not in ("", "-") else None)


@dataclass
class _Traffic:
    counters: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Host -> (requests, bytes in, bytes out) at the last sample."""
    open: set[str] = field(default_factory=set)
    """Session ids with an open connection record of ours."""


class ControlPlane:
    def __init__(
        self, redis: Redis, keys: Keys, sessions: SessionStore, users: UserStore, paths: IngressPaths, domain: str
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.sessions = sessions
        self.users = users
        self.paths = paths
        self.domain = domain
        self.api = RuntimeApi(paths.socket)
        self.applied: Maps = {}
        """What HAProxy holds, as far as this task knows (empty: unknown, rebuild)."""
        self.generation: str | None = None
        self._cached: dict[str, tuple[str, Session]] = {}
        """Live session id -> (revision, session) as last read."""
        self._versions: list[str | None] = [None, None]
        self._expiry: datetime | None = None
        self._traffic = _Traffic()
        self._change: str | None = None
        """The last entry of ``Keys.route_changes`` seen (None: not read yet)."""
        self.rebuilds = 0
        """Complete rebuilds done (tests and logs)."""

    async def run(self) -> None:
        """Keep HAProxy, while this process holds the control plane's lock (one per HAProxy: the gateway's other
        worker processes wait for it, and take over when its holder dies)."""
        with open(self.paths.state_dir / "control.lock", "a") as lock:  # noqa: ASYNC230 (once per process, a local file)
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_RETRY)
            while True:  # whatever breaks it, the control plane is set up again: it never dies silently in a task
                try:
                    await self._loop()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("app control plane failed; starting it again")
                    self.generation = None
                    await asyncio.sleep(RETRY)

    async def _loop(self) -> None:
        last_check = last_sample = 0.0
        while True:
            stop_if_cancelled()  # a cancellation redis-py lost (core.retry) would otherwise never stop the task
            try:
                if self._change is None:  # from now on: whatever was written before, the next sync reads
                    self._change = await last_id(self.redis, self.keys.route_changes)
                now = time.monotonic()
                if self.generation is None or now - last_check >= CHECK_INTERVAL:
                    last_check = now
                    await self._ensure_built()
                    await self.close_refused()  # admitted by a HAProxy thread as the last change was applied
                await self.sync()
                if now - last_sample >= SAMPLE_INTERVAL:
                    last_sample = now
                    await self.sample_traffic()
                await self._await_change(last_check + CHECK_INTERVAL - time.monotonic())
            except asyncio.CancelledError:
                raise
            except (RuntimeApiError, RedisError, OSError) as exc:
                log.warning("app control plane: %s; retrying", exc)
                self.generation = None
                self._change = None
                await asyncio.sleep(RETRY)

    async def _await_change(self, timeout: float) -> None:
        """Until a write appends to ``Keys.route_changes`` after the last entry seen, or ``timeout`` seconds."""
        assert self._change is not None
        block = max(1, int(timeout * 1000))
        reply = await self.redis.xread({self.keys.route_changes: self._change}, count=100, block=block)
        for _stream, entries in stream_reads(reply):
            if entries:
                self._change = entries[-1][0]

    async def _ensure_built(self) -> None:
        meta = await self.api.show_map(self.paths.map("meta"))
        if self.generation is None or meta.get("generation") != self.generation:
            await self.rebuild()

    async def rebuild(self) -> None:
        """HAProxy's maps whole, from Redis; the mark last (until then a restart check rebuilds again)."""
        self._versions = [None, None]
        self._cached = {}
        self.applied = {}
        desired = {**await self._session_maps(), **await self._user_maps()}
        for name in (*USER_MAPS, *SESSION_MAPS):
            await self.api.replace_map(self.paths.map(name), desired[name])
            self.applied[name] = desired[name]
        generation = uuid.uuid4().hex
        await self.api.replace_map(self.paths.map("meta"), {"generation": generation})
        self.generation = generation
        self.rebuilds += 1
        log.info("app control plane: HAProxy rebuilt (%d routes)", len(desired["routes"]))

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

    async def open_sockets(self) -> dict[str, OpenSocket]:
        """Client address:port -> the WebSocket HAProxy has open from it (its table ``ingress_config.WS_TABLE``)."""
        found = {}
        for entry in await self.api.table(WS_TABLE, "data.conn_cur gt 0"):
            parsed = parse_socket(entry.get("key", ""))
            if parsed is not None:
                found[parsed[0]] = parsed[1]
        return found

    async def close_refused(self) -> None:
        """Close the open WebSockets whose token, user or app stopped passing (``domain.app_routes.may_pass``)."""
        if not self.applied:
            return  # nothing applied yet: every socket would count as refused
        sockets = await self.open_sockets()
        refused = {c for c, s in sockets.items() if not may_pass(self.applied, s.host, s.user, s.token_hash)}
        if refused:
            await self._shutdown(refused)

    async def _shutdown(self, clients: set[str]) -> None:
        """HAProxy's streams from ``clients`` closed."""
        (listing,) = await self.api.run(["show sess"])
        streams = {}
        for line in listing.splitlines():
            words = line.split()
            if len(words) > 2 and words[0].endswith(":") and words[2].startswith("src="):
                streams[words[2][4:]] = words[0][:-1]
        await self.api.run([f"shutdown session {streams[c]}" for c in clients if c in streams])

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

    async def sample_traffic(self) -> None:
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
