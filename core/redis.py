"""Connecting to Redis."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterable
from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.errors import TransientError
from core.retry import backoff
from core.settings import RedisSettings

MAX_CONNECTIONS = 200
POOL_WAIT = 5.0
"""A command waits this long for a free pooled connection in a burst (redis-py's default pool refuses at once with
MaxConnectionsError), then fails as an outage (UNAVAILABLE)."""


class HiredisPacking(AbstractConnection):
    """Commands packed by hiredis's C packer, as redis-py's synchronous client packs them: its asyncio connection packs
    in Python, a large share of the schedule runner's CPU when many runs write large MSET and ZADD commands
    (``bench/schedules``; the figure in bench/README.md). Same bytes on the wire: str as UTF-8, floats as ``repr``, and
    what the Python packer refuses (None, bool, other types) is a ``DataError`` here too."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a bytearray (which hiredis refuses) or a value no packer takes: look at each argument
            pass
        converted: tuple[Any, ...] = tuple(bytes(a) if isinstance(a, bytearray) else a for a in args)
        try:
            return [hiredis.pack_command(converted)]
        except TypeError as exc:
            raise DataError(str(exc)) from exc

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(self.pack_command(*command)[0] for command in commands)]


class NotReplicated(ResponseError, TransientError):
    """A write no replica confirmed: refused by a primary that lost its replicas (``NOREPLICAS``, nothing written),
    or a transaction the primary applied but no replica acknowledged within the wait (``WAIT``; it may or may not
    survive a failover). Not retried on the spot: callers see an outage (the gateway answers UNAVAILABLE, the
    services retry with backoff)."""


class NotPrimary(ReadOnlyError, TransientError):
    """A transaction refused by a primary that a failover has just demoted (``READONLY`` inside ``EXEC``: a script's
    write, say): nothing was written. An outage, as :class:`NotReplicated`: the connection to it is dropped, so the
    next attempt goes to the primary the Sentinels name now."""


class ReplicaRefusals(AbstractConnection):
    """``NOREPLICAS`` (a primary with fewer good replicas than ``min-replicas-to-write``) read as :class:`NotReplicated`
    rather than as a plain error reply (which the gateway would report as INTERNAL)."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if str(exc).startswith("NOREPLICAS"):
                raise NotReplicated(str(exc)) from exc
            raise


class SentinelReconnects(SentinelManagedConnection):
    """A Sentinel-managed connection that, broken, connects again to the primary the Sentinels name now. redis-py
    (8.1) reconnects a broken connection on its next command to the address it had (``send_packed_command``), not
    through the Sentinels as a new connection does: a transaction's ``UNWATCH`` after its primary was killed reconnected
    to that port, where the node was back as a replica, and the pool handed the connection out again; every attempt
    then read ``READONLY`` there and began again at once (bench/chaos: a gateway spun on it at start, never ready)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]  # Sentinel-aware: asks for the primary again
        await super().send_packed_command(command, check_health)


class ClosedTransports(AbstractConnection):
    """A write on a connection whose peer has closed it read as the connection error it is. Under uvloop (the
    services' event loop) writing to a transport closed by the peer raises ``RuntimeError`` ("the handler is
    closed"), which redis-py lets through, where asyncio's own loop drops the write and the read that follows fails
    as a ``ConnectionError``: found by bench/chaos, a primary that closed a connection just made to it (killed, or
    demoted by a failover) during its ``HELLO``, and the gateway answered ``createSession`` with INTERNAL."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"the connection was closed by the server: {exc}") from exc


def with_hiredis_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (plain, TLS, Unix socket or Sentinel-managed) packing with hiredis, reading
    ``NOREPLICAS`` as :class:`NotReplicated` and a write to a transport the server closed as a connection error
    (:class:`ClosedTransports`); a Sentinel-managed one reconnecting through the Sentinels
    (:class:`SentinelReconnects`)."""
    bases: tuple[type[AbstractConnection], ...] = (ClosedTransports, HiredisPacking, ReplicaRefusals)
    if issubclass(connection_class, SentinelManagedConnection):
        bases += (SentinelReconnects,)
    return type(f"Hiredis{connection_class.__name__}", (*bases, connection_class), {})


class ReplicatedPipeline(Pipeline):
    """A pipeline whose transactions (``MULTI``/``EXEC``) count as written only once ``replicas`` replicas have them:
    ``WAIT replicas timeout`` on the same connection right after ``EXEC``, :class:`NotReplicated` when fewer confirm.
    With ``replicas`` 0, an ordinary pipeline."""

    replicas = 0
    wait_ms = 1000

    async def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: Any) -> Any:
        """The transaction's replies. A refusal inside ``EXEC`` (a script's write refused with ``NOREPLICAS`` or
        ``READONLY`` during a failover) is not a plain error reply but an outage (:class:`NotReplicated`,
        :class:`NotPrimary`): found by bench/chaos, where a standby scheduler or idle checker taking the lease then
        died of it (the lease's EVAL), and no standby took over a paused leader's lease for 30 s."""
        try:
            result = await super()._execute_transaction(connection, commands, raise_on_error)
        except NotReplicated:
            raise
        except ReadOnlyError as exc:
            await connection.disconnect()
            raise NotPrimary(str(exc)) from exc
        except ResponseError as exc:
            if "NOREPLICAS" in str(exc):
                raise NotReplicated(str(exc)) from exc
            raise
        if self.replicas:
            try:
                await connection.send_command("WAIT", self.replicas, self.wait_ms)
                confirmed = int(await connection.read_response())
            except (RedisConnectionError, RedisTimeoutError) as exc:  # never run the applied EXEC again
                raise NotReplicated(f"the primary was lost before a replica confirmed the write: {exc}") from exc
            if confirmed < self.replicas:
                raise NotReplicated(f"{confirmed} of {self.replicas} replicas confirmed the write in {self.wait_ms} ms")
        return result


class CaravanRedis(Redis):
    """The client: its transaction pipelines wait for ``wait_replicas`` replicas (:class:`ReplicatedPipeline`)."""

    wait_replicas = 0
    wait_ms = 1000

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = ReplicatedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.replicas = self.wait_replicas
        pipe.wait_ms = self.wait_ms
        return pipe


class IdleClosingPool(BlockingConnectionPool):
    """redis-py's blocking pool, which keeps every connection it ever made (after a burst, hundreds sat idle): this
    one closes the connections idle longer than ``idle_timeout`` seconds, so the pool shrinks back to what the
    traffic uses. Idle connections are reused newest first, so under a steady load the oldest are the spare ones.
    """

    def __init__(self, *, idle_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.idle_timeout = idle_timeout
        self._idle_since: weakref.WeakKeyDictionary[AbstractConnection, float] = weakref.WeakKeyDictionary()
        self._sweep: asyncio.TimerHandle | None = None

    async def release(self, connection: AbstractConnection) -> None:
        self._idle_since[connection] = time.monotonic()  # before it can be taken again: never a stale time
        await super().release(connection)
        if self._sweep is None:
            self._sweep_in(self.idle_timeout)

    async def close_idle(self) -> int:
        """Close the connections idle for longer than ``idle_timeout`` now; how many."""
        now = time.monotonic()
        stale = []
        async with self._condition:  # as get_connection and release: none is taken while it is looked at
            available = self._available_connections  # the latest released last (and reused first)
            while available and now - self._idle_since.get(available[0], now) >= self.idle_timeout:
                stale.append(available.pop(0))
        await asyncio.gather(*(connection.disconnect() for connection in stale), return_exceptions=True)
        return len(stale)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        await super().disconnect(inuse_connections)

    def _sweep_in(self, delay: float) -> None:
        self._sweep = asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(self._swept()))

    async def _swept(self) -> None:
        await self.close_idle()
        oldest = min((self._idle_since.get(c, time.monotonic()) for c in self._available_connections), default=None)
        self._sweep = None
        if oldest is not None:  # again when the oldest idle one is due
            self._sweep_in(max(0.05, oldest + self.idle_timeout - time.monotonic()))


class WholeSentinels(Sentinel):
    """redis-py's Sentinel manager, whose list of Sentinel clients concurrent discoveries cannot break.

    redis-py (8.1) moves the Sentinel that named the primary to the front of its list by the index it had when the
    discovery asked it (``sentinels[0], sentinels[i] = sentinel, sentinels[0]``). Two discoveries that both passed
    over the first Sentinel (in a failover it names no good primary, or cannot be reached) and were answered by the
    same second one swap twice: the second swap, its index stale, writes that Sentinel over the first one's place and
    the first client is gone from the list, its connections with it. ``aclose`` closes the clients on the list, so that
    client's connections stayed open until garbage collection warned of them (``unclosed Connection``, three
    connections to one Sentinel, in whichever test ran then: found after tests/e2e/test_redis_failover.py), and no
    discovery asked that Sentinel again. Here the list is made whole again after each discovery: the one that answered
    first, then every other client, each once."""

    def __init__(self, sentinels: Iterable[tuple[str, int]], **kwargs: Any) -> None:
        super().__init__(sentinels, **kwargs)  # type: ignore[no-untyped-call]
        self.clients: tuple[Redis, ...] = tuple(self.sentinels)
        """Every Sentinel client made, in the order given: the list's members, whatever its order."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        finally:  # no await between redis-py's swap and here: no other task sees the list broken
            front = self.sentinels[0]
            self.sentinels[:] = [front, *(c for c in self.clients if c is not front)]


class SentinelIdleClosingPool(IdleClosingPool, SentinelConnectionPool):
    """The idle-closing blocking pool, its connections going to the primary the Sentinels name: asked again at each
    new connection, and after a failover (a connection to the old primary reads ``READONLY`` once it is demoted, or
    breaks when it died) the pool drops its idle connections to it."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name=service_name, sentinel_manager=sentinel_manager, **kwargs)
        self.sentinels = sentinel_manager

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """The pool's connections and, at its end (``aclose``: every connection), the Sentinel clients' own (redis-py's
        pool leaves those open: they warned at garbage collection as unclosed connections). redis-py also calls this
        when the Sentinels name a new primary, for the idle connections alone: the Sentinel clients stay open then,
        as other tasks may be asking a Sentinel on them (found by bench/chaos: closed under such a task, they failed
        it with ``AttributeError`` or ``RuntimeError``, not a connection error, and the gateway answered 500)."""
        try:
            await super().disconnect(inuse_connections)
        finally:
            if inuse_connections:
                await self.sentinels.aclose()


def client(settings: RedisSettings) -> Redis:
    """A pooled client; commands fail fast when Redis is down and callers decide how to retry.

    A command on a pooled connection that broke (Redis was restarted, or its primary failed over) is retried on a
    fresh one, within about a second: without it, the first request on each stale connection failed after Redis was
    back (from_url leaves the client without redis-py's default retry). A WATCHed transaction is not retried here: it
    raises WatchError, and the store's optimistic loop runs it again. Connections idle longer than
    ``settings.idle_timeout`` are closed. With ``settings.sentinels``, the primary is the one the Sentinels name.
    """
    options: dict[str, Any] = {
        "idle_timeout": settings.idle_timeout,
        "max_connections": MAX_CONNECTIONS,
        "timeout": POOL_WAIT,
        "decode_responses": True,
        "socket_connect_timeout": 2.0,
        "socket_timeout": 10.0,
        "health_check_interval": 15,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    pool: IdleClosingPool
    if settings.sentinels:
        url = {k: v for k, v in parse_url(settings.url).items() if k in ("username", "password", "db")}
        sentinel = WholeSentinels(
            settings.sentinels,
            sentinel_kwargs={
                "username": settings.sentinel_username,
                "password": settings.sentinel_password,
                "socket_connect_timeout": 1.0,
                "socket_timeout": 1.0,
                "decode_responses": True,
            },
        )
        pool = SentinelIdleClosingPool(
            settings.sentinel_master,
            sentinel,
            is_master=True,
            connection_class=with_hiredis_packing(SentinelManagedConnection),
            **url,
            **options,
        )
    else:
        pool = IdleClosingPool.from_url(settings.url, **options)
        pool.connection_class = with_hiredis_packing(pool.connection_class)
    redis = CaravanRedis(connection_pool=pool)
    redis.auto_close_connection_pool = True  # aclose() closes the pool, as with from_url
    redis.wait_replicas = settings.wait_replicas
    redis.wait_ms = max(1, int(settings.wait_timeout * 1000))
    return redis


async def connect(settings: RedisSettings, *, give_up_after: float = 30.0) -> Redis:
    """A client that has answered a PING, retried with backoff while Redis comes up (closed when it never does, or
    the wait is cancelled)."""
    redis = client(settings)
    try:
        async for attempt in backoff(give_up_after=give_up_after):
            with attempt:
                await redis.ping()
    except BaseException:
        await redis.aclose()
        raise
    return redis
