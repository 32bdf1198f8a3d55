"""Runs a listing :class:`~domain.listing.Plan` against Redis: one page of sessions from a position.

Round trips per page: one. A script (:data:`READ_PAGE`) reads the ranges of the plan's indexes (one for a superadmin's
or a user's page, or the scratch set of a filter; an admin's own and project indexes, merged) and the documents of the
first sessions of their merged order; the count, when asked, is in the script (one index) or in the same pipeline.
A plan that combines indexes adds one MULTI that builds a scratch set and one that deletes it; ``nameContains`` scans
names instead, one range and one HMGET of names per batch, and one MGET of the page's documents. Ties in an order's
time (sessions created together) are resolved by id, exactly as Redis orders them (more read past them when a range
held too many: the documents the script did not read are read by an MGET).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from core.replies import optional_texts
from domain.listing import NAME_SCAN_BATCH, Plan, Position, ScoreRange, past
from stores.sessions import SessionStore

MAX_COUNT_COMMANDS = 64
"""Most commands counting a union of indexes by inclusion-exclusion; past it (an admin of more than 31 projects), a
scratch union counts it."""
SCRATCH_TTL = 30
"""Seconds a scratch set outlives a request that died before deleting it."""
TIE_SLACK = 8
"""Extra entries read past a cursor for the ones sharing its time (read again, more, if all are ties)."""


READ_PAGE = """
local descending = ARGV[1] == '1'
local count = false
if ARGV[6] ~= '' then count = redis.call('ZCOUNT', KEYS[1], ARGV[6], ARGV[7]) end
local reply, entries, seen = {count}, {}, {}
for k = 1, #KEYS do
  local rows
  if descending then
    rows = redis.call('ZRANGE', KEYS[k], ARGV[3], ARGV[2], 'BYSCORE', 'REV', 'LIMIT', 0, ARGV[4], 'WITHSCORES')
  else
    rows = redis.call('ZRANGE', KEYS[k], ARGV[2], ARGV[3], 'BYSCORE', 'LIMIT', 0, ARGV[4], 'WITHSCORES')
  end
  reply[k + 3] = rows
  for i = 1, #rows, 2 do
    if not seen[rows[i]] then
      seen[rows[i]] = true
      entries[#entries + 1] = {tonumber(rows[i + 1]), rows[i]}
    end
  end
end
if #KEYS > 1 then
  table.sort(entries, function(a, b)
    if a[1] ~= b[1] then
      if descending then return a[1] > b[1] else return a[1] < b[1] end
    end
    if descending then return a[2] > b[2] else return a[2] < b[2] end
  end)
end
local ids, keys = {}, {}
for i = 1, math.min(#entries, tonumber(ARGV[4])) do
  ids[i] = entries[i][2]
  keys[i] = ARGV[5] .. entries[i][2]
end
reply[2] = ids
reply[3] = {}
if #keys > 0 then reply[3] = redis.call('MGET', unpack(keys)) end
return reply
"""
"""The ranges of one or more indexes and the documents of the first sessions of their merged order, in one round
trip. KEYS: the indexes (ZSETs of session ids by order time). ARGV[1]: '1' to read descending; ARGV[2], ARGV[3]: the
range's low and high bounds (as ZRANGE BYSCORE takes them); ARGV[4]: the most entries per index, and of documents;
ARGV[5]: the documents' key prefix (``Keys.session`` of an empty id); ARGV[6], ARGV[7]: bounds to count the first
index's sessions within ('': no count). Returns {the count or false, the ids whose documents were read, their
documents (false: gone), then each index's {id, score, id, score...}}. The documents are keys the script does not
declare: one Redis, as every store here assumes (a Redis Cluster would need them in the indexes' hash slot). Which
documents it reads only saves a round trip: the merge that decides the page is :func:`merge`'s, and a document it did
not read is read by the page's MGET."""

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    entries: list[tuple[Position, T]]
    """In the order read (the plan's direction), each session as the listing's ``decode`` made it."""
    has_more: bool
    """Whether more sessions follow the page in that direction."""
    total: int | None
    """Sessions matching the whole listing (not only the page), when asked for."""


@dataclass(frozen=True)
class _Ranges:
    """One read of :meth:`SessionListing._read`: ``want`` positions of each source within ``window`` in order, and,
    when ``count``, the number of sessions in ``scores`` over them all (``disjoint`` as in ``Plan.disjoint``)."""

    sources: Sequence[str]
    window: ScoreRange
    scores: ScoreRange
    descending: bool
    want: int
    count: bool
    disjoint: Sequence[Sequence[str]]


class SessionListing(Generic[T]):
    """Pages of sessions, each document turned into a ``T`` by ``decode`` (a caller may cache it by document)."""

    def __init__(self, store: SessionStore, decode: Callable[[str], T]) -> None:
        self.store = store
        self.redis: Redis = store.redis
        self.keys = store.keys
        self.decode = decode
        self._read_page = store.redis.register_script(READ_PAGE)

    async def page(
        self,
        plan: Plan,
        *,
        size: int,
        after: Position | None = None,
        until: Position | None = None,
        count: bool = False,
    ) -> Page[T]:
        """Up to ``size`` sessions past ``after`` (and before ``until``) in the plan's direction."""
        if plan.empty:
            return Page([], False, 0 if count else None)
        documents: dict[str, str | None] = {}
        async with self._sources(plan) as sources:
            total: int | None = None
            if plan.name_contains is not None:
                positions = await self._scan_names(plan, sources, after, until, size + 1)
                if count:
                    total = await self._count_names(plan, sources)
            else:
                disjoint = plan.disjoint if sources == plan.sources else ()
                positions, total = await self._read(
                    sources,
                    plan.scores,
                    plan.descending,
                    after,
                    until,
                    size + 1,
                    count=count,
                    disjoint=disjoint,
                    documents=documents,
                )
        has_more = len(positions) > size
        positions = positions[:size]
        if missing := [p.id for p in positions if p.id not in documents]:
            raws = optional_texts(await self.redis.mget([self.keys.session(i) for i in missing]))
            documents.update(zip(missing, raws, strict=True))
        entries = [(p, self.decode(raw)) for p in positions if (raw := documents[p.id]) is not None]
        return Page(entries, has_more, total)

    # -- where the candidates come from ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _sources(self, plan: Plan) -> AsyncIterator[tuple[str, ...]]:
        """The ordered ZSETs to read: the plan's own, or one scratch set combining its indexes."""
        if plan.direct or plan.merged:
            yield plan.sources
            return
        base = self.keys.listing_scratch(uuid.uuid4().hex)
        parts: list[str] = []
        async with self.redis.pipeline(transaction=True) as pipe:
            inputs: list[str] = []
            for i, union in enumerate((plan.sources, *plan.filters)):
                if len(union) == 1:
                    inputs.append(union[0])
                    continue
                part = f"{base}:{i}"
                pipe.zunionstore(part, list(union), aggregate="MIN")
                parts.append(part)
                inputs.append(part)
            if plan.other_range is not None:
                key, scores = plan.other_range
                part = f"{base}:range"
                pipe.zrangestore(part, key, scores.redis_low(), scores.redis_high(), byscore=True)
                parts.append(part)
                inputs.append(part)
            # the sources' scores are the order's times; every other input only narrows (weight 0)
            weights: dict[str, int] = {}
            for i, key in enumerate(inputs):
                weights.setdefault(key, 1 if i == 0 else 0)  # a set intersected with itself is itself
            pipe.zinterstore(base, weights)
            pipe.expire(base, SCRATCH_TTL)
            if parts:
                pipe.delete(*parts)
            await pipe.execute()
        try:
            yield (base,)
        finally:
            await self.redis.delete(base)

    # -- reading in order -----------------------------------------------------------------------

    async def _read(
        self,
        sources: Sequence[str],
        scores: ScoreRange,
        descending: bool,
        after: Position | None,
        until: Position | None,
        limit: int,
        *,
        count: bool = False,
        disjoint: Sequence[Sequence[str]] = (),
        documents: dict[str, str | None] | None = None,
    ) -> tuple[list[Position], int | None]:
        """Up to ``limit`` positions past ``after`` merged over ``sources``, and their count if asked (``disjoint``:
        groups of sources that share no session, see ``Plan.disjoint``). Over one source, with ``documents`` given,
        the first read is :data:`READ_PAGE`'s, and the documents of the sessions it read are left in ``documents``."""
        window = scores.from_position(after, descending) if after else scores
        want = limit + (TIE_SLACK if after else 0)
        total: int | None = None
        while True:
            if documents is not None and len(sources) == 1:  # the count in the script: no pipeline
                batches, total = await self._read_with_documents(
                    sources, window, descending, want, scores if count and total is None else None, documents
                )
            else:
                ranges = _Ranges(sources, window, scores, descending, want, count and total is None, disjoint)
                batches, counted = await self._read_ranges(ranges, documents)
                total = total if counted is None else counted
            documents = None  # read again (more past ties): the page's MGET reads the documents still missing
            positions, complete = merge(batches, want, descending)
            if until is not None and positions and not past(until, positions[-1], descending):
                complete = True  # read up to the end bound: nothing more is wanted
            positions = [
                p
                for p in positions
                if (after is None or past(p, after, descending)) and (until is None or past(until, p, descending))
            ]
            if len(positions) >= limit or complete:
                return positions[:limit], total
            want *= 4

    def _read_page_args(
        self, window: ScoreRange, descending: bool, want: int, counted: ScoreRange | None = None
    ) -> list[Any]:
        count_args = (counted.redis_low(), counted.redis_high()) if counted is not None else ("", "")
        return [
            1 if descending else 0,
            window.redis_low(),
            window.redis_high(),
            want,
            self.keys.session(""),
            *count_args,
        ]

    async def _read_with_documents(
        self,
        sources: Sequence[str],
        window: ScoreRange,
        descending: bool,
        want: int,
        counted: ScoreRange | None,
        documents: dict[str, str | None],
    ) -> tuple[list[list[Position]], int | None]:
        """One source's range (and count within ``counted``), its sessions' documents into ``documents``."""
        reply = await self._read_page(
            keys=sources, args=self._read_page_args(window, descending, want, counted), client=self.redis
        )
        total = reply[0]
        return self._read_page_reply(reply, documents), None if total is None else int(total)

    @staticmethod
    def _read_page_reply(reply: list[Any], documents: dict[str, str | None]) -> list[list[Position]]:
        """Each source's positions from a :data:`READ_PAGE` reply; the documents it read into ``documents``."""
        _, ids, raws, *ranges = reply
        documents.update(zip(ids, optional_texts(raws), strict=True))
        return [[Position(float(score), member) for member, score in zip(r[::2], r[1::2], strict=True)] for r in ranges]

    async def _read_ranges(
        self, ranges: _Ranges, documents: dict[str, str | None] | None = None
    ) -> tuple[list[list[Position]], int | None]:
        """Each source's range in one pipeline (and the count, when asked); with ``documents``, the ranges are
        :data:`READ_PAGE`'s, with the documents it read."""
        if documents is not None:
            try:
                return await self._read_ranges_with_documents(ranges, documents)
            except NoScriptError:  # not loaded yet (or flushed, or a new primary): loaded, then read again
                await self.redis.script_load(READ_PAGE)
                return await self._read_ranges_with_documents(ranges, documents)
        low, high = ranges.window.redis_low(), ranges.window.redis_high()
        if ranges.descending:  # ZRANGE BYSCORE REV takes its bounds from the high end
            low, high = high, low
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in ranges.sources:
                pipe.zrange(
                    key, low, high, desc=ranges.descending, byscore=True, offset=0, num=ranges.want, withscores=True
                )
            counted = self._queue_ranges_count(pipe, ranges)
            replies = await pipe.execute()
        sources = len(ranges.sources)
        total = counted(replies[sources:]) if counted is not None else None
        return [[Position(score, member) for member, score in reply] for reply in replies[:sources]], total

    async def _read_ranges_with_documents(
        self, ranges: _Ranges, documents: dict[str, str | None]
    ) -> tuple[list[list[Position]], int | None]:
        sources = ranges.sources
        async with self.redis.pipeline(transaction=False) as pipe:
            args = self._read_page_args(ranges.window, ranges.descending, ranges.want)
            pipe.evalsha(self._read_page.sha, len(sources), *sources, *args)
            counted = self._queue_ranges_count(pipe, ranges)
            replies = await pipe.execute()
        total = counted(replies[1:]) if counted is not None else None
        return self._read_page_reply(replies[0], documents), total

    def _queue_ranges_count(self, pipe: Redis, ranges: _Ranges) -> Callable[[list[Any]], int] | None:
        """The count of ``ranges``' sessions queued in ``pipe`` when asked (see :meth:`_queue_count`)."""
        return self._queue_count(pipe, ranges.sources, ranges.scores, ranges.disjoint) if ranges.count else None

    def _queue_count(
        self, pipe: Redis, sources: Sequence[str], scores: ScoreRange, disjoint: Sequence[Sequence[str]] = ()
    ) -> Callable[[list[Any]], int]:
        """Queue the commands that count the sessions of ``sources`` in ``scores``; the count from their replies.

        Over several indexes (an admin's own and their projects'), the size of their union: with no score range, by
        inclusion-exclusion over ZCARD and ZINTERCARD of the indexes (nothing written, no sorted set of every session
        built per request), leaving out the intersections empty by ``disjoint`` (1 owner and p projects: 2p + 1
        commands, each as costly as the owner's index at most), up to :data:`MAX_COUNT_COMMANDS`; else by a scratch
        union of them all."""
        if len(sources) == 1:
            pipe.zcount(sources[0], scores.redis_low(), scores.redis_high())
            return lambda replies: int(replies[0])
        grouped = {key for group in disjoint for key in group}
        groups = [tuple(g) for g in disjoint] + [(key,) for key in sources if key not in grouped]
        if scores.unbounded and math.prod(len(g) + 1 for g in groups) - 1 <= MAX_COUNT_COMMANDS:
            signs = []
            for choice in itertools.product(*[(None, *g) for g in groups]):
                subset = [key for key in choice if key is not None]
                if len(subset) == 1:
                    pipe.zcard(subset[0])
                elif subset:
                    pipe.zintercard(len(subset), subset)
                if subset:
                    signs.append(1 if len(subset) % 2 else -1)
            return lambda replies: sum(sign * int(n) for sign, n in zip(signs, replies, strict=True))
        union = self.keys.listing_scratch(uuid.uuid4().hex)
        pipe.zunionstore(union, list(sources), aggregate="MIN")
        pipe.zcount(union, scores.redis_low(), scores.redis_high())
        pipe.delete(union)
        return lambda replies: int(replies[1])

    # -- nameContains: scanned in batches ------------------------------------------------------

    async def _scan_names(
        self, plan: Plan, sources: Sequence[str], after: Position | None, until: Position | None, limit: int
    ) -> list[Position]:
        assert plan.name_contains is not None
        found: list[Position] = []
        while len(found) < limit:
            batch, _ = await self._read(sources, plan.scores, plan.descending, after, until, NAME_SCAN_BATCH)
            if not batch:
                break
            names = optional_texts(await self.redis.hmget(self.keys.session_names, [p.id for p in batch]))
            found += [
                p for p, n in zip(batch, names, strict=True) if n is not None and plan.name_contains in n.casefold()
            ]
            if len(batch) < NAME_SCAN_BATCH:
                break
            after = batch[-1]
        return found[:limit]

    async def _count_names(self, plan: Plan, sources: Sequence[str]) -> int:
        assert plan.name_contains is not None
        total, after = 0, None
        while True:
            batch, _ = await self._read(sources, plan.scores, plan.descending, after, None, NAME_SCAN_BATCH)
            if not batch:
                return total
            names = optional_texts(await self.redis.hmget(self.keys.session_names, [p.id for p in batch]))
            total += sum(1 for n in names if n is not None and plan.name_contains in n.casefold())
            if len(batch) < NAME_SCAN_BATCH:
                return total
            after = batch[-1]


def merge(batches: Sequence[list[Position]], want: int, descending: bool) -> tuple[list[Position], bool]:
    """Positions of several ordered batches (each read with a limit of ``want``) merged in order, without repeats.

    Only what is certainly in order is kept: nothing past the end of a batch that hit its limit (that
    index may hold more before it). ``complete`` when no batch hit its limit.
    """
    full_ends = [b[-1] for b in batches if len(b) >= want]
    horizon = (max(full_ends) if descending else min(full_ends)) if full_ends else None
    seen: dict[str, Position] = {}
    for batch in batches:
        for position in batch:
            seen.setdefault(position.id, position)
    ordered = sorted(seen.values(), reverse=descending)
    if horizon is not None:
        ordered = [p for p in ordered if not past(p, horizon, descending)]
    return ordered, horizon is None
