"""What the gateway still does on an app origin (``<app>--<session id>.<apps domain>``, ``domain.apps``): the launch
exchange. Every other request to an app is HAProxy's (``gateway.apps.ingress_config``), which forwards it to the
kernel's Nomad host port itself, with no Python on the way; the gateway keeps its maps (``gateway.apps.control``).

``/.caravan/launch?code=`` (HAProxy hands this one path to the gateway) exchanges a ``launchApp`` code for the app's
cookie, a JWT HAProxy checks (``headers.signed_cookie_value``), and redirects to the app's root. Any other app-origin
request that reaches the gateway named no app HAProxy knows: 404, as HAProxy answers it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from core.settings import Settings
from domain.apps import parse_app_host
from gateway.apps.headers import app_cookie, signed_cookie_value
from gateway.apps.ingress_config import LAUNCH_PATH
from gateway.json_errors import send_error
from stores.app_access import AppAccessStore
from stores.users import UserStore


@dataclass(frozen=True)
class AppLaunches:
    """What the launch exchange needs, made in the gateway's lifespan."""

    settings: Settings
    access: AppAccessStore
    users: UserStore
    cookie_key: str
    """The app cookie's HS256 key (the secrets directory's ``app-cookie.key``), shared with HAProxy."""


def _header(scope: Scope, name: bytes) -> str:
    return next((str(v.decode("latin-1")) for k, v in scope["headers"] if k == name), "")


class AppOrigins:
    """ASGI middleware: app origins' launch exchange (and 404 for the rest of them); other hosts to ``app``."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            settings: Settings = self.state["settings"]
            host = _header(scope, b"host")
            if parse_app_host(host, settings.gateway.apps_domain) is not None:
                hostname = host.rsplit(":", 1)[0].lower().rstrip(".")
                if scope["type"] == "http" and scope["path"] == LAUNCH_PATH:
                    await _launch(self.state["apps"], scope, send, hostname)
                elif scope["type"] == "http":
                    await send_error(send, 404, "NOT_FOUND", "no such app")
                elif (await receive())["type"] == "websocket.connect":
                    await send({"type": "websocket.close", "code": 1008, "reason": "NOT_FOUND"})
                return
        await self.app(scope, receive, send)


async def _launch(launches: AppLaunches, scope: Scope, send: Send, hostname: str) -> None:
    """``/.caravan/launch?code=``: the code's grant, on its own host, for the app's cookie; then to the app."""
    codes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("code", [])
    grant = await launches.access.take_launch_code(codes[0]) if len(codes) == 1 else None
    if grant is None or grant.host != hostname:
        await send_error(send, 404, "NOT_FOUND", "unknown, used or expired launch code: ask launchApp for a new one")
        return
    found = await launches.users.authenticate_hash(grant.token_hash)
    if found is None:
        await send_error(send, 401, "UNAUTHENTICATED", "the token this launch was made with is no longer valid")
        return
    ttl = launches.settings.gateway.app_cookie_ttl
    value = signed_cookie_value(
        launches.cookie_key,
        host=grant.host,
        token_hash=grant.token_hash,
        user_id=found.user.id,
        expires=int(time.time()) + ttl,
    )
    cookie = app_cookie(value, ttl, secure=scope.get("scheme") == "https")
    headers = [
        (b"location", b"/"),
        (b"set-cookie", cookie.encode("latin-1")),
        (b"cache-control", b"no-store"),
        (b"referrer-policy", b"no-referrer"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
