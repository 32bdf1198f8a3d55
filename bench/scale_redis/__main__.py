"""100,000 live sessions in one Redis: memory per session, the listing, the idle sweep, event fan-out and the
scheduler's snapshot read, at each of ``--sizes`` (10,000 and 100,000).

Per size, a private Redis of its own (as the stack starts it) is seeded through ``SessionStore`` as the gateway and
the scheduler write: the sessions created (``SessionStore.create``, 500 per call and owner, ``--owners`` owners, two
projects), then ``--running-share`` of them (half) taken to RUNNING by ``SessionStore.update`` (SCHEDULED, then
RUNNING, as the scheduler records them); the rest stay PENDING. Every Redis call goes through the services' own
client (``core.redis.client``: commands packed by hiredis). Then, one JSON line per size:

- ``memory_per_session_bytes``: Redis's ``used_memory`` after the seeding minus before, over the sessions (documents,
  revisions, the listing's indexes, names, the queues and event streams: everything a session costs);
- ``listing_p50_ms`` / ``listing_p99_ms``: ``--pages`` newest pages of 50 with their count, read as the ``sessions``
  query reads them (``stores.session_listing`` running ``domain.listing``'s plan), for a superadmin (one index), an
  admin of both projects (three indexes merged) and with a filter (RUNNING BATCH sessions: indexes intersected);
- ``idle_sweep_cold_s`` / ``idle_sweep_s``: ``idle.sweeper.Sweeper.sweep`` as the idle checker runs it, the first
  sweep of a leader (every document read and decoded) and the median of ``--sweeps`` steady sweeps after it, each
  with ``--churn`` (2 %) of the RUNNING sessions changed since the one before (the idle service's ``settle`` after
  each). The policy checks lifetime and network idleness, no utilization, so the sweep asks Nomad for nothing (its
  client points where nothing listens): what is timed is Redis and the sweep's own Python. A steady sweep follows
  the change feed (``stores.session_changes``): ``idle_sweep_full_reads`` counts the steady sweeps that read every
  live session all the same (0 expected), ``idle_sweep_reads_s`` what such a full read's first two reads cost (every
  live id and every revision: a term's first sweep, then every ``idle.sweeper.RESYNC_INTERVAL``);
- ``events_p50_ms`` / ``events_p99_ms``: ``--events`` status changes written through ``SessionStore.update`` while
  one ``stores.event_hub.EventHub`` follows every owner's event stream, from the start of the write (its own round
  trips included) to the follower's receipt;
- ``snapshot_first_s`` / ``snapshot_s``: ``scheduler.snapshot.SnapshotReader.read``, the scheduler's read of every
  live session before a pass, with Nomad stood in by an empty cluster (no nodes, no allocations): its Redis reads and
  decoding. The first read of a leader (everything read), then the median of ``--sweeps`` reads after it, each with
  ``--churn`` of the RUNNING sessions changed since the one before (it follows the change feed:
  ``snapshot_full_reads``, 0 expected).

The last line (``"bench": "scale_redis"``) has every size's figures, the goal (an idle sweep under 1 s at the largest
size) and ``meets_goal``.

Usage: .venv/bin/python -m bench.scale_redis [--sizes 10000 100000] [--running-share 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from redis.asyncio import Redis

from bench.gateway.__main__ import OWNERS, calibration, own_redis, stored_session
from caravan.stack.processes import free_port
from core.keys import Keys
from core.redis import client as redis_client
from core.settings import NomadSettings, RedisSettings
from domain.access import Scope
from domain.idle.columns import WindowColumns
from domain.idle.config import CheckName, IdlePolicyConfig
from domain.lifecycle import transition
from domain.listing import ListingFilter, ListingOrder, plan_listing
from domain.model import Session, SessionStatus, SessionType
from domain.scheduling_config import SchedulingConfig
from idle.service import settle
from idle.sweeper import Sweeper
from nomad_jobs.client import NomadClient
from scheduler.snapshot import SnapshotReader
from stores.event_hub import EventHub
from stores.resource_policies import PolicyStore
from stores.session_listing import SessionListing
from stores.sessions import SessionStore

S = SessionStatus
GOAL_SWEEP_S = 1.0
"""Issue 30: the idle sweep over the largest size under one second."""
CONCURRENCY = 64
"""Updates in flight while seeding (each its own WATCH/MULTI, as the scheduler's)."""
LISTINGS = {
    "superadmin": (Scope(everything=True), ListingFilter()),
    "admin": (Scope(everything=False, owners=("user-000",), projects=("default", "research")), ListingFilter()),
    "filtered": (Scope(everything=True), ListingFilter(statuses=frozenset({S.RUNNING}), type=SessionType.BATCH)),
}


class EmptyCluster:
    """Stands in for Nomad in the snapshot read: a cluster with no nodes and no allocations (what is timed is the
    read of the sessions from Redis, not Nomad's answers)."""

    async def nodes(self) -> list[dict[str, Any]]:
        return []

    async def live_allocations(self) -> list[dict[str, Any]]:
        return []

    async def namespace_capabilities(self) -> dict[str, Any]:
        return {}


async def gather_limited(calls: list[Callable[[], Awaitable[Any]]], limit: int = CONCURRENCY) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


@dataclasses.dataclass
class Timed:
    wall: float = 0.0
    cpu: float = 0.0
    """This process's CPU seconds (user and system): the reader's own work, whatever else loads the machine."""


@contextlib.contextmanager
def timed() -> Iterator[Timed]:
    """The wall and CPU time of the block (filled in when it ends)."""
    figures = Timed()
    wall, cpu = time.perf_counter(), time.process_time()
    yield figures
    figures.wall, figures.cpu = time.perf_counter() - wall, time.process_time() - cpu


async def churned(store: SessionStore, session_ids: list[str]) -> None:
    """Each of these sessions written once (its document changed), as between two sweeps or passes."""
    await gather_limited(
        [lambda i=i: store.update(i, lambda s: dataclasses.replace(s, retries=s.retries + 1)) for i in session_ids]
    )


async def used_memory(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def advance(store: SessionStore, session_id: str, *targets: SessionStatus, at: datetime) -> None:
    def step(session: Session) -> Session:
        for target in targets:
            session = transition(session, target, reason="bench", at=at)
        return session

    await store.update(session_id, step)


async def seed(store: SessionStore, count: int, running_share: float) -> tuple[list[str], float]:
    """``count`` sessions created, ``running_share`` of them made RUNNING; their ids (RUNNING ones first) and the
    seconds it took."""
    started = time.perf_counter()
    by_owner: dict[str, list[Session]] = {}
    for i in range(count):
        session = stored_session(i)
        by_owner.setdefault(session.owner_id, []).append(session)
    ids: list[str] = []
    for sessions in by_owner.values():
        for start in range(0, len(sessions), 500):
            ids += [s.id for s in await store.create(sessions[start : start + 500])]
    running = ids[: int(len(ids) * running_share)]
    at = datetime.now(UTC)
    await gather_limited([lambda i=i: advance(store, i, S.SCHEDULED, S.RUNNING, at=at) for i in running])
    return ids, time.perf_counter() - started


async def listing_times(store: SessionStore, pages: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, (scope, wanted) in LISTINGS.items():
        plan = plan_listing(store.keys, scope, wanted, ListingOrder.CREATED_AT_DESC)
        listing: SessionListing[str] = SessionListing(store, lambda raw: raw)
        times = []
        for _ in range(pages):
            started = time.perf_counter()
            page = await listing.page(plan, size=50, count=True)
            times.append(time.perf_counter() - started)
            assert len(page.entries) == 50, f"{name}: a page of {len(page.entries)}"
        figures[name] = {
            "p50_ms": round(statistics.median(times) * 1000, 2),
            "p99_ms": round(percentile(times, 0.99) * 1000, 2),
        }
    return figures


async def sweep_times(store: SessionStore, running: list[str], sweeps: int, churn: float) -> dict[str, float]:
    nowhere = NomadClient(NomadSettings(addr=f"http://127.0.0.1:{free_port()}"))  # never called: no utilization
    config = IdlePolicyConfig(
        source="bench", enabled=frozenset({CheckName.SESSION_LIFETIME, CheckName.NETWORK_TIMEOUT})
    )
    sweeper = Sweeper(store, nowhere, windows=WindowColumns(), concurrency=8)
    rng = random.Random(1)
    try:
        with timed() as cold:
            swept = await sweeper.sweep(datetime.now(UTC), config)
        assert len(swept.sessions) == len(running), (len(swept.sessions), len(running))
        settle(collect=True)
        warm = []
        for _ in range(sweeps):
            await churned(store, rng.sample(running, int(len(running) * churn)))
            with timed() as steady:
                await sweeper.sweep(datetime.now(UTC), config)
            warm.append(steady)
            settle(collect=False)
        started = time.perf_counter()
        await store.revisions(sorted(await store.live_ids()))
        reads = time.perf_counter() - started
        full_reads = sweeper.feed.full_reads - 1  # the steady sweeps' (the first reads everything)
    finally:
        await nowhere.aclose()
        gc.unfreeze()
    return {
        "idle_sweep_cold_s": round(cold.wall, 3),
        "idle_sweep_cold_cpu_s": round(cold.cpu, 3),
        "idle_sweep_s": round(statistics.median(t.wall for t in warm), 3),
        "idle_sweep_cpu_s": round(statistics.median(t.cpu for t in warm), 3),
        "idle_sweep_max_s": round(max(t.wall for t in warm), 3),
        "idle_sweep_reads_s": round(reads, 3),
        "idle_sweep_full_reads": full_reads,
    }


async def event_times(store: SessionStore, running: list[str], count: int) -> dict[str, Any]:
    hub = EventHub(store.redis)
    received: dict[str, float] = {}
    arrived = asyncio.Event()

    async def follow(owner: str) -> None:
        async with hub.follower(store.keys.owner_events(owner)) as follower:
            while True:
                event = await follower.queue.get()
                if event is not None:
                    received.setdefault(event.session_id, time.perf_counter())
                    arrived.set()

    followers = [asyncio.create_task(follow(f"user-{o:03d}")) for o in range(OWNERS)]
    await asyncio.sleep(0.5)  # every follower joined, the reader's XREAD includes every stream
    written: dict[str, float] = {}
    try:
        for session_id in running[:count]:
            written[session_id] = time.perf_counter()
            await advance(store, session_id, S.TERMINATING, at=datetime.now(UTC))
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + 10
        while len(received.keys() & written.keys()) < len(written) and time.monotonic() < deadline:
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 1)
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        await hub.aclose()
    lags = [received[i] - written[i] for i in written if i in received]
    return {
        "events_p50_ms": round(statistics.median(lags) * 1000, 2),
        "events_p99_ms": round(percentile(lags, 0.99) * 1000, 2),
        "events_missed": len(written) - len(lags),
    }


async def snapshot_time(store: SessionStore, running: list[str], reads: int, churn: float) -> dict[str, Any]:
    reader = SnapshotReader(
        store, PolicyStore(store.redis, store.keys), cast(NomadClient, EmptyCluster()), SchedulingConfig(), "caravan-"
    )
    rng = random.Random(2)
    with timed() as first:
        read = await reader.read(datetime.now(UTC) - timedelta(seconds=1))
    times = []
    for _ in range(reads):
        await churned(store, rng.sample(running, int(len(running) * churn)))
        with timed() as steady:
            read = await reader.read(datetime.now(UTC) - timedelta(seconds=1))
        times.append(steady)
    return {
        "snapshot_first_s": round(first.wall, 3),
        "snapshot_first_cpu_s": round(first.cpu, 3),
        "snapshot_s": round(statistics.median(t.wall for t in times), 3),
        "snapshot_cpu_s": round(statistics.median(t.cpu for t in times), 3),
        "snapshot_full_reads": reader.feed.full_reads - 1,
        "snapshot_pending": len(read.snapshot.pending),
        "snapshot_live": len(read.sessions),
    }


async def measure(settings: RedisSettings, args: argparse.Namespace, size: int) -> dict[str, Any]:
    redis = redis_client(settings)  # the services' client (commands packed by hiredis)
    store = SessionStore(redis, Keys(settings.prefix))
    try:
        before = await used_memory(redis)
        ids, seeded_s = await seed(store, size, args.running_share)
        after = await used_memory(redis)
        running = ids[: int(len(ids) * args.running_share)]
        figures: dict[str, Any] = {
            "sessions": size,
            "running": len(running),
            "seed_s": round(seeded_s, 1),
            "used_memory_mb": round(after / 2**20, 1),
            "memory_per_session_bytes": round((after - before) / size),
            "listing": await listing_times(store, args.pages),
        }
        figures.update(await sweep_times(store, running, args.sweeps, args.churn))
        figures.update(await snapshot_time(store, running, args.sweeps, args.churn))
        figures.update(await event_times(store, running, args.events))
        return figures
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--running-share", type=float, default=0.5, help="share of the sessions made RUNNING")
    parser.add_argument("--pages", type=int, default=200, help="pages read per listing")
    parser.add_argument("--sweeps", type=int, default=5, help="steady idle sweeps after the first")
    parser.add_argument("--churn", type=float, default=0.02, help="share of RUNNING sessions changed between sweeps")
    parser.add_argument("--events", type=int, default=200, help="status changes followed through the event hub")
    args = parser.parse_args()
    print(json.dumps({"machine": calibration()}), flush=True)
    results = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-scale-redis-") as tmp:
            prefix = "scale" + uuid.uuid4().hex[:8]
            service, settings = own_redis(Path(tmp), prefix)
            try:
                figures = asyncio.run(measure(settings.for_role("admin").redis, args, size))
            finally:
                service.stop()
        figures["loadavg_1m"] = round(os.getloadavg()[0], 2)
        results.append(figures)
        print(json.dumps(figures), flush=True)
    largest = max(results, key=lambda r: r["sessions"])
    print(
        json.dumps(
            {
                "bench": "scale_redis",
                "sizes": results,
                "goal": {"idle_sweep_s": GOAL_SWEEP_S, "at_sessions": largest["sessions"]},
                "meets_goal": largest["idle_sweep_s"] < GOAL_SWEEP_S,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
