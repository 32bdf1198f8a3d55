"""Named retry policies, so no call site invents its own backoff."""

from __future__ import annotations

import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from common.errors import TransientError

log = logging.getLogger(__name__)

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
