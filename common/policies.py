"""Resource policies of users and projects, kept in Redis: the limits the scheduler enforces and creation admits.

A user policy caps
- ``max_concurrent_sessions``: sessions holding resources at once (SCHEDULED … TERMINATING); the scheduler keeps
  the rest PENDING with the reason;
- ``max_pending_sessions``: sessions queued at once; a creation beyond it is refused with ``QUOTA_EXCEEDED``;
- ``total_resource_slots``: per slot, what the user's running sessions may hold together, cluster-wide.

A project policy caps ``total_resource_slots`` of the project's sessions together. ``None`` means unlimited, for a
whole policy (nobody stored one) as for any of its fields; a slot not listed is unlimited, a listed 0 allows none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any, TypeVar

from redis.asyncio import Redis

from common.errors import QuotaExceeded
from common.keys import Keys
from common.model import SessionStatus
from common.store import SessionStore

Slots = Mapping[str, Decimal]
P = TypeVar("P")


def _limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a whole number >= 0 or None, got {value!r}")


def _slots(value: Mapping[str, Any] | None) -> Slots | None:
    if value is None:
        return None
    amounts: dict[str, Decimal] = {}
    for slot, raw in value.items():
        try:
            amount = Decimal(str(raw)) if not isinstance(raw, bool) else Decimal("nan")
        except InvalidOperation:
            amount = Decimal("nan")
        if not amount.is_finite() or amount < 0:
            raise ValueError(f"total_resource_slots.{slot} must be a number >= 0, got {raw!r}")
        amounts[str(slot)] = amount
    return MappingProxyType(amounts)


def _slots_json(slots: Slots | None) -> dict[str, str] | None:
    return None if slots is None else {slot: format(amount, "f") for slot, amount in slots.items()}


@dataclass(frozen=True)
class UserResourcePolicy:
    max_concurrent_sessions: int | None = None
    max_pending_sessions: int | None = None
    total_resource_slots: Slots | None = None
    """Slot -> amount (cores, bytes, devices), exact; amounts given as strings or numbers are converted."""

    def __post_init__(self) -> None:
        _limit("max_concurrent_sessions", self.max_concurrent_sessions)
        _limit("max_pending_sessions", self.max_pending_sessions)
        object.__setattr__(self, "total_resource_slots", _slots(self.total_resource_slots))

    def to_json(self) -> str:
        return json.dumps({"max_concurrent_sessions": self.max_concurrent_sessions,
                           "max_pending_sessions": self.max_pending_sessions,
                           "total_resource_slots": _slots_json(self.total_resource_slots)})

    @classmethod
    def from_json(cls, text: str | bytes) -> UserResourcePolicy:
        doc = json.loads(text)
        return cls(doc.get("max_concurrent_sessions"), doc.get("max_pending_sessions"), doc.get("total_resource_slots"))


@dataclass(frozen=True)
class ProjectResourcePolicy:
    total_resource_slots: Slots | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_resource_slots", _slots(self.total_resource_slots))

    def to_json(self) -> str:
        return json.dumps({"total_resource_slots": _slots_json(self.total_resource_slots)})

    @classmethod
    def from_json(cls, text: str | bytes) -> ProjectResourcePolicy:
        return cls(json.loads(text).get("total_resource_slots"))


class PolicyStore:
    """Get and put policies; reads of many are one round trip (the scheduler reads them every pass)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def user(self, user_id: str) -> UserResourcePolicy | None:
        return (await self.users([user_id])).get(user_id)

    async def users(self, user_ids: Iterable[str]) -> dict[str, UserResourcePolicy]:
        """The stored policies of ``user_ids`` (users without one are left out)."""
        return await self._many(user_ids, self.keys.user_policy, UserResourcePolicy.from_json)

    async def put_user(self, user_id: str, policy: UserResourcePolicy) -> None:
        await self.redis.set(self.keys.user_policy(user_id), policy.to_json())

    async def delete_user(self, user_id: str) -> None:
        await self.redis.delete(self.keys.user_policy(user_id))

    async def project(self, project: str) -> ProjectResourcePolicy | None:
        return (await self.projects([project])).get(project)

    async def projects(self, projects: Iterable[str]) -> dict[str, ProjectResourcePolicy]:
        return await self._many(projects, self.keys.project_policy, ProjectResourcePolicy.from_json)

    async def put_project(self, project: str, policy: ProjectResourcePolicy) -> None:
        await self.redis.set(self.keys.project_policy(project), policy.to_json())

    async def delete_project(self, project: str) -> None:
        await self.redis.delete(self.keys.project_policy(project))

    async def _many(self, names: Iterable[str], key: Callable[[str], str], parse: Callable[[str], P]) -> dict[str, P]:
        ordered = sorted(set(names))
        if not ordered:
            return {}
        raws = await self.redis.mget([key(name) for name in ordered])
        return {name: parse(raw) for name, raw in zip(ordered, raws, strict=True) if raw}


async def check_pending_limit(sessions: SessionStore, policies: PolicyStore, owner_id: str, adding: int,
                              client_token: str | None = None) -> None:
    """Creation-time admission: refuse (``QUOTA_EXCEEDED``) when ``adding`` more sessions would put the owner over
    their policy's ``max_pending_sessions``. Costs nothing for users without that limit; a repeated request (same
    ``client_token``) passes, as it creates nothing new.

    Not atomic with the creation: two requests racing may both pass, so the limit can be overshot by the requests
    in flight at one instant (the scheduler's limits on running sessions are exact).
    """
    policy = await policies.user(owner_id)
    limit = policy.max_pending_sessions if policy else None
    if limit is None:
        return
    if client_token and await sessions.redis.exists(sessions.keys.client_token(owner_id, client_token)):
        return
    live_of_owner = await sessions.redis.zinter([sessions.keys.sessions_of_owner(owner_id), sessions.keys.sessions_live])
    pending = sum(1 for s in await sessions.get_many(live_of_owner) if s and s.status is SessionStatus.PENDING)
    if pending + adding > limit:
        raise QuotaExceeded(
            f"you have {pending} pending session(s) and may queue at most {limit}: "
            f"wait for some to start or destroy them", field="count" if adding > 1 else None,
        )
