"""The autoscaler: the scheduler leader's loop that sizes every live inference endpoint to its load.

Every :data:`TICK` seconds, and at once when the activator asks to wake an endpoint (``stores.endpoint_traffic``'s
``next_wakes``), for each RUNNING INFERENCE session:

1. the endpoint's latest load sample (``read_loads``, written by the ingress about every second) joins the samples
   kept here, in memory (a new leader starts with none: it holds the replicas until it has some);
2. the pure policy decides the replicas (``domain.autoscaling.decide``), and ``domain.endpoint_scaling`` plans what
   that means for the kernels (add, drain, stop, park);
3. new replicas are placed on agents by the scheduler's own pass (``scheduler.scheduling_pass.run_pass``, over the
   agents' free capacity as Nomad reports it, the session's cluster mode kept: SINGLE_NODE replicas share the first
   one's agent), the job is rendered again with each replica pinned, and the decision, its reason and time are written
   with the kernels in one fenced update. The store asks the job owner, in that same transaction, to register the job
   as it now is (``stores.sessions.rescaled``); the owner alone writes to Nomad (``scheduler.submitter.resubmit``).

A replica down on a node Nomad marks down (its client lost) is placed again the same way, on another agent
(``move_stranded``): it is pinned to its agent, so Nomad itself cannot move it.

The loop changes an endpoint's job only when the previous change is registered (the session is no longer in the
owner's ``work_to_submit``): so two changes never race, and the owner never registers a job older than the stored one.
It uses Nomad's plain job registration, not its ``job scale`` API: a registration is accepted while a deployment is
active (it supersedes it), unlike ``job scale``, so there is nothing to wait for in Nomad itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from decimal import Decimal

from core.clock import utcnow
from core.lease import Fence
from core.replies import text_set
from core.retry import stop_if_cancelled
from core.settings import Settings
from devices.catalog import device_asks
from domain.autoscaling import STALE_AFTER, Sample, ScalingState, decide, observe
from domain.endpoint_scaling import (
    ReplicaPlan,
    fresh,
    is_scalable,
    moved,
    plan_replicas,
    plan_rollout,
    replica_template,
    replicas_now,
    rules_of,
    serving,
    stranded,
    with_decision,
    with_plan,
)
from domain.model import ClusterMode, Session, SessionStatus, SessionType
from domain.scheduling_config import SchedulingConfig
from nomad_jobs.agents import agents_of, allowed_drivers, devices_of, healthy_drivers, mhz_per_core
from nomad_jobs.client import NomadClient
from nomad_jobs.session_job import JobContext, mhz_rendered, render_session_job
from scheduler.pass_model import PassConfig, Snapshot
from scheduler.placer import job_context
from scheduler.scheduling_pass import run_pass
from scheduler.snapshot import pending_session, requiring_driver, with_wanted_slots
from stores.endpoint_traffic import EndpointLoad, next_wakes, read_loads
from stores.sessions import SessionStore

log = logging.getLogger(__name__)
S = SessionStatus

TICK = 1.0
"""Seconds between two decisions of every endpoint (a wake decides at once)."""


class Autoscaler:
    def __init__(
        self,
        store: SessionStore,
        nomad: NomadClient,
        fence: Fence | None,
        settings: Settings,
        config: SchedulingConfig,
        core: PassConfig,
    ) -> None:
        self.store, self.nomad, self.fence = store, nomad, fence
        self.settings, self.config, self.core = settings, config, core
        self.samples: dict[str, tuple[Sample, ...]] = {}
        self.states: dict[str, ScalingState] = {}
        self.waking: set[str] = set()
        """Endpoints asked to wake and not yet given a replica (a wake is kept until acted on)."""

    async def run_forever(self) -> None:
        while True:
            stop_if_cancelled()
            woken = await next_wakes(self.store.redis, self.store.keys, timeout=TICK)
            await self.tick(woken)

    async def tick(self, woken: Collection[str] = ()) -> None:
        """One decision for every live endpoint (``woken``: asked to wake now)."""
        keys = self.store.keys
        inference = keys.sessions_of_type(SessionType.INFERENCE.value)
        ids = sorted(text_set(await self.store.redis.sinter([inference, keys.sessions_live])))
        self.waking |= set(woken) & set(ids)
        loads = await read_loads(self.store.redis, keys)
        submitting = await self.store.ids_to_submit()
        sessions = [s for s in await self.store.get_many(ids) if s is not None]
        for gone in set(self.states) - {s.id for s in sessions}:
            self.states.pop(gone, None)
            self.samples.pop(gone, None)
        for session in sessions:
            stop_if_cancelled()
            if is_scalable(session):
                await self.decide(session, loads.get(session.id), busy=session.id in submitting)

    async def decide(self, session: Session, load: EndpointLoad | None, *, busy: bool) -> None:
        now = utcnow()
        rules = rules_of(session)
        samples = self.samples.get(session.id, ())
        if load is not None:
            sample = Sample(load.sampled_at, load.in_flight, load.requests_total, load.held)
            samples = observe(samples, sample, keep=rules.stable_window + STALE_AFTER)
            self.samples[session.id] = samples
        replicas = replicas_now(session)
        wake = session.id in self.waking
        decision = decide(
            rules, samples, replicas, self.states.get(session.id, ScalingState()), now=now.timestamp(), wake=wake
        )
        self.states[session.id] = decision.state
        if busy:  # its last change is not registered in Nomad yet: decide again once it is
            return
        if await self.move_stranded(session, now):
            return  # a replica moved off a lost node: the load decides again at the next tick
        fresh_load = load is not None and now.timestamp() - load.sampled_at <= STALE_AFTER
        in_flight = load.in_flight + load.held if load is not None and fresh_load else None
        sampled_at = load.sampled_at if load is not None and fresh_load else None
        drain = rules.drain_timeout
        # A rolling update goes first (the endpoint keeps its replicas meanwhile), then the load decides.
        plan = plan_rollout(session, now=now, drain_timeout=drain, in_flight=in_flight, sampled_at=sampled_at)
        if plan is None:
            plan = plan_replicas(
                session, decision.desired, now=now, drain_timeout=drain, in_flight=in_flight, sampled_at=sampled_at
            )
        recorded = with_decision(session, decision.desired, decision.reason, decision.panicking, now=now)
        if plan.empty and recorded is session:
            if wake and replicas.current > 0:
                self.waking.discard(session.id)
            return
        agents = await self.place(session, plan.add, now) if plan.add else {}
        placed = ReplicaPlan(tuple(h for h in plan.add if h in agents), plan.undrain, plan.drain, plan.stop)
        context = await self.job_context(session) if placed.changes_job else None
        before = session.kernels

        def mutate(current: Session) -> Session | None:
            if not is_scalable(current) or current.kernels != before:
                return None  # moved on meanwhile (observed, ended): decided again at the next tick
            after = with_decision(
                with_plan(current, placed, now=now, agents=agents),
                decision.desired,
                decision.reason,
                decision.panicking,
                now=now,
            )
            if context is not None:
                rendered = render_session_job(after, context(after))
                after = after.evolve(job_hcl=rendered.hcl)
            return after

        stored = await self.store.update(session.id, mutate, fence=self.fence)
        if stored is not None and stored.kernels != before:
            log.info(
                "session=%s replicas %d -> %d (%s): add %s, drain %s, stop %s",
                session.id,
                replicas.current,
                decision.desired,
                decision.reason,
                ",".join(placed.add) or "-",
                ",".join(placed.drain) or "-",
                ",".join(placed.stop) or "-",
            )
            if serving(stored):
                self.waking.discard(session.id)

    async def move_stranded(self, session: Session, now: datetime) -> bool:
        """Place again, on another agent, each replica down on a node Nomad marks down (``domain.endpoint_scaling``'s
        ``stranded``: its pin keeps Nomad from rescheduling it), and render the job with the new pins; the store asks
        the job owner to register it, as for any change of replicas. One Nomad call (the nodes) per endpoint with a
        replica not running, none otherwise. Whether it changed the endpoint."""
        if all(k.status is S.RUNNING for k in serving(session)):
            return False
        down = {str(n["ID"]) for n in await self.nomad.nodes() if n.get("Status") == "down"}
        lost = stranded(session, down)
        agents = await self.place(session, lost, now) if lost else {}
        if not agents:
            return False
        context = await self.job_context(session)
        before = session.kernels

        def mutate(current: Session) -> Session | None:
            if not is_scalable(current) or current.kernels != before:
                return None  # moved on meanwhile (observed, ended): looked at again at the next tick
            after = moved(current, agents)
            return after.evolve(job_hcl=render_session_job(after, context(after)).hcl)

        stored = await self.store.update(session.id, mutate, fence=self.fence)
        if stored is None or stored.kernels == before:
            return False
        log.info("session=%s replicas on a lost node placed again: %s", session.id, agents)
        return True

    async def place(self, session: Session, hostnames: Sequence[str], now: datetime) -> dict[str, str]:
        """An agent for each new replica, by the scheduler's pass over what Nomad reports free (those that fit now;
        the others wait for the next decision)."""
        nodes = await self.nomad.nodes()
        allocs = await self.nomad.live_allocations()
        capabilities = await self.nomad.namespace_capabilities()
        live = {s.id: s for s in await self.store.get_many(sorted(await self.store.live_ids())) if s is not None}
        mhz = mhz_per_core(nodes, self.config.cpu_mhz_per_core)
        agents = agents_of(nodes, allocs, live, self.settings.nomad.job_prefix, mhz, self.config.devices)
        template = replica_template(session)  # a rolling update's new replicas: the new revision's image and slots
        new = tuple(fresh(template, int(h.removeprefix("main")), "", session.revision) for h in hostnames)
        anchor = next((k.agent for k in serving(session) if k.agent and k.hostname not in hostnames), None)
        asked = session.evolve(kernels=new)
        if session.cluster_mode is ClusterMode.SINGLE_NODE and anchor is not None:
            asked = asked.evolve(designated_agent=anchor)  # replicas of a single-node endpoint share its agent
        pending = requiring_driver(pending_session(asked), session.driver.value)
        drivers = {str(n["ID"]): allowed_drivers(healthy_drivers(n), capabilities) for n in nodes}
        snapshot = Snapshot(agents=with_wanted_slots(agents, drivers, [pending]), pending=(pending,))
        result = run_pass(snapshot, self.core, now)
        placements = {p.role: p.agent_id for p in result.placements.get(session.id, ())}
        if not placements:
            why = result.waiting.get(session.id)
            log.info("session=%s new replicas wait: %s", session.id, why.message if why else "not placed")
        return placements

    async def job_context(self, session: Session) -> Callable[[Session], JobContext]:
        """How the session's job is rendered, as the placer rendered it (the same inputs give the same groups, so
        the replicas that stay are left as they run), for its kernels as they will be. The MHz per core is the one
        the registered job was rendered with (the agents' may have changed since, as nodes came and went)."""
        nodes = await self.nomad.nodes()
        mhz = await self.rendered_mhz(session) or mhz_per_core(nodes, self.config.cpu_mhz_per_core)
        devices = device_asks(self.config.devices, devices_of(nodes))

        def context(after: Session) -> JobContext:
            pinned = {k.hostname: k.agent for k in after.kernels if k.agent and not k.parked}  # parked: no allocation
            return job_context(self.settings, after, mhz, devices, pinned)

        return context

    async def rendered_mhz(self, session: Session) -> int | None:
        """The MHz per core the session's job was rendered with, from Nomad's parse of its HCL (None: not known)."""
        if not session.job_hcl:
            return None
        job = await self.nomad.parse(session.job_hcl)
        for group in job.get("TaskGroups") or []:
            kernel = next((k for k in session.kernels if k.hostname == group.get("Name")), None)
            cpu = ((group.get("Tasks") or [{}])[0].get("Resources") or {}).get("CPU")
            if kernel is not None and isinstance(cpu, int):
                return mhz_rendered(cpu, Decimal(kernel.resources.get("cpu", "1")))
        return None
