"""What the apps' and the endpoints' control planes share (``gateway.apps.control``, ``gateway.endpoints.control``):
one task (in the gateway, or deployed in ``caravan ingress``: ``gateway.planes``) that keeps part of HAProxy equal to
what Redis says, through the runtime API.

- **One holder.** With several gateway workers, the holder of a lock (``flock`` on a file in HAProxy's state
  directory, one per plane) keeps HAProxy; the others wait for it and take over when its holder dies.
- **Changes, without polling.** The task blocks reading ``Keys.route_changes`` (``XREAD BLOCK``), the stream every
  write that moves what HAProxy must hold appends to in its MULTI (``stores.changes``), for at most
  :data:`CHECK_INTERVAL` seconds (the bounded fallback: a change is seen within it even if the stream were lost);
  then the plane's ``sync`` reads what changed and sends HAProxy the edits. An idle plane sends Redis one blocking
  read per :data:`CHECK_INTERVAL`, and the counters of its ``sync``.
- **Restarts.** Every :data:`CHECK_INTERVAL` seconds the task reads its mark in HAProxy (``generation`` in a map of
  its own); a HAProxy without it (restarted, or new) is rebuilt whole from Redis, the mark last.
- **Open WebSockets.** HAProxy keeps the WebSockets it admitted in a stick table of the plane's, keyed
  ``<client>|<host>|<token hash>|<user>`` (who opened each, with which token): after every change the plane applied,
  and every :data:`CHECK_INTERVAL` seconds, it reads the open ones and shuts down those that no longer pass
  (``refused``). Nothing of it lives in this process, so a restarted gateway closes the WebSockets opened before it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core.keys import Keys
from core.replies import stream_reads
from core.retry import stop_if_cancelled
from domain.app_routes import FIELD
from gateway.apps.runtime_api import RuntimeApi, RuntimeApiError
from stores.events import last_id

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.25
"""Seconds between checks that HAProxy still has the plane's mark (else: restarted, rebuild) and sweeps of its open
WebSockets; also the longest wait for a change (``Keys.route_changes``) before the plane's counters are read anyway."""
LOCK_RETRY = 1.0
"""Seconds between a waiting worker's attempts at the plane's lock."""
RETRY = 0.5
"""Seconds to wait after Redis or HAProxy failed to answer."""


@dataclass(frozen=True)
class OpenSocket:
    """A WebSocket HAProxy admitted: who opened it, with which token."""

    host: str
    user: str | None
    token_hash: str | None


def parse_socket(key: str) -> tuple[str, OpenSocket] | None:
    """``(client address:port, socket)`` of a key of a table of open WebSockets (``<client>|<host>|<token
    hash>|<user>``, ``-`` or nothing for none), or None."""
    parts = key.split(FIELD, 3)
    if len(parts) != 4:
        return None
    client, host, token, user = parts
    return client, OpenSocket(host, user if user not in ("", "-") else None, token if token not in ("", "-") else None)


class Plane(ABC):
    """The loop of a control plane; a plane says what its mark, rebuild, sync, sample and refused sockets are."""

    name = "control plane"
    lock_name = "control.lock"
    sockets_table = ""
    """HAProxy's table of the WebSockets this plane closes when they stop passing."""
    sample_interval = 2.0

    def __init__(self, redis: Redis, keys: Keys, api: RuntimeApi, lock_path: str) -> None:
        self.redis = redis
        self.keys = keys
        self.api = api
        self.lock_path = lock_path
        self.generation: str | None = None
        """The mark this task left in HAProxy (None: unknown, rebuild)."""
        self._change: str | None = None
        """The last entry of ``Keys.route_changes`` seen (None: not read yet)."""
        self._inode: int | None = None
        """The runtime socket's inode when the mark was last checked."""

    def haproxy_replaced(self) -> bool:
        """Whether the runtime socket is another than at the last check of the mark: a new HAProxy took the state
        directory over (an ingress upgrade's, prefilled: ``gateway.planes.prefilled``). Checked before each change
        is applied, so no edit meant for the old HAProxy's content lands on the new one's (the endpoints' backends
        may be assigned otherwise there)."""
        return inode(self.api.socket) != self._inode

    async def run(self) -> None:
        """Keep HAProxy while this process holds the plane's lock; whatever breaks the loop, it is set up again: the
        plane never dies silently in a task."""
        with await self._lock_file() as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_RETRY)
            while True:
                try:
                    await self._loop()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    stop_if_cancelled()
                    log.exception("%s failed; starting it again", self.name)
                    self.generation = None
                    self._change = None
                    await asyncio.sleep(RETRY)

    async def _lock_file(self) -> IO[str]:
        """The plane's lock file, opened once HAProxy's state directory exists: the ingress makes it, and may start
        after the gateway (the deployed jobs, ``bench/chaos``'s processes). A plane that gave up here stayed down for
        the gateway's life, and no route reached HAProxy (``bench/chaos``: ``routes_seen_live`` 0 for 120 s)."""
        waited = False
        while True:
            try:
                return open(self.lock_path, "a")  # noqa: ASYNC230 (once per process, a local file)
            except FileNotFoundError:
                if not waited:
                    log.info("%s: waiting for HAProxy's state directory (%s)", self.name, Path(self.lock_path).parent)
                    waited = True
                await asyncio.sleep(RETRY)

    async def _loop(self) -> None:
        last_check = last_sample = 0.0
        while True:
            stop_if_cancelled()  # a cancellation redis-py lost (core.retry) would otherwise never stop the task
            try:
                if self._change is None:  # from now on: whatever was written before, the next sync reads
                    self._change = await last_id(self.redis, self.keys.route_changes)
                now = time.monotonic()
                if self.generation is None or now - last_check >= CHECK_INTERVAL or self.haproxy_replaced():
                    last_check = now
                    self._inode = inode(self.api.socket)
                    if self.generation is None or await self.mark() != self.generation:
                        await self.rebuild()
                    await self.close_refused()  # admitted by a HAProxy thread as the last change was applied
                await self.sync()
                if self.generation is None:
                    continue  # sync saw a new HAProxy: rebuild it now
                if now - last_sample >= self.sample_interval:
                    last_sample = now
                    await self.sample()
                await self._await_change(last_check + CHECK_INTERVAL - time.monotonic())
            except asyncio.CancelledError:
                raise
            except (RuntimeApiError, RedisError, OSError) as exc:
                stop_if_cancelled(exc)
                log.warning("%s: %s; retrying", self.name, exc)
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

    @abstractmethod
    async def mark(self) -> str | None:
        """The generation HAProxy holds for this plane (None: none, a HAProxy nobody built)."""

    @abstractmethod
    async def rebuild(self) -> None:
        """What this plane keeps in HAProxy whole, from Redis; sets ``generation`` last."""

    @abstractmethod
    async def sync(self) -> None:
        """Send HAProxy what changed in Redis since the last call."""

    @abstractmethod
    async def sample(self) -> None:
        """Read HAProxy's counters (every :attr:`sample_interval` seconds)."""

    @abstractmethod
    async def refused(self, sockets: dict[str, OpenSocket]) -> set[str]:
        """The clients of ``sockets`` that no longer pass."""

    async def open_sockets(self) -> dict[str, OpenSocket]:
        """Client address:port -> the WebSocket HAProxy has open from it (the plane's :attr:`sockets_table`)."""
        found = {}
        for entry in await self.api.table(self.sockets_table, "data.conn_cur gt 0"):
            parsed = parse_socket(entry.get("key", ""))
            if parsed is not None:
                found[parsed[0]] = parsed[1]
        return found

    async def close_refused(self) -> None:
        """Close the open WebSockets that stopped passing (``refused``)."""
        if self.generation is None:
            return  # nothing applied yet: every socket would count as refused
        sockets = await self.open_sockets()
        if sockets:
            closing = await self.refused(sockets)
            if closing:
                await self._shutdown(closing)

    async def _shutdown(self, clients: set[str]) -> None:
        """HAProxy's streams from ``clients`` closed."""
        (listing,) = await self.api.run(["show sess"])
        streams = {}
        for line in listing.splitlines():
            words = line.split()
            if len(words) > 2 and words[0].endswith(":") and words[2].startswith("src="):
                streams[words[2][4:]] = words[0][:-1]
        await self.api.run([f"shutdown session {streams[c]}" for c in clients if c in streams])


def inode(path: Path) -> int | None:
    """``path``'s inode (None: no such file)."""
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None
