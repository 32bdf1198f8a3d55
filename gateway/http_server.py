"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools one, whose own refusals answer as the gateway does.

uvicorn refuses a request it cannot parse with ``400 text/plain`` before the app sees it; with httptools that
includes every URL over 65535 bytes (its URL parser's offsets are 16-bit), such as a long GraphQL query sent with
GET. Here those refusals carry a JSON body of GraphQL errors with ``extensions.code``, like every other answer:
``414 URI_TOO_LONG`` for such a URL, ``400 BAD_REQUEST`` for anything else that is not HTTP/1.1. URLs up to the
parser's limit reach the app, which has a limit of its own (``CARAVAN_GRAPHQL_MAX_URL_BYTES``,
``gateway.graphql.limits``).

Every server of the gateway passes ``http=GatewayHttpProtocol`` (``caravan.services.server_options``, which the tests'
harness uses too).
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

PARSER_MAX_URL_BYTES = 65535
"""The longest URL httptools parses (``http_parser_parse_url`` keeps 16-bit offsets)."""
LINGER_SECONDS = 2.0
"""How long a refused connection keeps reading (and dropping) the rest of the request before it closes."""


def refusal_body(message: str, code: str, **details: object) -> bytes:
    """A JSON body of one GraphQL error, as every refusal of the gateway has."""
    return json.dumps({"errors": [{"message": message, "extensions": {"code": code, **details}}]}).encode()


class UrlTooLong(Exception):
    """Raised from the parser's URL callback: parsing stops, and uvicorn answers with ``send_400_response``."""


class GatewayHttpProtocol(HttpToolsProtocol):
    lingering = False
    """Refused: the rest of what the client sends is read and dropped until it closes (or :data:`LINGER_SECONDS`)."""

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > PARSER_MAX_URL_BYTES:  # stop now: the rest of a huge URL is not even buffered
            raise UrlTooLong

    def send_400_response(self, msg: str) -> None:
        if len(getattr(self, "url", b"")) > PARSER_MAX_URL_BYTES:
            status, body = (
                414,
                refusal_body(
                    f"the URL is longer than {PARSER_MAX_URL_BYTES} bytes: send the query in a POST body",
                    "URI_TOO_LONG",
                    limit=PARSER_MAX_URL_BYTES,
                ),
            )
        else:
            status, body = 400, refusal_body(f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})", "BAD_REQUEST")
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        # Closing now, with the client's request still arriving, would make the kernel answer it with a reset that
        # can destroy the refusal before the client reads it: end our side, drop what comes, close a little later.
        self.lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)
