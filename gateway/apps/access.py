"""Who may pass to an app: one function, :func:`authorize_app`, for every path into a session's app (HTTP and
WebSocket alike).

- An app the owner made **public** needs no credentials.
- Otherwise the request carries the caller's API token as a bearer (API clients), or the gateway's app cookie
  (browsers, ``stores.app_access``) made for this very host, on a request from the app's own origin
  (``domain.apps.cookie_may_pass``: another app's page is same-site, so its requests would carry the cookie too;
  they are 403 ``CROSS_ORIGIN``). No valid credential: 401, whether or not the session
  exists. A valid one whose user may not see the session (``domain.access.can_access``), an unknown session or app,
  an ended session: 404, never 403 (a session's existence is not revealed).
- The token a credential stands for is checked at every request: a revoked token or a deactivated user is refused
  at once; what stays open (a WebSocket) is watched through ``gateway.revocations`` by the returned token hash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from domain.access import can_access
from domain.apps import App, session_apps
from domain.model import Session
from domain.users import User, hash_token
from gateway.apps.headers import gateway_cookie_values
from gateway.apps.token_cache import TokenCache
from gateway.auth import bearer_token, cookie_credential
from stores.app_access import AppAccessStore
from stores.sessions import SessionStore
from stores.users import UserStore


class Denied(Exception):
    """Not let through: the HTTP status and the JSON error's code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AppPass:
    session: Session
    app: App
    user: User | None
    """None: a public app, passed without credentials."""
    token_hash: str | None
    """The SHA-256 of the token the credential stands for (watch it for revocation); None for a public app."""


NOT_FOUND = Denied(404, "NOT_FOUND", "no such app")
CROSS_ORIGIN = Denied(
    403,
    "CROSS_ORIGIN",
    "the app's cookie is accepted only from the app's own pages (Origin, Sec-Fetch-Site): this request came from "
    "another origin",
)
UNAUTHENTICATED = Denied(
    401, "UNAUTHENTICATED", "send your API token as 'Authorization: Bearer <token>', or open the app's launchApp url"
)


@dataclass(frozen=True)
class AppStores:
    sessions: SessionStore
    users: UserStore
    access: AppAccessStore
    tokens: TokenCache
    """Bearer tokens checked a moment ago (revocations still immediate)."""


@dataclass(frozen=True)
class Moment:
    """When a request is checked: the monotonic second (for the token cache) and the wall clock (for expiries)."""

    monotonic: float
    now: datetime


async def _credential(
    stores: AppStores, host: str, authorization: str, cookie_headers: Iterable[str], at: Moment
) -> tuple[User, str] | None:
    """The user and token hash of the request's bearer token, else of its first app cookie valid on ``host``."""
    token = bearer_token(authorization)
    if token is not None:  # a bearer header, even an empty one, is the credential: cookies are not looked at
        found = await stores.tokens.authenticate(token, at.monotonic, at.now) if token else None
        return (found.user, hash_token(token)) if found else None
    cookie = await cookie_credential(stores.access, stores.users, host, gateway_cookie_values(cookie_headers))
    return (cookie.user, cookie.token_hash) if cookie else None


async def authorize_app(
    stores: AppStores,
    *,
    host: str,
    app_name: str,
    session_id: str,
    authorization: str,
    cookie_headers: Iterable[str],
    cookie_allowed: bool,
    at: Moment,
) -> AppPass:
    """Who passes to app ``app_name`` of ``session_id`` on ``host`` (the app's host name, no port); else
    :class:`Denied`. ``cookie_allowed``: the request comes from the app's own origin (``domain.apps.cookie_may_pass``);
    if not, its app cookies are not looked at (a public app still passes, as to anyone), and a private app answers
    403 ``CROSS_ORIGIN`` when the request carried one."""
    cookie_headers = list(cookie_headers)
    credential = await _credential(stores, host, authorization, cookie_headers if cookie_allowed else (), at)
    session = await stores.sessions.get(session_id)
    app = _app(session, app_name)
    if credential is None:
        if session is not None and app is not None and app.public:
            return AppPass(session, app, None, None)
        if not cookie_allowed and gateway_cookie_values(cookie_headers):
            raise CROSS_ORIGIN
        raise UNAUTHENTICATED
    user, token_hash = credential
    if session is None or app is None or not can_access(user, session.owner_id, session.project):
        raise NOT_FOUND
    return AppPass(session, app, user, token_hash)


def _app(session: Session | None, name: str) -> App | None:
    if session is None or session.status.is_terminal:
        return None
    return next((a for a in session_apps(session.apps, session.preopen_ports) if a.name == name and a.proxied), None)
