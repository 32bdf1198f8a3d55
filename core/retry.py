"""Named retry policies, so no call site invents its own backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from core.errors import TransientError

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT = (TransientError, RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


def backoff(*, give_up_after: float = 30.0) -> AsyncRetrying:
    """Retry transient failures (Redis or Nomad unreachable) with jittered exponential backoff."""
    return AsyncRetrying(
        retry=retry_if_exception_type(TRANSIENT),
        wait=wait_exponential_jitter(initial=0.1, max=5.0),
        stop=stop_after_delay(give_up_after),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


async def forever(name: str, step: Callable[[], Awaitable[None]], *, pause: float = 0.0) -> None:
    """Run ``step`` again and again; transient failures back off, anything else (a lost lease) ends the loop."""
    delay = 0.2
    while True:
        stop_if_cancelled()
        try:
            await step()
            stop_if_cancelled()  # before the pause: a stop request lost in the step takes effect now
            delay = 0.2
            if pause:
                await asyncio.sleep(pause)
        except TRANSIENT as exc:
            stop_if_cancelled(exc)
            log.warning("%s: %s; retrying in %.1fs", name, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def with_backoff(name: str, step: Callable[[], Awaitable[T]], *, max_delay: float = 5.0) -> T:
    """``step``'s result, retrying transient failures with backoff (at most ``max_delay`` apart) for as long as it
    takes."""
    delay = 0.2
    while True:
        stop_if_cancelled()
        try:
            result = await step()
        except TRANSIENT as exc:
            stop_if_cancelled(exc)
            log.warning("%s: %s; retrying in %.1fs", name, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
            continue
        stop_if_cancelled()  # a caller asked to stop must not go on with the result
        return result


def stop_if_cancelled(cause: BaseException | None = None) -> None:
    """Raise CancelledError when the current task has been asked to stop; loops call it at every turn.

    A cancellation can get lost before it reaches a loop: Python 3.11's ``asyncio.wait_for``, which redis-py
    wraps around every socket write, returns normally when the cancellation arrives just as the write
    completes, and redis-py's cleanup of a cancelled command may raise a connection error in its place.
    The task still counts the request (``Task.cancelling()``), so a loop that checks it stops anyway.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause
