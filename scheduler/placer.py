"""One scheduling pass at the I/O edge: read the snapshot, decide (pure: :mod:`scheduler.scheduling_pass`), write back.

Written back, every write fenced by the leader's term:
- placements: PENDING -> SCHEDULED, each kernel's ``agent`` set and the job rendered pinned to it (the submitter
  registers it; Nomad runs exactly what was decided);
- cancellations: CANCELLED ``dependency-failed`` (a dependency failed, errored, was cancelled or is gone; the pass
  after wakes at once, so dependents of the cancelled follow in cascade) and ``pending-timeout``;
- still PENDING: the added failed attempts (``retries``), the reasons (``wait_reasons``, one line per failed check)
  and the ``queue_position``, only for sessions where one of them changed;
- the round-robin positions, the slot types the agents report and the resource groups (node pools and configured
  groups) seen (the gateway admits requests by them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime

from redis.typing import EncodableT

from core.clock import utcnow
from core.lease import Fence, write_fenced
from core.replies import optional_text
from core.settings import Settings
from devices.catalog import DeviceAsk
from domain.apps import grant_preferred_ports
from domain.lifecycle import transition
from domain.model import Kernel, Session, SessionStatus
from domain.scheduling_config import SchedulingConfig
from domain.slots import SlotType
from nomad_jobs.client import NomadClient
from nomad_jobs.kernel_network import POOLED_NAME, poolable
from nomad_jobs.session_job import JobContext, render_session_job
from scheduler.config import pass_config
from scheduler.pass_model import KernelPlacement, PassConfig, PassResult, WaitExplanation
from scheduler.scheduling_pass import run_pass
from scheduler.snapshot import PassInput, SnapshotReader
from stores.known_resources import record_resource_groups, record_slot_types
from stores.resource_policies import PolicyStore
from stores.sessions import Mutation, SessionStore

IDLE_REFRESH_SECONDS = 10.0
"""With an empty queue, the node snapshot is still read this often (known slot types, capacity)."""

__all__ = ["PENDING_TIMEOUT", "PassSummary", "Placer", "wait_reasons"]

log = logging.getLogger(__name__)

PENDING_TIMEOUT = "pending-timeout"
WRITE_CONCURRENCY = 32


def wait_reasons(explanation: WaitExplanation) -> tuple[str, ...]:
    """One line per failed check (``start-time: starts at …``), else ``<kind>: <why>`` (``no-agent-fits: …``)."""
    if explanation.failed_checks:
        return tuple(f"{name}: {message}" for name, message in explanation.failed_checks)
    return (f"{explanation.kind.value}: {explanation.message}",)


@dataclass(frozen=True)
class PassSummary:
    placed: int = 0
    cancelled: int = 0
    waiting: int = 0


class Placer:
    def __init__(
        self,
        store: SessionStore,
        nomad: NomadClient,
        fence: Fence | None,
        settings: Settings,
        config: SchedulingConfig,
        core: PassConfig | None = None,
    ) -> None:
        """``core``: the pass's configuration (resolved from ``config`` when not given)."""
        self.store = store
        self.fence = fence
        self.settings = settings
        self.config = config
        self.core = core if core is not None else pass_config(config)
        self.reader = SnapshotReader(
            store, PolicyStore(store.redis, store.keys), nomad, config, settings.nomad.job_prefix
        )
        self._recorded: dict[str, SlotType] = {}
        self._recorded_groups: set[str] = set()
        self._last_read = float("-inf")

    async def run_pass(self) -> PassSummary:
        # Nothing queued: skip the Nomad snapshot (every live allocation), except for a periodic refresh
        # that keeps the known slot types current for the gateway's admission check.
        if not await self._anything_pending() and time.monotonic() - self._last_read < IDLE_REFRESH_SECONDS:
            return PassSummary()
        self._last_read = time.monotonic()
        now = utcnow()
        read = await self.reader.read(now)
        await self._record_slot_types(read.slot_types)
        await self._record_groups({agent.resource_group for agent in read.snapshot.agents} | set(self.config.groups))
        if not read.snapshot.pending and not read.timed_out:
            return PassSummary()
        result = run_pass(read.snapshot, self.core, now)
        summary = await self._apply(read, result, now)
        if summary.cancelled:
            await self.store.wake_scheduler("cancelled")  # their dependents are cancelled in the next pass
        return summary

    async def _anything_pending(self) -> bool:
        groups = sorted(await self.store.resource_groups())
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.zcard(self.store.keys.pending_queue(group))
            return any(await pipe.execute())

    async def _apply(self, read: PassInput, result: PassResult, now: datetime) -> PassSummary:
        writes: list[tuple[str, Mutation]] = []
        for session_id in read.timed_out:
            writes.append((session_id, _cancel(PENDING_TIMEOUT, now)))
        for session_id, cancellation in result.cancellations.items():
            log.info("session=%s cancelled: %s", session_id, cancellation.message)
            writes.append((session_id, _cancel(cancellation.reason, now)))
        granted: dict[str, dict[int, str]] = {}  # node -> preferred port -> the session of this pass granted it
        for session_id, kernels in result.placements.items():
            log.info("session=%s placed: %s", session_id, ", ".join(f"{k.role} on {k.agent_id}" for k in kernels))
            pooled = await self._claim_namespace(read.sessions[session_id], kernels)
            place = self._place(kernels, read.mhz_per_core, read.device_asks, now, read.host_ports, granted, pooled)
            writes.append((session_id, place))
        waiting = 0
        for session_id, explanation in result.waiting.items():
            before = read.sessions[session_id]
            reasons = wait_reasons(explanation)
            position = result.queue_positions.get(session_id)
            added = result.retry_increments.get(session_id, 0)
            waiting += 1
            if added or (before.wait_reasons, before.queue_position) != (reasons, position):
                log.debug("session=%s waits (#%s): %s", session_id, position, "; ".join(reasons))
                writes.append((session_id, _annotate(added, reasons, position)))
        await self._write(writes)
        if dict(result.roundrobin_state) != dict(read.snapshot.roundrobin_state):
            await self._save_roundrobin(result.roundrobin_state)
        cancelled = len(read.timed_out) + len(result.cancellations)
        return PassSummary(len(result.placements), cancelled, waiting)

    def _place(
        self,
        kernels: Sequence[KernelPlacement],
        mhz: int,
        devices: Mapping[str, DeviceAsk],
        now: datetime,
        host_ports: Mapping[str, Set[int]],
        granted: dict[str, dict[int, str]],
        pooled: str | None = None,
    ) -> Mutation:
        """``host_ports``: node -> the host ports held there as the pass began; ``granted``: node -> the preferred
        ports this pass granted, and to which session (filled in: a session written again keeps its own);
        ``pooled``: the pooled network namespace claimed for its kernel."""
        on = {p.role: p.agent_id for p in kernels}  # roles are the kernels' hostnames (see scheduler.snapshot)

        def mutate(session: Session) -> Session | None:
            if session.status is not SessionStatus.PENDING:
                return None
            placed = session.evolve(kernels=tuple(_on(k, on[k.hostname]) for k in session.kernels))
            node = on[session.main_kernel.hostname]
            here = granted.setdefault(node, {})
            in_use = host_ports.get(node, set()) | {port for port, holder in here.items() if holder != session.id}
            static, taken = grant_preferred_ports(session.apps, in_use)
            for host_port in static.values():
                here[host_port] = session.id
            if taken:
                log.info("session=%s preferred ports taken on %s: %s get dynamic ones", session.id, node, taken)
            ctx = replace(
                job_context(self.settings, session, mhz, devices, on), static_ports=static, pooled_namespace=pooled
            )
            rendered = render_session_job(placed, ctx)
            placed = placed.evolve(nomad_job_id=rendered.job_id, job_hcl=rendered.hcl, preferred_ports_taken=taken)
            return transition(placed, SessionStatus.SCHEDULED, reason="scheduled", at=now)

        return mutate

    async def _claim_namespace(self, session: Session, kernels: Sequence[KernelPlacement]) -> str | None:
        """A pooled network namespace of the kernel's node, taken from its free set (``SPOP``: handed to this session
        alone), for a session that may use one (``kernel_network.poolable``); None: none free, today's path."""
        if not poolable(session, self.settings.session_network) or len(kernels) != 1:
            return None
        popped = await self.store.redis.spop(self.store.keys.namespace_pool(kernels[0].agent_id))
        claimed = optional_text(popped) if isinstance(popped, (bytes, str)) else None
        if claimed is not None and not POOLED_NAME.fullmatch(claimed):
            log.warning("session=%s: %r in the namespace pool is no pooled namespace's name", session.id, claimed)
            return None
        if claimed is not None:
            log.info("session=%s claimed pooled namespace %s on %s", session.id, claimed, kernels[0].agent_id)
        return claimed

    async def _write(self, writes: Sequence[tuple[str, Mutation]]) -> None:
        limit = asyncio.Semaphore(WRITE_CONCURRENCY)

        async def one(session_id: str, mutate: Mutation) -> None:
            async with limit:
                await self.store.update(session_id, mutate, fence=self.fence)

        await asyncio.gather(*(one(session_id, mutate) for session_id, mutate in writes))

    async def _save_roundrobin(self, state: Mapping[str, int]) -> None:
        key = self.store.keys.scheduler_roundrobin
        mapping: dict[EncodableT, EncodableT] = {group: str(index) for group, index in state.items()}
        if self.fence is None:
            await self.store.redis.hset(key, mapping=mapping)
        else:
            await write_fenced(self.store.redis, self.fence, lambda pipe: pipe.hset(key, mapping=mapping))

    async def _record_slot_types(self, slot_types: Mapping[str, SlotType]) -> None:
        new = {slot: kind for slot, kind in slot_types.items() if slot not in self._recorded}
        if new:
            await record_slot_types(self.store.redis, self.store.keys, new)
            self._recorded.update(new)

    async def _record_groups(self, groups: set[str]) -> None:
        if new := groups - self._recorded_groups:
            await record_resource_groups(self.store.redis, self.store.keys, new)
            self._recorded_groups |= new


def job_context(
    settings: Settings, session: Session, mhz: int, devices: Mapping[str, DeviceAsk], pinned: Mapping[str, str]
) -> JobContext:
    """How a session's job is rendered: its kernels pinned to their agents (the autoscaler renders a live endpoint's
    job again the same way, so the replicas that stay are left as they run)."""
    nomad = settings.nomad
    return JobContext(
        job_prefix=nomad.job_prefix,
        datacenter=nomad.datacenter,
        namespace=nomad.namespace,
        mhz_per_core=mhz,
        pinned_nodes=dict(pinned),
        node_pool=session.resource_group,
        devices=devices,
        qemu_images=settings.qemu_images,
        network_mode=settings.session_network,
        restart_delay=nomad.restart_delay,
    )


def _on(kernel: Kernel, agent: str) -> Kernel:
    return Kernel(**{**kernel.__dict__, "agent": agent})


def _cancel(reason: str, now: datetime) -> Mutation:
    def mutate(session: Session) -> Session | None:
        if session.status is not SessionStatus.PENDING:
            return None
        return transition(session, SessionStatus.CANCELLED, reason=reason, at=now)

    return mutate


def _annotate(added_retries: int, reasons: tuple[str, ...], position: int | None) -> Mutation:
    def mutate(session: Session) -> Session | None:
        if session.status is not SessionStatus.PENDING:
            return None
        return session.evolve(retries=session.retries + added_retries, wait_reasons=reasons, queue_position=position)

    return mutate
