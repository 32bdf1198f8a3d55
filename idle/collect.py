"""One utilization sample per session, from Nomad's allocation stats of each of its kernels.

Each kernel is one allocation (``Kernel.alloc_id``); its stats are normalized by what the kernel was
allocated (:func:`idle.samples.kernel_sample`) and the session's sample is the mean over the kernels
that answered. A kernel whose stats cannot be read (no allocation yet, collected by Nomad, its node
unreachable) is left out: the window sees a gap rather than fake idleness.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import datetime

from core.errors import PermanentError, TransientError
from devices.catalog import DeviceCatalog
from domain import sftp
from domain.idle.facts import SweptKernel, SweptSession, kernel_allocation
from domain.idle.network import NET_STATS_FILE, NetReading, net_rates, parse_net_stats
from domain.model import SessionType
from idle.samples import kernel_sample, session_sample
from nomad_jobs.client import NomadClient

log = logging.getLogger(__name__)

Sample = dict[str, float]

UNMEASURED_WARNING_INTERVAL = 600.0
"""Seconds between two warnings that Nomad measured nothing for some allocations (a client misconfigured)."""
_warned_at: float | None = None


def _warn_unmeasured(alloc_ids: Sequence[str], now: float) -> None:
    global _warned_at
    if _warned_at is not None and now - _warned_at < UNMEASURED_WARNING_INTERVAL:
        return
    _warned_at = now
    log.warning(
        "Nomad measured nothing for %d allocation(s) (e.g. %s): their clients keep no allocation statistics; set "
        "telemetry { publish_allocation_metrics = true } in those Nomad clients' configuration, or utilization "
        "stays unknown (never read as idle)",
        len(alloc_ids),
        alloc_ids[0],
    )


async def collect_clients_seen(
    nomad: NomadClient, sessions: Sequence[SweptSession], *, limit: asyncio.Semaphore
) -> dict[str, datetime]:
    """Session id -> when its SFTP server last saw a client connected (``domain.sftp.ACTIVITY_FILE``'s modification
    time), for the SYSTEM sessions among ``sessions`` (the only SYSTEM sessions are SFTP servers) whose server saw
    one at all: their traffic never passes through the gateway. ``limit``: the sweep's bound on Nomad requests in
    flight, shared with :func:`collect_samples`."""

    async def seen(session: SweptSession) -> datetime | None:
        alloc_ids = [k.alloc_id for k in session.kernels if k.alloc_id is not None]
        if not alloc_ids:
            return None
        async with limit:
            try:
                return await nomad.file_modified(alloc_ids[0], sftp.ACTIVITY_FILE)
            except (TransientError, PermanentError) as exc:  # not touched yet (no client so far), or unreachable
                log.debug("session=%s no SFTP client seen: %s", session.id, exc)
                return None

    servers = [s for s in sessions if s.type is SessionType.SYSTEM]
    found = await asyncio.gather(*(seen(s) for s in servers))
    return {session.id: at for session, at in zip(servers, found, strict=True) if at is not None}


async def collect_samples(
    nomad: NomadClient,
    sessions: Sequence[SweptSession],
    *,
    limit: asyncio.Semaphore,
    devices: DeviceCatalog | None = None,
    per_kernel: dict[str, dict[str, Sample]] | None = None,
) -> dict[str, Sample]:
    """Session id -> metric -> percent; a session none of whose kernels answered maps to ``{}``. ``limit``: the
    sweep's bound on Nomad requests in flight, shared with :func:`collect_clients_seen`; ``per_kernel``: filled with
    session id -> kernel hostname -> its own sample, for each kernel that answered (the session page's charts)."""

    async def kernel(session: SweptSession, kernel: SweptKernel) -> Sample | None:
        if kernel.alloc_id is None:
            return None
        async with limit:
            try:
                stats = await nomad.alloc_stats(kernel.alloc_id)
            except (TransientError, PermanentError) as exc:
                log.debug("session=%s kernel=%s no stats: %s", session.id, kernel.hostname, exc)
                return None
        cores, memory = kernel_allocation(kernel)
        sample = kernel_sample(stats, cores=cores, memory_bytes=memory, devices=devices)
        if not sample:
            unmeasured.append(kernel.alloc_id)
        elif per_kernel is not None:
            per_kernel.setdefault(session.id, {})[kernel.hostname] = sample
        return sample

    async def one(session: SweptSession, placed: list[SweptKernel]) -> Sample:
        if len(placed) == 1:  # most sessions: no task of its own per kernel
            sample = await kernel(session, placed[0])
            return session_sample([sample] if sample is not None else [])
        samples = await asyncio.gather(*(kernel(session, k) for k in placed))
        return session_sample([s for s in samples if s is not None])  # a list: one kernel takes the short path

    unmeasured: list[str] = []
    # only kernels with an allocation are asked: at 100,000 sessions a coroutine for each of the others was most of
    # a steady sweep (bench/scale_redis)
    asked = [(s, placed) for s in sessions if (placed := [k for k in s.kernels if k.alloc_id is not None])]
    found = await asyncio.gather(*(one(s, placed) for s, placed in asked))
    if unmeasured:
        _warn_unmeasured(unmeasured, time.monotonic())
    samples: dict[str, Sample] = {session.id: {} for session in sessions}
    samples.update((session.id, sample) for (session, _), sample in zip(asked, found, strict=True))
    return samples


async def collect_network(
    nomad: NomadClient,
    sessions: Sequence[SweptSession],
    readings: dict[str, NetReading],
    *,
    limit: asyncio.Semaphore,
) -> dict[str, dict[str, Sample]]:
    """Session id -> kernel hostname -> its network I/O since its last reading (``domain.idle.network``: bytes per
    second received and sent), for the kernels of ``sessions`` whose counters were read now and earlier. ``readings``:
    allocation id -> its last reading, updated in place (the caller forgets the allocations gone). A kernel with no
    counters (not on the session network, just started, its node unreachable) is left out. ``limit``: the sweep's
    bound on Nomad requests in flight."""

    async def kernel(kernel: SweptKernel, alloc_id: str) -> dict[str, float]:
        async with limit:
            try:
                text = await nomad.read_file(alloc_id, NET_STATS_FILE)
            except (TransientError, PermanentError) as exc:
                log.debug("kernel=%s no network counters: %s", kernel.hostname, exc)
                return {}
        reading = parse_net_stats(text.decode(errors="replace"))
        if reading is None:
            return {}
        rates = net_rates(readings.get(alloc_id), reading)
        readings[alloc_id] = reading
        return rates

    pairs = [(s.id, k, k.alloc_id) for s in sessions for k in s.kernels if k.alloc_id is not None]
    found = await asyncio.gather(*(kernel(k, alloc_id) for _, k, alloc_id in pairs))
    rates: dict[str, dict[str, Sample]] = {}
    for (session_id, k, _), measured in zip(pairs, found, strict=True):
        if measured:
            rates.setdefault(session_id, {})[k.hostname] = measured
    return rates
