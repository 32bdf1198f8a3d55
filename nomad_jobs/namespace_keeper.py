"""``namespace-keeper``: keeps a Nomad client's pool of network namespaces made ahead (``node_plugins.namespace_pool``).

A kernel's start on the session network is mostly its namespace, made at launch (docs/environments.md). The keeper,
one per Nomad client host, keeps ``size`` namespaces made ahead and free, each in the SET
``Keys.namespace_pool(<node id>)`` (added once, when made, never again). At placement the scheduler claims one for a
single-kernel docker session with ``SPOP`` (atomic: no two sessions are handed the same) and renders the kernel's task
into it (``network_mode = "container:<name>"``, ``nomad_jobs.kernel_network``); an empty pool is today's path. The
keeper follows its node's allocations (a blocking query) and, for each pooled namespace of its own:

- a live allocation's docker task names it: bound to that allocation's session (Nomad namespace, job id) with its
  allocated ports, to that session only (the isolation plugin refuses another's); a replacement allocation of the
  same session (an ``alloc stop``, a batch kernel placed again) with other ports has them published instead;
- named by an allocation that ended, and by no live one: deleted once that allocation's job is stopped (the session
  ended), gone or dead, never offered again (a failed allocation that Nomad replaces keeps it for the replacement, which
  is the same session's);
- neither free, nor named, nor bound for :data:`UNCLAIMED_GRACE` seconds (claimed by a placement that was never
  written, or the keeper restarted): deleted;
- free, with its pause container stopped (the Docker daemon restarted): taken back from the free set and deleted, at
  the keeper's start and every :data:`CHECK_PERIOD` seconds; a fresh one takes its place.

Until bound, a pooled namespace is isolated like a session's only kernel; a claimed one that is never bound publishes
nothing and reaches nothing. The keeper writes no Nomad job (only the scheduler's job owner does): it reads its node's
allocations and runs Docker and the CNI chain on its own host, as root.

``caravan namespace-keeper`` runs one (``caravan.services.run_namespace_keeper``, ``CARAVAN_NAMESPACE_POOL``
namespaces, 0: none): ``caravan dev`` beside the stack's client, ``caravan deploy`` as a system job, one on every client
with Docker and a session network. It serves the node it runs on: Nomad's ``${node.unique.id}`` (deployed), or the
node whose meta (:data:`NETWORK_META`) names the directory where its session network is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from core.keys import Keys
from core.replies import texts
from core.retry import stop_if_cancelled
from node_plugins.cni_isolation import Membership, PluginError, pool_key, published_ports
from node_plugins.namespace_pool import PREFIX, Client, Pooled, PoolError, bind, delete, labelled, make, running
from nomad_jobs.client import Json, NomadClient, NomadNotFound
from nomad_jobs.kernel_network import POOLED_HOSTNAME

log = logging.getLogger(__name__)

NETWORK_META = "caravan_session_network"
"""Node meta: the directory where the client's session network is recorded (``session-network.json``), which
``caravan stack`` sets on every client it starts: where the keeper on that host finds the network and its node."""
LABEL = "caravan.pool.node"
"""Docker label of a pooled namespace's pause container: the Nomad node id of the keeper that made it (what a stack's
reset deletes, whichever deployment's)."""
POOL_LABEL = "caravan.pool.key"
"""Docker label of a pooled namespace's pause container: its keeper's free set (:meth:`core.keys.Keys.namespace_pool`,
the deployment's key prefix and the node), by which a keeper finds its own again after a start: two deployments with
keepers on one node (another key prefix) never take each other's."""
UNCLAIMED_GRACE = 600.0
"""Seconds a pooled namespace taken from the free set may stay unnamed by any allocation before it is deleted."""
REFILL_DELAY = 2.0
"""Seconds after a namespace was claimed before a fresh one is made: not while the kernel that claimed it starts
(making one costs a pause container and the CNI chain, 0.2-0.3 s of the host's CPU)."""
CHECK_PERIOD = 5.0
"""Seconds between two looks at the free namespaces' pause containers (:meth:`NamespaceKeeper.drop_stopped`)."""
ENDED = frozenset({"complete", "failed", "lost"})
"""Allocation client statuses whose tasks are gone."""


def named_namespace(alloc: Mapping[str, Any]) -> str | None:
    """The pooled namespace an allocation's docker task joins (``network_mode = "container:<name>"``), if any."""
    for group in (alloc.get("Job") or {}).get("TaskGroups") or []:
        if group.get("Name") != alloc.get("TaskGroup"):
            continue
        for task in group.get("Tasks") or []:
            mode = str((task.get("Config") or {}).get("network_mode") or "")
            if task.get("Driver") == "docker" and mode.startswith("container:" + PREFIX):
                return mode.removeprefix("container:")
    return None


def port_mappings(alloc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The allocation's ports as CNI's ``portMappings`` (both protocols, as Nomad's CNI hook passes them)."""
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    return [
        {
            "hostIP": port.get("HostIP") or "127.0.0.1",
            "hostPort": int(port["Value"]),
            "containerPort": int(port.get("To") or port["Value"]),
            "protocol": protocol,
        }
        for port in shared.get("Ports") or []
        for protocol in ("tcp", "udp")
    ]


@dataclass(frozen=True)
class Plan:
    """What one look at the node's allocations asks of the keeper."""

    bind: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Pooled namespace → the live allocation to bind it to."""
    retire: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pooled namespace → the (Nomad namespace, job id) of the ended allocation that named it: deleted once that job
    is stopped, gone or dead (a failed allocation Nomad will replace keeps it for its replacement)."""
    delete: list[str] = field(default_factory=list)


def ports_of(alloc: Mapping[str, Any]) -> frozenset[tuple[str, int, int]]:
    """The allocation's ports the isolation plugin publishes, as (protocol, host port, kernel port): read as the plugin
    reads them (``published_ports``), so that one it skips (an IPv6 host address) is not taken for a port left
    unpublished, and the namespace bound again, at every look. Mappings the plugin refuses: all of them as given (the
    bind that follows fails and says why)."""
    mappings = port_mappings(alloc)
    try:
        published = published_ports({"runtimeConfig": {"portMappings": mappings}})
    except PluginError:
        return frozenset((m["protocol"], m["hostPort"], m["containerPort"]) for m in mappings)
    return frozenset((protocol, host_port, port) for _, protocol, host_port, port in published)


def plan(
    ours: Mapping[str, float],
    bound: Mapping[str, Collection[tuple[str, int, int]]],
    free: Iterable[str],
    allocs: Iterable[Mapping[str, Any]],
    now: float,
) -> Plan:
    """``ours``: our pooled namespaces → when first seen (monotonic); ``bound``: those bound already → the ports they
    publish (as :func:`ports_of`); ``free``: those still in the free set. Pure."""
    free = set(free)
    live: dict[str, Mapping[str, Any]] = {}
    ended: dict[str, tuple[str, str]] = {}
    shared: set[str] = set()
    for alloc in allocs:
        name = named_namespace(alloc)
        if name is None or name not in ours:
            continue
        if alloc.get("ClientStatus") in ENDED:
            ended[name] = (str(alloc.get("Namespace") or "default"), str(alloc.get("JobID")))
        elif name in live and live[name].get("JobID") != alloc.get("JobID"):
            shared.add(name)  # two sessions naming one namespace (the claim prevents it): bound to neither
        elif name not in live or int(alloc.get("CreateIndex") or 0) > int(live[name].get("CreateIndex") or 0):
            live[name] = alloc  # a replacement still beside the allocation it replaces: the newest one's ports
    result = Plan()
    for name, seen in ours.items():
        if name in shared:
            log.error("namespace-keeper: %s is named by two sessions' allocations: bound to neither", name)
        elif name in live:
            if name not in bound or frozenset(bound[name]) != ports_of(live[name]):
                result.bind[name] = live[name]  # first, or a replacement allocation with other ports
        elif name in ended:
            result.retire[name] = ended[name]
        elif name in bound or (name not in free and now - seen > UNCLAIMED_GRACE):
            result.delete.append(name)
    return result


class NamespaceKeeper:
    def __init__(
        self, client: Client, nomad: NomadClient, redis: Redis, keys: Keys, node_id: str, size: int, pause_image: str
    ) -> None:
        self.client = client
        self.nomad = nomad
        self.redis = redis
        self.key = keys.namespace_pool(node_id)
        self.node_id = node_id
        self.size = size
        self.pause_image = pause_image
        self.members = Membership(str(client.isolation()["stateDir"]))
        self.ours: dict[str, float] = {}
        self.unoffered: set[str] = set()
        """Ours made by this keeper and not yet added to the free set: a stop deletes them."""
        self._refill = asyncio.Event()

    async def run_forever(self) -> None:
        await self.recover()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow())
            tasks.create_task(self._fill())
            tasks.create_task(self._check())

    async def recover(self) -> None:
        """After a start: our pause containers found again; free-set entries whose container is gone removed, and
        free ones whose container stopped deleted (:meth:`drop_stopped`)."""
        # ours: of this node and this free set (or made by a keeper from before POOL_LABEL, which only knew the node)
        listed = await asyncio.to_thread(labelled, LABEL, self.node_id, also=(POOL_LABEL, self.key))
        now = time.monotonic()
        self.ours = dict.fromkeys(listed, now)
        stale = set(texts(await self.redis.smembers(self.key))) - self.ours.keys()
        if stale:
            await self.redis.srem(self.key, *stale)
        await self.drop_stopped()

    async def drop_stopped(self) -> list[str]:
        """Our free namespaces whose pause container stopped (the Docker daemon restarted, the container killed),
        taken back from the free set and deleted; the pool is refilled. Handed out, one of them failed its session's
        start ("cannot join network of a non running container": found on a dev stack after a restart of Docker).
        One a placement claims meanwhile is its session's (the ``SREM`` decides who has it)."""
        free = set(texts(await self.redis.smembers(self.key))) & self.ours.keys()
        if not free:
            return []
        stopped = free - await asyncio.to_thread(running, free)
        dropped = []
        for name in sorted(stopped):
            if await self.redis.srem(self.key, name):
                log.warning("namespace-keeper: %s's pause container is not running: deleted, to be replaced", name)
                await self._delete(name)
                dropped.append(name)
        return dropped

    async def _check(self) -> None:
        while True:
            await asyncio.sleep(CHECK_PERIOD)
            stop_if_cancelled()
            try:
                await self.drop_stopped()
            except Exception as exc:  # as in _follow: Redis or Docker failing once is logged, looked at again later
                stop_if_cancelled(exc)
                log.warning("namespace-keeper: the free namespaces not checked: %r", exc)

    def bound_ports(self, name: str) -> frozenset[tuple[str, int, int]] | None:
        """The ports a bound namespace publishes (as :func:`ports_of`); None while it is not bound."""
        record = self.members.recall(name)
        if record is None or record.session == pool_key(name):
            return None
        return frozenset((protocol, host_port, port) for _, protocol, host_port, port in record.published)

    async def step(self, allocs: list[Json]) -> None:
        free = texts(await self.redis.smembers(self.key))
        bound = {name: ports for name in self.ours if (ports := self.bound_ports(name)) is not None}
        decided = plan(self.ours, bound, free, allocs, time.monotonic())
        for name, alloc in decided.bind.items():
            try:
                args = (self.client, name, str(alloc.get("Namespace") or "default"), str(alloc["JobID"]))
                await asyncio.to_thread(bind, *args, port_mappings(alloc))
                log.info("namespace-keeper: %s bound to %s (allocation %s)", name, alloc["JobID"], alloc["ID"])
            except PoolError as exc:
                log.warning("namespace-keeper: %s not bound to %s: %s", name, alloc.get("JobID"), exc)
        for name, (namespace, job_id) in decided.retire.items():
            if await self._job_over(namespace, job_id):
                await self._delete(name)
        for name in decided.delete:
            await self._delete(name)

    async def _job_over(self, namespace: str, job_id: str) -> bool:
        """Whether the job will run no allocation again: stopped (its session ended), gone, or dead."""
        try:
            job = await self.nomad.in_namespace(namespace).job(job_id)
        except NomadNotFound:
            return True
        return bool(job.get("Stop")) or job.get("Status") == "dead"

    async def _delete(self, name: str) -> None:
        await self.redis.srem(self.key, name)
        await asyncio.to_thread(delete, self.client, name)
        self.ours.pop(name, None)
        log.info("namespace-keeper: %s deleted", name)
        self._refill.set()

    async def _follow(self) -> None:
        index = 0
        while True:
            stop_if_cancelled()  # a stop's cancellation lost on the way (Python 3.11, redis-py): see stop_if_cancelled
            try:
                allocs, index = await self.nomad.node_allocations(self.node_id, index=index)
                await self.step(allocs)
            except Exception as exc:  # a daemon: Nomad, Redis, Docker or the plugin failing once is logged, retried
                stop_if_cancelled(exc)
                log.warning("namespace-keeper: %r", exc)
                index = 0  # read the node's allocations again at once
                await asyncio.sleep(1.0)

    async def _fill(self) -> None:
        offered, claimed_at = 0, float("-inf")
        while True:
            stop_if_cancelled()  # before, a lost one kept the keeper running past its SIGTERM: killed, its pool left
            try:
                free = set(texts(await self.redis.smembers(self.key))) & self.ours.keys()
                if len(free) < offered:
                    claimed_at = time.monotonic()
                offered = len(free)
                if time.monotonic() - claimed_at < REFILL_DELAY:
                    self._refill.clear()
                    await asyncio.sleep(REFILL_DELAY)
                    continue
                for _ in range(self.size - len(free)):
                    made = await self._make()
                    await self._offer(made.name)
                    offered += 1
            except Exception as exc:  # as in _follow; tried again within a second
                stop_if_cancelled(exc)
                log.warning("namespace-keeper: no namespace made: %r", exc)
            self._refill.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._refill.wait()

    async def _make(self) -> Pooled:
        """A new pooled namespace, ours from the moment it exists: a cancellation while Docker and the CNI chain make
        it (a stop, a test's end) waits for the thread, which goes on either way, and keeps what it made among ours, so
        :meth:`release_free` and :meth:`delete_all` delete it (before, its pause container was left running: found
        after a CI run)."""
        making = asyncio.ensure_future(
            asyncio.to_thread(
                make,
                self.client,
                self.pause_image,
                {LABEL: self.node_id, POOL_LABEL: self.key},
                hostname=POOLED_HOSTNAME,
            )
        )
        try:
            made = await asyncio.shield(making)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                made = await making
                self.ours[made.name] = time.monotonic()
                self.unoffered.add(made.name)
            raise
        self.ours[made.name] = time.monotonic()
        self.unoffered.add(made.name)
        return made

    async def _offer(self, name: str) -> None:
        """``name`` added to the free set, and known as offered once it is, even when a stop cancels us meanwhile
        (as :meth:`_make`): :meth:`release_free` then takes it back, or deletes it if it was never offered."""
        adding = asyncio.ensure_future(self.redis.sadd(self.key, name))
        try:
            await asyncio.shield(adding)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await adding
                self.unoffered.discard(name)
            raise
        self.unoffered.discard(name)

    async def release_free(self) -> None:
        """On a stop (SIGTERM: Nomad stopping or updating the keeper's job): the namespaces still free taken back
        from the set and deleted, and so are those made and never offered (a stop while one was being made: before,
        its pause container was left running); one claimed meanwhile stays, found again by the next start, and
        bound ones stay with their sessions."""
        for name in list(self.ours):
            try:
                if name in self.unoffered or await self.redis.srem(self.key, name):
                    await self._delete(name)
            except Exception as exc:  # one that fails is logged; the others are still deleted
                log.error("namespace-keeper: %s not deleted on the stop: %r", name, exc)

    async def delete_all(self) -> None:
        """Every pooled namespace of this keeper deleted, bound or not (a test's teardown, after its jobs)."""
        for name in list(self.ours):
            await self._delete(name)
