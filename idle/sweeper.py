"""The idle sweep and the state it keeps from one sweep to the next, for one leadership term.

A :class:`Sweeper` holds every session's utilization window (``domain.idle.columns``), the sessions' views
(:class:`idle.views.ViewCache`), what the last sweep derived from each view (:class:`idle.sweep.Derived`) and the
sessions as its verdicts took them (``domain.idle.arbiter.Batch``). Each :meth:`Sweeper.sweep` reads the live sessions
(the sessions the change feed names since the last sweep, ``stores.session_changes``, or every live one at a term's
start, every :data:`RESYNC_INTERVAL` and when the feed has a gap; only the documents whose revision changed are
decoded again), works out how each RUNNING one is judged under the
policy file in force (:func:`idle.sweep.planned`: once per view and file), gathers the facts (the sampled sessions'
allocation stats from Nomad, the activity the gateway records, SFTP clients seen, the owners' limits) and judges them
(:func:`idle.sweep.judge`, pure). Leadership, reloading the policy, saving and reclaiming are the service's
(:mod:`idle.service`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import NamedTuple

from devices.catalog import DeviceCatalog
from domain import sftp
from domain.idle.arbiter import Batch
from domain.idle.columns import WindowColumns
from domain.idle.config import IdlePolicyConfig
from domain.idle.facts import Activity, SessionView
from domain.idle.network import NetReading
from domain.idle.series import SeriesPoint, due
from domain.idle.verdict import Verdict
from idle.collect import Sample, collect_clients_seen, collect_network, collect_samples
from idle.sweep import Derived, chart_points, judge, planned
from idle.views import ViewCache
from nomad_jobs.client import NomadClient
from stores.activity import read_activity
from stores.resource_policies import PolicyStore
from stores.session_changes import Follower
from stores.sessions import SessionStore

NO_ACTIVITY = Activity(None, 0)
RESYNC_INTERVAL = timedelta(minutes=10)
"""How long a term follows the change feed before a sweep reads every live session again (a safety net: the feed
gives up by itself when it cannot vouch for what changed, ``stores.session_changes``)."""
FEED_READ_LIMIT = 20_000
"""Changes (writes) since the last sweep above which the sweep reads everything instead."""


class Swept(NamedTuple):
    """What one sweep found."""

    live_ids: list[str]
    """Every live session's id (RUNNING or not)."""
    sessions: list[SessionView]
    """The RUNNING sessions, judged."""
    verdicts: dict[str, Verdict]
    """Session id -> verdict, for each of :attr:`sessions`."""
    points: dict[str, SeriesPoint]
    """Session id -> this sweep's point of its utilization series (``domain.idle.series``): each kernel's own sample
    and the thresholds judged, for the sampled sessions some kernel of which answered."""


class Sweeper:
    def __init__(
        self,
        store: SessionStore,
        nomad: NomadClient,
        *,
        windows: WindowColumns,
        concurrency: int,
        devices: DeviceCatalog | None = None,
    ) -> None:
        """``windows``: the last saved windows (``stores.idle.IdleStore.load_windows``); ``concurrency``: at most
        this many Nomad requests at once; ``devices``: the operator's device names (they name the device metrics)."""
        self.store = store
        self.policies = PolicyStore(store.redis, store.keys)
        self.nomad = nomad
        self.concurrency = concurrency
        self.devices = devices
        self.windows = windows
        """Every checked session's utilization window, recorded into by each sweep."""
        self.views = ViewCache()
        """The sessions read last sweep: only changed documents are decoded again."""
        self.derived: Mapping[str, Derived] = {}
        """What the last sweep derived from each session (:func:`idle.sweep.judge`)."""
        self.batch: Batch | None = None
        """The sessions as the last sweep's verdicts took them (:func:`idle.sweep.judge`)."""
        self.sweeps = 0
        """Sweeps so far in this term (whose turn it is to get a point of its utilization series)."""
        self.net_readings: dict[str, NetReading] = {}
        """Allocation id -> the last reading of its network counters (``domain.idle.network``), for the next rate."""
        self.feed = Follower(store.redis, store.keys, resync_every=RESYNC_INTERVAL, limit=FEED_READ_LIMIT)
        """Where the last sweep stopped reading the change feed (``stores.session_changes``), and how many sweeps
        of this term read every live session."""

    async def sweep(self, now: datetime, config: IdlePolicyConfig) -> Swept:
        """Verdicts on every RUNNING session at ``now`` under ``config``, with this sweep's samples recorded."""
        live_ids, sessions = await self._read_live(now)
        derived_of = self.derived.get
        plans = {s.id: planned(config, s, derived_of(s.id)) for s in sessions}
        sweep = self.sweeps + 1
        # the checked sessions every sweep (their windows), every other one on its chart turn only (its series): each
        # running session is charted, and an unchecked one costs a stats read every SWEEPS_PER_POINT sweeps
        charted = [s for s in sessions if due(s.id, sweep)]
        checked = [s for s, (_, plan) in zip(sessions, plans.values(), strict=True) if plan.metrics]
        sampled = checked + [s for s in charted if not plans[s.id][1].metrics] if checked else charted
        in_flight = asyncio.Semaphore(self.concurrency)  # every Nomad request of the sweep, stats and SFTP alike
        redis, keys = self.store.redis, self.store.keys
        per_kernel: dict[str, dict[str, Sample]] = {}
        samples, network, activity, limits, clients = await asyncio.gather(
            collect_samples(self.nomad, sampled, limit=in_flight, devices=self.devices, per_kernel=per_kernel),
            collect_network(self.nomad, charted, self.net_readings, limit=in_flight),
            read_activity(redis, keys, [s.id for s in sessions], now),
            self.policies.limits_of(sessions),
            collect_clients_seen(self.nomad, sessions, limit=in_flight),
        )
        if network or self.net_readings:  # the allocations gone are forgotten
            live = {k.alloc_id for s in sessions for k in s.kernels}
            self.net_readings = {a: r for a, r in self.net_readings.items() if a in live}
        for session_id, kernels in network.items():  # a new dict per kernel: the sample itself is the session's too
            charts = per_kernel.setdefault(session_id, {})
            for hostname, rates in kernels.items():
                charts[hostname] = {**charts.get(hostname, {}), **rates}
        for session_id, seen_at in clients.items():  # SFTP traffic, seen by the session's own server
            known = activity.get(session_id, NO_ACTIVITY)
            activity[session_id] = known.with_client_seen(seen_at, now=now, connected_within=sftp.CONNECTED_WITHIN)
        result = judge(
            now=now,
            sessions=sessions,
            config=config,
            windows=self.windows,
            activity=activity,
            samples=samples,
            limits=limits,
            derived={session_id: known for session_id, (known, _) in plans.items()},
            batch=self.batch,
        )
        self.windows, self.derived, self.batch = result.windows, result.derived, result.batch
        self.sweeps = sweep
        return Swept(live_ids, sessions, result.verdicts, chart_points(sweep, now, per_kernel, plans))

    async def _read_live(self, now: datetime) -> tuple[list[str], list[SessionView]]:
        """Every live session's id, and the RUNNING ones' views: only what the change feed names since the last sweep
        read, or everything (a new term's first sweep, every :data:`RESYNC_INTERVAL`, or when the feed cannot vouch
        for what changed)."""
        changed = await self.feed.changed(now)
        if changed is not None:
            ids = sorted(changed)
            revisions = await self.store.revisions(ids)  # first: a document read after is at least as new
            self.views.apply(ids, revisions, await self.store.documents(ids))
            self.feed.caught_up()
            return self.views.live()
        await self.feed.resyncing(now)
        live_ids = sorted(await self.store.live_ids())
        # the view, not whole sessions: the sweep reads a dozen fields of each, and reads and decodes only the
        # documents whose revision changed (the revisions first: a document read after is at least as new)
        revisions = await self.store.revisions(live_ids)
        stale = self.views.stale(live_ids, revisions)
        read = dict(zip(stale, await self.store.documents(stale), strict=True))
        self.views.views(live_ids, [read.get(i) for i in live_ids], revisions)
        self.feed.caught_up()
        return live_ids, self.views.live()[1]
