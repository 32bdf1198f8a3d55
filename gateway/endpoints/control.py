"""The inference endpoints' control plane: one task in the gateway process (next to the apps' control plane, with a
lock of its own) that keeps HAProxy's endpoint maps and backends equal to what Redis says, through the runtime API:
no reload, ever. Its loop is the apps' (``gateway.apps.plane``): it blocks on ``Keys.route_changes``, which every
session write, endpoint token issued or revoked and public flag set appends to (``stores.changes``).

- **Changes.** When woken it reads ``Keys.sessions_version`` and ``Keys.endpoints_version``; when one
  moved it reads what changed and sends HAProxy the edits: each live INFERENCE session gets a backend of the pool
  (``domain.endpoint_routes.assign_backends``), its routable replicas (``domain.inference.endpoints_of``) in that
  backend's server slots (``set server … addr``, ``state ready``; the others ``state maint``), then its map entries.
  Order: an entry removed before its servers go, servers ready before an entry is added (a new endpoint's first
  request finds its replicas).
- **Restarts.** The same as the apps': a HAProxy without the mark in ``endpoint_meta.map`` is rebuilt whole.
- **Open WebSockets.** HAProxy keeps the WebSockets it admitted to an endpoint in a table of their own
  (``ingress.WS_TABLE``: client, host, token hash, user); after each change and every check the plane shuts down
  those that no longer pass (``domain.endpoint_routes.may_pass``: an endpoint token revoked, the endpoint made
  private or ended, an API token revoked or its user no longer allowed).
- **Load.** Every :data:`SAMPLE_INTERVAL` seconds it reads ``show stat`` and writes one load sample per endpoint
  (``stores.endpoint_traffic.record_loads``: in-flight is the replicas' current sessions plus the backend's queue;
  held, the activator's) and the counters the API and ``/metrics`` show (``stores.endpoint_access``); every
  ``domain.endpoint_series.STEP`` seconds a point of the endpoint's series (requests/s, replicas) the web UI charts.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from redis.asyncio import Redis

from core.keys import Keys
from core.replies import text
from core.retry import stop_if_cancelled
from domain.app_routes import USER_MAPS, Maps, edits
from domain.endpoint_routes import (
    ENDPOINT_MAPS,
    SERVER_PREFIX,
    assign_backends,
    backend_name,
    endpoint_maps,
    live_endpoints,
    may_pass,
    place_servers,
    routable,
)
from domain.endpoint_series import EndpointPoint, due, point
from domain.model import Session
from gateway.apps.ingress_config import IngressPaths
from gateway.apps.plane import OpenSocket, Plane
from gateway.apps.runtime_api import RuntimeApi, RuntimeApiError
from gateway.endpoints.ingress import LATENCY_COMMAND, META_MAP, WS_TABLE, map_path
from stores.endpoint_access import LATENCY_WINDOW, EndpointAccessStore, EndpointStats
from stores.endpoint_traffic import EndpointLoad, forget_loads, record_loads
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 1.0
Servers = dict[str, str | None]


@dataclass
class _Counter:
    session_id: str
    base_requests: int
    """The backend's request counter when this session got it (a backend of the pool serves several in turn)."""
    base_errors: int
    last_requests: int = 0
    last_at: float = 0.0
    point_requests: int = 0
    point_at: float = 0.0
    """The request counter and the moment of the endpoint's last series point (``domain.endpoint_series``)."""
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    """The last response times (ms, to the headers) HAProxy measured on this backend for this session."""


def raise_if_cancelling() -> None:
    """A cancellation that a client turned into its own error (redis-py), or that Python 3.11's ``asyncio.wait_for``
    swallowed, still ends the task (``core.retry.stop_if_cancelled``)."""
    stop_if_cancelled()


def _stat_rows(csv_text: str) -> list[dict[str, str]]:
    body = csv_text.lstrip("# ")
    return list(csv.DictReader(io.StringIO(body)))


def _latencies(answer: str) -> dict[str, list[float]]:
    """Backend name -> response times (ms) from the answer of :data:`LATENCY_COMMAND`."""
    found: dict[str, list[float]] = {}
    for line in answer.splitlines():
        words = line.split()
        if words:
            with contextlib.suppress(ValueError):
                found.setdefault(words[0], []).extend(float(v) for v in words[1:])
    return found


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile of ``values`` (``share`` in 0-1), or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))], 1)


def _int(row: dict[str, str], name: str) -> int:
    value = row.get(name) or "0"
    return int(value) if value.isdigit() else 0


class EndpointControl(Plane):
    name = "endpoint control plane"
    sockets_table = WS_TABLE
    sample_interval = SAMPLE_INTERVAL

    def __init__(
        self, redis: Redis, keys: Keys, sessions: SessionStore, paths: IngressPaths, domain: str, pool: int
    ) -> None:
        super().__init__(redis, keys, RuntimeApi(paths.socket), str(paths.state_dir / "endpoints.lock"))
        self.sessions = sessions
        self.paths = paths
        self.domain = domain
        self.pool = pool
        self.access = EndpointAccessStore(redis, keys)
        self.backends: dict[str, int] = {}
        """Session id -> its backend slot, as HAProxy holds them."""
        self.servers: dict[int, Servers] = {}
        """Backend slot -> server slot -> ``host:port`` (None: maintenance), as HAProxy holds them."""
        self.applied: Maps = {}
        self.endpoints: dict[str, Session] = {}
        self._cached: dict[str, tuple[str, Session]] = {}
        self._versions: list[str | None] = [None, None]
        self._counters: dict[int, _Counter] = {}

    async def mark(self) -> str | None:
        return (await self.api.show_map(map_path(self.paths.state_dir, META_MAP))).get("generation")

    async def rebuild(self) -> None:
        """Every backend's servers and every map whole; the mark last. A HAProxy that routes endpoints otherwise
        than Redis now says (a prefilled one Redis moved on from, another holder's) loses its mark first: its
        endpoint requests answer 503 while its backends are refilled, never reaching another endpoint's replicas."""
        self._reset()
        maps = await self._desired()
        if await self.api.show_map(map_path(self.paths.state_dir, "endpoints")) != maps["endpoints"]:
            await self.api.replace_map(map_path(self.paths.state_dir, META_MAP), {})
        await self._push_servers(force=True)
        for name in ENDPOINT_MAPS:
            await self.api.replace_map(map_path(self.paths.state_dir, name), maps[name])
            self.applied[name] = maps[name]
        generation = uuid.uuid4().hex
        await self.api.replace_map(map_path(self.paths.state_dir, META_MAP), {"generation": generation})
        self.generation = generation
        log.info("endpoint control plane: HAProxy rebuilt (%d endpoints)", len(self.backends))

    def _reset(self) -> None:
        self._versions = [None, None]
        self._cached = {}
        self.applied = {}
        self.backends = {}
        self.servers = {slot: {} for slot in range(self.pool)}
        self._counters = {}

    async def prefill(self) -> tuple[Maps, list[tuple[int, str, str]]]:
        """The maps and the replicas (backend slot, server slot, ``host:port``) a new HAProxy starts with, as Redis
        has them now: what :meth:`rebuild` would build (the same backends: assigned afresh, in the same order)."""
        self._reset()
        maps = await self._desired()
        servers = [
            (slot, name, address)
            for session_id, slot in self.backends.items()
            for name, address in place_servers({}, routable(self.endpoints[session_id])).items()
            if address is not None
        ]
        return maps, servers

    async def sync(self) -> None:
        versions = [text(v) if v is not None else None for v in await self.redis.mget(
            [self.keys.sessions_version, self.keys.endpoints_version]
        )]  # fmt: skip
        if versions == self._versions:
            return
        ended = set(self.endpoints)
        maps = await self._desired()
        ended -= set(self.endpoints)
        if self.haproxy_replaced():  # the edits are against the old HAProxy's backends: rebuild the new one instead
            self.generation = None
            await self._forget(ended)
            return
        for name in ENDPOINT_MAPS:  # entries gone first: no request is routed to a backend being emptied
            change = edits(self.applied.get(name, {}), maps[name])
            if change.delete:
                await self.api.edit_map(map_path(self.paths.state_dir, name), {}, {}, change.delete)
        await self._push_servers(force=False)
        for name in ENDPOINT_MAPS:
            change = edits(self.applied.get(name, {}), maps[name])
            if change.add or change.change:
                await self.api.edit_map(map_path(self.paths.state_dir, name), change.add, change.change, [])
            self.applied[name] = maps[name]
        self._versions = versions
        await self.close_refused()
        await self._forget(ended)

    async def _forget(self, ended: set[str]) -> None:
        if ended:
            await self.access.forget(ended)
            await forget_loads(self.redis, self.keys, ended)

    async def refused(self, sockets: dict[str, OpenSocket]) -> set[str]:
        """The open WebSockets whose endpoint token was revoked, whose endpoint went private or ended, or whose
        user's API token no longer passes (the apps' user maps, read from HAProxy only when a socket has a user)."""
        users: Maps = {}
        if any(s.user for s in sockets.values()):
            users = {name: await self.api.show_map(self.paths.map(name)) for name in USER_MAPS}
        return {c for c, s in sockets.items() if not may_pass(self.applied, users, s.host, s.user, s.token_hash)}

    async def _desired(self) -> Maps:
        """Reads Redis; sets ``self.endpoints`` and ``self.backends``; the maps HAProxy must hold."""
        revisions = {text(k): text(v) for k, v in (await self.redis.hgetall(self.keys.session_revisions)).items()}
        self._cached = {i: c for i, c in self._cached.items() if i in revisions}
        stale = sorted(i for i, r in revisions.items() if self._cached.get(i, ("",))[0] != r)
        for session_id, session in zip(stale, await self.sessions.get_many(stale), strict=True):
            if session is not None:
                self._cached[session_id] = (revisions[session_id], session)
        self.endpoints = live_endpoints(s for _, s in self._cached.values())
        order = sorted(self.endpoints, key=lambda i: (self.endpoints[i].created_at, i))
        self.backends = assign_backends(self.backends, order, self.pool)
        return endpoint_maps(
            self.endpoints, self.backends, await self.access.public(), await self.access.grants(), self.domain
        )

    async def _push_servers(self, *, force: bool) -> None:
        owner = {slot: sid for sid, slot in self.backends.items()}
        commands: list[str] = []
        for slot in range(self.pool):
            session = self.endpoints.get(owner.get(slot, ""))
            replicas = routable(session) if session is not None else ()
            current = self.servers.get(slot, {})
            placed = place_servers(current, replicas)
            for name, address in placed.items():
                if not force and current.get(name) == address:
                    continue
                server = f"{backend_name(slot)}/{name}"
                if address is None:
                    commands.append(f"set server {server} state maint")
                else:
                    host, _, port = address.rpartition(":")
                    commands += [
                        f"set server {server} addr {host} port {port}",
                        f"set server {server} state ready",
                        f"set server {server} health up",
                    ]
            self.servers[slot] = placed
        for command, answer in zip(commands, await self.api.run(commands), strict=True):
            if "No such" in answer or "Require" in answer or "invalid" in answer.lower():
                raise RuntimeApiError(f"{command}: {answer.strip()[:200]}")

    async def sample(self) -> None:
        """HAProxy's counters of each endpoint's backend into its load sample and stats."""
        answer, timings = await self.api.run(["show stat", LATENCY_COMMAND])
        rows = _stat_rows(answer)
        latencies = _latencies(timings)
        now = time.time()
        held = await self.access.all_held(now)
        loads: list[EndpointLoad] = []
        stats: dict[str, EndpointStats] = {}
        points: dict[str, EndpointPoint] = {}
        for session_id, slot in self.backends.items():
            name = backend_name(slot)
            mine = [r for r in rows if r.get("pxname") == name]
            backend = next((r for r in mine if r.get("svname") == "BACKEND"), None)
            if backend is None:
                continue
            requests = _int(backend, "req_tot")
            errors = _int(backend, "hrsp_5xx") + _int(backend, "econ") + _int(backend, "eresp")
            counter = self._counters.get(slot)
            if counter is None or counter.session_id != session_id or requests < counter.last_requests:
                counter = self._counters[slot] = _Counter(session_id, requests, errors, requests, now, requests, now)
            in_flight = _int(backend, "qcur") + sum(
                _int(r, "scur") for r in mine if r.get("svname", "").startswith(SERVER_PREFIX)
            )
            total = requests - counter.base_requests
            elapsed = now - counter.last_at
            rate = (requests - counter.last_requests) / elapsed if elapsed > 0 else 0.0
            counter.last_requests, counter.last_at = requests, now
            counter.latencies.extend(latencies.get(name, ()))
            window = list(counter.latencies)
            waiting = held.get(session_id, 0)
            routable_now = sum(1 for a in self.servers.get(slot, {}).values() if a is not None)
            if due(counter.point_at, now):
                points[session_id] = point(
                    now, counter.point_at, requests, counter.point_requests, routable_now, in_flight
                )
                counter.point_requests, counter.point_at = requests, now
            loads.append(EndpointLoad(session_id, in_flight, total, now, held=waiting))
            stats[session_id] = EndpointStats(
                sampled_at=now,
                requests_per_second=round(rate, 3),
                in_flight=in_flight,
                requests_total=total,
                errors_total=errors - counter.base_errors,
                avg_response_ms=_int(backend, "rtime"),
                avg_total_ms=_int(backend, "ttime"),
                replicas_routable=routable_now,
                held=waiting,
                p50_ms=percentile(window, 0.5),
                p99_ms=percentile(window, 0.99),
            )
        await record_loads(self.redis, self.keys, loads)
        await self.access.record_stats(stats)
        await self.access.record_points(points)
