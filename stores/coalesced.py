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
local absent = tonumber(ARGV[1])
for k = 1, absent do
  if redis.call('EXISTS', KEYS[k]) == 1 then return -k end
end
local a = 2
for k = absent + 1, #KEYS do
  local count = tonumber(ARGV[a + 1])
  redis.call(ARGV[a], KEYS[k], unpack(ARGV, a + 2, a + 1 + count))
  a = a + 2 + count
end
return #KEYS - absent
"""
"""Runs one-key commands given as KEYS and ARGV: ARGV[1] is how many KEYS come first that must not exist (if one
does, nothing is written and the reply is minus its position); then per command, its key in KEYS (in order) and in
ARGV its name, how many arguments follow the key, the arguments. Replies how many commands ran."""
MERGED_PIECE = 1000
"""Members (or fields) per merged command in the script: Lua's ``unpack`` takes at most about 8,000 values."""


class Coalesced:
    def __init__(self, pipe: Redis, *, guarded: bool = False) -> None:
        """``guarded``: every write goes into the batch script (also the merged ones, and INCR, RPUSH), which first
        checks that the keys given to :meth:`require_absent` do not exist, and writes nothing if one does: then the
        pipeline's reply to it is negative (:func:`guard_failed`). A check without a WATCH, whose cost grows with
        the square of the keys watched (Redis 7.0 looks each one up in a list of the client's)."""
        self._pipe = pipe
        self._absent: list[str] = []
        self._guarded = guarded
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

    def require_absent(self, *keys: str) -> None:
        """Guarded: write nothing if one of ``keys`` exists when the script runs."""
        if not self._guarded:
            raise TypeError("only a guarded batch checks keys")
        self._absent.extend(keys)

    def set(self, key: str, value: EncodableT, **options: Any) -> None:
        if options:
            if self._guarded:
                raise TypeError("a SET with options cannot go into a guarded batch")
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

    def incr(self, key: str) -> None:
        self._batched("INCR", key)

    def rpush(self, key: str, *values: EncodableT) -> None:
        self._batched("RPUSH", key, *values)

    def _batched(self, command: str, key: str, *args: EncodableT) -> None:
        self._batch_keys.append(key)
        self._batch_args.extend((command, len(args), *args))

    def __getattr__(self, name: str) -> Any:
        if self._guarded:
            raise AttributeError(f"{name} cannot go into a guarded batch")
        return getattr(self._pipe, name)  # any other command: queued as it comes

    def flush(self) -> None:
        """Queue the merged commands on the pipeline (guarded: all in the one script call)."""
        if self._guarded:
            self._merged_into_script()
        else:
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
        if self._batch_keys or self._absent:
            keys = [*self._absent, *self._batch_keys]
            self._pipe.eval(BATCH_SCRIPT, len(keys), *keys, len(self._absent), *self._batch_args)
        for merged in (self._zadd, self._zrem, self._sadd, self._hset, self._mset, self._batch_keys, self._batch_args):
            merged.clear()
        self._absent = []

    def _merged_into_script(self) -> None:
        """The merged writes as commands of the batch script, before the one-key writes queued so far."""
        keys, args = self._batch_keys, self._batch_args
        self._batch_keys, self._batch_args = [], []
        for key, value in self._mset.items():
            self._batched("SET", key, value)
        for command, merged in (("ZADD", self._zadd), ("HSET", self._hset)):
            for key, mapping in merged.items():
                pairs = list(mapping.items())
                for start in range(0, len(pairs), MERGED_PIECE):
                    piece = pairs[start : start + MERGED_PIECE]
                    if command == "ZADD":
                        self._batched(command, key, *(part for m, score in piece for part in (score, m)))
                    else:
                        self._batched(command, key, *(part for pair in piece for part in pair))
        for command, listed in (("ZREM", self._zrem), ("SADD", self._sadd)):
            for key, members in listed.items():
                for start in range(0, len(members), MERGED_PIECE):
                    self._batched(command, key, *members[start : start + MERGED_PIECE])
        self._batch_keys.extend(keys)
        self._batch_args.extend(args)


def guard_failed(reply: Any) -> bool:
    """Did a guarded batch (``Coalesced(..., absent=...)``) find one of its keys there, and write nothing?"""
    return isinstance(reply, int) and reply < 0
