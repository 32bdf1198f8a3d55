"""The typed per-request context every resolver receives."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import strawberry
from starlette.requests import Request
from starlette.websockets import WebSocket

from core.errors import CaravanError, Unauthenticated
from core.settings import Settings
from domain.users import User
from gateway.graphql.loaders import Loaders, loaders_for
from gateway.kernel_exec import ConnectionExecs
from gateway.log_follows import ConnectionFollows
from gateway.revocations import RevocationWatch, Watched
from gateway.scheduling_config import scheduling_config
from nomad_jobs.client import NomadClient
from stores.creation_rules import SessionCreation
from stores.event_hub import EventHub
from stores.idle import IdleStore
from stores.sessions import SessionStore
from stores.users import UserStore


@dataclass
class Context:
    request: Request | WebSocket
    settings: Settings
    sessions: SessionStore
    users: UserStore
    nomad: NomadClient
    user: User | None
    request_id: str
    auth_failure: CaravanError | None = None
    """Why the token could not be checked (e.g. Redis unreachable): reported when a field needs the viewer."""
    connection_params: dict[str, object] | None = None
    """WebSocket only: the ``connection_init`` payload (Strawberry sets it; ``{"authorization": "Bearer …"}``)."""
    token: str | None = None
    """WebSocket only: the connection's API token, checked again at each operation (revoked: the connection closes)."""
    hub: EventHub | None = None
    """The process's reader of event streams (subscriptions follow them through it)."""
    revocations: RevocationWatch | None = None
    """The process's reader of token revocations (WebSocket connections close when theirs is revoked)."""
    watched: Watched | None = None
    """WebSocket only: the connection's token as the revocation watch follows it (tripped: close the connection)."""
    log_follows: ConnectionFollows | None = None
    """The kernel logs this connection (or request) follows, within its and the process's caps."""
    execs: ConnectionExecs | None = None
    """The commands this connection (or request) runs in kernels, within its, its user's and the process's caps."""
    events_from: str | None = None
    """WebSocket only: the viewer's event stream position when the connection was acknowledged (``sessionEvents``
    without ``after`` starts there, so a client that subscribes and then creates a session misses nothing)."""

    @cached_property
    def loaders(self) -> Loaders:
        """This request's DataLoaders (made on first use; their caches last one request)."""
        return loaders_for(self.users, IdleStore(self.sessions.redis, self.sessions.keys))

    @cached_property
    def creation(self) -> SessionCreation:
        """The one admission path of new sessions (``stores.creation_rules``), with the scheduling configuration in
        force (``Unavailable`` when it cannot be read)."""
        return SessionCreation(self.sessions, self.settings, scheduling_config(self.settings.scheduler.config_path))

    @property
    def viewer(self) -> User:
        if self.auth_failure is not None:
            raise self.auth_failure
        if self.user is None:
            raise Unauthenticated("send an API token as 'Authorization: Bearer <token>'")
        return self.user


Info = strawberry.Info[Context, Any]
