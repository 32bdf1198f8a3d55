"""Users and their API tokens. Tokens are stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from redis.asyncio import Redis

from common.keys import Keys

BOOTSTRAP_ADMIN_ID = "admin"


class Role(StrEnum):
    SUPERADMIN = "SUPERADMIN"
    ADMIN = "ADMIN"
    USER = "USER"


@dataclass(frozen=True)
class User:
    id: str
    name: str
    role: Role
    projects: tuple[str, ...] = field(default=("default",))

    @property
    def is_admin(self) -> bool:
        return self.role in (Role.ADMIN, Role.SUPERADMIN)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class UserStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def put(self, user: User) -> None:
        await self.redis.set(self.keys.user(user.id), json.dumps(asdict(user)))

    async def get(self, user_id: str) -> User | None:
        raw = await self.redis.get(self.keys.user(user_id))
        if not raw:
            return None
        doc = json.loads(raw)
        return User(id=doc["id"], name=doc["name"], role=Role(doc["role"]), projects=tuple(doc["projects"]))

    async def by_token(self, token: str) -> User | None:
        user_id = await self.redis.get(self.keys.api_token(hash_token(token)))
        return await self.get(user_id) if user_id else None

    async def add_token(self, user_id: str, token: str) -> None:
        await self.redis.set(self.keys.api_token(hash_token(token)), user_id)

    async def issue_token(self, user_id: str) -> str:
        token = "cv_" + secrets.token_urlsafe(32)
        await self.add_token(user_id, token)
        return token

    async def ensure_bootstrap_admin(self, token: str) -> User:
        admin = User(id=BOOTSTRAP_ADMIN_ID, name="admin", role=Role.SUPERADMIN)
        await self.put(admin)
        await self.add_token(admin.id, token)
        return admin


def bootstrap_admin_token(configured: str | None, home: Path) -> str:
    """The configured token, else one generated on first start and kept in the state directory."""
    if configured:
        return configured
    path = home / "admin-token"
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    token = "cv_" + secrets.token_urlsafe(32)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token
