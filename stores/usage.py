"""Usage accounting in Redis: each ended session's raw record and its share of the daily rollups, written once.

* **Exactly once**: :meth:`UsageStore.write_ended` is called by ``stores.sessions.SessionStore.update`` inside the
  MULTI that moves the session's document from a live status to a terminal one (TERMINATED, CANCELLED). That move
  happens once per session (WATCHed document, no way out of a terminal status), and its MULTI writes the record, the
  rollup increments and the document together or not at all: a crashed or restarted process, a retried write or a
  Redis restart (AOF: a MULTI is replayed whole or not at all) counts nothing twice and loses nothing. Whoever ends
  the session (the scheduler's follower, a forced destroy in the gateway, the idle checker) records it.
* **Layout**: one HASH per UTC day (``Keys.usage_day``), field ``user␟project␟group␟type␟measure`` -> integer
  (``domain.usage``), kept forever; a month's report reads 31 hashes, never the raw records. Raw records
  (``Keys.usage_record``) expire after ``CARAVAN_USAGE_RAW_RETENTION``; ``Keys.usage_records`` indexes them by end.
* **Live sessions** count up to the moment of the query, from their status history (they are in no rollup yet).
* **Used**: the idle checker adds each sweep's measured utilization to ``Keys.usage_utilization`` (percent ×
  seconds); the session's record keeps its average beside what it was allocated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

import msgspec
from redis.asyncio import Redis

from core.codec import decode, encode
from core.errors import InvalidInput
from core.keys import Keys
from core.replies import optional_texts, ranked, text_hash, text_set
from domain.access import listing_scope
from domain.model import Session
from domain.usage import (
    FIELD_SEPARATOR,
    SECONDS,
    SLOT,
    Grouping,
    Period,
    ReportRow,
    Rollup,
    UsageRecord,
    days_of,
    record_of,
    record_rollup,
    rollup,
    row_key,
    utc_span,
)
from domain.users import User

TOTAL_SEPARATOR = "\x1f"
DEFAULT_RAW_RETENTION = 90 * 86400.0
UTILIZATION_TTL = 14 * 86400
"""A session's utilization sums outlive its last sweep by this long (then its record has long been written)."""
READ_CHUNK = 1000
COMPACT_TTL = 35 * 86400
"""A day's compact document is dropped after this long unread (it is built again when asked)."""
COMPACT_INTERVAL = 60.0
"""Seconds between the scheduler leader's compactions of the days written since (``compact_written_days``)."""


_NAME_AND_SUMS = "return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2])}"
_FIRST_DAY_KEY = 6
_RECORD = """
-- KEYS: 1 the raw record, 2 the records' index by end, 3 the days' versions, 4 the totals, 5 a key to delete (or the
-- record's own key: nothing to delete), 6.. the day hashes. ARGV: record, ttl, end, session id, the index's cutoff,
-- then n and n triples (day's KEYS index, field, amount), m and m day names, t and t pairs (total field, amount).
-- Amounts stay strings: HINCRBY parses them as 64-bit integers, never as Lua's doubles.
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
if KEYS[5] ~= KEYS[1] then redis.call('DEL', KEYS[5]) end
local i = 7
for _ = 1, tonumber(ARGV[6]) do
  redis.call('HINCRBY', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
local m = tonumber(ARGV[i])
i = i + 1
for _ = 1, m do
  redis.call('HINCRBY', KEYS[3], ARGV[i], 1)
  i = i + 1
end
local t = tonumber(ARGV[i])
i = i + 1
for _ = 1, t do
  redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
"""


class CompactDay(msgspec.Struct, frozen=True):
    """One UTC day's rollup in one document: its rows (``user␟project␟group␟type``) and their measures, as of
    ``version`` (``Keys.usage_day_versions``)."""

    day: str
    version: int
    rows: list[tuple[str, dict[str, int]]]


class UsageStore:
    def __init__(self, redis: Redis, keys: Keys, *, raw_retention: float = DEFAULT_RAW_RETENTION) -> None:
        self.redis = redis
        self.keys = keys
        self.raw_retention = raw_retention

    # -- recording (inside the MULTI that ends a session) -------------------------------------------

    async def utilization(self, session_id: str) -> dict[str, float]:
        """The average utilization (percent) of each metric the idle checker measured over the session."""
        return averages(text_hash(await self.redis.hgetall(self.keys.usage_utilization(session_id))))

    async def name_and_utilization(
        self, watched: Redis, name_key: str, session_id: str
    ) -> tuple[bytes | str | None, dict[str, float]]:
        """On the connection of a WATCHed transaction about to end a session, in one round trip: who holds the live
        name ``name_key``, and the session's utilization sums (:func:`averages` of them: what its record keeps). A
        second connection read beside cost the ending write about a fifth more (``bench/usage``)."""
        owner, sums = await watched.eval(_NAME_AND_SUMS, 2, name_key, self.keys.usage_utilization(session_id))
        return owner, averages(text_hash(_pairs(sums)))

    def write_ended(self, pipe: Redis, session: Session, used: Mapping[str, float]) -> None:
        """Queue, in the caller's MULTI, the ended session's raw record, its rollup increments and its totals."""
        self.write_record(
            pipe, record_of(session, now=session.created_at, used=used), forget=self.keys.usage_utilization(session.id)
        )

    def write_record(self, pipe: Redis, record: UsageRecord, *, forget: str | None = None) -> None:
        """Queue one ended record, as one script call (:data:`_RECORD`): kept raw for the retention, added to each of
        its UTC days and to the totals; ``forget`` (its utilization sums) deleted. One command instead of about
        fifteen keeps the MULTI that ends a session as cheap as it was without recording (``bench/usage``)."""
        if not record.intervals:  # never ran: nothing held, nothing to keep
            if forget is not None:
                pipe.delete(forget)
            return
        end = record.intervals[-1][1]
        record_key = self.keys.usage_record(record.session_id)
        days: dict[str, int] = {}  # day key -> its index in KEYS
        increments: list[str | int] = []
        rows = record_rollup(record)
        for key, row in rows.items():
            day = self.keys.usage_day(key.day.isoformat())
            index = days.setdefault(day, _FIRST_DAY_KEY + len(days))
            for measure, amount in row.items():
                if amount:
                    increments += [index, key.field(measure), amount]
        versions = sorted({key.day.isoformat() for key in rows})
        totals: list[str | int] = []
        for measure, amount in record.totals().items():
            if amount and (measure.startswith(SLOT) or measure == SECONDS):
                totals += [f"{record.project}{TOTAL_SEPARATOR}{measure}", amount]
        keys = [record_key, self.keys.usage_records, self.keys.usage_day_versions, self.keys.usage_totals]
        keys += [forget or record_key, *days]
        args: list[str | int | bytes] = [encode(record), max(1, round(self.raw_retention)), end, record.session_id]
        args += [f"({end - self.raw_retention}", len(increments) // 3, *increments, len(versions), *versions]
        args += [len(totals) // 2, *totals]
        pipe.eval(_RECORD, len(keys), *keys, *args)

    # -- reads --------------------------------------------------------------------------------------

    async def record(self, session_id: str) -> UsageRecord | None:
        raw = await self.redis.get(self.keys.usage_record(session_id))
        return decode(raw, UsageRecord) if raw is not None else None

    async def stored_days(self, days: Sequence[date]) -> tuple[list[dict[str, str]], set[str]]:
        """The stored daily rollup hashes of ``days`` (UTC) and, read in the same MULTI, the ids of live sessions."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for day in days:
                pipe.hgetall(self.keys.usage_day(day.isoformat()))
            pipe.smembers(self.keys.sessions_live)
            replies = await pipe.execute()
        return [text_hash(reply) for reply in replies[:-1]], text_set(replies[-1])

    async def compact_days(self, days: Sequence[date]) -> tuple[list[CompactDay], set[str]]:
        """``days``' rollups as compact documents (``Keys.usage_day_compact``), each as of the day's version read in
        the same MULTI, and the ids of live sessions read there too. A document older than its day's version (or
        missing) is built again from the day's hash, read with the version in one MULTI, and stored for the next."""
        names = [day.isoformat() for day in days]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.usage_day_versions, names)
            pipe.mget([self.keys.usage_day_compact(n) for n in names])
            pipe.smembers(self.keys.sessions_live)
            versions, documents, live = await pipe.execute()
        compact = []
        for name, version, document in zip(names, versions, documents, strict=True):
            found = decode(document, CompactDay) if document is not None else None
            if found is None or found.version != int(version or 0):
                found = await self._compacted(name)
            compact.append(found)
        return compact, text_set(live)

    async def _compacted(self, name: str) -> CompactDay:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.usage_day_versions, name)
            pipe.hgetall(self.keys.usage_day(name))
            version, fields = await pipe.execute()
        by_row: dict[str, dict[str, int]] = {}
        for text, amount in text_hash(fields).items():
            row, _, measure = text.rpartition(FIELD_SEPARATOR)
            by_row.setdefault(row, {})[measure] = int(amount)
        day = CompactDay(name, int(version or 0), [(row, measures) for row, measures in by_row.items()])
        # a cache: a reader that stored an older one meanwhile only makes the next reader build it again
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.usage_day_compact(name), encode(day), ex=COMPACT_TTL)
            pipe.hset(self.keys.usage_days_compacted, name, day.version)
            await pipe.execute()
        return day

    async def compact_written_days(self) -> list[str]:
        """Build again the compact document of every day written since its document was built (the scheduler
        leader's task, every ``COMPACT_INTERVAL``): a report then finds its days ready and builds on its own path
        only a day written within the last interval (today, mostly). Returns the days built, oldest first."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.usage_day_versions)
            pipe.hgetall(self.keys.usage_days_compacted)
            versions, compacted = await pipe.execute()
        built = text_hash(compacted)
        written = sorted(day for day, version in text_hash(versions).items() if built.get(day) != version)
        for name in written:
            await self._compacted(name)
        return written

    async def stored_rollup(self, days: Sequence[date]) -> tuple[Rollup, set[str]]:
        """The stored daily rollups of ``days`` (UTC) as rows, and the ids of live sessions."""
        hashes, live = await self.stored_days(days)
        rows: Rollup = {}
        for day, fields in zip(days, hashes, strict=True):
            for text, amount in fields.items():
                row, _, measure = text.rpartition(FIELD_SEPARATOR)
                key = row_key(day, row)
                if key is not None:
                    rows.setdefault(key, {})[measure] = int(amount)
        return rows, live

    async def live_records(self, session_ids: Iterable[str], *, now: datetime) -> list[UsageRecord]:
        """Sessions that were live when the rollups were read, counted up to ``now`` (one that ended since counts to
        its end: it was in no rollup read)."""
        ids = sorted(session_ids)
        records = []
        for start in range(0, len(ids), READ_CHUNK):
            keys = [self.keys.session(i) for i in ids[start : start + READ_CHUNK]]
            for raw in optional_texts(await self.redis.mget(keys)):
                if raw is not None:
                    records.append(record_of(decode(raw, Session), now=now))
        return [r for r in records if r.intervals]

    async def raw_records(self, start: int, end: int) -> list[UsageRecord]:
        """Kept raw records of sessions that ended at or after ``start`` and held something before ``end``."""
        ordered = ranked(await self.redis.zrangebyscore(self.keys.usage_records, start, "+inf"))
        records = []
        for first in range(0, len(ordered), READ_CHUNK):
            keys = [self.keys.usage_record(i) for i in ordered[first : first + READ_CHUNK]]
            for raw in optional_texts(await self.redis.mget(keys)):
                if raw is not None:
                    record = decode(raw, UsageRecord)
                    if record.intervals and record.intervals[0][0] < end:
                        records.append(record)
        return records

    async def grouped(self, period: Period, grouping: Grouping, *, now: datetime) -> Grouping:
        """Every day of ``period`` in its zone summed into ``grouping``: the stored UTC rollups plus live sessions;
        another zone from the raw records (kept ``raw_retention``), since a UTC day's total cannot be split at another
        zone's midnight."""
        if period.is_utc:
            compact, live = await self.compact_days(days_of(period.first, period.last))
            for day in compact:
                grouping.add_compact(date.fromisoformat(day.day), day.rows)
            return grouping.add_rows(rollup(await self.live_records(live, now=now)), period.first, period.last)
        start, end = utc_span(period.first, period.last, period.zone)
        horizon = now.timestamp() - self.raw_retention
        if start < horizon:
            kept = round(self.raw_retention / 86400)
            raise InvalidInput(
                f"raw usage records are kept {kept} days: a report in a time zone other than UTC reaches back only "
                "that far (daily UTC rollups are kept forever)",
                field="from",
            )
        live = text_set(await self.redis.smembers(self.keys.sessions_live))
        records = await self.raw_records(start, end)
        seen = {r.session_id for r in records}
        records += [r for r in await self.live_records(live, now=now) if r.session_id not in seen]
        return grouping.add_rows(rollup(records, period.zone), period.first, period.last)

    async def totals(self) -> dict[tuple[str, str], int]:
        """(project, measure) -> amount of every ended session ever."""
        totals = {}
        for text, amount in text_hash(await self.redis.hgetall(self.keys.usage_totals)).items():
            project, _, measure = text.partition(TOTAL_SEPARATOR)
            totals[(project, measure)] = int(amount)
        return totals


async def report_for(
    store: UsageStore, viewer: User, period: Period, group_by: Sequence[str], *, now: datetime
) -> list[ReportRow]:
    """``viewer``'s report (``domain.access``: their own usage; an ADMIN's projects'; a SUPERADMIN's everything)."""
    grouping = Grouping(group_by, listing_scope(viewer))
    return (await store.grouped(period, grouping, now=now)).rows()


def add_utilization(pipe: Redis, keys: Keys, session_id: str, averages: Mapping[str, float], seconds: float) -> None:
    """Queue, in the idle checker's sweep transaction, one sweep's measured utilization (percent) of a session as
    ``seconds`` of it (the sweep's interval)."""
    key = keys.usage_utilization(session_id)
    for metric, percent in averages.items():
        pipe.hincrbyfloat(key, metric, percent * seconds)
        pipe.hincrbyfloat(key, f"{metric}:seconds", seconds)
    if averages:
        pipe.expire(key, UTILIZATION_TTL)


def averages(sums: Mapping[str, str]) -> dict[str, float]:
    """The average utilization (percent) of each metric, from a session's sums (``metric`` and ``metric:seconds``)."""
    found = {}
    for metric, total in sums.items():
        seconds = sums.get(f"{metric}:seconds")
        if metric.endswith(":seconds") or not seconds or float(seconds) <= 0:
            continue
        found[metric] = float(total) / float(seconds)
    return found


def _pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    """HGETALL's reply inside a script: a flat list of field, value."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
