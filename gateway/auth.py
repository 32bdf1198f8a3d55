"""Who a request is: the one place the gateway reads a credential from a request and checks it.

A credential comes in one of three ways, each with its reader here (an app's own requests are checked by HAProxy, not
here: ``gateway.apps.ingress_config``):

- the ``Authorization: Bearer <token>`` header (:func:`header_token`): GraphQL over HTTP, the files API, a
  terminal's upgrade request, ``launchApp``, GraphQL WebSockets without a token in their ``connection_init``;
- the GraphQL WebSocket's ``connection_init`` payload ``{"authorization": "Bearer <token>"}`` (the key in either
  case), else the upgrade request's header (:func:`init_payload_token`);
- a terminal's first message ``{"type": "auth", "token": "<token>"}``, ``"Bearer "`` before the token optional
  (:func:`first_message_token`): browsers cannot set headers on a WebSocket.

A token is checked by :func:`authenticate` (the GraphQL HTTP view checks it in its rate limit's script instead,
``gateway.graphql.rate_limit``): what stays open (a WebSocket) has its token registered with the revocation watch
*before* the check (``gateway.revocations``: no revocation slips in between) and set to trip at its expiry. A token
that is unknown, revoked or expired, or whose user is deactivated, gives None: each caller answers with its own typed
refusal (401, 4401, 4403, ``UNAUTHENTICATED``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from starlette.websockets import WebSocket

from domain.users import User, hash_token
from gateway.revocations import RevocationWatch, Watched
from stores.users import UserStore


@dataclass(frozen=True)
class Credential:
    """A checked credential: whose it is, until when, and the token it stands for."""

    user: User
    token_hash: str
    """The SHA-256 of the token (what a cookie keeps; what the revocation watch follows)."""
    expires_at: datetime | None
    token: str | None = None
    """The token itself."""
    watched: Watched | None = None
    """The token as the revocation watch follows it, when :func:`authenticate` was given the watch."""


def bearer_token(value: object) -> str | None:
    """The token of an ``Authorization`` value (``Bearer <token>``, the scheme in any case; "" for the scheme alone),
    or None when the value is not a bearer credential."""
    if not isinstance(value, str) or not value.lower().startswith("bearer "):
        return None
    return value[7:].strip()


def bearer(value: object) -> str:
    """The token of an ``Authorization`` value (``Bearer <token>``), or ""."""
    return bearer_token(value) or ""


def header_token(headers: Mapping[str, str]) -> str:
    """The token of a request's (first) ``Authorization`` header, or ""."""
    return bearer(headers.get("authorization", ""))


def init_payload_token(params: Mapping[str, object] | None, headers: Mapping[str, str]) -> str:
    """The token of a GraphQL WebSocket: its ``connection_init`` payload's ``authorization`` (or ``Authorization``),
    else, when that holds no bearer token, the upgrade request's header; or ""."""
    params = params or {}
    return bearer(params.get("authorization") or params.get("Authorization")) or header_token(headers)


async def first_message_token(websocket: WebSocket, wait: float) -> str:
    """The token of an accepted WebSocket's first text message ``{"type": "auth", "token": "<token>"}`` (the token
    with or without ``"Bearer "`` before it), received within ``wait`` seconds; "" for anything else (another message,
    not JSON, binary, late)."""
    try:
        async with asyncio.timeout(wait):
            text = await websocket.receive_text()
        first = json.loads(text)
    except (TimeoutError, ValueError, KeyError, RuntimeError):
        return ""
    if isinstance(first, dict) and first.get("type") == "auth" and isinstance(first.get("token"), str):
        token: str = first["token"]
        return token.removeprefix("Bearer ").strip()
    return ""


async def authenticate(users: UserStore, token: str, revocations: RevocationWatch | None = None) -> Credential | None:
    """Whose ``token`` is (None: none, unknown, revoked, expired, deactivated user). With ``revocations``, the token is
    registered with the watch before the check and set to trip at its expiry (``Credential.watched``: the caller
    forgets it when its connection ends); a failed check (or an outage, which propagates) leaves nothing registered."""
    if not token:
        return None
    watched = None
    if revocations is not None:
        await revocations.open()
        watched = revocations.watch(token)
    found = None
    try:
        found = await users.authenticate(token)
    finally:
        if revocations is not None and watched is not None:
            if found is None:
                revocations.forget(watched)
            else:
                revocations.expire_at(watched, found.expires_at)
    if found is None:
        return None
    return Credential(found.user, hash_token(token), found.expires_at, token, watched)
