"""What the idle checker keeps in Redis: last verdicts, utilization windows, the policy it enforces.

* **Reports** (``Keys.idle_report``): each sweep's verdict per session with the time it was reached,
  expiring after :func:`report_ttl`; the gateway serves them as ``idleChecks`` and never recomputes.
* **Windows** (``Keys.idle_windows``): the leader keeps windows in memory (a JSON round trip per session
  per sweep would cost more than the decisions) and saves them now and then, so a new leader resumes
  with full windows instead of waiting a whole window to judge again.
* **Policy** (``Keys.idle_policy``): the text and source of the policy in force, so the gateway shows
  the effective policy the checker actually enforces, even while a broken file is being refused.

The checker's writes carry its fencing token (:func:`core.lease.write_fenced`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.keys import Keys
from core.lease import Fence, write_fenced
from core.replies import optional_text, optional_texts, text_hash
from domain.idle.columns import WindowColumns
from domain.idle.config import IdlePolicyConfig
from domain.idle.policy_file import parse_policy
from domain.idle.verdict import Verdict, VerdictDoc
from domain.idle.window import UtilizationWindow, WindowDoc

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
        windows: Mapping[str, UtilizationWindow] | None = None,
        forget_windows: Collection[str] = (),
    ) -> None:
        """One sweep's reports, and (when given) the windows to save and those to drop, in one transaction."""

        def write(pipe: Pipeline) -> None:
            stamp = encode(checked_at)
            for session_id, verdict in verdicts.items():
                pipe.set(self.keys.idle_report(session_id), report_document(stamp, verdict), ex=ttl)
            if forget_windows:
                pipe.hdel(self.keys.idle_windows, *forget_windows)
            if windows:
                stored = (
                    windows.encoded()
                    if isinstance(windows, WindowColumns)
                    else {i: encode(w.to_doc()) for i, w in windows.items()}
                )
                pipe.hset(self.keys.idle_windows, mapping={i: text for i, text in stored.items()})

        await write_fenced(self.redis, fence, write)

    async def publish_policy(self, fence: Fence, policy: PublishedPolicy) -> None:
        def write(pipe: Pipeline) -> None:
            pipe.hset(self.keys.idle_policy, mapping={"source": policy.source, "text": policy.text})

        await write_fenced(self.redis, fence, write)

    # -- reads ------------------------------------------------------------------------------------

    async def load_windows(self) -> dict[str, UtilizationWindow]:
        """The saved windows; a malformed one is skipped (that session starts a fresh window)."""
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


def _stored_verdict(raw: str) -> StoredVerdict:
    report = decode(raw, ReportDoc)
    return StoredVerdict(checked_at=report["checked_at"], verdict=Verdict.from_dict(report))


@lru_cache(maxsize=8)
def _parsed(text: str, source: str) -> IdlePolicyConfig:
    # the checker published only text it parsed, so this does not fail; cached: the gateway asks per request
    return parse_policy(text, source, published=True)
