"""What the idle checker keeps in Redis: last verdicts, utilization windows, the policy it enforces.

* **Reports** (``Keys.idle_report``): each sweep's verdict per session with the time it was reached,
  expiring after :func:`report_ttl`; the gateway serves them as ``idleChecks`` and never recomputes.
* **Windows** (``Keys.idle_window_tables``): the leader keeps windows in memory as arrays (a round trip per
  session per sweep would cost more than the decisions) and saves them now and then, one document per array table
  (``domain.idle.columns.WindowTableDoc``), so a new leader resumes with full windows instead of waiting a whole
  window to judge again. Windows saved one document per session (``Keys.idle_windows``, before the tables) are read
  when no tables are saved yet.
* **Policy** (``Keys.idle_policy``): the text and source of the policy in force, so the gateway shows
  the effective policy the checker actually enforces, even while a broken file is being refused.

The checker's writes carry its fencing token (:func:`core.lease.write_fenced`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.keys import Keys
from core.lease import Fence, write_fenced
from core.replies import optional_text, optional_texts, text_hash
from domain.idle.columns import WindowColumns, WindowTableDoc
from domain.idle.config import CheckName, IdlePolicyConfig
from domain.idle.policy_file import parse_policy
from domain.idle.series import SERIES_RETENTION, SeriesPoint, compact, needs_compaction
from domain.idle.verdict import Verdict, VerdictDoc
from domain.idle.window import UtilizationWindow, WindowDoc
from stores.usage import add_utilization

log = logging.getLogger(__name__)

REPORT_TTL_INTERVALS = 10
MIN_REPORT_TTL = 30.0


def report_ttl(check_interval: float) -> int:
    """Seconds a report outlives its sweep: several sweeps, so one slow sweep does not blank it."""
    return round(max(check_interval * REPORT_TTL_INTERVALS, MIN_REPORT_TTL))


@dataclass(frozen=True)
class StoredVerdict:
    checked_at: datetime
    """When the sweep reached it: ``remaining`` times in the reports are as of this moment."""
    verdict: Verdict


class ReportDoc(VerdictDoc):
    """A session's idle report as stored: its verdict and when the sweep reached it."""

    checked_at: datetime


@dataclass(frozen=True)
class PublishedPolicy:
    source: str
    """The policy file's path, or "built-in"."""
    text: str


def report_document(checked_at: bytes, verdict: Verdict) -> bytes:
    """A verdict's idle report as stored (``ReportDoc``): ``encode({"checked_at": ..., **verdict.to_dict()})`` byte for
    byte, written without the dicts (msgspec writes the verdict's structs field by field as ``to_dict`` spells them);
    ``checked_at``: the moment as ``core.codec.encode`` writes it, once for the whole sweep."""
    return b'{"checked_at":' + checked_at + b"," + encode(verdict)[1:]


class IdleStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    # -- the checker's writes (fenced) ------------------------------------------------------------

    async def save_sweep(
        self,
        fence: Fence,
        *,
        checked_at: datetime,
        verdicts: Mapping[str, Verdict],
        ttl: int,
        windows: WindowColumns | None = None,
        interval: float = 0.0,
        series_appended: Mapping[str, SeriesPoint] = MappingProxyType({}),
        series_rewritten: Mapping[str, Sequence[SeriesPoint]] = MappingProxyType({}),
    ) -> None:
        """One sweep's reports, and (when given) every window, replacing those saved before, in one transaction;
        each session's measured utilization counts for ``interval`` seconds of its usage (``stores.usage``); the
        sessions' utilization series get this sweep's point appended, or are replaced (:meth:`series_to_write`)."""

        def write(pipe: Pipeline) -> None:
            retention = round(SERIES_RETENTION)
            for session_id, appended in series_appended.items():
                pipe.rpush(self.keys.idle_series(session_id), encode(appended))
                pipe.expire(self.keys.idle_series(session_id), retention)
            for session_id, points in series_rewritten.items():
                pipe.delete(self.keys.idle_series(session_id))
                if points:
                    pipe.rpush(self.keys.idle_series(session_id), *[encode(p) for p in points])
                    pipe.expire(self.keys.idle_series(session_id), retention)
            stamp = encode(checked_at)
            for session_id, verdict in verdicts.items():
                pipe.set(self.keys.idle_report(session_id), report_document(stamp, verdict), ex=ttl)
                if interval > 0:
                    add_utilization(pipe, self.keys, session_id, measured_utilization(verdict), interval)
            if windows is not None:
                pipe.delete(self.keys.idle_window_tables, self.keys.idle_windows)
                tables = windows.stored()
                if tables:
                    pipe.hset(self.keys.idle_window_tables, mapping={n: encode(t) for n, t in tables.items()})

        await write_fenced(self.redis, fence, write)

    async def publish_policy(self, fence: Fence, policy: PublishedPolicy) -> None:
        def write(pipe: Pipeline) -> None:
            pipe.hset(self.keys.idle_policy, mapping={"source": policy.source, "text": policy.text})

        await write_fenced(self.redis, fence, write)

    async def series_to_write(
        self, points: Mapping[str, SeriesPoint], lengths: dict[str, int]
    ) -> tuple[dict[str, SeriesPoint], dict[str, list[SeriesPoint]]]:
        """This sweep's ``points`` split into (session id -> point to append, session id -> whole series to write
        instead): a series grown past :func:`~domain.idle.series.needs_compaction` is read, compacted with its new
        point and rewritten. ``lengths``: session id -> its stored length, kept by the leader (unknown ones are read
        here) and updated to what :meth:`save_sweep` leaves."""
        unknown = [session_id for session_id in points if session_id not in lengths]
        if unknown:
            async with self.redis.pipeline(transaction=False) as pipe:
                for session_id in unknown:
                    pipe.llen(self.keys.idle_series(session_id))
                lengths.update(zip(unknown, await pipe.execute(), strict=True))
        appended: dict[str, SeriesPoint] = {}
        rewritten: dict[str, list[SeriesPoint]] = {}
        for session_id, new in points.items():
            if needs_compaction(lengths[session_id] + 1):
                kept = compact([*await self.series(session_id), new])
                rewritten[session_id] = kept
                lengths[session_id] = len(kept)
            else:
                appended[session_id] = new
                lengths[session_id] += 1
        return appended, rewritten

    # -- reads ------------------------------------------------------------------------------------

    async def series(self, session_id: str) -> list[SeriesPoint]:
        """A session's utilization series, oldest first (empty when none is kept); an unreadable point is skipped."""
        points = []
        for raw in await self.redis.lrange(self.keys.idle_series(session_id), 0, -1):
            try:
                points.append(decode(raw, SeriesPoint))
            except ValueError as exc:
                log.warning("session=%s utilization series point unreadable, skipped: %s", session_id, exc)
        return points

    async def load_windows(self) -> WindowColumns:
        """The saved windows; a malformed table or window is skipped (its sessions start those series afresh)."""
        raw = text_hash(await self.redis.hgetall(self.keys.idle_window_tables))
        if not raw:
            return WindowColumns.of(await self._load_windows_saved_one_by_one())
        tables = []
        for name, text in raw.items():
            try:
                tables.append(decode(text, WindowTableDoc))
            except ValueError as exc:
                log.warning("saved utilization windows %s unreadable, starting them afresh: %s", name, exc)
        columns, problems = WindowColumns.from_stored(tables)
        for problem in problems:
            log.warning("saved utilization windows %s, starting them afresh", problem)
        return columns

    async def _load_windows_saved_one_by_one(self) -> dict[str, UtilizationWindow]:
        raw = text_hash(await self.redis.hgetall(self.keys.idle_windows))
        windows = {}
        for session_id, text in raw.items():
            try:
                windows[session_id] = UtilizationWindow.from_doc(decode(text, WindowDoc))
            except ValueError as exc:
                log.warning("session=%s saved utilization window unreadable, starting afresh: %s", session_id, exc)
        return windows

    async def verdict(self, session_id: str) -> StoredVerdict | None:
        raw = optional_text(await self.redis.get(self.keys.idle_report(session_id)))
        return _stored_verdict(raw) if raw is not None else None

    async def verdicts(self, session_ids: Sequence[str]) -> list[StoredVerdict | None]:
        """Several sessions' last verdicts in one round trip (MGET), in the order asked."""
        if not session_ids:
            return []
        raws = optional_texts(await self.redis.mget([self.keys.idle_report(i) for i in session_ids]))
        return [_stored_verdict(raw) if raw is not None else None for raw in raws]

    async def published_policy(self) -> tuple[PublishedPolicy, IdlePolicyConfig] | None:
        """The policy in force, or None while no idle checker has led yet."""
        doc = text_hash(await self.redis.hgetall(self.keys.idle_policy))
        if "text" not in doc:
            return None
        published = PublishedPolicy(source=doc.get("source", ""), text=doc["text"])
        return published, _parsed(published.text, published.source)


def measured_utilization(verdict: Verdict) -> dict[str, float]:
    """The utilization check's measured averages (percent) of a verdict, by metric (none when it measured none)."""
    return {
        reading.metric: reading.average
        for report in verdict.reports
        if report.name is CheckName.UTILIZATION
        for reading in report.readings
        if reading.average is not None
    }


def _stored_verdict(raw: str) -> StoredVerdict:
    report = decode(raw, ReportDoc)
    return StoredVerdict(checked_at=report["checked_at"], verdict=Verdict.from_dict(report))


@lru_cache(maxsize=8)
def _parsed(text: str, source: str) -> IdlePolicyConfig:
    # the checker published only text it parsed, so this does not fail; cached: the gateway asks per request
    return parse_policy(text, source, published=True)
