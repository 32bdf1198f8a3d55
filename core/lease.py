"""One active instance of a service across processes: a Redis lease with a fencing token.

Whoever holds the lease key is the leader; each new term takes the next fencing number, and
every write of a leader carries it (:class:`Fence`), so a paused old leader
that wakes up after losing the lease cannot write. The scheduler and the idle checker each
lead through :func:`lead_forever` with a lease of their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from core.replies import begin
from core.retry import TRANSIENT, stop_if_cancelled, with_backoff

log = logging.getLogger(__name__)


class LostLease(Exception):
    """A leader tried to write after another took over (its fencing token is stale)."""


@dataclass(frozen=True)
class Fence:
    """A leadership term: writes carrying it are refused once a newer term has started."""

    key: str
    token: int


_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return redis.call('INCR', KEYS[2])
end
return false
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    def __init__(self, redis: Redis, key: str, fence_key: str, *, ttl: float) -> None:
        self.redis = redis
        self.key = key
        self.fence_key = fence_key
        self.ttl_ms = int(ttl * 1000)
        self.holder = uuid.uuid4().hex
        self.term: Fence | None = None
        """The term this process leads now (set by :func:`lead_forever`); None while it stands by."""

    async def try_acquire(self) -> Fence | None:
        """The lease and the next fencing token, taken together in one transaction: with replicas to wait for
        (``CARAVAN_REDIS_WAIT_REPLICAS``) a term starts only once a replica has both, so a failover cannot hand the
        same token to a second leader (raises ``NotReplicated`` otherwise). A lease of this holder's own that is
        still there (a refused attempt's write that stayed, or a term it gave up while Redis was unreachable) is
        taken again at once, with a new token: no other process holds it, and waiting for it to expire left the
        service without a leader for up to a TTL (bench/chaos: an idle checker's pause not taken over in 30 s)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.eval(_ACQUIRE, 2, self.key, self.fence_key, self.holder, str(self.ttl_ms))
            (token,) = await pipe.execute()
        return None if token is None else Fence(key=self.fence_key, token=int(token))

    async def acquire(self, *, poll: float = 0.5) -> Fence:
        while (fence := await self.try_acquire()) is None:
            stop_if_cancelled()
            await asyncio.sleep(poll)
        return fence

    async def renew(self) -> bool:
        return bool(await self.redis.eval(_RENEW, 1, self.key, self.holder, str(self.ttl_ms)))

    async def release(self) -> None:
        await self.redis.eval(_RELEASE, 1, self.key, self.holder)

    async def hold(self) -> None:
        """Renew until the lease is lost (then raise :class:`LostLease`); the caller stops leading.

        While Redis is unreachable the lease may still be ours: keep trying until a full TTL has
        passed since the last successful renewal, after which another holder may have taken it.
        """
        renewed_at = time.monotonic()
        while True:
            try:
                if not await self.renew():
                    break
                renewed_at = time.monotonic()
            except TRANSIENT:
                if time.monotonic() - renewed_at > self.ttl_ms / 1000:
                    break
            stop_if_cancelled()
            await asyncio.sleep(self.ttl_ms / 3000)
        raise LostLease("lease expired or taken")


STANDBY_RETRY_MAX = 1.0
"""The longest a standby waits between two attempts at the lease while Redis fails (it polls a held lease every 0.5 s
anyway): with the usual 5 s, a standby tried a Redis failing over every few seconds only in its outages, and took a
paused leader's lease 49 s late (bench/chaos)."""


async def lead_forever(name: str, lease: Lease, lead: Callable[[Fence], Awaitable[None]]) -> None:
    """Wait for the lease, run ``lead`` while holding it, stand by again once it is lost; never returns.

    ``lead`` is cancelled as soon as renewal fails, and ends a term itself by raising :class:`LostLease`
    (a fenced write was refused). A term also ends on any other failure; the next one starts clean.
    """
    while True:
        fence = await with_backoff("acquire lease", lease.acquire, max_delay=STANDBY_RETRY_MAX)
        log.info("%s leading (fencing token %d)", name, fence.token)
        lease.term = fence
        try:
            ended = await _term(lease.hold(), lead(fence))
        finally:
            lease.term = None
        if isinstance(ended, LostLease):
            log.warning("%s lost its lease; standing by", name)
        elif ended is not None:
            log.error("%s term %d failed; standing by", name, fence.token, exc_info=ended)
            await asyncio.sleep(1)


async def _term(holding: Awaitable[None], leading: Awaitable[None]) -> BaseException | None:
    """Run both until one ends, then stop the other; what ended the term (None: ``leading`` returned).

    Not a TaskGroup: on Python 3.11 a TaskGroup whose child fails while it waits leaves a cancellation
    request on the calling task (it calls ``uncancel`` too early), which would stop the next term at once.
    """
    tasks = [asyncio.ensure_future(holding), asyncio.ensure_future(leading)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    first = next(task for task in tasks if task in done)
    return asyncio.CancelledError() if first.cancelled() else first.exception()


async def watch_fenced(pipe: Pipeline, fence: Fence | None, *keys: str) -> None:
    """Start an optimistic transaction on ``pipe``: WATCH ``keys`` and, with a ``fence``, its counter, which must be
    the current term (:class:`LostLease` otherwise; a new term started before ``EXEC`` fails it as a conflict)."""
    await pipe.watch(*keys, *([fence.key] if fence else []))
    if fence is not None and int(await pipe.get(fence.key) or 0) != fence.token:
        raise LostLease(f"fencing token {fence.token} is stale")


async def write_fenced(redis: Redis, fence: Fence, write: Callable[[Pipeline], object]) -> None:
    """Run the commands ``write`` queues as one transaction, only while ``fence`` is the current term.

    Raises :class:`LostLease` when a newer term has started, before or during the transaction.
    """
    async with redis.pipeline(transaction=True) as pipe:
        await watch_fenced(pipe, fence)
        begin(pipe)
        write(pipe)
        try:
            await pipe.execute()
        except WatchError as exc:  # the fencing counter only moves when a new term starts
            raise LostLease(f"fencing token {fence.token} went stale during the write") from exc
