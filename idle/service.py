"""The idle checker service (``caravan idle``): reclaims RUNNING sessions its policy finds idle.

Exactly one instance is active across processes: it holds a Redis lease (as the scheduler does) and
every write it makes carries the lease's fencing token. While leading it sweeps every ``check_interval``
of the policy in force:

1. reload the policy file if it changed (:mod:`idle.reload`; SIGHUP asks for this at once);
2. judge every RUNNING session (:class:`idle.sweeper.Sweeper`, which keeps the sweep's state): lifetime from
   RUNNING, network idleness from the activity the gateway records, utilization from Nomad's allocation stats;
3. store each verdict as the session's idle report (GraphQL ``idleChecks``), and every
   ``window_persist_interval`` the utilization windows, for the next leader;
4. reclaim the sessions found idle through the one termination path (``domain.termination``, written by
   ``SessionStore.request_termination``): TERMINATING with the reason (``idle-session-lifetime``, ``idle-timeout``,
   ``idle-utilization``), a fenced write that also asks the scheduler's job owner to stop the job (the idle
   checker writes nothing to Nomad). The scheduler's follower moves the session to TERMINATED keeping that reason.

Windows live in the leader's memory between saves; a new leader starts from the last save.

Between sweeps the leader holds every session's utilization window (as numpy arrays, ``domain.idle.columns``), the
sessions' views and what the sweep derived from them: long-lived objects Python's cyclic garbage collector would
otherwise walk again and again while a sweep allocates (a cost ``bench/idle`` measured: bench/README.md).
:func:`settle` moves them out of its reach (``gc.freeze``) after the windows are loaded and after each sweep; every
:data:`FULL_COLLECTION_INTERVAL` of a term it first collects in full, so
cyclic garbage frozen meanwhile is freed within minutes. Reference counting frees everything else as usual. The service
runs in a process of its own (``caravan idle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.lease import Fence, Lease, lead_forever
from core.retry import forever
from core.settings import Settings
from domain.idle.facts import SessionView
from domain.idle.verdict import Verdict
from domain.scheduling_config import load_scheduling_config
from idle.reload import PolicySource
from idle.sweeper import Sweeper
from nomad_jobs.client import NomadClient
from stores.activity import forget_activity
from stores.idle import IdleStore, report_ttl
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

FULL_COLLECTION_INTERVAL = 600.0
"""Seconds between two full garbage collections of the leader (:func:`settle`)."""


@dataclass
class Term:
    """What one leadership term keeps between sweeps."""

    fence: Fence
    sweeper: Sweeper
    """The sweep and what it keeps between sweeps: the windows, the views, what was derived from them."""
    saved_at: float = field(default_factory=time.monotonic)
    """When the windows were last saved."""
    collected_at: float = field(default_factory=time.monotonic)
    """When :func:`settle` last collected in full."""
    series_lengths: dict[str, int] = field(default_factory=dict)
    """Session id -> points in its stored utilization series (``stores.idle.IdleStore.series_to_write``)."""


def settle(*, collect: bool) -> None:
    """Put everything alive now out of the cyclic collector's reach (``collect``: after a full collection)."""
    if collect:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


class IdleService:
    def __init__(
        self,
        settings: Settings,
        redis: Redis,
        nomad: NomadClient,
        *,
        policy: PolicySource | None = None,
    ) -> None:
        """Raises :class:`domain.idle.policy_file.PolicyFileError` when the policy file is broken at start, and
        :class:`domain.scheduling_config.SchedulingConfigError` when the scheduling configuration is (its device names
        name the device metrics)."""
        self.settings = settings
        self.keys = Keys(settings.redis.prefix)
        self.store = SessionStore(redis, self.keys, usage_retention=settings.usage_raw_retention)
        self.idle_store = IdleStore(redis, self.keys)
        self.nomad = nomad
        self.devices = load_scheduling_config(settings.scheduler.config_path).devices  # the operator's device names
        self.policy = policy or PolicySource(settings.idle.policy_path, self.devices)
        self.lease = Lease(redis, self.keys.idle_lease, self.keys.idle_fence, ttl=settings.idle.lease_ttl)
        self._wake = asyncio.Event()

    def request_reload(self) -> None:
        """Re-read the policy file now rather than at the next sweep (the SIGHUP handler)."""
        self._wake.set()

    async def run_forever(self) -> None:
        try:
            await lead_forever("idle checker", self.lease, self.lead)
        finally:
            # a standby takes over at once instead of after the lease's TTL
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.lease.release()

    async def lead(self, fence: Fence) -> None:
        windows = await self.idle_store.load_windows()
        sweeper = Sweeper(
            self.store, self.nomad, windows=windows, concurrency=self.settings.idle.stats_concurrency,
            devices=self.devices,
        )  # fmt: skip
        term = Term(fence=fence, sweeper=sweeper)
        # frozen, not collected: a full collection walks the whole heap with the event loop blocked, and the lease
        # (renewed on that loop) could lapse meanwhile; the first one comes FULL_COLLECTION_INTERVAL later
        settle(collect=False)
        await self.idle_store.publish_policy(fence, self.policy.published)
        await forever("idle sweep", lambda: self._sweep_and_wait(term))

    async def _sweep_and_wait(self, term: Term) -> None:
        started = time.monotonic()
        if self.policy.refresh():
            await self.idle_store.publish_policy(term.fence, self.policy.published)
        await self.sweep(term)
        pause = self.policy.config.check_interval - (time.monotonic() - started)
        # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives as the event is set
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(pause, 0.0)):
                await self._wake.wait()
        self._wake.clear()

    async def sweep(self, term: Term) -> None:
        now = utcnow()
        config = self.policy.config
        live_ids, sessions, verdicts, points = await term.sweeper.sweep(now, config)
        appended, rewritten = await self.idle_store.series_to_write(points, term.series_lengths)
        save_windows = time.monotonic() - term.saved_at >= self.settings.idle.window_persist_interval
        await self.idle_store.save_sweep(
            term.fence,
            checked_at=now,
            verdicts=verdicts,
            ttl=report_ttl(config.check_interval),
            windows=term.sweeper.windows if save_windows else None,
            interval=config.check_interval,
            series_appended=appended,
            series_rewritten=rewritten,
        )
        for gone in term.series_lengths.keys() - set(live_ids):
            del term.series_lengths[gone]
        if save_windows:
            term.saved_at = time.monotonic()
            await forget_activity(self.store.redis, self.keys, keep=set(live_ids), now=now)
        for session in sessions:
            await self._reclaim_if_idle(term, session, verdicts[session.id])
        collect = time.monotonic() - term.collected_at >= FULL_COLLECTION_INTERVAL
        settle(collect=collect)
        if collect:
            term.collected_at = time.monotonic()

    async def _reclaim_if_idle(self, term: Term, session: SessionView, verdict: Verdict) -> None:
        if verdict.reason is None:
            return
        reason = verdict.reason.value
        after = await self.store.request_termination(session.id, reason=reason, at=utcnow(), fence=term.fence)
        if after is not None and after.status_info == reason:
            expired = next(r for r in verdict.reports if r.expired)
            log.info("session=%s reclaimed: %s (%s)", session.id, reason, expired.note or expired.name.value)
