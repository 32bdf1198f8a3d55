"""The checks a GraphQL request over HTTP passes before GraphQL sees it: the body size (413), the URL length (414),
and the token check with the rate limit's count (429, :mod:`gateway.graphql.rate_limit`), each refusal a
:class:`RequestError` the HTTP view answers with its status and a JSON error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.types import Message, Receive

from gateway.auth import header_token
from gateway.graphql.limits import Limits
from gateway.graphql.rate_limit import RateLimiter, client_subject, rate_subject

log = logging.getLogger(__name__)


@dataclass
class RequestError(Exception):
    """A request refused over HTTP before (or instead of) executing it."""

    status: int
    message: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)


class Guard:
    """The checks a request passes before GraphQL sees it."""

    def __init__(self, limits: Limits, rate_limiter: RateLimiter) -> None:
        self.limits = limits
        self.rate_limiter = rate_limiter
        """Checks the token (and counts the request, unless ``rate_limit`` is 0) for every request."""

    def too_large(self) -> RequestError:
        limit = self.limits.max_body_bytes
        return RequestError(
            413, f"the request body is larger than {limit} bytes", "PAYLOAD_TOO_LARGE", details={"limit": limit}
        )

    def check_url(self, request: Request) -> None:
        """Refuses a request target longer than the limit (a GET carries its query there) with 414."""
        target = len(request.scope.get("raw_path") or b"") + len(request.scope.get("query_string") or b"") + 1
        if target > self.limits.max_url_bytes:
            limit = self.limits.max_url_bytes
            raise RequestError(
                414,
                f"the URL is longer than {limit} bytes: send the query in a POST body",
                "URI_TOO_LONG",
                details={"limit": limit},
            )

    def bounded(self, receive: Receive) -> Receive:
        """``receive`` that refuses a body growing past the limit (bodies without Content-Length)."""
        seen = 0

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limits.max_body_bytes:
                raise self.too_large()
            return message

        return bounded_receive

    async def admit(self, request: Request, read: Sequence[str] = ()) -> list[Any] | None:
        """Refuses a request over a limit; returns the values of the keys ``read``, read with the token check and the
        rate limit's count (None when Redis failed: the fields that need it answer UNAVAILABLE). The token's user
        (or None) is left in ``request.state.admitted`` for the GraphQL context."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limits.max_body_bytes:
            raise self.too_large()
        token = header_token(request.headers)
        try:
            admission = await self.rate_limiter.admit(
                token, client_subject(request.client.host if request.client else None), read
            )
        except (RedisError, OSError) as exc:  # fail open: an outage is reported by the fields that need Redis
            log.debug("rate limit not checked: %s", exc)
            return None
        request.state.admitted = admission.viewer
        request.state.rate_subject = rate_subject(admission.viewer, request)
        self._check_rate(admission.retry_after)
        return admission.values

    async def count_more(self, request: Request, requests: int) -> None:
        """Count a batch's operations beyond the first against the same budget as the request; 429 when over."""
        subject = getattr(request.state, "rate_subject", None)
        if requests <= 0 or not self.rate_limiter.limit or subject is None:  # None: Redis failed at admission
            return
        try:
            retry_after = await self.rate_limiter.count_more(subject, requests)
        except (RedisError, OSError) as exc:  # fail open, as at admission
            log.debug("rate limit not checked: %s", exc)
            return
        self._check_rate(retry_after)

    def _check_rate(self, retry_after: float | None) -> None:
        if retry_after is not None:
            message, seconds = self.rate_limiter.refusal(retry_after)
            raise RequestError(
                429, message, "RATE_LIMITED", headers={"Retry-After": str(seconds)}, details={"retryAfter": seconds}
            )
