"""What a GraphQL request must stay within: document size, shape and cost, body size, request rate, Nomad calls.

The document limits are schema extensions (Strawberry's depth, token and alias limiters, and the cost limit of
:mod:`gateway.graphql.cost`, each with an ``extensions.code`` of its own); the body limit and the per-user rate
limit are checked by the HTTP view before GraphQL sees the request, and refuse it with 413 and 429. The caps on
concurrent Nomad calls are :mod:`gateway.nomad_shares`'.

The rate limit counts per user, whatever token they send (ten tokens get one budget), and per client address for
requests without a valid token (a made-up token does not buy a fresh budget). It needs the token's user, so the
token check and the count run in one Redis script (:data:`ADMIT`, with the reads the result cache wants): one round
trip per request for all three.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from graphql import ASTValidationRule, GraphQLError, ValidationContext, ValidationRule
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.types import Message, Receive
from strawberry.extensions import MaxTokensLimiter, SchemaExtension
from strawberry.extensions.add_validation_rules import AddValidationRules
from strawberry.extensions.max_aliases import create_validator as alias_validator
from strawberry.extensions.query_depth_limiter import create_validator as depth_validator

from core.keys import Keys
from gateway.graphql.cost import CostLimit
from gateway.graphql.document_cache import DocumentCache
from gateway.http_server import PARSER_MAX_URL_BYTES
from nomad_jobs.client import CONNECTIONS, LOG_FOLLOWS
from stores.users import AUTHENTICATE_FUNCTION, Authenticated, authenticated, token_check_args

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Every limit of the GraphQL endpoint; each is set by ``CARAVAN_GRAPHQL_<FIELD NAME>``."""

    max_depth: int = 10
    """Deepest field nesting an operation may select (introspection fields are not counted)."""
    max_tokens: int = 2000
    """Most lexical tokens a document may have; the parser stops at the first one over."""
    max_aliases: int = 15
    """Most aliased fields a document may have (aliases repeat one expensive field many times)."""
    max_page: int = 100
    """Most items one page of a Relay connection returns (Strawberry's ``relay_max_results``)."""
    max_body_bytes: int = 1 << 20
    """Largest request body in bytes; a larger one is refused with 413 before it is read whole."""
    max_batch: int = 10
    """Most operations one batched request (a JSON array body) may hold; each counts against the rate limit and is
    held to the cost limit. 0: batching off (refused with BATCHING_DISABLED)."""
    max_url_bytes: int = 32768
    """Longest request target (path and query string) in bytes, a GET's query included; a longer one is refused with
    414. At most 65535: the HTTP server refuses longer ones itself (``gateway.http_server``)."""
    rate_limit: int = 600
    """Requests one user (or one client address, without a valid token) may make per window; 0: off."""
    rate_window: int = 60
    """Length in seconds of the fixed rate-limit window."""
    result_cache: int = 1
    """1: repeated session queries are answered from ``gateway.graphql.result_cache`` while no session changed.
    0: off."""
    max_cost: int = 5000
    """Most an operation may cost (``gateway.graphql.cost``: 1 per field that reads Redis, 10 per Nomad call, times
    the page size or bound of the lists around it); a page of 100 sessions with their main kernel's logs costs 2101."""
    max_nomad_calls: int = 8
    """Nomad calls one request (or WebSocket connection) has in flight at once; more wait their turn."""
    max_user_nomad_calls: int = 16
    """Nomad calls one user's requests have in flight at once in one gateway process; below the Nomad client's pool
    (``nomad_jobs.client.CONNECTIONS``), so that one user's heavy queries leave connections to the others."""
    max_log_follows: int = 8
    """``kernelLogs`` subscriptions one WebSocket connection follows at once; at most the user's cap below."""
    max_user_log_follows: int = 16
    """``kernelLogs`` subscriptions one user's connections follow at once in one gateway process; below the process's
    follow pool (``nomad_jobs.client.LOG_FOLLOWS``, which caps the process: ``gateway.log_follows``), so that one
    user's follows leave follows to the others."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < (0 if f.name in ("rate_limit", "result_cache", "max_batch") else 1):
                raise ValueError(f"CARAVAN_GRAPHQL_{f.name.upper()} must be positive, not {getattr(self, f.name)}")
        if self.max_url_bytes > PARSER_MAX_URL_BYTES:
            raise ValueError(
                f"CARAVAN_GRAPHQL_MAX_URL_BYTES must be at most {PARSER_MAX_URL_BYTES}, the longest URL "
                f"the HTTP server parses, not {self.max_url_bytes}"
            )
        if not self.max_nomad_calls <= self.max_user_nomad_calls < CONNECTIONS:
            raise ValueError(
                f"CARAVAN_GRAPHQL_MAX_NOMAD_CALLS ({self.max_nomad_calls}) must be at most "
                f"CARAVAN_GRAPHQL_MAX_USER_NOMAD_CALLS ({self.max_user_nomad_calls}), which must be "
                f"below the Nomad client's {CONNECTIONS} connections"
            )
        if not self.max_log_follows <= self.max_user_log_follows < LOG_FOLLOWS:
            raise ValueError(
                f"CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS ({self.max_log_follows}) must be at most "
                f"CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS ({self.max_user_log_follows}), which must be "
                f"below the gateway process's {LOG_FOLLOWS} log follows"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for f in fields(cls):
            name = f"CARAVAN_GRAPHQL_{f.name.upper()}"
            if env.get(name):
                try:
                    values[f.name] = int(env[name])
                except ValueError:
                    raise ValueError(f"{name} must be a whole number, not {env[name]!r}") from None
        return cls(**values)


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


# -- document limits ----------------------------------------------------------------------------


class _CodedContext:
    """A validation context whose reported errors carry ``extensions.code`` (and the limit)."""

    def __init__(self, context: ValidationContext, extensions: dict[str, Any]) -> None:
        self._context = context
        self._extensions = extensions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def report_error(self, error: GraphQLError) -> None:
        error.extensions = {**(error.extensions or {}), **self._extensions}
        self._context.report_error(error)


def _coded(rule: type[ValidationRule], code: str, limit: int) -> type[ValidationRule]:
    # mypy cannot check a class whose base is a value (strawberry's validator factories make the rule classes)
    class Coded(rule):  # type: ignore[valid-type,misc]
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(_CodedContext(context, {"code": code, "limit": limit}))

    return Coded


TOO_MANY_TOKENS = "TOO_MANY_TOKENS"


class _MaxTokens(MaxTokensLimiter):
    """Strawberry's token limit, with the parser's refusal coded TOO_MANY_TOKENS."""

    def on_parse(self) -> Iterator[None]:
        yield
        for error in self.execution_context.pre_execution_errors or ():
            if f"contains more than {self.max_token_count} tokens" in error.message:
                error.extensions = {**(error.extensions or {}), "code": TOO_MANY_TOKENS, "limit": self.max_token_count}


def schema_extensions(limits: Limits) -> list[Callable[[], SchemaExtension]]:
    """Factories of the document-limit extensions (Strawberry builds them afresh for each operation)."""
    rules: list[type[ASTValidationRule]] = [
        _coded(depth_validator(limits.max_depth, None), "QUERY_TOO_DEEP", limits.max_depth),
        _coded(alias_validator(limits.max_aliases), "TOO_MANY_ALIASES", limits.max_aliases),
    ]
    # DocumentCache last: it parses with the token limit and validates with the rules the others set
    return [
        functools.partial(_MaxTokens, limits.max_tokens),
        functools.partial(AddValidationRules, rules),
        DocumentCache,
        functools.partial(CostLimit, limits.max_cost, limits.max_page),
    ]


# -- body size and request rate -----------------------------------------------------------------


# KEYS[1]: the token record (Keys.no_token without a token); KEYS[2..]: keys to read. ARGV[1..3]: the token
# check's (see stores.users); ARGV[4]: the rate-limit key prefix, ARGV[5]: the window's number, ARGV[6]: its length
# in seconds, ARGV[7]: the limit (0: count nothing), ARGV[8]: the subject without a valid token (the client's address).
# Returns {the user's document or false, the token's expiry or false, the count (0 when not counted), the reads...}.
ADMIT = (
    AUTHENTICATE_FUNCTION
    + """
local doc, user, expires = authenticate(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
local count = 0
if tonumber(ARGV[7]) > 0 then
  local key = ARGV[4] .. (user and ('user:' .. user) or ARGV[8]) .. ':' .. ARGV[5]
  count = redis.call('INCR', key)
  if count == 1 then redis.call('EXPIRE', key, tonumber(ARGV[6]) + 1) end
end
local reply = {doc, expires, count}
for i = 2, #KEYS do reply[#reply + 1] = redis.call('GET', KEYS[i]) end
return reply
"""
)


@dataclass(frozen=True)
class Admission:
    """What the admission script found for one request."""

    viewer: Authenticated | None
    """The token's user and expiry; None without a token, for an unknown, revoked or expired one, or a deactivated
    user."""
    retry_after: float | None
    """Over the rate limit: seconds until the window ends; else None."""
    values: list[Any]
    """The keys asked to be read, in order."""


class RateLimiter:
    """A fixed-window request counter in Redis (``Keys.rate_limit``) per user, or per client address for requests
    without a valid token, counted by the script that checks the token."""

    def __init__(self, redis: Callable[[], Redis], keys: Keys, limit: int, window: int) -> None:
        self.redis = redis
        self.keys = keys
        self.limit = limit
        """Requests per window; 0: the token is checked and the keys read, but nothing is counted."""
        self.window = window
        self._script: AsyncScript | None = None

    async def admit(self, token: str, anonymous: str, read: Sequence[str] = (), now: float | None = None) -> Admission:
        """Check ``token`` and count one request against its user (against ``anonymous`` without a valid token),
        reading the keys ``read`` too: one round trip."""
        now = time.time() if now is None else now
        window = int(now // self.window)
        redis = self.redis()
        if self._script is None:
            self._script = redis.register_script(ADMIT)
        token_key, token_args = token_check_args(self.keys, token, datetime.fromtimestamp(now, UTC))
        doc, expires, count, *values = await self._script(
            keys=[token_key, *read],
            client=redis,
            args=[*token_args, self.keys.rate_limit_prefix, window, self.window, self.limit, anonymous],
        )
        over = self.limit and count > self.limit
        return Admission(authenticated(doc, expires), (window + 1) * self.window - now if over else None, values)

    async def count_more(self, subject: str, requests: int, now: float | None = None) -> float | None:
        """Count ``requests`` more against ``subject`` (a batch's operations beyond the request admitted); seconds to
        wait when that goes over the limit, else None."""
        now = time.time() if now is None else now
        window = int(now // self.window)
        key = f"{self.keys.rate_limit_prefix}{subject}:{window}"
        async with self.redis().pipeline(transaction=True) as pipe:
            pipe.incrby(key, requests)
            pipe.expire(key, self.window + 1)
            count, _ = await pipe.execute()
        return (window + 1) * self.window - now if count > self.limit else None

    def refusal(self, wait: float) -> tuple[str, int]:
        """The message of a refusal over the limit, and the whole seconds to wait (``Retry-After``)."""
        seconds = max(1, math.ceil(wait))
        return f"more than {self.limit} requests in {self.window} s; retry in {seconds} s", seconds


def bearer(value: object) -> str:
    """The token of an ``Authorization`` value (``Bearer <token>``), or ""."""
    text = value if isinstance(value, str) else ""
    return text[7:].strip() if text.lower().startswith("bearer ") else ""


def client_subject(address: str | None) -> str:
    """Whom a request without a valid token is counted against: its client address."""
    return "addr:" + (address or "unknown")


def rate_subject(viewer: Authenticated | None, request: Request) -> str:
    """Whom a request is counted against, as the admission script keys it: its user, else its client address."""
    if viewer is not None:
        return "user:" + viewer.user.id
    return client_subject(request.client.host if request.client else None)


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
        token = bearer(request.headers.get("authorization", ""))
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
