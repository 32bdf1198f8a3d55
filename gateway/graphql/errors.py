"""Every error leaves the API with ``extensions.code``; unexpected ones never leak internals."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from strawberry.extensions import SchemaExtension

from core.errors import CaravanError, TransientError, Unavailable
from gateway.outage_log import OutageReporter

log = logging.getLogger(__name__)

OUTAGES = (RedisConnectionError, RedisTimeoutError, TransientError, ConnectionError)
REPORTER = OutageReporter()
"""The process's log of UNAVAILABLE errors: a few lines per outage, whatever the number of errors."""


def coded(error: GraphQLError, request_id: str) -> GraphQLError:
    original = error.original_error
    if original is None or isinstance(original, GraphQLError):
        # A syntax, validation or variable-coercion error: the request itself is malformed.
        if (error.extensions or {}).get("code"):
            return error
        return GraphQLError(
            error.message,
            error.nodes,
            error.source,
            error.positions,
            error.path,
            original,
            {**(error.extensions or {}), "code": "INVALID_INPUT"},
        )
    if isinstance(original, (*OUTAGES, Unavailable)) and not (error.extensions or {}).get("code"):  # once per error
        REPORTER.answered(original)
    if isinstance(original, OUTAGES):
        original = Unavailable("a backing service (Redis or Nomad) is unreachable; retry shortly")
    if isinstance(original, CaravanError):
        extensions: dict[str, object] = {"code": original.code}
        if original.field:
            extensions["field"] = original.field
        extensions.update(original.details)  # what the code needs said (a limit, ...)
        return GraphQLError(
            original.message, error.nodes, error.source, error.positions, error.path, original, extensions
        )
    log.error("request=%s unexpected error at %s", request_id, error.path, exc_info=original)
    return GraphQLError(
        f"internal error (request id {request_id})",
        error.nodes,
        error.source,
        error.positions,
        error.path,
        None,
        {"code": "INTERNAL", "requestId": request_id},
    )


class ErrorCodes(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        if result is not None and result.errors:
            request_id = getattr(self.execution_context.context, "request_id", "-")
            result.errors = [coded(e, request_id) for e in result.errors]

    def on_stream_result(self, result: Any) -> Iterator[None]:
        """Each result sent over a WebSocket (a subscription's events come long before ``on_operation`` ends)."""
        if result.errors:
            request_id = getattr(self.execution_context.context, "request_id", "-")
            result.errors = [coded(e, request_id) for e in result.errors]
        yield
