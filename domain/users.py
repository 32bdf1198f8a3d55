"""Users, their roles and projects, and what is known of an API token: the model. Kept in Redis by
``stores.users``."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from core.clock import from_unix

BOOTSTRAP_ADMIN_ID = "admin"
BOOTSTRAP_TOKEN_ID = "bootstrap"
"""The bootstrap admin's configured token keeps this id, so a new configured secret replaces the old one."""


class Role(StrEnum):
    SUPERADMIN = "SUPERADMIN"
    ADMIN = "ADMIN"
    USER = "USER"

    @property
    def rank(self) -> int:
        """Higher ranks may do more: USER 0, ADMIN 1, SUPERADMIN 2."""
        return (Role.USER, Role.ADMIN, Role.SUPERADMIN).index(self)


@dataclass(frozen=True)
class User:
    id: str
    name: str
    role: Role
    projects: tuple[str, ...] = field(default=("default",))
    active: bool = True
    """A deactivated user's tokens are revoked and no new ones are issued; their sessions are left alone."""

    @property
    def is_admin(self) -> bool:
        return self.role in (Role.ADMIN, Role.SUPERADMIN)


@dataclass(frozen=True)
class ApiToken:
    """What is known of a token besides its secret."""

    id: str
    user_id: str
    label: str
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> ApiToken:
        return cls(
            id=record["id"],
            user_id=record["user"],
            label=record["label"],
            created_at=from_unix(record["created"]),
            expires_at=from_unix(record["expires"]) if record.get("expires") else None,
            last_used_at=from_unix(record["last_used"]) if record.get("last_used") else None,
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret() -> str:
    return "cv_" + secrets.token_urlsafe(32)
