"""A pipeline facade that turns the writes of many documents into a handful of commands.

Storing 500 new sessions (``SessionStore.create_each``, a schedule runner's chunk) queues the same ZADD, SADD and
HSET on the shared indexes (by creation time, by status, the live set...) once per session, and an XADD or LPUSH on
each session's or schedule's own key; each queued command costs the client as much as the server (redis-py packs it,
then parses its ``QUEUED`` reply and its result). Written through :class:`Coalesced`, the ZADDs, SADDs, ZREMs and
HSETs of one key become one command at :meth:`Coalesced.flush`, every plain SET (no option) one MSET, and the
one-key writes of many keys (XADD, LPUSH, LTRIM, EXPIRE) one call of :data:`BATCH_SCRIPT`, which runs them in Redis
in the order they came. Any other command goes to the pipeline as it comes. Only for writes whose order across
kinds does not matter: the merged commands run at the flush, after the others.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from redis.asyncio import Redis
from redis.typing import EncodableT

BATCH_SCRIPT = """
local a = 1
for k = 1, #KEYS do
  local count = tonumber(ARGV[a + 1])
  redis.call(ARGV[a], KEYS[k], unpack(ARGV, a + 2, a + 1 + count))
  a = a + 2 + count
end
return #KEYS
"""
"""Runs one-key commands given as KEYS (the key of each, in order) and ARGV (per command: its name, how many
arguments follow the key, the arguments)."""


class Coalesced:
    def __init__(self, pipe: Redis) -> None:
        self._pipe = pipe
        self._zadd: defaultdict[str, dict[str, float]] = defaultdict(dict)
        self._zrem: defaultdict[str, list[str]] = defaultdict(list)
        self._sadd: defaultdict[str, list[str]] = defaultdict(list)
        self._hset: defaultdict[str, dict[EncodableT, EncodableT]] = defaultdict(dict)
        self._mset: dict[str, EncodableT] = {}
        self._batch_keys: list[str] = []
        self._batch_args: list[EncodableT] = []

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

    def xadd(
        self, key: str, fields: dict[str, EncodableT], *, maxlen: int | None = None, approximate: bool = True
    ) -> None:
        """XADD with an id Redis picks (``*``), capped at about (``approximate``) or exactly ``maxlen`` entries."""
        cap: list[EncodableT] = [] if maxlen is None else ["MAXLEN", "~" if approximate else "=", maxlen]
        self._batched("XADD", key, *cap, "*", *(part for pair in fields.items() for part in pair))

    def lpush(self, key: str, *values: EncodableT) -> None:
        self._batched("LPUSH", key, *values)

    def ltrim(self, key: str, start: int, end: int) -> None:
        self._batched("LTRIM", key, start, end)

    def expire(self, key: str, seconds: int) -> None:
        self._batched("EXPIRE", key, seconds)

    def _batched(self, command: str, key: str, *args: EncodableT) -> None:
        self._batch_keys.append(key)
        self._batch_args.extend((command, len(args), *args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)  # any other command: queued as it comes

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
        if self._batch_keys:
            self._pipe.eval(BATCH_SCRIPT, len(self._batch_keys), *self._batch_keys, *self._batch_args)
        for merged in (self._zadd, self._zrem, self._sadd, self._hset, self._mset, self._batch_keys, self._batch_args):
            merged.clear()
