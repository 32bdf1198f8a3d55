"""The typed per-request context every resolver receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import strawberry
from starlette.requests import Request
from starlette.websockets import WebSocket

from common.errors import CaravanError, Unauthenticated
from common.settings import Settings
from common.store import SessionStore
from common.users import User, UserStore
from nomad_jobs.client import NomadClient


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

    @property
    def viewer(self) -> User:
        if self.auth_failure is not None:
            raise self.auth_failure
        if self.user is None:
            raise Unauthenticated("send an API token as 'Authorization: Bearer <token>'")
        return self.user


Info = strawberry.Info[Context, Any]
