"""The gateway's outermost ASGI middleware: an outage (Redis away, a failover under way) that reaches no answer of its
own is answered ``503 UNAVAILABLE`` with ``Retry-After`` (a WebSocket not accepted yet: closed 1013, try again later),
never Starlette's ``500`` with a traceback in the log.

The GraphQL view types its own outage errors; what reaches this is what runs before the routes: the app origins'
launch exchange (``gateway.apps.proxy``) and the endpoint activator (``gateway.endpoints.activator``), which read Redis
for every request on their hosts. An outage after the answer began is not answerable: it is raised as before (the
server closes the connection). Each answer is counted in the process's log of outages (``gateway.outage_log``).

The gateway's own stop is an outage of this process: a request still unanswered when uvicorn's shutdown grace is over
(``caravan.services.SHUTDOWN_GRACE``; the activator holds a cold endpoint's requests for up to a minute) is cancelled,
and uvicorn would answer it a plain-text ``500 Internal Server Error``. It is answered ``503 UNAVAILABLE`` here instead,
the answer a client retries on (through the ingress, another gateway serves the retry).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.graphql.errors import OUTAGES, REPORTER
from gateway.json_errors import send_error

log = logging.getLogger(__name__)

RETRY_AFTER = 1
"""Seconds a client is asked to wait: a Sentinel failover takes a few, and most outages here are one."""


class OutageAnswers:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] in ("http.response.start", "websocket.accept", "websocket.close")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except OUTAGES as exc:
            if answered:
                raise
            REPORTER.answered(exc)
            await unavailable(scope, send, "the service is unavailable; retry shortly")
        except asyncio.CancelledError:
            # only uvicorn cancels a request's own task: its stop's grace is over (an inner cancellation, a timeout
            # say, ends where it was made). The task ends here, answered, rather than in uvicorn's 500.
            if answered:
                raise
            log.info("a %s request was still unanswered when the gateway stopped: 503 UNAVAILABLE", scope["type"])
            await unavailable(scope, send, "the gateway is stopping; retry shortly")


async def unavailable(scope: Scope, send: Send, message: str) -> None:
    """``503 UNAVAILABLE`` with ``Retry-After`` (a WebSocket not accepted yet: closed 1013, try again later)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1013, "reason": "UNAVAILABLE"})
        return
    await send_error(send, 503, "UNAVAILABLE", message, [(b"retry-after", str(RETRY_AFTER).encode())])
