"""What a reverse proxy forwards of the headers, each way. Pure.

- **Hop-by-hop** headers (RFC 9110 §7.6.1: ``Connection`` and those it names, ``Keep-Alive``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``) belong to one connection: dropped both ways.
- **The gateway's credentials** never reach the app: the ``Authorization`` header and the gateway's app cookie are
  dropped from the request (the app's own cookies pass), and a ``Set-Cookie`` of the gateway's cookie name from the app
  is dropped from the response.
- ``X-Forwarded-For`` (appended to), ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` tell the app who asked and how;
  ``Host`` is passed unchanged (apps build their links from it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from http.cookies import CookieError, SimpleCookie

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
COOKIE_NAME = "caravan_app"
"""The gateway's app cookie (``stores.app_access``)."""
MAX_COOKIE_CANDIDATES = 200
"""Values of the gateway's cookie tried per request, in one Redis round trip: another app's origin may toss in
cookies of that name (``Domain=`` the apps' parent domain), and the user's own must still be found among them. Over
what a browser sends to one site (Chromium and Firefox keep at most 180 cookies per site), so a browser's request
never has its real cookie cut off; it bounds what a crafted request costs."""

Headers = Sequence[tuple[str, str]]


def _connection_named(headers: Headers) -> set[str]:
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    return named


def _end_to_end(headers: Headers) -> list[tuple[str, str]]:
    drop = HOP_BY_HOP | _connection_named(headers)
    return [(name, value) for name, value in headers if name.lower() not in drop]


def upstream_request_headers(
    headers: Headers, *, client: str | None, scheme: str, websocket: bool = False
) -> list[tuple[str, str]]:
    """The request's headers as the app gets them. ``websocket``: the handshake's own headers (``Sec-WebSocket-*``)
    are also dropped; the upstream client makes its own."""
    forwarded_for: list[str] = []
    host = ""
    out: list[tuple[str, str]] = []
    for name, value in _end_to_end(headers):
        lower = name.lower()
        if lower == "authorization" or lower.startswith("x-forwarded-") or lower == "forwarded":
            if lower == "x-forwarded-for":
                forwarded_for.append(value)
            continue
        if websocket and (lower.startswith("sec-websocket-") or lower == "host"):
            if lower == "host":
                host = value
            continue
        if lower == "cookie":
            kept = without_gateway_cookie(value)
            if kept:
                out.append((name, kept))
            continue
        if lower == "host":
            host = value
        out.append((name, value))
    if client:
        forwarded_for.append(client)
    if forwarded_for:
        out.append(("x-forwarded-for", ", ".join(forwarded_for)))
    out.append(("x-forwarded-proto", scheme))
    if host:
        out.append(("x-forwarded-host", host))
    return out


def downstream_response_headers(headers: Headers) -> list[tuple[str, str]]:
    """The app's response headers as the client gets them."""
    return [
        (name, value)
        for name, value in _end_to_end(headers)
        if not (name.lower() == "set-cookie" and value.split("=", 1)[0].strip() == COOKIE_NAME)
    ]


def without_gateway_cookie(cookie_header: str) -> str:
    """A ``Cookie`` header without the gateway's cookie (the others kept as sent)."""
    parts = [p for p in cookie_header.split(";") if p.split("=", 1)[0].strip() != COOKIE_NAME]
    return ";".join(parts).strip().strip(";").strip()


def gateway_cookie_values(cookie_headers: Iterable[str]) -> list[str]:
    """The values of the gateway's cookie in a request's ``Cookie`` headers (several, if another origin tossed in
    some), each once, in order, at most :data:`MAX_COOKIE_CANDIDATES`."""
    values: dict[str, None] = {}
    for header in cookie_headers:
        for part in header.split(";"):
            name, sep, value = part.partition("=")
            if sep and name.strip() == COOKIE_NAME and value.strip():
                values[value.strip()] = None
                if len(values) == MAX_COOKIE_CANDIDATES:
                    return list(values)
    return list(values)


def app_cookie(value: str, ttl: int, *, secure: bool) -> str:
    """The ``Set-Cookie`` value of an app cookie: host-only (no Domain), whole origin, HttpOnly, SameSite=Lax."""
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie[COOKIE_NAME] = value
    except CookieError as exc:  # our own values are URL-safe base64: cannot happen
        raise ValueError(f"not a cookie value: {value!r}") from exc
    morsel = cookie[COOKIE_NAME]
    morsel["path"] = "/"
    morsel["max-age"] = str(ttl)
    morsel["httponly"] = True
    morsel["samesite"] = "Lax"
    if secure:
        morsel["secure"] = True
    return morsel.OutputString()


def signed_cookie_value(key: str, *, host: str, token_hash: str, user_id: str, expires: int) -> str:
    """An app cookie HAProxy checks itself (``gateway.apps.ingress_config``): a JWT, HS256 with ``key``, whose claims
    bind it to the app's host (``h``), the API token it was launched with (``t``, its SHA-256: a revoked token's
    cookies die with it), that token's user (``sub``) and its expiry (``exp``, unix seconds)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"h": host, "t": token_hash, "sub": user_id, "exp": expires}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
