"""Optimistic transactions on Redis, the one way the stores write what they read first.

A store's ``attempt`` WATCHes the keys it reads on the pipeline it is given (``pipe.watch``, or
:func:`core.lease.watch_fenced` for a fenced write), reads them, decides (it may return without writing, or raise to
refuse), queues its writes after :func:`core.replies.begin` and executes them. When a watched key changed in between,
Redis refuses the ``EXEC`` (``WatchError``) and :func:`transact` runs the attempt again from the start, on a fresh
pipeline: the attempt reads what is stored now, so a decision is never applied to a state it was not made on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

T = TypeVar("T")


async def transact(redis: Redis, attempt: Callable[[Pipeline], Awaitable[T]]) -> T:
    """``attempt``'s answer, once it ran to its end without a watched key changing under it (any number of tries:
    each conflict means another writer got through)."""
    while True:
        async with redis.pipeline(transaction=True) as pipe:
            try:
                return await attempt(pipe)
            except WatchError:
                continue
