"""Resource policies of users and projects in Redis (the model is ``domain.resource_policies``).

Reads of many policies are one round trip; ``pending_admission`` refuses a creation past ``max_pending_sessions``
atomically, under a WATCH of the owner's index."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from redis.asyncio import Redis

from core.codec import decode, encode
from core.errors import QuotaExceeded
from core.keys import Keys
from core.replies import text_set
from domain.idle.facts import SweptSession
from domain.model import SessionStatus
from domain.resource_policies import ProjectResourcePolicy, SessionLimits, UserResourcePolicy, session_limits
from stores.sessions import Admission, SessionStore

P = TypeVar("P")


class PolicyStore:
    """Get and put policies; reads of many are one round trip (the scheduler reads them every pass)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def user(self, user_id: str) -> UserResourcePolicy | None:
        return (await self.users([user_id])).get(user_id)

    async def users(self, user_ids: Iterable[str]) -> dict[str, UserResourcePolicy]:
        """The stored policies of ``user_ids`` (users without one are left out)."""
        return await self._many(user_ids, self.keys.user_policy, UserResourcePolicy)

    async def put_user(self, user_id: str, policy: UserResourcePolicy) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.user_policy(user_id), encode(policy.to_doc()))
            pipe.sadd(self.keys.users_with_policy, user_id)
            await pipe.execute()

    async def delete_user(self, user_id: str) -> bool:
        """False when the user had no policy."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.user_policy(user_id))
            pipe.srem(self.keys.users_with_policy, user_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    async def user_ids(self) -> set[str]:
        """Users with a stored policy."""
        return text_set(await self.redis.smembers(self.keys.users_with_policy))

    async def project(self, project: str) -> ProjectResourcePolicy | None:
        return (await self.projects([project])).get(project)

    async def projects(self, projects: Iterable[str]) -> dict[str, ProjectResourcePolicy]:
        return await self._many(projects, self.keys.project_policy, ProjectResourcePolicy)

    async def put_project(self, project: str, policy: ProjectResourcePolicy) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.project_policy(project), encode(policy.to_doc()))
            pipe.sadd(self.keys.projects_with_policy, project)
            await pipe.execute()

    async def delete_project(self, project: str) -> bool:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.project_policy(project))
            pipe.srem(self.keys.projects_with_policy, project)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    async def project_names(self) -> set[str]:
        """Projects with a stored policy."""
        return text_set(await self.redis.smembers(self.keys.projects_with_policy))

    async def _many(self, names: Iterable[str], key: Callable[[str], str], kind: type[P]) -> dict[str, P]:
        ordered = sorted(set(names))
        if not ordered:
            return {}
        raws = await self.redis.mget([key(name) for name in ordered])
        return {name: decode(raw, kind) for name, raw in zip(ordered, raws, strict=True) if raw}

    async def limits_of(self, sessions: Sequence[SweptSession]) -> dict[str, SessionLimits]:
        """Session id -> the limits its owner's and project's policies set (the idle checks apply them); sessions
        without any are left out. Two Redis reads, however many sessions."""
        users = await self.users({s.owner_id for s in sessions})
        projects = await self.projects({s.project for s in sessions})
        if not users and not projects:  # no policy at all: no limits, without a look at each session
            return {}
        found = {}
        of_pair: dict[tuple[str, str], SessionLimits] = {}  # a few owners and projects, many sessions
        for session in sessions:
            pair = (session.owner_id, session.project)
            limits = of_pair.get(pair)
            if limits is None:
                limits = of_pair[pair] = session_limits(users.get(pair[0]), projects.get(pair[1]))
            if limits != (None, None):
                found[session.id] = limits
        return found


def pending_admission(owner_id: str, limit: int | None, adding: int) -> Admission | None:
    """The check ``SessionStore.create`` runs under its WATCH: refuse (``QUOTA_EXCEEDED``) when ``adding`` more
    sessions would put the owner over ``limit`` PENDING sessions. None (nothing to check) without a limit.

    Exact under racing creations: the store re-runs it when another creation of the owner lands in between
    (sessions leaving PENDING meanwhile only make the count conservative). One Redis command, whatever the owner
    has: the owner's index intersected with the PENDING status index (kept in the same MULTI as each document).
    """
    if limit is None:
        return None

    async def admit(sessions: SessionStore) -> None:
        pending = await sessions.redis.zintercard(
            2,
            [
                sessions.keys.sessions_of_owner(owner_id),
                sessions.keys.sessions_with_status(SessionStatus.PENDING.value),
            ],
        )
        if pending + adding > limit:
            raise QuotaExceeded(
                f"you have {pending} pending session(s) and may queue at most {limit}: "
                f"wait for some to start or destroy them",
                field="count" if adding > 1 else None,
            )

    return admit
