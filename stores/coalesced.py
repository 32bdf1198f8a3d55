"""A pipeline facade that merges the writes many documents make to the same index into one command each.

Storing 500 new sessions (``SessionStore.create_each``, a schedule runner's chunk) queues the same ZADD, SADD and
HSET on the shared indexes (by creation time, by status, the live set...) once per session; each queued command costs
the client as much as the server. Written through :class:`Coalesced`, the ZADDs, SADDs, ZREMs and HSETs of one key
become one command at :meth:`Coalesced.flush`, and every plain SET (no option) one MSET; every other command goes to
the pipeline as it comes. Only for writes whose order does not matter: the merged commands run at the flush, after
the others.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from redis.asyncio import Redis
from redis.typing import EncodableT


class Coalesced:
    def __init__(self, pipe: Redis) -> None:
        self._pipe = pipe
        self._zadd: defaultdict[str, dict[str, float]] = defaultdict(dict)
        self._zrem: defaultdict[str, list[str]] = defaultdict(list)
        self._sadd: defaultdict[str, list[str]] = defaultdict(list)
        self._hset: defaultdict[str, dict[EncodableT, EncodableT]] = defaultdict(dict)
        self._mset: dict[str, EncodableT] = {}

    def as_pipe(self) -> Redis:
        """This facade where a pipeline is expected (it has the methods the writers of new documents call)."""
        return cast(Redis, self)

    def set(self, key: str, value: EncodableT, **options: Any) -> None:
        if options:
            self._pipe.set(key, value, **options)
        else:
            self._mset[key] = value

    def zadd(self, key: str, mapping: dict[str, float]) -> None:
        self._zadd[key].update(mapping)

    def zrem(self, key: str, *members: str) -> None:
        self._zrem[key].extend(members)

    def sadd(self, key: str, *members: str) -> None:
        self._sadd[key].extend(members)

    def hset(self, key: str, field: str, value: str) -> None:
        self._hset[key][field] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)  # set, xadd, expire, lpush...: queued as they come

    def flush(self) -> None:
        """Queue the merged commands on the pipeline."""
        for key, mapping in self._zadd.items():
            self._pipe.zadd(key, mapping)
        for key, members in self._zrem.items():
            self._pipe.zrem(key, *members)
        for key, members in self._sadd.items():
            self._pipe.sadd(key, *members)
        for key, fields in self._hset.items():
            self._pipe.hset(key, mapping=fields)
        if self._mset:
            self._pipe.mset(self._mset)
        for merged in (self._zadd, self._zrem, self._sadd, self._hset, self._mset):
            merged.clear()
