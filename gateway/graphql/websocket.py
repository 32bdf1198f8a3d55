"""GraphQL over WebSocket (``graphql-transport-ws`` only): who the connection is, and its rate limit.

- Authentication: the ``connection_init`` payload ``{"authorization": "Bearer <token>"}``, else the
  upgrade request's ``Authorization`` header. No valid token: the connection closes with 4403
  Forbidden, as the protocol says, before any operation runs. Once open, the connection closes with
  4403 within about a second of its token being revoked (or its user deactivated), and at its expiry,
  its running subscriptions ended first (``gateway.revocations``).
- The legacy ``graphql-ws`` subprotocol is not offered: asking only for it closes with 4406.
- Every ``subscribe`` message (a subscription, or a query or mutation sent over the socket) checks the
  token again and counts against the same per-user rate limit as an HTTP request, in one round trip; a
  token no longer valid closes the connection (4403); over the limit, that operation gets an ``error``
  message with ``extensions.code`` RATE_LIMITED and the connection stays open.
- Document limits (depth, tokens, aliases) are schema extensions: they apply here as over HTTP. A document over
  the token limit (which stops the parser) gets an ``error`` message with TOO_MANY_TOKENS for that operation, and the
  connection stays open (Strawberry closes it with 4400 for a syntax error, which the parser's refusal is).
- A subscription sent over HTTP is refused (INVALID_INPUT, 400 with graphql-response+json).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from graphql import ExecutionResult, GraphQLError, GraphQLFormattedError
from redis.exceptions import RedisError
from starlette.websockets import WebSocket
from strawberry.exceptions import ConnectionRejectionError
from strawberry.extensions import SchemaExtension
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_transport_ws.types import (
    ConnectionInitMessage,
    ErrorMessage,
    SubscribeMessage,
)
from strawberry.types.graphql import OperationType

from core.errors import InvalidInput
from gateway.auth import authenticate, init_payload_token
from gateway.graphql.context import Context
from gateway.graphql.document_limits import TOO_MANY_TOKENS
from gateway.graphql.http import GraphQLOverHTTP
from gateway.graphql.rate_limit import Admission, RateLimiter, client_subject
from gateway.revocations import Watched
from stores import events

log = logging.getLogger(__name__)

PROTOCOLS = (GRAPHQL_TRANSPORT_WS_PROTOCOL,)
"""The subprotocols the gateway speaks (Strawberry's ``subscription_protocols``)."""


async def accept_connection(context: Context) -> None:
    """Strawberry's ``on_ws_connect``: resolve the viewer, or refuse the connection (4403)."""
    token = init_payload_token(context.connection_params, context.request.headers)
    # an outage is not a refusal (4403 would tell the client its token is bad): it propagates, and the
    # server closes the connection as failed (1011), which clients retry
    found = await authenticate(context.users, token, context.revocations)
    if found is None:
        raise ConnectionRejectionError({"code": "UNAUTHENTICATED"})
    context.watched = found.watched
    context.user = found.user
    context.auth_failure = None
    context.token = token
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
    """Strawberry's graphql-transport-ws handler, with each ``subscribe`` admitted as an HTTP request is, and the
    connection closed when its token is revoked or expires."""

    _closer: asyncio.Task[None] | None = None

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        await super().handle_connection_init(message)
        watched = self.context.watched
        if watched is not None and self.connection_acknowledged and self._closer is None:
            self._closer = asyncio.create_task(self._close_when_tripped(watched), name="close-when-revoked")

    async def shutdown(self) -> None:
        if self._closer is not None:
            self._closer.cancel()
        if self.context.watched is not None and self.context.revocations is not None:
            self.context.revocations.forget(self.context.watched)
        await super().shutdown()

    async def _close_when_tripped(self, watched: Watched) -> None:
        await watched.tripped.wait()
        log.info("closing a WebSocket connection: its token was %s", watched.reason)
        for operation_id in list(self.operations):  # its subscriptions end first, then the connection
            await self.cleanup_operation(operation_id)
        await self.websocket.close(code=4403, reason="Forbidden")

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        admission = await self._admission() if self.connection_acknowledged else None
        if admission is not None and admission.viewer is None:
            await self.websocket.close(code=4403, reason="Forbidden")  # its running subscriptions end with it
            return
        if admission is not None and admission.retry_after is not None:
            message_text, seconds = self._limiter.refusal(admission.retry_after)
            refusal: GraphQLFormattedError = {
                "message": message_text,
                "extensions": {"code": "RATE_LIMITED", "retryAfter": seconds},
            }
            await self.send_message(ErrorMessage(id=message["id"], type="error", payload=[refusal]))
            return
        if admission is not None and admission.viewer is not None:
            self.context.user = admission.viewer.user  # a changed role or projects apply from this operation on
        await super().handle_subscribe(message)

    @staticmethod
    def _get_pre_execution_close_reason(error: GraphQLError) -> str | None:
        """Strawberry closes the connection (4400) on a syntax error; a document refused for its size is answered
        like any other limit, with an ``error`` message for its operation."""
        if (error.extensions or {}).get("code") == TOO_MANY_TOKENS:
            return None
        return BaseGraphQLTransportWSHandler._get_pre_execution_close_reason(error)

    @property
    def _limiter(self) -> RateLimiter:
        view = self.view
        assert isinstance(view, GraphQLOverHTTP), "the transport runs under the gateway's view, which has the guard"
        return view.guard.rate_limiter

    async def _admission(self) -> Admission | None:
        """The connection's token checked again and this operation counted against its user (one round trip). A
        revoked or expired token, or a deactivated user, is refused from the next operation on, as over HTTP.
        None when Redis failed: an outage is not a refusal (the operation reports UNAVAILABLE)."""
        try:
            client = self.context.request.client
            return await self._limiter.admit(self.context.token or "", client_subject(client.host if client else None))
        except (RedisError, OSError) as exc:
            log.debug("token not checked again: %s", exc)
            return None
