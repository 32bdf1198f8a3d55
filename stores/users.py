"""Users, their projects and their API tokens, in Redis.

A user has one role and belongs to one or more projects. An API token is a record (id, label, when it was
created, last used and expires) kept under the SHA-256 of its secret: the secret is shown once, when issued,
and never stored. Checking a token is one Redis round trip (a script reads the record, checks its expiry,
reads the user and notes the use), since the gateway checks one on every request.

Every write is one optimistic transaction (WATCH … MULTI/EXEC), so a user document, the user and project
indexes and the token records never disagree; in particular a token cannot be issued to a user being
deactivated.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.typing import EncodableT

from core.clock import from_unix, utcnow
from core.codec import decode, encode
from core.errors import Conflict, NotFound, QuotaExceeded
from core.keys import Keys
from core.replies import begin, optional_text, optional_texts, text_hash, text_set
from core.secrets import write_private
from core.settings import GatewaySettings
from core.transactions import transact
from domain.app_routes import TokenEntry
from domain.users import BOOTSTRAP_ADMIN_ID, BOOTSTRAP_TOKEN_ID, ApiToken, Role, User, hash_token, new_secret
from stores.changes import users_changed

REVOCATIONS_KEPT = 10_000
"""Entries the token revocation stream keeps (about: trimmed approximately); its readers follow it live."""
LAST_USED_RESOLUTION = 60.0
"""Seconds: a token's last use is written at most this often (not on every request)."""


# The token check, as a Lua function other scripts include (the gateway's admission runs it with the rate limit's
# count: gateway.graphql.rate_limit). token_key: the token record (Keys.no_token for none); user_prefix: the user key
# prefix; now: unix seconds, as text; resolution: the last-use resolution in seconds. Returns the user's JSON
# document, the user id and the expiry (unix seconds, as text; false if none), or false three times for no token,
# an unknown or expired token, or a user that is gone. The user key is built here from the prefix (it is only known
# once the record is read): Caravan runs on a single Redis, not a cluster, so a key not passed in KEYS is fine.
AUTHENTICATE_FUNCTION = """
local function authenticate(token_key, user_prefix, now, resolution)
  local record = redis.call('HMGET', token_key, 'user', 'expires', 'last_used')
  if not record[1] then return false, false, false end
  local moment = tonumber(now)
  if record[2] and tonumber(record[2]) <= moment then return false, false, false end
  local doc = redis.call('GET', user_prefix .. record[1])
  if not doc then return false, false, false end
  if not record[3] or moment - tonumber(record[3]) >= tonumber(resolution) then
    redis.call('HSET', token_key, 'last_used', now)
  end
  return doc, record[1], record[2] or false
end
"""
# KEYS[1]: the token record. ARGV: the user key prefix, now (unix seconds), the last-use resolution.
# Returns {the user's JSON document, the expiry or false}, or false.
AUTHENTICATE = (
    AUTHENTICATE_FUNCTION
    + """
local doc, _, expires = authenticate(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if not doc then return false end
return {doc, expires}
"""
)


@dataclass(frozen=True)
class Authenticated:
    """Who a valid token belongs to, and until when it is valid."""

    user: User
    expires_at: datetime | None


def authenticated(doc: str | bytes | None, expires: str | bytes | None) -> Authenticated | None:
    """What the token check's document and expiry say: None without a document, or for a deactivated user."""
    if not doc:
        return None
    user = decode(doc, User)
    if not user.active:
        return None
    return Authenticated(
        user, from_unix(expires.decode() if isinstance(expires, bytes) else expires) if expires else None
    )


def token_check_args(keys: Keys, token: str, now: datetime | None = None) -> tuple[str, list[str]]:
    """The token check function's first argument (the record's key; without a token, one that never exists) and its
    other three."""
    moment = (now or utcnow()).timestamp()
    return (
        keys.api_token(hash_token(token)) if token else keys.no_token,
        [keys.user_prefix, repr(moment), repr(LAST_USED_RESOLUTION)],
    )


class UserStore:
    def __init__(self, redis: Redis, keys: Keys, *, max_tokens: int = GatewaySettings.max_tokens_per_user) -> None:
        self.redis = redis
        self.keys = keys
        self.max_tokens = max_tokens
        """Live tokens per user; a token replacing one of the same id (the bootstrap token) does not count."""
        self._authenticate = redis.register_script(AUTHENTICATE)

    # -- users ----------------------------------------------------------------------------------

    async def get(self, user_id: str) -> User | None:
        raw = await self.redis.get(self.keys.user(user_id))
        return decode(raw, User) if raw else None

    async def get_many(self, user_ids: Iterable[str]) -> list[User]:
        """The users that exist among ``user_ids``, sorted by id."""
        ids = sorted(set(user_ids))
        raws = await self.redis.mget([self.keys.user(i) for i in ids]) if ids else []
        return [decode(r, User) for r in raws if r]

    async def ids(self, projects: Iterable[str] | None = None) -> set[str]:
        """Every user id, or the ids of the members of any of ``projects``."""
        if projects is None:
            return text_set(await self.redis.smembers(self.keys.all_users))
        keys = [self.keys.project_members(p) for p in projects]
        return text_set(await self.redis.sunion(keys)) if keys else set()

    async def put(self, user: User) -> None:
        """Store ``user`` as given, new or not."""
        await self._write(user.id, lambda _: user)

    async def create(self, user: User) -> User:
        """Store a new user; CONFLICT if the id is taken."""

        def new(before: User | None) -> User:
            if before is not None:
                raise Conflict(
                    f"a user named {user.id!r} already exists"
                    + ("" if before.active else " (deactivated: reactivateUser makes them active again)"),
                    field="name",
                )
            return user

        created = await self._write(user.id, new)
        assert created is not None
        return created

    async def update(self, user_id: str, mutate: Callable[[User], User]) -> User | None:
        """Apply ``mutate`` (pure; it may run more than once, and may raise to refuse) to a stored user."""
        return await self._write(user_id, lambda before: mutate(before) if before is not None else None)

    async def _write(self, user_id: str, decide: Callable[[User | None], User | None]) -> User | None:
        key = self.keys.user(user_id)

        async def attempt(pipe: Pipeline) -> User | None:
            await pipe.watch(key)
            raw = await pipe.get(key)
            before = decode(raw, User) if raw else None
            after = decide(before)
            if after is None:
                return None
            begin(pipe)
            self._write_user(pipe, before, after)
            await pipe.execute()
            return after

        return await transact(self.redis, attempt)

    def _write_user(self, pipe: Redis, before: User | None, after: User) -> None:
        pipe.set(self.keys.user(after.id), encode(after))
        users_changed(pipe, self.keys)
        pipe.sadd(self.keys.all_users, after.id)
        for project in set(before.projects if before else ()) - set(after.projects):
            pipe.srem(self.keys.project_members(project), after.id)
        for project in after.projects:
            pipe.sadd(self.keys.project_members(project), after.id)

    async def deactivate(self, user_id: str, check: Callable[[User], None] | None = None) -> User | None:
        """Mark the user inactive and revoke all their tokens, at once; ``None`` if there is no such user.

        ``check`` (pure; it may raise to refuse) is run on the stored user inside the transaction."""
        key, tokens_key = self.keys.user(user_id), self.keys.user_tokens(user_id)

        async def attempt(pipe: Pipeline) -> User | None:
            await pipe.watch(key, tokens_key)
            raw = await pipe.get(key)
            if raw is None:
                return None
            before = decode(raw, User)
            if check is not None:
                check(before)
            token_ids = sorted(text_set(await pipe.smembers(tokens_key)))
            hashes = optional_texts(await pipe.hmget(self.keys.api_token_ids, token_ids)) if token_ids else []
            after = replace(before, active=False)
            begin(pipe)
            self._write_user(pipe, before, after)
            for token_hash in hashes:
                if token_hash:
                    pipe.delete(self.keys.api_token(token_hash))
                    self._announce_revocation(pipe, token_hash)
            if token_ids:
                pipe.hdel(self.keys.api_token_ids, *token_ids)
            pipe.delete(tokens_key)
            await pipe.execute()
            return after

        return await transact(self.redis, attempt)

    async def ensure_bootstrap_admin(self, token: str) -> User:
        """The configured superadmin, active, with ``token`` as its bootstrap token (replacing an earlier one).

        Its projects are kept across restarts; its role and activity are not: it is the way back in."""

        def restored(before: User | None) -> User:
            projects = before.projects if before else ("default",)
            return User(id=BOOTSTRAP_ADMIN_ID, name="admin", role=Role.SUPERADMIN, projects=projects)

        admin = await self._write(BOOTSTRAP_ADMIN_ID, restored)
        assert admin is not None
        await self._store_token(admin.id, token, label="bootstrap", token_id=BOOTSTRAP_TOKEN_ID, now=utcnow())
        return admin

    # -- tokens ---------------------------------------------------------------------------------

    async def by_token(self, token: str, now: datetime | None = None) -> User | None:
        """The active user a token belongs to, or ``None`` (unknown, revoked or expired token; deactivated user)."""
        found = await self.authenticate(token, now)
        return found.user if found else None

    async def authenticate(self, token: str, now: datetime | None = None) -> Authenticated | None:
        """``by_token``, with the token's expiry; one round trip."""
        if not token:
            return None
        token_key, args = token_check_args(self.keys, token, now)
        reply = await self._authenticate(keys=[token_key], args=args)
        return authenticated(*reply) if reply else None

    async def authenticate_hash(self, token_hash: str, now: datetime | None = None) -> Authenticated | None:
        """``authenticate`` by the token's SHA-256 (what an app cookie keeps instead of the token)."""
        _, args = token_check_args(self.keys, "", now)
        reply = await self._authenticate(keys=[self.keys.api_token(token_hash)], args=args)
        return authenticated(*reply) if reply else None

    async def new_token(
        self, user_id: str, label: str, *, expires_at: datetime | None = None, now: datetime | None = None
    ) -> tuple[str, ApiToken]:
        """A new token for an active user: its secret (shown once) and its record."""
        secret = new_secret()
        record = await self._store_token(
            user_id, secret, label=label, token_id=uuid.uuid4().hex[:16], expires_at=expires_at, now=now or utcnow()
        )
        return secret, record

    async def issue_token(self, user_id: str, label: str = "api") -> str:
        """A new token's secret."""
        secret, _ = await self.new_token(user_id, label)
        return secret

    async def _store_token(
        self, user_id: str, secret: str, *, label: str, token_id: str, now: datetime, expires_at: datetime | None = None
    ) -> ApiToken:
        await self.tokens_of(user_id)  # drops the ids of expired records, which must not count below
        user_key, tokens_key = self.keys.user(user_id), self.keys.user_tokens(user_id)
        token_hash = hash_token(secret)
        record = ApiToken(id=token_id, user_id=user_id, label=label, created_at=now, expires_at=expires_at)
        fields: dict[EncodableT, EncodableT] = {
            "id": token_id,
            "user": user_id,
            "label": label,
            "created": repr(now.timestamp()),
            **({"expires": repr(expires_at.timestamp())} if expires_at else {}),
        }

        async def attempt(pipe: Pipeline) -> ApiToken:
            await pipe.watch(user_key, tokens_key)
            raw = await pipe.get(user_key)
            if raw is None:
                raise NotFound(f"no user {user_id}", field="userId")
            if not decode(raw, User).active:
                raise Conflict(f"user {user_id} is deactivated: no new tokens", field="userId")
            adding = not await pipe.sismember(tokens_key, token_id)  # else it replaces its namesake
            if adding and await pipe.scard(tokens_key) >= self.max_tokens:
                raise QuotaExceeded(
                    f"user {user_id} already has {self.max_tokens} tokens, the most a user may have: revoke some first",
                    field="userId",
                )
            replaced = optional_text(await pipe.hget(self.keys.api_token_ids, token_id))
            begin(pipe)
            if replaced and replaced != token_hash:
                pipe.delete(self.keys.api_token(replaced))
                self._announce_revocation(pipe, replaced)
            pipe.delete(self.keys.api_token(token_hash))
            pipe.hset(self.keys.api_token(token_hash), mapping=fields)
            if expires_at:  # Redis drops the record itself once it is of no use
                pipe.pexpireat(self.keys.api_token(token_hash), int(expires_at.timestamp() * 1000))
            pipe.hset(self.keys.api_token_ids, token_id, token_hash)
            pipe.sadd(tokens_key, token_id)
            users_changed(pipe, self.keys)
            await pipe.execute()
            return record

        return await transact(self.redis, attempt)

    async def token(self, token_id: str) -> ApiToken | None:
        token_hash = optional_text(await self.redis.hget(self.keys.api_token_ids, token_id))
        if not token_hash:
            return None
        record = text_hash(await self.redis.hgetall(self.keys.api_token(token_hash)))
        return ApiToken.from_record(record) if record else None

    async def tokens_of(self, user_id: str) -> list[ApiToken]:
        """A user's live tokens, oldest first; ids of records Redis has expired are dropped on the way."""
        token_ids = sorted(text_set(await self.redis.smembers(self.keys.user_tokens(user_id))))
        if not token_ids:
            return []
        hashes = optional_texts(await self.redis.hmget(self.keys.api_token_ids, token_ids))
        async with self.redis.pipeline(transaction=False) as pipe:
            for token_hash in hashes:
                pipe.hgetall(self.keys.api_token(token_hash or "-"))
            records = [text_hash(reply) for reply in await pipe.execute()]
        gone = [i for i, r in zip(token_ids, records, strict=True) if not r]
        if gone:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.srem(self.keys.user_tokens(user_id), *gone)
                pipe.hdel(self.keys.api_token_ids, *gone)
                await pipe.execute()
        tokens = [ApiToken.from_record(r) for r in records if r]
        return sorted(tokens, key=lambda t: (t.created_at, t.id))

    async def revoke_token(self, token_id: str) -> ApiToken | None:
        """Delete a token: it is refused from the next request on. ``None`` if there is no such token."""
        token_hash = optional_text(await self.redis.hget(self.keys.api_token_ids, token_id))
        if not token_hash:
            return None
        record = text_hash(await self.redis.hgetall(self.keys.api_token(token_hash)))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.api_token(token_hash))
            pipe.hdel(self.keys.api_token_ids, token_id)
            if record:
                pipe.srem(self.keys.user_tokens(record["user"]), token_id)
            self._announce_revocation(pipe, token_hash)
            await pipe.execute()
        return ApiToken.from_record(record) if record else None

    def _announce_revocation(self, pipe: Redis, token_hash: str) -> None:
        """In the revocation's MULTI: tell every gateway (``gateway.revocations``) to close the token's connections."""
        pipe.xadd(self.keys.token_revocations, {"token": token_hash}, maxlen=REVOCATIONS_KEPT, approximate=True)
        users_changed(pipe, self.keys)

    async def live_tokens(self) -> list[TokenEntry]:
        """Every stored token (hash, user, expiry), for the app data plane (``domain.app_routes``)."""
        hashes = sorted(set(text_hash(await self.redis.hgetall(self.keys.api_token_ids)).values()))
        async with self.redis.pipeline(transaction=False) as pipe:
            for token_hash in hashes:
                pipe.hmget(self.keys.api_token(token_hash), ["user", "expires"])
            replies = await pipe.execute()
        found = []
        for token_hash, (user, expires) in zip(hashes, replies, strict=True):
            if user:
                user_id = user.decode() if isinstance(user, bytes) else user
                expiry = from_unix(float(expires)) if expires else None
                found.append(TokenEntry(token_hash, user_id, expiry))
        return found

    async def all(self) -> list[User]:
        """Every user."""
        return await self.get_many(await self.ids())


def bootstrap_admin_token(configured: str | None, home: Path) -> str:
    """The configured token, else one generated on first start and kept in the state directory."""
    if configured:
        return configured
    path = home / "admin-token"
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    token = new_secret()
    write_private(path, token)
    return token
