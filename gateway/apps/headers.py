"""The app cookie: its ``Set-Cookie`` and its signed value. Pure.

What HAProxy forwards of the headers each way (hop-by-hop headers dropped, ``Authorization`` and this cookie never
to the app, ``X-Forwarded-*``) is in its configuration, ``gateway.apps.ingress_config``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from http.cookies import CookieError, SimpleCookie

from gateway.apps.ingress_config import COOKIE_NAME


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
