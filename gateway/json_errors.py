"""The JSON error answer of the gateway's raw ASGI parts (the app origins' launch exchange, the endpoint activator, the
outage answer): ``{"error": {"code", "message"}}`` with its status, as the routes answer through Starlette."""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.types import Send


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


async def send_error(
    send: Send, status: int, code: str, message: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``status`` with the error ``code`` and ``message`` (and ``headers``, a ``Retry-After`` say)."""
    body = error_body(code, message)
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
