"""Every limit of the GraphQL endpoint, in one place: :class:`Limits`, read from ``CARAVAN_GRAPHQL_*``.

Who enforces each: the document limits (depth, tokens, aliases, cost) are schema extensions
(:mod:`gateway.graphql.document_limits`, :mod:`gateway.graphql.cost`); the body, URL and rate limits are checked by
the HTTP view before GraphQL sees a request (:mod:`gateway.graphql.guard`, :mod:`gateway.graphql.rate_limit`); the
caps on concurrent Nomad calls and log follows are :mod:`gateway.nomad_shares`' and :mod:`gateway.log_follows`'.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from gateway.http_server import PARSER_MAX_URL_BYTES
from nomad_jobs.client import CONNECTIONS, LOG_FOLLOWS


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
