"""One blocking ``XREAD`` per process for every event stream its subscribers follow.

A subscription blocking in ``XREAD`` on a pooled connection of its own would hold that connection for
as long as it is open: a hundred subscriptions would use up the Redis client's pool (100 by default)
and starve every other request of the process. So a process has one :class:`EventHub`: a single
reader task reads all the streams someone follows (one ``XREAD`` over all of them) and hands each
entry to the local followers of its stream.

A follower joins before it catches up from its cursor with ``XRANGE``, so nothing between the two is
lost; what both deliver is dropped by id. A follower that falls behind (its queue fills up because its
client reads slowly) is not a reason to drop events: its queue is emptied and it catches up from Redis
again, where the events still are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.typing import KeyT, StreamIdT

from core.replies import stream_reads
from core.retry import stop_if_cancelled
from stores import events
from stores.events import SessionEvent

log = logging.getLogger(__name__)

QUEUE_LENGTH = 256
"""Events a follower may have waiting before it is told to catch up from Redis instead."""
RETRY_SECONDS = 1.0
"""Pause of the reader after a failed read (Redis unreachable); followers wait meanwhile, and miss nothing."""


@dataclass(eq=False)
class Follower:
    """One subscriber's view of one stream."""

    stream: str
    queue: asyncio.Queue[SessionEvent | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_LENGTH))
    behind: bool = False
    """Its queue overflowed: it must reread from Redis (a ``None`` in the queue says so)."""

    def offer(self, event: SessionEvent) -> None:
        if self.behind:
            return
        if self.queue.full():
            while not self.queue.empty():
                self.queue.get_nowait()
            self.behind = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(event)

    async def wait(self, timeout: float) -> None:
        """Return when anything arrived on the stream, or after ``timeout`` seconds."""
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns when a cancellation lands as the event
        # arrives, and the waiting loop (a log follow waiting for its kernel) would go on
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.queue.get()
        self.behind = False


class EventHub:
    def __init__(self, redis: Redis, *, block_ms: int = events.BLOCK_MS) -> None:
        self.redis = redis
        self.block_ms = block_ms
        self._followers: dict[str, set[Follower]] = {}
        self._positions: dict[str, str] = {}
        """Per followed stream, the last entry id the reader has handed out (or the stream's end when joined)."""
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def follower(self, stream: str) -> AsyncIterator[Follower]:
        """A follower of ``stream`` from now on (entries the reader reads after this)."""
        follower = Follower(stream)
        if stream not in self._positions:
            end = await events.last_id(self.redis, stream)
            self._positions.setdefault(stream, end)  # another follower may have joined meanwhile
        self._followers.setdefault(stream, set()).add(follower)
        self._changed.set()  # the reader's XREAD must include this stream
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="event-hub")
        try:
            yield follower
        finally:
            self._leave(follower)

    async def follow(self, stream: str, after: str) -> AsyncIterator[SessionEvent]:
        """Every entry of ``stream`` after ``after``, in order, waiting for new ones for ever (the caller stops)."""
        async with self.follower(stream) as follower:
            last = after
            while True:
                for event in await events.read_after(self.redis, stream, last):  # catch up from Redis
                    last = event.id
                    yield event
                follower.behind = False
                while (queued := await follower.queue.get()) is not None:  # None: it fell behind
                    if events.order(queued.id) > events.order(last):
                        last = queued.id
                        yield queued

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def _leave(self, follower: Follower) -> None:
        followers = self._followers.get(follower.stream, set())
        followers.discard(follower)
        if not followers:
            self._followers.pop(follower.stream, None)
            self._positions.pop(follower.stream, None)
            self._changed.set()

    async def _read(self) -> None:
        while self._followers:
            stop_if_cancelled()  # aclose's cancel, if it landed in the suppressed wait below, ends the loop here
            self._changed.clear()
            streams: dict[KeyT, StreamIdT] = {stream: self._positions[stream] for stream in self._followers}
            read = asyncio.ensure_future(self.redis.xread(streams, count=500, block=self.block_ms))
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({read, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                if not read.done():
                    read.cancel()  # redis-py drops the connection of a cancelled command: nothing is left unread
                    with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                        await read
            if read.cancelled():
                continue
            try:
                reply = read.result()
            except (RedisError, OSError) as exc:
                log.warning("event streams unreadable (%s); retrying in %s s", exc, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            for stream, entries in stream_reads(reply):
                for entry_id, fields in entries:
                    if stream not in self._positions:
                        break  # nobody follows it any more
                    self._positions[stream] = entry_id
                    event = events.decode(entry_id, fields)
                    for follower in list(self._followers.get(stream, ())):
                        follower.offer(event)
