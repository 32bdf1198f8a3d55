"""Per-request DataLoaders: what a field fetches for each session of a page is fetched for the whole page at once.

Strawberry's ``DataLoader`` gathers the ``load`` calls made while one level of the result resolves and
hands them to one batch function, so ``sessions(first: 50) { edges { node { owner { name } idleChecks {…} } } }``
costs one MGET of users and one MGET of idle reports, not fifty GETs of each.

They batch but do not cache (``cache=False``): a WebSocket connection keeps one context for its whole
life, and a cached idle verdict or user would go stale there. Repeated keys in a batch are read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strawberry.dataloader import DataLoader

from domain.users import User
from stores.idle import IdleStore, StoredVerdict
from stores.users import UserStore


@dataclass(frozen=True)
class Loaders:
    users: DataLoader[str, User | None]
    """User records by id (None: no such user)."""
    idle_verdicts: DataLoader[str, StoredVerdict | None]
    """The idle checker's last verdict by session id (None: no recent sweep judged it)."""


def loaders_for(users: UserStore, idle: IdleStore) -> Loaders:
    async def load_users(ids: Sequence[str]) -> list[User | None]:
        found = {u.id: u for u in await users.get_many(ids)}  # one MGET of the distinct ids
        return [found.get(i) for i in ids]

    async def load_verdicts(ids: Sequence[str]) -> list[StoredVerdict | None]:
        distinct = list(dict.fromkeys(ids))
        found = dict(zip(distinct, await idle.verdicts(distinct), strict=True))
        return [found[i] for i in ids]

    return Loaders(
        users=DataLoader(load_fn=load_users, cache=False),
        idle_verdicts=DataLoader(load_fn=load_verdicts, cache=False),
    )
