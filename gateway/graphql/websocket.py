"""GraphQL over WebSocket (``graphql-transport-ws`` only): who the connection is, and its rate limit.

- Authentication: the ``connection_init`` payload ``{"authorization": "Bearer <token>"}``, else the
  upgrade request's ``Authorization`` header. No valid token: the connection closes with 4403
  Forbidden, as the protocol says, before any operation runs.
- The legacy ``graphql-ws`` subprotocol is not offered: asking only for it closes with 4406.
- Every ``subscribe`` message (a subscription, or a query or mutation sent over the socket) counts
  against the same per-token rate limit as an HTTP request; over it, that operation gets an
  ``error`` message with ``extensions.code`` RATE_LIMITED and the connection stays open.
- Document limits (depth, tokens, aliases) are schema extensions: they apply here as over HTTP.
- A subscription sent over HTTP is refused (INVALID_INPUT, 400 with graphql-response+json).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

from graphql import ExecutionResult, GraphQLError
from redis.exceptions import RedisError
from starlette.websockets import WebSocket
from strawberry.exceptions import ConnectionRejectionError
from strawberry.extensions import SchemaExtension
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_transport_ws.types import SubscribeMessage
from strawberry.types.graphql import OperationType

from common import events
from common.errors import InvalidInput
from common.users import hash_token
from gateway.graphql.context import Context
from gateway.graphql.protection import Guard, bearer

log = logging.getLogger(__name__)

PROTOCOLS = (GRAPHQL_TRANSPORT_WS_PROTOCOL,)
"""The subprotocols the gateway speaks (Strawberry's ``subscription_protocols``)."""


async def accept_connection(context: Context) -> None:
    """Strawberry's ``on_ws_connect``: resolve the viewer, or refuse the connection (4403)."""
    params = context.connection_params or {}
    token = bearer(params.get("authorization") or params.get("Authorization")) or bearer(
        context.request.headers.get("authorization", "")
    )
    # an outage is not a refusal (4403 would tell the client its token is bad): it propagates, and the
    # server closes the connection as failed (1011), which clients retry
    context.user = await context.users.by_token(token) if token else None
    if context.user is None:
        raise ConnectionRejectionError({"code": "UNAUTHENTICATED"})
    context.auth_failure = None
    context.token = token
    context.rate_subject = "token:" + hash_token(token)[:32]
    sessions = context.sessions
    context.events_from = await events.last_id(sessions.redis, sessions.keys.owner_events(context.user.id))


class SubscriptionsOverWebSocket(SchemaExtension):
    """Refuses a subscription sent over HTTP (Strawberry would run it as a plain field and fail)."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        if context.operation_type is OperationType.SUBSCRIPTION and not isinstance(
            getattr(context.context, "request", None), WebSocket
        ):
            refusal = InvalidInput("subscriptions are served over WebSocket (graphql-transport-ws) at this URL")
            # a result set here is returned instead of executing (and gets its code from ErrorCodes)
            context.result = ExecutionResult(data=None, errors=[GraphQLError(refusal.message, original_error=refusal)])
        yield


class RateLimitedTransportWS(BaseGraphQLTransportWSHandler[Context, None]):
    """Strawberry's graphql-transport-ws handler, with each ``subscribe`` counted by the rate limiter."""

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        if self.connection_acknowledged and not await self._still_authenticated():
            await self.websocket.close(code=4403, reason="Forbidden")  # its running subscriptions end with it
            return
        if self.connection_acknowledged and (refusal := await self._over_rate_limit()):
            error = {"id": message["id"], "type": "error", "payload": [refusal]}
            await self.send_message(error)  # type: ignore[arg-type]
            return
        await super().handle_subscribe(message)

    async def _still_authenticated(self) -> bool:
        """Is the connection's token still valid? A revoked or expired token, or a deactivated user, is refused
        from the next operation on, as over HTTP; a changed role or projects apply from there too."""
        token = self.context.token
        if token is None:
            return True
        try:
            user = await self.context.users.by_token(token)
        except (RedisError, OSError) as exc:  # an outage is not a refusal: the operation reports UNAVAILABLE
            log.debug("token not checked again: %s", exc)
            return True
        if user is None:
            return False
        self.context.user = user
        return True

    async def _over_rate_limit(self) -> dict[str, Any] | None:
        guard: Guard = self.view.guard  # type: ignore[attr-defined]
        limiter, subject = guard.rate_limiter, self.context.rate_subject
        if limiter is None or subject is None:
            return None
        try:
            wait = await limiter.hit(subject)
        except (RedisError, OSError) as exc:  # fail open, as over HTTP
            log.debug("rate limit not checked: %s", exc)
            return None
        if wait is None:
            return None
        seconds = max(1, math.ceil(wait))
        return {
            "message": f"more than {limiter.limit} requests in {limiter.window} s; retry in {seconds} s",
            "extensions": {"code": "RATE_LIMITED", "retryAfter": seconds},
        }
